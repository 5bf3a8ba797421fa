// rdma_cm in steps on the rig: private data both ways and in a refusal, the
// transport's limits, negotiated read depths, events after establishment,
// IPv6 / "::" / port 0 / names, the Asio forms, and peers that misbehave.
#include "cm_end.hpp"
#include "gpuverbs/async.hpp"
#include "gpuverbs/connections/rdma_cm.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstring>
#include <future>
#include <optional>

#include "build_has.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <rdma/rdma_cma.h>

using namespace gpuverbs;
using gpuverbs::test::poll_for;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using Side = gpuverbs::test::CmEnd;

/// A coroutine's completion that names what it threw (detached would swallow it).
auto report_exception(const char* who) {
    return [who](const std::exception_ptr& e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            FAIL_CHECK(who << " threw: " << x.what());
        }
    };
}

std::vector<std::byte> bytes_of(std::size_t n, std::uint32_t seed) {
    std::vector<std::byte> v(n);
    gpuverbs::test::fill_pattern(v, seed);
    return v;
}

bool starts_with(std::span<const std::byte> data, std::span<const std::byte> prefix) {
    return data.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), data.begin());
}

/// A raw librdmacm client (no gpuverbs): resolves, creates a QP, connects with
/// `param` and then does only what the test tells it to.
struct RawClient {
    rdma_event_channel* channel = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;

    RawClient(const std::string& to, std::uint16_t port, const std::string& from) {
        REQUIRE(channel != nullptr);
        REQUIRE(rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) == 0);
        sockaddr_in dst{}, src{};
        dst.sin_family = src.sin_family = AF_INET;
        dst.sin_port = htons(port);
        REQUIRE(inet_pton(AF_INET, to.c_str(), &dst.sin_addr) == 1);
        REQUIRE(inet_pton(AF_INET, from.c_str(), &src.sin_addr) == 1);
        REQUIRE(rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst), 5000) == 0);
        expect(RDMA_CM_EVENT_ADDR_RESOLVED);
        REQUIRE(rdma_resolve_route(id, 5000) == 0);
        expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
        pd = ibv_alloc_pd(id->verbs);
        cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
        REQUIRE((pd != nullptr && cq != nullptr));
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = init.cap.max_recv_wr = 8;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        REQUIRE(rdma_create_qp(id, pd, &init) == 0);
    }
    RawClient(const RawClient&) = delete;
    RawClient& operator=(const RawClient&) = delete;
    ~RawClient() {
        if (id != nullptr && id->qp != nullptr) rdma_destroy_qp(id);
        if (cq != nullptr) ibv_destroy_cq(cq);
        if (pd != nullptr) ibv_dealloc_pd(pd);
        if (id != nullptr) rdma_destroy_id(id);
        rdma_destroy_event_channel(channel);
    }
    void expect(rdma_cm_event_type wanted) const {
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(channel, &ev) == 0);
        CHECK_MESSAGE(ev->event == wanted, rdma_event_str(ev->event), " instead of ", rdma_event_str(wanted));
        rdma_ack_cm_event(ev);
    }
};

} // namespace

TEST_SUITE("rdma_cm in steps" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE(
        "private data both ways at the transport's limits, and each limit refused one byte over before anything "
        "is sent, leaving the connection usable") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        const auto hello = bytes_of(56, 1);
        const auto answer = bytes_of(196, 2);
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            CHECK(side->conn.private_data_limits().accept == 196);
            CHECK(starts_with(side->conn.peer_private_data(), hello));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            const auto too_much = bytes_of(197, 3);
            try {
                side->conn.accept({}, too_much);
                FAIL("accepted with 197 bytes of private data");
            } catch (const Error& e) {
                CHECK(e.code() == errc::invalid_argument);
                CHECK(std::string(e.what()) ==
                      "rdma_accept: private data of 197 bytes does not fit an accept: this transport carries at most "
                      "196 bytes in one; nothing was sent");
            }
            side->conn.accept({}, answer, 20s);
            return side;
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        CHECK(client.conn.private_data_limits().connect == 56);
        client.conn.create_qp(client.pd, client.cq, client.cq);
        std::error_code ec;
        Diagnostics diag;
        client.conn.connect({}, bytes_of(57, 4), 20s, ec, diag);
        CHECK(ec == errc::invalid_argument);
        CHECK(diag.message() ==
              "rdma_connect: private data of 57 bytes does not fit a connection request: this transport carries at "
              "most 56 bytes in one; nothing was sent");
        client.conn.connect({}, hello, 20s); // the same connection, after the refusal
        auto srv = server.get();
        CHECK(starts_with(client.conn.peer_private_data(), answer));
        CHECK(client.conn.connected());
        CHECK(srv->conn.connected());
    }

    TEST_CASE(
        "a refusal with a reason: the client's connect fails with connection_rejected and reads the server's "
        "words; an oversized refusal is refused first and the request stays") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        std::vector<std::byte> reason(148, std::byte{0});
        const std::string words = "busy: try port 7472";
        std::memcpy(reason.data(), words.data(), words.size());
        auto server = std::async(std::launch::async, [&] {
            CmConnection request = listener.accept(20s);
            std::error_code ec;
            std::move(request).reject(bytes_of(149, 5), ec);
            CHECK(ec == errc::invalid_argument);
            REQUIRE(request); // still a request: refuse it properly
            std::move(request).reject(reason);
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        try {
            client.conn.connect({}, {}, 20s);
            FAIL("connected although refused");
        } catch (const Error& e) {
            CHECK(e.code() == errc::connection_rejected);
            CHECK(e.code() == std::errc::connection_refused);
            CHECK(std::string(e.what()).find("REJECTED (status 28: consumer defined; the peer's program refused with "
                                             "148 bytes of private data)") != std::string::npos);
        }
        server.get();
        REQUIRE(client.conn.rejection().has_value());
        const CmRejection& r = *client.conn.rejection();
        CHECK(r.by_peer);
        CHECK(r.reason == 28);
        CHECK(r.reason_text == "consumer defined");
        REQUIRE(r.private_data.size() >= words.size());
        CHECK(std::string(reinterpret_cast<const char*>(r.private_data.data()), words.size()) == words);
        CHECK_FALSE(client.conn.connected());
    }

    TEST_CASE(
        "read depths: the minimum of what each side asked for and what the device allows, read back from the "
        "queue pair; a client asking for more than the device allows is clamped, and reads use the depth") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        CmOptions server_options;
        server_options.responder_resources = 4; // we answer at most 4 reads at once
        server_options.initiator_depth = 2;
        server_options.rnr_retry_count = 4; // the client retries 4 times when we are not ready
        server_options.retry_count = 2;     // not carried in an answer: the request's count rules
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            CHECK(side->conn.requested().initiator_depth == 128); // rxe's maximum, not the 255 asked
            CHECK(side->conn.requested().responder_resources == 128);
            side->conn.accept(server_options);
            return side;
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        CmOptions greedy;
        greedy.initiator_depth = 255; // more than rxe's 128: librdmacm alone would refuse with EINVAL
        greedy.responder_resources = 255;
        greedy.rnr_retry_count = 3; // the server retries 3 times when we are not ready
        greedy.retry_count = 5;
        greedy.min_rnr_timer = 14;
        client.conn.connect(greedy);
        auto srv = server.get();
        const CmParameters& s = srv->conn.parameters();
        const CmParameters& c = client.conn.parameters();
        CHECK(s.responder_resources == 4);
        CHECK(s.initiator_depth == 2);
        CHECK(s.retry_count == 5); // the request's
        CHECK(c.retry_count == 5);
        CHECK(c.initiator_depth == 4); // as the server answers
        CHECK(c.responder_resources == 2);
        // Each side's RNR retries are what the other asked for (IBA: the request carries the
        // server's, the answer the client's).
        CHECK(c.rnr_retry_count == 4);
        CHECK(s.rnr_retry_count == 3);
        CHECK(c.min_rnr_timer == 14);
        CHECK(s.min_rnr_timer == CmOptions{}.min_rnr_timer);
        CHECK(c.qp_num == srv->qp().qp_num());
        CHECK(s.qp_num == client.qp().qp_num());
        // 16 reads at once through a depth of 4: the device queues them, every byte arrives.
        gpuverbs::test::fill_pattern(std::span(srv->memory).first(std::size_t{16} * 1024), 9);
        for (std::uint64_t i = 0; i < 16; ++i) {
            REQUIRE_FALSE(
                client.qp().post_read(client.mr.slice(i * 1024, 1024), srv->mr.remote(), i * 1024, {.context = i}));
        }
        auto done = poll_for(client.cq, 16);
        REQUIRE(done.size() == 16);
        for (const auto& d : done) CHECK(d.ok());
        CHECK(
            std::equal(client.memory.begin(), client.memory.begin() + std::ptrdiff_t{16} * 1024, srv->memory.begin()));
    }

    TEST_CASE(
        "disconnect from either side completes every outstanding operation once, and the other side reads "
        "disconnected") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            for (std::uint64_t i = 0; i < 10; ++i)
                REQUIRE_FALSE(side->qp().post_receive(side->mr.slice(i * 64, 64), i));
            side->conn.accept();
            return side;
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        REQUIRE_FALSE(client.qp().post_receive(client.mr.slice(0, 64), 77));
        client.conn.connect();
        auto srv = server.get();
        // Three of ten messages, then the client leaves mid-exchange.
        for (std::uint64_t i = 0; i < 3; ++i)
            REQUIRE_FALSE(client.qp().post_send(client.mr.slice(4096, 32), {.context = i}));
        REQUIRE(poll_for(client.cq, 3).size() == 3);
        const auto left = Clock::now();
        client.conn.disconnect();
        client.conn.disconnect(); // idempotent
        // Our own outstanding receive completes once, flushed.
        auto ours = poll_for(client.cq, 1);
        REQUIRE(ours.size() == 1);
        CHECK(ours[0].context == 77);
        CHECK(ours[0].status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        // The server learns it as an event, and its seven open receives complete, once each.
        auto event = srv->conn.wait_event(5s);
        REQUIRE(event.has_value());
        const auto noticed = Clock::now() - left;
        CHECK(event->type == CmEventType::disconnected);
        CHECK(event->describe().find("disconnected (RDMA_CM_EVENT_DISCONNECTED") == 0);
        auto done = poll_for(srv->cq, 11, 3s); // asks for one more than there can be
        CHECK(done.size() == 10);
        int flushed = 0, received = 0;
        for (const auto& d : done) {
            if (d.ok()) {
                ++received;
                CHECK(d.byte_length == 32);
            } else {
                ++flushed;
                CHECK(d.status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
            }
        }
        CHECK(received == 3);
        CHECK(flushed == 7);
        CHECK_FALSE(srv->conn.connected());
        MESSAGE("the client's disconnect -> the server's disconnected event: ",
                std::chrono::duration_cast<std::chrono::microseconds>(noticed).count(), " us");
        // The client's side sees its own disconnect complete as an event too.
        auto own = client.conn.wait_event(5s);
        REQUIRE(own.has_value());
        CHECK(own->type == CmEventType::disconnected);
    }

    TEST_CASE(
        "a listener on \"::\" with port 0 takes IPv4 and IPv6 clients, and a client reaches it by IPv6 "
        "address and by host name") {
        const auto rig = *gpuverbs::test::rig_devices();
        const std::string ip6_0 = gpuverbs::test::env_or("GPUVERBS_TEST_IP6_0");
        const std::string ip6_1 = gpuverbs::test::env_or("GPUVERBS_TEST_IP6_1");
        REQUIRE_MESSAGE(!ip6_1.empty(), "the rig gives its devices IPv6 addresses (GPUVERBS_TEST_IP6_*)");
        CmListener listener("::", 0);
        REQUIRE(listener.port() != 0);
        CHECK(listener.address() == "::");
        const std::vector<std::pair<std::string, std::string>> clients{
            {rig.ip1, rig.ip0}, {ip6_1, ip6_0}, {"softroce-peer", rig.ip0}};
        for (const auto& client_and_source : clients) {
            const std::string& to = client_and_source.first;
            const std::string& from = client_and_source.second;
            CAPTURE(to);
            auto server = std::async(std::launch::async, [&] {
                auto side = std::make_unique<Side>(listener.accept(20s));
                side->conn.create_qp(side->pd, side->cq, side->cq);
                REQUIRE_FALSE(side->qp().post_receive(side->mr.slice(0, 64), 1));
                side->conn.accept();
                return side;
            });
            Side client(cm_resolve(to, listener.port(), 20s, from));
            client.conn.create_qp(client.pd, client.cq, client.cq);
            client.conn.connect();
            auto srv = server.get();
            CHECK(srv->conn.peer_address() == from);
            CHECK(srv->conn.device().name() == rig.dev1);
            gpuverbs::test::fill_pattern(std::span(client.memory).first(64), 11);
            REQUIRE_FALSE(client.qp().post_send(client.mr.slice(0, 64)));
            auto got = poll_for(srv->cq, 1);
            REQUIRE(got.size() == 1);
            CHECK(got[0].ok());
            CHECK(std::equal(client.memory.begin(), client.memory.begin() + 64, srv->memory.begin()));
        }
        std::error_code ec;
        Diagnostics diag;
        CHECK_FALSE(cm_resolve("no-such-host.invalid", 7000, 5s, "", ec, diag));
        CHECK(ec == errc::invalid_argument);
        CHECK(diag.message().find("'no-such-host.invalid' is not an IP address or a host name this machine can "
                                  "resolve") != std::string::npos);
        CHECK_FALSE(CmListener::create("fd00::99", 0, ec));
        CHECK(ec == std::errc::address_not_available);
    }

    TEST_CASE("the steps as coroutines: async_accept and async_connect with private data, then async_wait_event") {
        const auto rig = *gpuverbs::test::rig_devices();
        boost::asio::io_context io;
        CmListener listener(rig.ip1, 0);
        const auto hello = bytes_of(40, 21);
        bool server_done = false, client_done = false;
        std::unique_ptr<Side> srv;
        boost::asio::co_spawn(
            io,
            [&]() -> boost::asio::awaitable<void> {
                srv = std::make_unique<Side>(co_await listener.async_accept(20s, boost::asio::use_awaitable));
                CHECK(starts_with(srv->conn.peer_private_data(), hello));
                srv->conn.create_qp(srv->pd, srv->cq, srv->cq);
                REQUIRE_FALSE(srv->qp().post_receive(srv->mr.slice(0, 64), 1));
                co_await srv->conn.async_accept({}, {}, 20s, boost::asio::use_awaitable);
                CmEvent e = co_await srv->conn.async_wait_event(boost::asio::use_awaitable);
                CHECK(e.type == CmEventType::disconnected);
                server_done = true;
            },
            report_exception("server"));
        boost::asio::co_spawn(
            io,
            [&]() -> boost::asio::awaitable<void> {
                Side client(
                    co_await async_cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0, boost::asio::use_awaitable));
                client.conn.create_qp(client.pd, client.cq, client.cq);
                co_await client.conn.async_connect({}, hello, 20s, boost::asio::use_awaitable);
                CHECK(client.conn.connected());
                REQUIRE_FALSE(client.qp().post_send(client.mr.slice(0, 8)));
                CHECK(poll_for(client.cq, 1).size() == 1);
                client.conn.disconnect();
                client_done = true;
            },
            report_exception("client"));
        io.run_for(30s);
        CHECK(server_done);
        CHECK(client_done);
    }

    TEST_CASE("an asynchronous connect keeps working when its connection is moved while it runs") {
        const auto rig = *gpuverbs::test::rig_devices();
        boost::asio::io_context io;
        CmListener listener(rig.ip1, 0);
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            side->conn.accept();
            return side;
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        std::optional<boost::system::error_code> result;
        client.conn.async_connect({}, {}, 20s,
                                  boost::asio::bind_executor(io, [&](boost::system::error_code ec) { result = ec; }));
        CmConnection moved = std::move(client.conn);
        io.run_for(20s);
        REQUIRE(result.has_value());
        CHECK_MESSAGE(!*result, result->message());
        CHECK(moved.connected());
        CHECK(server.get()->conn.connected());
    }

    TEST_CASE(
        "a listener's async_accept: cancelled through its slot it ends with operation_aborted long before its "
        "timeout; the listener may be moved while one waits") {
        const auto rig = *gpuverbs::test::rig_devices();
        boost::asio::io_context io;
        auto first = std::make_unique<CmListener>(rig.ip1, 0);
        boost::asio::cancellation_signal signal;
        std::optional<boost::system::error_code> result;
        const auto start = Clock::now();
        first->async_accept(20s, boost::asio::bind_cancellation_slot(
                                     signal.slot(), boost::asio::bind_executor(
                                                        io, [&](boost::system::error_code ec, CmConnection conn) {
                                                            result = ec;
                                                            CHECK_FALSE(conn);
                                                        })));
        CmListener moved = std::move(*first); // the operation holds the listening id, not the object
        first.reset();
        boost::asio::steady_timer timer(io, 100ms);
        timer.async_wait([&](boost::system::error_code) { signal.emit(boost::asio::cancellation_type::terminal); });
        io.run_for(10s);
        REQUIRE(result.has_value());
        CHECK(*result == boost::asio::error::operation_aborted);
        CHECK(Clock::now() - start < 5s); // not the 20 s timeout

        // The moved listener still serves a connection.
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(moved.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            side->conn.accept();
            return side;
        });
        Side client(cm_resolve(rig.ip1, moved.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        client.conn.connect();
        CHECK(client.conn.connected());
        CHECK(server.get()->conn.connected());
    }

    TEST_CASE(
        "an event wait: a plain callback is refused for want of an executor, one before establishment with "
        "not_connected, and a cancelled one ends with operation_aborted") {
        const auto rig = *gpuverbs::test::rig_devices();
        boost::asio::io_context io;
        CmListener listener(rig.ip1, 0);
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            side->conn.accept();
            return side;
        });
        Side client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        std::error_code ec;
        CHECK_FALSE(client.conn.poll_event(ec));
        CHECK(ec == errc::not_connected);
        client.conn.create_qp(client.pd, client.cq, client.cq);
        client.conn.connect();
        auto srv = server.get();
        std::promise<boost::system::error_code> plain;
        client.conn.async_wait_event([&](boost::system::error_code e, CmEvent) { plain.set_value(e); });
        auto f = plain.get_future();
        REQUIRE(f.wait_for(5s) == std::future_status::ready);
        CHECK(f.get() == make_error_code(errc::no_executor));
        boost::system::error_code cancelled;
        int calls = 0;
        client.conn.async_wait_event(boost::asio::bind_executor(io, [&](boost::system::error_code e, CmEvent) {
            cancelled = e;
            ++calls;
        }));
        io.poll();
        client.conn.cancel_event_wait();
        io.run_for(2s);
        CHECK(calls == 1);
        CHECK(cancelled == boost::asio::error::operation_aborted);
        CHECK(client.conn.connected()); // cancelling a wait leaves the connection alone
    }

    TEST_CASE(
        "bad peers: one that connects and never completes the handshake, one that connects and sends nothing; "
        "each a clear outcome and the listener keeps serving") {
        const auto rig = *gpuverbs::test::rig_devices();
        CmListener listener(rig.ip1, 0);
        {
            // Sends its request, never reads the answer: no RTU, so no ESTABLISHED.
            RawClient silent(rig.ip1, listener.port(), rig.ip0);
            rdma_conn_param param{};
            param.responder_resources = param.initiator_depth = 1;
            param.retry_count = 1;
            REQUIRE(rdma_connect(silent.id, &param) == 0);
            Side side(listener.accept(20s));
            side.conn.create_qp(side.pd, side.cq, side.cq);
            const auto start = Clock::now();
            std::error_code ec;
            side.conn.accept({}, {}, 1s, ec);
            CHECK(ec == std::errc::timed_out);
            CHECK(Clock::now() - start < 5s);
            CHECK_FALSE(side.conn.connected());
        }
        {
            // Connects, then sends nothing: our receive waits until we decide, disconnect, and it completes once.
            auto server = std::async(std::launch::async, [&] {
                auto side = std::make_unique<Side>(listener.accept(20s));
                side->conn.create_qp(side->pd, side->cq, side->cq);
                REQUIRE_FALSE(side->qp().post_receive(side->mr.slice(0, 64), 5));
                side->conn.accept();
                return side;
            });
            Side mute(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
            mute.conn.create_qp(mute.pd, mute.cq, mute.cq);
            mute.conn.connect();
            auto srv = server.get();
            CHECK(poll_for(srv->cq, 1, 300ms).empty()); // nothing came
            srv->conn.disconnect();
            auto flushed = poll_for(srv->cq, 2, 2s);
            REQUIRE(flushed.size() == 1);
            CHECK(flushed[0].context == 5);
            CHECK(flushed[0].status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
            auto event = mute.conn.wait_event(5s);
            REQUIRE(event.has_value());
            CHECK(event->type == CmEventType::disconnected);
        }
        // And the listener still serves a well-behaved client.
        auto server = std::async(std::launch::async, [&] {
            auto side = std::make_unique<Side>(listener.accept(20s));
            side->conn.create_qp(side->pd, side->cq, side->cq);
            side->conn.accept();
            return side;
        });
        Side good(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        good.conn.create_qp(good.pd, good.cq, good.cq);
        good.conn.connect();
        CHECK(server.get()->conn.connected());
    }

    TEST_CASE("steps out of order name the right step") {
        const auto rig = *gpuverbs::test::rig_devices();
        Side client(cm_resolve(rig.ip1, 7995, 20s, rig.ip0));
        std::error_code ec;
        client.conn.connect({}, {}, 5s, ec);
        CHECK(ec == errc::invalid_argument); // no queue pair yet
        client.conn.accept({}, {}, 5s, ec);
        CHECK(ec == errc::invalid_argument); // accept is the server's step
        // The Diagnostics form carries the words the throwing form throws.
        Diagnostics diagnostics;
        client.conn.accept({}, {}, 5s, ec, diagnostics);
        CHECK(ec == errc::invalid_argument);
        try {
            client.conn.accept({}, {}, 5s);
            FAIL("a client accepted");
        } catch (const Error& e) {
            CHECK(diagnostics.message() == e.what());
            CHECK_FALSE(diagnostics.verb().empty());
        }
        CHECK_THROWS_WITH_AS((void)client.conn.qp(),
                             "CmConnection::qp: the connection has no queue pair yet: call create_qp first", Error);
        client.conn.create_qp(client.pd, client.cq, client.cq);
        CHECK_FALSE(client.conn.create_qp(client.pd, client.cq, client.cq, {}, ec));
        CHECK(ec == errc::invalid_argument);
        CmOptions bad;
        bad.rnr_retry_count = 8;
        client.conn.connect(bad, {}, 5s, ec);
        CHECK(ec == errc::invalid_argument);
    }
}

#else

// Built without librdmacm: the suite is counted as skipped, and says why.
TEST_SUITE("rdma_cm in steps" * doctest::skip(!gpuverbs::test::build_has::rdmacm)) {
    TEST_CASE("skipped: this build has no librdmacm (GPUVERBS_WITH_RDMACM=OFF or librdmacm-dev missing)") {}
}

#endif
