// Faults injected into the rig's real wire and devices (tests/softroce/setup-rxe
// FAULT): a link that goes down and comes back, a wire that drops everything,
// an SRQ running low, a peer writing outside what it was given. Each checks
// what the user sees (events, completion errors and their words) and that the
// documented recovery brings every byte back.
//
// The device-removal case is in the "faults: device removal" suite, which
// tests/integration/run-in-rig runs in a process of its own: librdmacm keeps
// every device open once any rdma_cm call has run, and a removal waits for
// that.
#include "rig_faults.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <sys/resource.h>

#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

using namespace gpuverbs;
using gpuverbs::test::fault;
using gpuverbs::test::faults_available;
using gpuverbs::test::fill_pattern;
using gpuverbs::test::has_pattern;
using gpuverbs::test::Heal;
using gpuverbs::test::poll_for;

namespace {

constexpr std::size_t chunk = 4096;
constexpr std::size_t chunks = 256;

/// Writes every chunk of a's memory into the same place in b's, `seed`
/// patterned, at most 16 in flight; true when all completed without error.
bool stream(test::Pair& p, std::uint32_t seed) {
    for (std::size_t i = 0; i < chunks; ++i)
        fill_pattern(std::span(p.a.memory).subspan(i * chunk, chunk), seed + static_cast<std::uint32_t>(i));
    std::size_t posted = 0;
    std::size_t completed = 0;
    bool ok = true;
    while (completed < chunks) {
        while (posted < chunks && posted - completed < 16) {
            if (p.a.qp.post_write(p.a.mr.slice(posted * chunk, chunk), p.b.mr.remote(), posted * chunk)) return false;
            ++posted;
        }
        auto got = poll_for(p.a.cq, 1, std::chrono::seconds(10));
        if (got.empty()) return false; // a hang: the caller's CHECK names it
        for (auto& c : got) ok = ok && c.ok();
        completed += got.size();
    }
    return ok;
}

bool verified(const test::Pair& p, std::uint32_t seed) {
    for (std::size_t i = 0; i < chunks; ++i) {
        if (!has_pattern(std::span(p.b.memory).subspan(i * chunk, chunk), seed + static_cast<std::uint32_t>(i)))
            return false;
    }
    return true;
}

/// The documented recovery: both QPs back to INIT with a new PSN, endpoints
/// exchanged again, connected again.
void reconnect(test::Pair& p, const ConnectOptions& options) {
    PreparedQueuePair pa = std::move(p.a.qp).reset();
    PreparedQueuePair pb = std::move(p.b.qp).reset();
    const Endpoint ea = pa.endpoint();
    const Endpoint eb = pb.endpoint();
    p.a.qp = std::move(pa).connect(eb, options);
    p.b.qp = std::move(pb).connect(ea, options);
}

/// Waits (sync) until an event of `type` arrives; the events seen on the way are kept.
std::optional<DeviceEvent> wait_event(DeviceEvents& events, DeviceEventType type, std::vector<DeviceEvent>& seen,
                                      std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        auto e = events.wait_for(std::chrono::milliseconds(100));
        if (!e) continue;
        seen.push_back(*e);
        if (e->type == type) return e;
    }
    return std::nullopt;
}

/// The first srq_limit_reached within `limit`; other events (a late GID or port
/// event from an earlier test) are not this test's business.
std::optional<DeviceEvent> srq_limit_event(DeviceEvents& events, std::chrono::milliseconds limit) {
    std::vector<DeviceEvent> seen;
    return wait_event(events, DeviceEventType::srq_limit_reached, seen, limit);
}

ConnectOptions fast_fail() {
    ConnectOptions o;
    o.timeout = 12;    // 4.096 us x 2^12 = 16.8 ms per try
    o.retry_count = 3; // 4 tries: a request fails after ~67 ms without an answer
    return o;
}

} // namespace

TEST_SUITE("faults" * doctest::skip(!faults_available())) {
    TEST_CASE(
        "link down: port_error events on both devices, every write ends, none hangs; link up: port_active, "
        "reconnect, every byte verified") {
        test::Pair p(chunks * chunk, {}, fast_fail());
        boost::asio::io_context io;
        DeviceEvents async_events(p.a.device, io.get_executor()); // side a: asynchronously
        DeviceEvents sync_events(p.b.device);                     // side b: synchronously
        std::vector<DeviceEvent> a_seen;
        std::vector<DeviceEvent> b_seen;
        int a_handlers = 0;
        std::function<void()> arm = [&] {
            async_events.async_wait([&](boost::system::error_code ec, DeviceEvent e) {
                ++a_handlers;
                if (ec) return;
                a_seen.push_back(std::move(e));
                arm();
            });
        };
        arm();
        auto a_saw = [&](DeviceEventType type) {
            return std::any_of(a_seen.begin(), a_seen.end(), [&](const DeviceEvent& e) { return e.type == type; });
        };
        auto run_until = [&](DeviceEventType type) {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (!a_saw(type) && std::chrono::steady_clock::now() < deadline)
                io.run_for(std::chrono::milliseconds(50));
            return a_saw(type);
        };

        REQUIRE(stream(p, 1));
        CHECK(verified(p, 1));

        Heal heal("link-up");
        REQUIRE(fault("link-down") == 0);
        // Writes posted after the link went down all end, with errors, within the bound.
        std::size_t posted = 0;
        for (; posted < 16; ++posted) {
            if (p.a.qp.post_write(p.a.mr.slice(0, chunk), p.b.mr.remote())) break;
        }
        REQUIRE(posted > 0);
        auto done = poll_for(p.a.cq, posted, std::chrono::seconds(10));
        CHECK(done.size() == posted);
        for (auto& c : done) {
            CHECK_FALSE(c.ok());
            MESSAGE("after link down: " << c.status.message());
        }
        CHECK(p.a.qp.state() == QpState::error);

        REQUIRE(run_until(DeviceEventType::port_error));
        auto down_b = wait_event(sync_events, DeviceEventType::port_error, b_seen);
        REQUIRE(down_b);
        CHECK(down_b->element == EventElement::port);
        CHECK(down_b->port == gpuverbs::test::rig_devices()->port);
        CHECK(down_b->device == p.b.device.name());
        MESSAGE(down_b->describe());
        CHECK(down_b->describe().find("link is down") != std::string::npos);

        REQUIRE(heal.now() == 0);
        REQUIRE(run_until(DeviceEventType::port_active));
        REQUIRE(wait_event(sync_events, DeviceEventType::port_active, b_seen));

        reconnect(p, fast_fail());
        CHECK(stream(p, 2));
        CHECK(verified(p, 2));

        // Ending the wait: the handler runs exactly once more, with operation_aborted.
        const int before = a_handlers;
        async_events.cancel();
        io.restart();
        io.run_for(std::chrono::seconds(2));
        CHECK(a_handlers == before + 1);
    }

    TEST_CASE(
        "a silent wire: requests fail with retry exceeded within (retry_count + 1) x timeout, saying the peer "
        "is unreachable; reconnect resumes the stream, every byte verified") {
        test::Pair p(chunks * chunk, {}, fast_fail());
        REQUIRE(stream(p, 3));
        Heal heal("drop-off");
        REQUIRE(fault("drop-on") == 0);
        const auto start = std::chrono::steady_clock::now();
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, chunk), p.b.mr.remote()));
        auto done = poll_for(p.a.cq, 1, std::chrono::seconds(20));
        const auto took =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        REQUIRE(done.size() == 1); // it ended: no hang
        CHECK(done[0].status == make_wc_error(IBV_WC_RETRY_EXC_ERR));
        CHECK(done[0].status.message().find("unreachable") != std::string::npos);
        MESSAGE("retry exceeded after " << took.count()
                                        << " ms (bound: 4 tries x 16.8 ms, plus Soft-RoCE's timer "
                                           "granularity); "
                                        << done[0].status.message());
        REQUIRE(heal.now() == 0);
        reconnect(p, fast_fail());
        CHECK(stream(p, 4));
        CHECK(verified(p, 4));
    }
}

TEST_SUITE("events" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("SRQ limit: the event names the SharedReceiveQueue when posted receives drop below the armed limit") {
        auto rig = gpuverbs::test::rig_devices();
        test::Side a(rig->dev0, 1 << 16, {});
        Device device = Device::open(rig->dev1);
        ProtectionDomain pd(device);
        CompletionQueue cq(device, 256);
        SharedReceiveQueue srq(pd, 64);
        SharedReceiveQueue other(pd, 64);
        std::vector<std::byte> memory(1 << 16);
        MemoryRegion mr(pd, memory, Access::local_write);
        PreparedQueuePair prepared(pd, cq, cq, srq);
        const Endpoint eb = prepared.endpoint();
        QueuePair b = std::move(prepared).connect(a.prepared.endpoint());
        a.qp = std::move(a.prepared).connect(eb);
        DeviceEvents events(device);

        for (std::uint32_t i = 0; i < 8; ++i) REQUIRE_FALSE(srq.post_receive(mr.slice(std::size_t{i} * 64, 64), i));
        // Arming at or above the capacity is refused, naming both numbers.
        std::error_code ec;
        srq.arm_limit(64, ec);
        CHECK(ec == errc::invalid_argument);
        CHECK_THROWS_WITH(srq.arm_limit(100),
                          doctest::Contains("an SRQ limit of 100 is not below the queue's capacity of"));
        srq.arm_limit(4);
        // 3 sends leave 5 posted: no event yet.
        for (int i = 0; i < 3; ++i) REQUIRE_FALSE(a.qp.post_send(a.mr.slice(0, 64)));
        CHECK(poll_for(a.cq, 3).size() == 3);
        CHECK(poll_for(cq, 3).size() == 3);
        CHECK_FALSE(srq_limit_event(events, std::chrono::milliseconds(300)));
        // 2 more leave 3 < 4.
        for (int i = 0; i < 2; ++i) REQUIRE_FALSE(a.qp.post_send(a.mr.slice(0, 64)));
        CHECK(poll_for(cq, 2).size() == 2);
        auto e = srq_limit_event(events, std::chrono::seconds(5));
        REQUIRE(e);
        CHECK(e->element == EventElement::shared_receive_queue);
        CHECK(e->concerns(srq));
        CHECK_FALSE(e->concerns(other));
        CHECK_FALSE(e->concerns(b));
        CHECK(e->object == srq.id());
        MESSAGE(e->describe());
        // One-shot: no second event without re-arming.
        REQUIRE_FALSE(a.qp.post_send(a.mr.slice(0, 64)));
        CHECK(poll_for(cq, 1).size() == 1);
        CHECK_FALSE(srq_limit_event(events, std::chrono::milliseconds(300)));
    }

    TEST_CASE("one DeviceEvents per device; a second is refused and the first keeps working after it") {
        auto rig = gpuverbs::test::rig_devices();
        Device device = Device::open(rig->dev0);
        DeviceEvents first(device);
        CHECK_THROWS_WITH(DeviceEvents{device}, doctest::Contains("already has a DeviceEvents reader"));
        std::error_code ec;
        (void)first.poll(ec);
        CHECK_FALSE(ec);
        first = DeviceEvents();
        DeviceEvents again(device); // released by the move-assignment
        CHECK(again);
    }

    TEST_CASE(
        "async_wait ends once with operation_aborted by a cancellation slot, by cancel() and by destruction; "
        "a new reader can start at once") {
        auto rig = gpuverbs::test::rig_devices();
        Device device = Device::open(rig->dev0);
        boost::asio::io_context io;
        auto events = std::make_unique<DeviceEvents>(device, io.get_executor());
        std::vector<boost::system::error_code> results;
        auto record = [&](boost::system::error_code ec, const DeviceEvent&) { results.push_back(ec); };

        boost::asio::cancellation_signal signal;
        events->async_wait(boost::asio::bind_cancellation_slot(signal.slot(), record));
        io.run_for(std::chrono::milliseconds(250)); // a few removal checks: nothing happens
        CHECK(results.empty());
        signal.emit(boost::asio::cancellation_type::terminal);
        io.run_for(std::chrono::milliseconds(250));
        REQUIRE(results.size() == 1);
        CHECK(results[0] == boost::asio::error::operation_aborted);

        events->async_wait(record);
        io.restart();
        io.run_for(std::chrono::milliseconds(150));
        events->cancel();
        io.run_for(std::chrono::milliseconds(250));
        REQUIRE(results.size() == 2);
        CHECK(results[1] == boost::asio::error::operation_aborted);

        events->async_wait(record);
        io.restart();
        io.run_for(std::chrono::milliseconds(150));
        events.reset();
        DeviceEvents next(device); // the reader is free the moment the old one is destroyed
        CHECK(next);
        io.restart();
        io.run_for(std::chrono::milliseconds(250));
        REQUIRE(results.size() == 3);
        CHECK(results[2] == boost::asio::error::operation_aborted);
        io.restart();
        io.run_for(std::chrono::milliseconds(250));
        CHECK(results.size() == 3); // and never again
    }

    TEST_CASE(
        "a peer writing outside the range it was given gets a remote access error; the memory beside it "
        "is untouched") {
        test::Pair p(1 << 16);
        // b lets a write to [4096, 8192) only: a region of its own.
        std::vector<std::byte> window(std::size_t{3} * 4096, std::byte{0x5a});
        MemoryRegion advertised(p.b.pd, std::span(window).subspan(4096, 4096),
                                Access::local_write | Access::remote_write);
        RemoteMemory given = advertised.remote();
        REQUIRE(given.length == 4096);
        DeviceEvents events(p.b.device);
        // A peer that lies about the length: the local check trusts its claim, the NIC's rkey check does not.
        RemoteMemory lie = given;
        lie.length = std::uint64_t{3} * 4096;
        fill_pattern(std::span(p.a.memory).subspan(0, 8192), 9);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 8192), lie));
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK(p.a.qp.state() == QpState::error);
        // Below the address: also refused.
        reconnect(p, ConnectOptions{});
        RemoteMemory before = given;
        before.address -= 4096;
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 4096), before));
        done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        for (std::size_t i = 0; i < window.size(); ++i) {
            if ((i < 4096 || i >= 8192) && window[i] != std::byte{0x5a}) {
                FAIL_CHECK("byte " << i << " outside the advertised range changed");
                break;
            }
        }
        // A QP-level event, where the device reports one, names the queue pair; Soft-RoCE reports
        // access errors only in the completion (docs/events.md).
        while (auto e = events.wait_for(std::chrono::milliseconds(300))) {
            MESSAGE(e->describe());
            if (e->element == EventElement::queue_pair) CHECK(e->concerns(p.b.qp));
        }
    }
}

TEST_SUITE("faults: device removal" * doctest::skip(!faults_available())) {
    TEST_CASE(
        "a device removed under traffic: device_removed (or device_fatal) is reported, every operation "
        "ends, and destroying its objects lets the removal finish") {
        auto rig = gpuverbs::test::rig_devices();
        auto a = std::make_unique<test::Side>(rig->dev0, chunks * chunk, QueuePairOptions{});
        auto b = std::make_unique<test::Side>(rig->dev1, chunks * chunk, QueuePairOptions{});
        const Endpoint ea = a->prepared.endpoint();
        const Endpoint eb = b->prepared.endpoint();
        (void)a->prepared.advertise(a->mr);
        (void)b->prepared.advertise(b->mr);
        a->qp = std::move(a->prepared).connect(eb, fast_fail());
        b->qp = std::move(b->prepared).connect(ea, fast_fail());
        boost::asio::io_context io;
        auto events = std::make_unique<DeviceEvents>(b->device, io.get_executor());
        Heal heal("add-device " + rig->dev1);

        // Traffic from a into the device that is about to go.
        std::size_t posted = 0;
        for (; posted < 64; ++posted) {
            REQUIRE_FALSE(a->qp.post_write(a->mr.slice(0, chunk), b->mr.remote(), (posted % chunks) * chunk));
        }
        // The removal blocks until this process lets go of the device: in the background.
        auto removal = std::async(std::launch::async, [&] { return fault("remove-device " + rig->dev1); });
        // However this test ends, let go of the device before anything waits for the removal
        // (the future's destructor does), or both would wait for each other.
        struct LetGo {
            std::unique_ptr<DeviceEvents>& events;
            std::unique_ptr<test::Side>& side;
            ~LetGo() {
                events.reset();
                side.reset();
            }
        } let_go{events, b};

        std::vector<DeviceEvent> seen;
        std::optional<DeviceEvent> lost;
        std::function<void()> arm = [&] {
            events->async_wait([&](boost::system::error_code ec, DeviceEvent e) {
                if (ec) return;
                seen.push_back(e);
                if (e.device_lost()) {
                    lost = std::move(e);
                } else {
                    arm();
                }
            });
        };
        arm();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!lost && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(50));
        REQUIRE_MESSAGE(lost, "no device_removed/device_fatal event within 10 s");
        MESSAGE(lost->describe());
        CHECK(lost->device == rig->dev1);

        // Nothing more comes from a lost device: a wait neither completes nor spins, and
        // cancel() ends it once.
        int after = 0;
        boost::system::error_code after_ec;
        events->async_wait([&](boost::system::error_code ec, const DeviceEvent&) {
            ++after;
            after_ec = ec;
        });
        rusage before{};
        ::getrusage(RUSAGE_SELF, &before);
        io.restart();
        io.run_for(std::chrono::milliseconds(500));
        rusage later{};
        ::getrusage(RUSAGE_SELF, &later);
        auto cpu_us = [](const rusage& r) {
            return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
        };
        CHECK(after == 0);
        CHECK(cpu_us(later) - cpu_us(before) < 250000); // 0.5 s of waiting, far less of CPU
        events->cancel();
        io.run_for(std::chrono::milliseconds(300));
        CHECK(after == 1);
        CHECK(after_ec == boost::asio::error::operation_aborted);

        // The recipe: destroy everything made from the device (the QP first: its requests end).
        events.reset();
        b.reset();
        REQUIRE_MESSAGE(removal.wait_for(std::chrono::seconds(20)) == std::future_status::ready,
                        "the removal did not finish after every object was destroyed (is librdmacm holding the "
                        "device? this suite must run in a process of its own)");
        CHECK(removal.get() == 0);
        auto names = Device::list();
        CHECK(std::none_of(names.begin(), names.end(), [&](const DeviceInfo& d) { return d.name == rig->dev1; }));

        // Every write a posted ends: delivered before the removal, or failed after it.
        auto done = poll_for(a->cq, posted, std::chrono::seconds(20));
        CHECK(done.size() == posted);
        auto more = poll_for(a->cq, 1, std::chrono::milliseconds(200));
        CHECK(more.empty()); // and no completion twice
        a.reset();

        // The rig gets its device back; a new one by the same name works.
        REQUIRE(heal.now() == 0);
        test::Pair p(chunks * chunk, {}, fast_fail());
        CHECK(stream(p, 5));
        CHECK(verified(p, 5));
    }
}
