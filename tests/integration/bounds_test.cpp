// Bounds one step from where the other suites look (issue 47): a queue pair
// that was idle longer than the stall bound and then sends on a slow wire, a
// request far longer than the stall bound on a slow wire, a notification the
// peer never takes (deadline, cancellation, notification_timeout; RNR retried
// for ever), a send the peer never posts a receive for (receiver_wait),
// timeouts that are negative or larger than an int of milliseconds. Each ends within its documented bound, or succeeds.
// GPUVERBS_BOUNDS_RUNS=N repeats the fault cases (the 20-in-a-row check).
#include "gpuverbs/gpuverbs.hpp"
#include "rig.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace gpuverbs;
using namespace std::chrono_literals;

namespace {

using test::mode_name;
using test::run_until;
using test::Side;

int runs() {
    const char* n = std::getenv("GPUVERBS_BOUNDS_RUNS"); // NOLINT(concurrency-mt-unsafe): read before any thread
    return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 1;
}

/// Two sides connected with `options` (retry counts), b advertising its memory to a.
struct Connected {
    Side a, b;
    Connected(asio::io_context& io, const AsyncOptions& mode, std::size_t bytes, const ConnectOptions& options)
        : a(test::rig_devices()->dev0, io.get_executor(), mode, bytes, {}),
          b(test::rig_devices()->dev1, io.get_executor(), mode, bytes, {}) {
        const Endpoint ea = a.prepared.endpoint(), eb = b.prepared.endpoint();
        (void)a.prepared.advertise(a.mr);
        (void)b.prepared.advertise(b.mr);
        a.qp = std::move(a.prepared).connect(eb, options);
        b.qp = std::move(b.prepared).connect(ea, options);
    }
};

/// The flush grace and two ticks after the moment the library acts, with a
/// second for the rig's emulated CPU.
std::chrono::milliseconds after_acting(const AsyncOptions& m) {
    return 2 * m.liveness_tick + m.flush_grace + 1000ms;
}

/// retry_count 7: Soft-RoCE retries for ever, so only gpuverbs' watch can end a stall.
ConnectOptions retried_for_ever() {
    ConnectOptions o;
    o.retry_count = 7;
    return o;
}

/// The control beside a case that must succeed: the same queue pair, its wire
/// now dropping everything, is declared stalled within the stall bound (so the
/// watch was there, and the success was not the watch doing nothing).
void check_the_watch_still_ends_a_stall(asio::io_context& io, Side& a, Side& b, const AsyncOptions& mode) {
    REQUIRE(test::fault("wire-slow loss 100%") == 0);
    std::optional<boost::system::error_code> wrote;
    a.qp.async_write(a.mr.slice(0, 64), b.mr.remote(), 0,
                     [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
    const auto took = run_until(
        io, [&] { return wrote.has_value(); }, 30s);
    REQUIRE_MESSAGE(wrote.has_value(), "a write into a dropping wire did not end in 30 s");
    // The provider's flush once gpuverbs moved it to error, or gpuverbs' own code after the flush grace.
    CHECK_MESSAGE((*wrote == errc::queue_pair_stalled || *wrote == make_wc_error(IBV_WC_WR_FLUSH_ERR)),
                  wrote->message());
    REQUIRE(a.qp.failure());
    CHECK(a.qp.failure()->cause == QueuePairFailure::Cause::stalled);
    // The stall bound with the defaults (timeout 14, retry 7: 2 x 8 x 67 ms + 0.5 s), two ticks, the grace.
    CHECK(took <= std::chrono::milliseconds(2 * 8 * 68 + 500) + after_acting(mode));
    MESSAGE(mode_name(mode) << ": the control (everything dropped) was declared stalled after " << took.count()
                            << " ms");
}

} // namespace

TEST_SUITE("bounds on real RDMA" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "a queue pair idle for longer than the stall bound, then writing over a wire slowed by 300 ms, succeeds "
        "(the watch does not take the idle period for a stall)") {
        REQUIRE(test::faults_available());
        for (int run = 0; run < runs(); ++run) {
            for (const auto& mode : {test::modes[0], test::modes[1], test::polled_mode}) {
                CAPTURE(run);
                CAPTURE(mode_name(mode));
                asio::io_context io(1);
                Connected c(io, mode, 1 << 20, retried_for_ever());
                // Request/response: a's receive stays outstanding after its write
                // completed, so a tick sees a's send queue idle; then b answers.
                std::optional<boost::system::error_code> wrote, answered, received;
                c.a.qp.async_receive(c.a.mr.slice(0, 64),
                                     [&](boost::system::error_code ec, Received) { received = ec; });
                c.a.qp.async_write(c.a.mr.slice(0, 4096), c.b.mr.remote(), 0,
                                   [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
                (void)run_until(
                    io, [&] { return wrote.has_value(); }, 10s);
                REQUIRE(wrote.has_value());
                REQUIRE_FALSE(*wrote);
                (void)run_until(
                    io, [] { return false; }, 3 * mode.liveness_tick); // ticks that see a's send queue idle
                c.b.qp.async_send(c.b.mr.slice(0, 64),
                                  [&](boost::system::error_code ec, std::size_t) { answered = ec; });
                (void)run_until(
                    io, [&] { return answered.has_value() && received.has_value(); }, 10s);
                REQUIRE(received.has_value());
                REQUIRE_FALSE(*received);
                // Idle for longer than the stall bound (1.44 s with the defaults).
                std::this_thread::sleep_for(2500ms);
                REQUIRE(test::fault("wire-slow delay 300ms") == 0);
                test::Heal fast("wire-fast");
                wrote.reset();
                c.a.qp.async_write(c.a.mr.slice(0, 4096), c.b.mr.remote(), 4096,
                                   [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
                const auto took = run_until(
                    io, [&] { return wrote.has_value(); }, 20s);
                REQUIRE(wrote.has_value());
                CHECK_MESSAGE(!*wrote, wrote->message());
                CHECK_FALSE(c.a.qp.failure());
                MESSAGE(mode_name(mode) << ": after 2.5 s idle, a write over the 300 ms wire took " << took.count()
                                        << " ms: " << (*wrote ? wrote->message() : std::string("success")));
                check_the_watch_still_ends_a_stall(io, c.a, c.b, mode);
            }
        }
    }

    TEST_CASE(
        "one 48 MiB write over a wire slowed to 100 Mbit/s (its one completion ~4 s away, past the stall bound) "
        "succeeds: the requester's new packets are progress") {
        REQUIRE(test::faults_available());
        for (int run = 0; run < runs(); ++run) {
            CAPTURE(run);
            asio::io_context io(1);
            const AsyncOptions mode = test::modes[run % 2];
            Connected c(io, mode, std::size_t{48} << 20, retried_for_ever());
            test::fill_pattern(c.a.memory, 47);
            REQUIRE(test::fault("wire-slow rate 100mbit") == 0);
            test::Heal fast("wire-fast");
            std::optional<boost::system::error_code> wrote;
            c.a.qp.async_write(c.a.mr.slice(0, c.a.memory.size()), c.b.mr.remote(), 0,
                               [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
            const auto took = run_until(
                io, [&] { return wrote.has_value(); }, 120s);
            REQUIRE(wrote.has_value());
            CHECK_MESSAGE(!*wrote, wrote->message());
            CHECK_FALSE(c.a.qp.failure());
            CHECK(test::has_pattern(c.b.memory, 47));
            MESSAGE("48 MiB in one request at 100 Mbit/s took " << took.count() << " ms (stall bound ~1440 ms)");
            CHECK(took > 1500ms); // else the wire was not slow and the case proves nothing
            check_the_watch_still_ends_a_stall(io, c.a, c.b, mode);
        }
    }

    TEST_CASE(
        "a transfer's notification the peer never takes (no receive posted, rnr_retry_count 7: retried for ever) "
        "ends at the deadline, at a cancellation, or at notification_timeout, never with success") {
        ConnectOptions forever;
        forever.rnr_retry_count = 7; // the specification's "for ever"; rxe counts it down, hardware does not
        forever.retry_count = 7;
        enum class How { deadline, cancel, notification_timeout };
        for (int run = 0; run < runs(); ++run) {
            for (How how : {How::deadline, How::cancel, How::notification_timeout}) {
                CAPTURE(run);
                CAPTURE(static_cast<int>(how));
                const AsyncOptions mode = test::modes[run % 2];
                asio::io_context io(1);
                Connected c(io, mode, 1 << 20, forever);
                std::vector<LocalBuffer> local{c.a.mr.slice(0, 4096), c.a.mr.slice(8192, 4096)};
                std::vector<RemoteBlock> remote{{c.b.mr.remote(), 0, 4096}, {c.b.mr.remote(), 4096, 4096}};
                TransferPlan plan(TransferDirection::write, local, remote);
                TransferOptions options{.notify = 42};
                options.notification_timeout = 0ms; // only the case's own bound
                if (how == How::deadline) options.deadline = std::chrono::steady_clock::now() + 1s;
                if (how == How::notification_timeout) options.notification_timeout = 1s;
                std::optional<boost::system::error_code> ended;
                TransferResult result;
                asio::cancellation_signal cancel;
                const auto t0 = std::chrono::steady_clock::now();
                async_transfer(c.a.qp, plan, options,
                               asio::bind_cancellation_slot(cancel.slot(), [&](auto ec, TransferResult r) {
                                   ended = ec;
                                   result = std::move(r);
                               }));
                asio::steady_timer at(io, 1s);
                if (how == How::cancel) {
                    at.async_wait([&](boost::system::error_code) { cancel.emit(asio::cancellation_type::terminal); });
                }
                (void)run_until(
                    io, [&] { return ended.has_value(); }, 1s + after_acting(mode) + 1000ms);
                const auto took =
                    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
                REQUIRE_MESSAGE(ended.has_value(), "still running after " << took.count() << " ms");
                if (how == How::cancel) {
                    CHECK(*ended == asio::error::operation_aborted);
                } else {
                    CHECK(*ended == std::errc::timed_out);
                }
                CHECK_MESSAGE(result.failed_blocks.find("before the peer took the notification") != std::string::npos,
                              result.failed_blocks);
                if (how == How::notification_timeout)
                    CHECK_MESSAGE(result.failed_blocks.find("notification_timeout (1000 ms)") != std::string::npos,
                                  result.failed_blocks);
                CHECK(result.bytes == 8192); // every block landed: only the notification did not
                REQUIRE(c.a.qp.failure());
                CHECK(c.a.qp.failure()->cause == QueuePairFailure::Cause::notification_not_taken);
                CHECK(took <= 1s + after_acting(mode));
                MESSAGE(mode_name(mode) << ", case " << static_cast<int>(how) << ": ended after " << took.count()
                                        << " ms: " << ended->message() << ": " << result.failed_blocks);
                // The peer posting a receive now changes nothing: the transfer ended once.
                c.b.qp.async_receive(c.b.mr.slice(0, 64), [](boost::system::error_code, Received) {});
                (void)run_until(
                    io, [] { return false; }, 200ms);
            }
        }
    }

    TEST_CASE(
        "a send the peer never posts a receive for (rnr_retry_count 7, the default: retried for as long as the peer "
        "takes) fails its queue pair as stalled after AsyncOptions::receiver_wait; with receiver_wait 0 it waits, and "
        "a receive posted late completes it") {
        REQUIRE(ConnectOptions{}.rnr_retry_count == 7); // the default this case is about
        ConnectOptions forever;
        forever.retry_count = 7; // Soft-RoCE then retries RNR for ever too (it counts RNR against retry_count)
        for (int run = 0; run < runs(); ++run) {
            for (const auto& base : {test::modes[0], test::modes[1]}) {
                CAPTURE(run);
                CAPTURE(mode_name(base));
                AsyncOptions mode = base;
                mode.receiver_wait = 1500ms;
                asio::io_context io(1);
                Connected c(io, mode, 1 << 16, forever);
                std::optional<boost::system::error_code> sent;
                c.a.qp.async_send(c.a.mr.slice(0, 64), [&](boost::system::error_code ec, std::size_t) { sent = ec; });
                const auto took = run_until(
                    io, [&] { return sent.has_value(); }, 30s);
                REQUIRE_MESSAGE(sent.has_value(), "a send with no receive at the peer did not end in 30 s");
                CHECK_MESSAGE((*sent == errc::queue_pair_stalled || *sent == make_wc_error(IBV_WC_WR_FLUSH_ERR)),
                              sent->message());
                REQUIRE(c.a.qp.failure());
                CHECK(c.a.qp.failure()->cause == QueuePairFailure::Cause::stalled);
                CHECK(took >= 1400ms); // not before receiver_wait (less a tick's rounding)
                CHECK(took <= mode.receiver_wait + after_acting(mode));
                MESSAGE(mode_name(mode) << ": a send nobody posted a receive for ended after " << took.count()
                                        << " ms (receiver_wait 1500 ms): " << sent->message());
            }
        }
        // receiver_wait 0: the wait is the application's; a receive posted after 3 s completes the send.
        AsyncOptions patient = test::modes[0];
        patient.receiver_wait = 0ms;
        asio::io_context io(1);
        Connected c(io, patient, 1 << 16, forever);
        std::optional<boost::system::error_code> sent, received;
        c.a.qp.async_send(c.a.mr.slice(0, 64), [&](boost::system::error_code ec, std::size_t) { sent = ec; });
        (void)run_until(
            io, [&] { return sent.has_value(); }, 3s);
        CHECK_FALSE(sent.has_value());
        c.b.qp.async_receive(c.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) { received = ec; });
        (void)run_until(
            io, [&] { return sent.has_value() && received.has_value(); }, 10s);
        REQUIRE(sent.has_value());
        CHECK_MESSAGE(!*sent, sent->message());
        CHECK(received.has_value());
        CHECK_FALSE(c.a.qp.failure());
    }

    TEST_CASE(
        "CompletionQueue::wait: a negative timeout is refused at once, and one longer than an int of milliseconds "
        "waits (it neither waits for ever nor wraps to a short wait)") {
        Side b(test::rig_devices()->dev1, 1 << 16);
        Device dev = Device::open(test::rig_devices()->dev0);
        ProtectionDomain pd(dev);
        CompletionChannel ch(dev);
        CompletionQueue cq(dev, 64, ch);
        std::vector<std::byte> memory(1 << 16);
        MemoryRegion mr(pd, memory, access_all);
        PreparedQueuePair prepared(pd, cq, cq, test::test_qp_options());
        const Endpoint ea = prepared.endpoint(), eb = b.prepared.endpoint();
        (void)b.prepared.advertise(b.mr);
        QueuePair qa = std::move(prepared).connect(eb);
        b.qp = std::move(b.prepared).connect(ea);

        for (const std::chrono::milliseconds bad : {-1ms, -5000ms, std::chrono::milliseconds::min()}) {
            std::error_code ec;
            const auto t0 = std::chrono::steady_clock::now();
            CHECK_FALSE(cq.wait(bad, ec));
            CHECK(ec == errc::invalid_argument);
            CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
            CHECK_THROWS_WITH_AS((void)cq.wait(bad), doctest::Contains("the timeout is negative"), Error);
        }
        for (const std::chrono::milliseconds huge :
             {std::chrono::milliseconds(std::int64_t{1} << 31),
              std::chrono::milliseconds((std::int64_t{1} << 32) + 100), std::chrono::milliseconds::max()}) {
            REQUIRE_FALSE(cq.request_notify());
            std::thread later([&] {
                std::this_thread::sleep_for(400ms);
                (void)qa.post_write(mr.slice(0, 64), b.mr.remote(), 0);
            });
            const auto t0 = std::chrono::steady_clock::now();
            std::error_code ec;
            const bool got = cq.wait(huge, ec);
            const auto took = std::chrono::steady_clock::now() - t0;
            later.join();
            CHECK_FALSE(ec);
            CHECK(got); // woken by the completion, not by a wrapped timeout
            CHECK(took >= 350ms);
            REQUIRE(test::poll_for(cq, 1).size() == 1);
        }
        // 0 looks once without waiting.
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_FALSE(cq.wait(0ms));
        CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
    }
}
