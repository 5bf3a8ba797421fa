// rdma_cm as other programs speak it: gpuverbs against rdma-core's own tools
// (rdmacm-utils: rdma_server, rdma_client, ucmatose), over IPv4 and IPv6,
// with the receive posted before accept/connect and the rxe devices' RNR
// counters read before and after each exchange.
#include "child_process.hpp"
#include "cm_end.hpp"
#include "gpuverbs/connections/rdma_cm.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>

#include <fstream>
#include <sstream>

#include "build_has.hpp"

#if GPUVERBS_HAVE_RDMACM

using namespace gpuverbs;
using gpuverbs::test::ChildProcess;
using gpuverbs::test::poll_for;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// RNR NAKs sent and received by the rig's two devices (rxe's hardware counters).
std::uint64_t rnr_naks() {
    std::uint64_t total = 0;
    for (const char* dev : {"rxe0", "rxe1"}) {
        for (const char* counter : {"send_rnr_err", "rcvd_rnr_err"}) {
            std::ifstream in(std::string("/sys/class/infiniband/") + dev + "/ports/1/hw_counters/" + counter);
            std::uint64_t n = 0;
            REQUIRE_MESSAGE(static_cast<bool>(in >> n), "cannot read ", dev, "'s counter ", counter);
            total += n;
        }
    }
    return total;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string log_file(const std::string& name) {
    return "/tmp/gpuverbs-" + name + "-" + std::to_string(::getpid()) + ".log";
}

/// A free-ish port for a tool that cannot choose one itself.
std::uint16_t tool_port(std::uint16_t offset) {
    return static_cast<std::uint16_t>(20000 + (::getpid() % 2000) * 10 + offset);
}

using Side = gpuverbs::test::CmEnd;

/// Connects to a tool's server that may not listen yet: resolves, creates the
/// QP, posts `receives` receives of `size` bytes, connects; retries while refused.
std::unique_ptr<Side> connect_to_tool(const std::string& host, std::uint16_t port, const std::string& source,
                                      int receives, std::uint32_t size, const CmOptions& options = {}) {
    const auto deadline = Clock::now() + 20s;
    for (;;) {
        auto side = std::make_unique<Side>(cm_resolve(host, port, 20s, source));
        QueuePair& qp = side->conn.create_qp(side->pd, side->cq, side->cq);
        for (int i = 0; i < receives; ++i) {
            REQUIRE_FALSE(qp.post_receive(side->mr.slice(static_cast<std::size_t>(i) * size, size),
                                          static_cast<std::uint64_t>(i)));
        }
        std::error_code ec;
        side->conn.connect(options, {}, 20s, ec);
        if (!ec) return side;
        REQUIRE_MESSAGE(ec == errc::connection_rejected, ec.message());
        REQUIRE_MESSAGE(Clock::now() < deadline, "the tool's server never listened on port ", port);
        std::this_thread::sleep_for(50ms);
    }
}

} // namespace

TEST_SUITE("rdma_cm against rdmacm-utils" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("a gpuverbs server answers rdma-core's rdma_client: receive posted before accept, no RNR NAK") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        const auto naks_before = rnr_naks();
        ChildProcess client({"/usr/bin/rdma_client", "-s", rig.ip1, "-p", std::to_string(listener.port())},
                            ChildProcess::Output{log_file("rdma_client")});
        Side side(listener.accept(20s));
        QueuePair& qp = side.conn.create_qp(side.pd, side.cq, side.cq);
        REQUIRE_FALSE(qp.post_receive(side.mr.slice(0, 64), 1));
        std::fill(side.memory.begin(), side.memory.end(), std::byte{0x5a});
        side.conn.accept();
        const auto accepted = Clock::now();
        CHECK(side.conn.connected());
        auto got = poll_for(side.cq, 1);
        const auto first_message = Clock::now() - accepted;
        REQUIRE(got.size() == 1);
        REQUIRE(got[0].ok());
        // rdma_client sends its 16-byte message buffer, a zeroed static array.
        CHECK(got[0].byte_length == 16);
        CHECK(
            std::all_of(side.memory.begin(), side.memory.begin() + 16, [](std::byte b) { return b == std::byte{0}; }));
        CHECK(side.memory[16] == std::byte{0x5a}); // nothing beyond it
        REQUIRE_FALSE(qp.post_send(side.mr.slice(4096, 16)));
        auto sent = poll_for(side.cq, 1);
        REQUIRE(sent.size() == 1);
        CHECK(sent[0].ok());
        // rdma_client disconnects once it has our answer; reading the event answers
        // its disconnect request (until then its rdma_destroy_ep waits).
        auto event = side.conn.wait_event(10s);
        REQUIRE(event.has_value());
        CHECK(event->type == CmEventType::disconnected);
        CHECK_FALSE(side.conn.connected());
        CHECK(client.wait(20s) == 0);
        const std::string out = slurp(log_file("rdma_client"));
        CHECK_MESSAGE(out.find("rdma_client: end 0") != std::string::npos, out);
        const auto naks = rnr_naks() - naks_before;
        CHECK(naks == 0);
        MESSAGE("accept -> first message from rdma_client: ",
                std::chrono::duration_cast<std::chrono::microseconds>(first_message).count(), " us, ", naks,
                " RNR NAKs (receive posted before accept)");
    }

    TEST_CASE(
        "a receive posted after accept: the first message waits for RNR retries (the old behaviour, and the "
        "short form)") {
        // Not an assertion on timing: the numbers of the behaviour this replaces, for the record.
        const auto rig = *gpuverbs::test::rig_devices();
        for (const bool old_timer : {true, false}) {
            CAPTURE(old_timer);
            CmListener listener(rig.ip1, 0);
            const auto naks_before = rnr_naks();
            ChildProcess client({"/usr/bin/rdma_client", "-s", rig.ip1, "-p", std::to_string(listener.port())},
                                ChildProcess::Output{log_file("rdma_client_late")});
            CmConnection conn = listener.accept(20s);
            ProtectionDomain pd(conn.device());
            CompletionQueue cq(conn.device(), 16);
            std::vector<std::byte> memory(4096);
            MemoryRegion mr(pd, memory, access_all);
            QueuePair qp;
            if (old_timer) {
                // What establish() did before: accept, RNR retries forever, rdma_cm's RNR timer (0 = 655 ms).
                CmOptions old;
                old.rnr_retry_count = 7;
                old.min_rnr_timer = 0;
                conn.create_qp(pd, cq, cq);
                conn.accept(old);
                qp = std::move(conn.qp());
            } else {
                qp = std::move(conn).establish(pd, cq, cq, {}, 20s); // today's short form
            }
            const auto accepted = Clock::now();
            std::this_thread::sleep_for(2ms); // the client's send arrives before this receive
            REQUIRE_FALSE(qp.post_receive(mr.slice(0, 64), 1));
            auto got = poll_for(cq, 1);
            const auto first_message = Clock::now() - accepted;
            REQUIRE(got.size() == 1);
            CHECK(got[0].ok()); // retried forever: late, not lost
            REQUIRE_FALSE(qp.post_send(mr.slice(1024, 16)));
            CHECK(poll_for(cq, 1).size() == 1);
            qp = QueuePair(); // no events read here: destroying the queue pair answers the disconnect
            conn = CmConnection();
            CHECK(client.wait(20s) == 0);
            MESSAGE(std::string(old_timer ? "before (RNR timer 655 ms)" : "establish() today (RNR timer 2.56 ms)"),
                    ": receive posted after accept: accept -> first message ",
                    std::chrono::duration_cast<std::chrono::microseconds>(first_message).count(), " us, ",
                    rnr_naks() - naks_before, " RNR NAKs");
        }
    }

    TEST_CASE("a gpuverbs client talks to rdma-core's rdma_server over IPv4 and IPv6") {
        const auto rig = *gpuverbs::test::rig_devices();
        const std::string ip6_0 = gpuverbs::test::env_or("GPUVERBS_TEST_IP6_0");
        const std::string ip6_1 = gpuverbs::test::env_or("GPUVERBS_TEST_IP6_1");
        std::vector<std::pair<std::string, std::string>> families{{rig.ip1, rig.ip0}};
        if (!ip6_1.empty()) families.emplace_back(ip6_1, ip6_0);
        REQUIRE_MESSAGE(families.size() == 2, "the rig gives its devices IPv6 addresses (GPUVERBS_TEST_IP6_*)");
        std::uint16_t offset = 0;
        for (const auto& family : families) {
            const std::string& server_ip = family.first;
            const std::string& client_ip = family.second;
            CAPTURE(server_ip);
            const std::uint16_t port = tool_port(offset++);
            const auto naks_before = rnr_naks();
            ChildProcess server({"/usr/bin/rdma_server", "-s", server_ip, "-p", std::to_string(port)},
                                ChildProcess::Output{log_file("rdma_server")});
            auto side = connect_to_tool(server_ip, port, client_ip, 1, 64);
            CHECK(side->conn.peer_address() == server_ip);
            CHECK(side->conn.local_address() == client_ip);
            if (server_ip.find(':') != std::string::npos) {
                // RoCE v2 over the IPv6 GID, not an IPv4-mapped one.
                CHECK(side->conn.qp().remote_endpoint().gid.to_string().find("fd00") == 0);
            }
            gpuverbs::test::fill_pattern(std::span(side->memory).subspan(4096, 16), 7);
            REQUIRE_FALSE(side->conn.qp().post_send(side->mr.slice(4096, 16), {.context = 100}));
            auto done = poll_for(side->cq, 2);
            REQUIRE(done.size() == 2);
            for (const auto& c : done) CHECK(c.ok());
            const auto& received = done[0].context == 100 ? done[1] : done[0];
            CHECK(received.byte_length == 16); // rdma_server answers with its zeroed 16-byte buffer
            auto event = side->conn.wait_event(10s);
            REQUIRE(event.has_value());
            CHECK(event->type == CmEventType::disconnected);
            CHECK(server.wait(20s) == 0);
            CHECK(rnr_naks() - naks_before == 0);
        }
    }

    TEST_CASE(
        "ucmatose's client: four connections, ten messages each way, its connection parameters negotiated, "
        "every disconnect an event") {
        const auto rig = *gpuverbs::test::rig_devices();
        constexpr int connections = 4;
        constexpr int messages = 10;
        constexpr std::uint32_t size = 100;
        CmListener listener(rig.ip1, 0);
        const auto naks_before = rnr_naks();
        ChildProcess client({"/usr/bin/ucmatose", "-s", rig.ip1, "-p", std::to_string(listener.port()), "-c",
                             std::to_string(connections), "-C", std::to_string(messages), "-S", std::to_string(size)},
                            ChildProcess::Output{log_file("ucmatose_client")});
        std::vector<std::unique_ptr<Side>> sides;
        for (int i = 0; i < connections; ++i) {
            auto side = std::make_unique<Side>(listener.accept(20s));
            // ucmatose asks for one read each way and 5 transport retries.
            CHECK(side->conn.requested().responder_resources == 1);
            CHECK(side->conn.requested().initiator_depth == 1);
            CHECK(side->conn.requested().retry_count == 5);
            CHECK(side->conn.requested().rnr_retry_count == 0); // its conn_param is zeroed but for these
            QueuePair& qp = side->conn.create_qp(side->pd, side->cq, side->cq);
            for (int m = 0; m < messages; ++m) {
                REQUIRE_FALSE(qp.post_receive(side->mr.slice(static_cast<std::size_t>(m) * size, size),
                                              static_cast<std::uint64_t>(m)));
            }
            side->conn.accept();
            CHECK(side->conn.parameters().responder_resources == 1); // min(16, device, its initiator depth 1)
            CHECK(side->conn.parameters().initiator_depth == 1);     // min(16, device, its responder resources 1)
            // Our RNR retries are what the peer asked of us: ucmatose asks none.
            CHECK(side->conn.parameters().rnr_retry_count == 0);
            CHECK(side->conn.parameters().retry_count == 5); // the request's count, on both queue pairs
            sides.push_back(std::move(side));
        }
        // ucmatose's server role: send first, then take the replies, then disconnect.
        for (auto& side : sides) {
            for (int m = 0; m < messages; ++m) {
                REQUIRE_FALSE(side->conn.qp().post_send(side->mr.slice(32768, size), {.context = 1000}));
            }
        }
        for (auto& side : sides) {
            auto done = poll_for(side->cq, std::size_t{2} * messages);
            REQUIRE(done.size() == 2 * messages);
            int replies = 0;
            for (const auto& c : done) {
                CHECK(c.ok());
                if (c.context < 1000) {
                    CHECK(c.byte_length == size);
                    ++replies;
                }
            }
            CHECK(replies == messages);
        }
        long long slowest_ms = 0;
        for (auto& side : sides) {
            const auto start = Clock::now();
            side->conn.disconnect();
            auto event = side->conn.wait_event(5s);
            REQUIRE(event.has_value());
            CHECK(event->type == CmEventType::disconnected);
            slowest_ms = std::max<long long>(
                slowest_ms, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
        }
        CHECK(client.wait(20s) == 0);
        const std::string out = slurp(log_file("ucmatose_client"));
        CHECK_MESSAGE(out.find("return status 0") != std::string::npos, out);
        CHECK(rnr_naks() - naks_before == 0);
        MESSAGE("our disconnect -> our disconnected event: at most ", slowest_ms, " ms over ", connections,
                " connections");
    }

    TEST_CASE(
        "gpuverbs clients against ucmatose's server: three connections, the server's disconnects arrive as "
        "events through Asio") {
        const auto rig = *gpuverbs::test::rig_devices();
        constexpr int connections = 3;
        constexpr int messages = 10;
        constexpr std::uint32_t size = 100;
        const std::uint16_t port = tool_port(5);
        const auto naks_before = rnr_naks();
        ChildProcess server({"/usr/bin/ucmatose", "-b", rig.ip1, "-p", std::to_string(port), "-c",
                             std::to_string(connections), "-C", std::to_string(messages), "-S", std::to_string(size)},
                            ChildProcess::Output{log_file("ucmatose_server")});
        // Declared first, destroyed last: the connections' event waits live on it (Asio's rule for I/O objects).
        boost::asio::io_context io;
        std::vector<std::unique_ptr<Side>> sides;
        sides.reserve(connections);
        for (int i = 0; i < connections; ++i) sides.push_back(connect_to_tool(rig.ip1, port, rig.ip0, messages, size));
        for (auto& side : sides) {
            auto got = poll_for(side->cq, messages);
            REQUIRE(got.size() == messages);
            for (const auto& c : got) CHECK((c.ok() && c.byte_length == size));
        }
        std::vector<Clock::time_point> replied(connections);
        std::vector<long long> after_ms(connections, -1);
        int events = 0;
        for (int i = 0; i < connections; ++i) {
            auto& side = *sides[static_cast<std::size_t>(i)];
            for (int m = 0; m < messages; ++m) REQUIRE_FALSE(side.conn.qp().post_send(side.mr.slice(32768, size)));
            auto sent = poll_for(side.cq, messages);
            REQUIRE(sent.size() == messages);
            replied[static_cast<std::size_t>(i)] = Clock::now();
            side.conn.async_wait_event(boost::asio::bind_executor(io, [&, i](boost::system::error_code ec, CmEvent e) {
                CHECK_MESSAGE(!ec, ec.message());
                CHECK(e.type == CmEventType::disconnected);
                after_ms[static_cast<std::size_t>(i)] = std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            Clock::now() - replied[static_cast<std::size_t>(i)])
                                                            .count();
                ++events;
            }));
        }
        io.run_for(10s);
        CHECK(events == connections);
        for (long long ms : after_ms) {
            CHECK(ms >= 0);
            CHECK(ms < 3000); // docs/rdma-cm.md: the peer's disconnect arrives within milliseconds (bound: 3 s)
        }
        MESSAGE("last reply -> the server's disconnect as our event: ", after_ms[0], ", ", after_ms[1], ", ",
                after_ms[2], " ms");
        CHECK(server.wait(20s) == 0);
        const std::string out = slurp(log_file("ucmatose_server"));
        CHECK_MESSAGE(out.find("return status 0") != std::string::npos, out);
        CHECK(rnr_naks() - naks_before == 0);
    }
}

#else

// Built without librdmacm: the suite is counted as skipped, and says why.
TEST_SUITE("rdma_cm against rdmacm-utils" * doctest::skip(!gpuverbs::test::build_has::rdmacm)) {
    TEST_CASE("skipped: this build has no librdmacm (GPUVERBS_WITH_RDMACM=OFF or librdmacm-dev missing)") {}
}

#endif
