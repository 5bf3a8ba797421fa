// Liveness on real Soft-RoCE: every operation and every transfer ends within
// the bound docs/transfers.md states, whether or not the provider completes
// it (rxe on kernel 6.1 never completes a receive posted on a queue pair
// already in the error state, and may leave a queue pair whose port went
// down in RTS with its requests outstanding). The decisions are unit-tested
// in tests/unit/liveness_test.cpp.
#include "gpuverbs/detail/async/liveness.hpp"
#include "gpuverbs/gpuverbs.hpp"
#include "rig.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"
#include "rig_rails.hpp"
#include "transfer_rig.hpp"

#include <boost/asio/io_context.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace gpuverbs;
using namespace std::chrono_literals;

namespace {

using test::mode_name;
using test::modes;
using test::Pair;
using test::run_until;
using test::Side;

/// The bound docs/transfers.md promises for an operation on a queue pair
/// that is already in error: two ticks (one to see it, one to end it) plus
/// the flush grace, with a second for the emulated CPU of the rig.
std::chrono::milliseconds error_state_bound(const AsyncOptions& m) {
    return 2 * m.liveness_tick + m.flush_grace + 1000ms;
}

const std::error_code in_error = errc::queue_pair_in_error;

} // namespace

TEST_SUITE("liveness on real RDMA" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "a post on a queue pair known to be in error is refused at once, naming why, in the synchronous "
        "forms too") {
        test::Pair p;
        CHECK_FALSE(p.a.qp.failure());
        REQUIRE_FALSE(p.a.qp.force_error());
        const std::optional<QueuePairFailure> f = p.a.qp.failure();
        REQUIRE(f);
        CHECK(f->cause == QueuePairFailure::Cause::moved_to_error);
        CHECK(f->status == in_error);
        CHECK_MESSAGE(f->describe().find("in the error state since") == 0, f->describe());
        CHECK(p.a.qp.post_write(p.a.mr.slice(0, 64), p.b.mr.remote()) == in_error);
        CHECK(p.a.qp.post_receive(p.a.mr.slice(0, 64)) == in_error);
        CHECK(p.a.qp.outstanding_sends() == 0);
        CHECK(p.a.qp.outstanding_receives() == 0);
        CHECK_MESSAGE(std::error_code(in_error).message().find("connect a new queue pair") != std::string::npos,
                      std::error_code(in_error).message());
        // Reset and connected again: healthy, and it moves data.
        PreparedQueuePair again = std::move(p.a.qp).reset();
        PreparedQueuePair peer = std::move(p.b.qp).reset();
        const Endpoint ea = again.endpoint(), eb = peer.endpoint();
        p.a.qp = std::move(again).connect(eb);
        p.b.qp = std::move(peer).connect(ea);
        CHECK_FALSE(p.a.qp.failure());
        CHECK_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 64), p.b.mr.remote()));
        CHECK(test::poll_for(p.a.cq, 1).size() == 1);
    }

    TEST_CASE(
        "after a request fails, every operation on either queue pair ends within the bound, in every "
        "completion mode: the receive rxe never flushes too") {
        for (const auto& mode : test::modes_and_polled) {
            CAPTURE(mode_name(mode));
            asio::io_context io(1);
            Pair p(io.get_executor(), mode);
            // A write with a key the peer never gave: both queue pairs go to ERROR (rxe NAKs it).
            RemoteMemory bad = p.b.mr.remote();
            bad.rkey ^= 0x00a5a500;
            std::optional<boost::system::error_code> wrote;
            p.a.qp.async_write(p.a.mr.slice(0, 4096), bad, 0,
                               [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
            run_until(
                io, [&] { return wrote.has_value(); }, 10s);
            REQUIRE(wrote.has_value());
            CHECK(*wrote);
            REQUIRE(p.a.qp.failure());
            CHECK(p.a.qp.failure()->cause == QueuePairFailure::Cause::completion_failed);
            // B's queue pair is in error in the provider; gpuverbs has seen nothing of it yet.
            CHECK_FALSE(p.b.qp.failure());

            // A receive on B: rxe takes it and never completes it. The watch
            // finds the error state and ends it within the bound.
            std::optional<boost::system::error_code> received;
            p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) { received = ec; });
            const auto took = run_until(
                io, [&] { return received.has_value(); }, 30s);
            REQUIRE(received.has_value());
            CHECK(*received == in_error);
            CHECK(took <= error_state_bound(mode));
            REQUIRE(p.b.qp.failure());
            CHECK(p.b.qp.failure()->cause == QueuePairFailure::Cause::provider_reports_error);
            MESSAGE(mode_name(mode) << ": the receive rxe never completes ended after " << took.count() << " ms (bound "
                                    << error_state_bound(mode).count() << " ms)");

            // Now known on both sides: every kind is refused at once.
            int ended = 0;
            std::vector<boost::system::error_code> results;
            std::vector<TransferPlan> plans;
            plans.reserve(2); // they live until the transfers end
            auto record = [&](boost::system::error_code ec, auto&&...) {
                ++ended;
                results.push_back(ec);
            };
            for (Side* s : {&p.a, &p.b}) {
                Side& peer = s == &p.a ? p.b : p.a;
                s->qp.async_write(s->mr.slice(0, 64), peer.mr.remote(), 0, record);
                s->qp.async_read(s->mr.slice(64, 64), peer.mr.remote(), 0, record);
                s->qp.async_send(s->mr.slice(128, 64), record);
                s->qp.async_receive(s->mr.slice(192, 64), record);
                std::vector<LocalBuffer> local{s->mr.slice(4096, 4096), s->mr.slice(16384, 4096)};
                std::vector<RemoteBlock> remote{{peer.mr.remote(), 8192, 4096}, {peer.mr.remote(), 0, 4096}};
                TransferPlan& plan = plans.emplace_back(TransferDirection::write, local, remote);
                async_transfer(s->qp, plan, TransferOptions{.notify = 5}, record);
            }
            const auto refused_in = run_until(
                io, [&] { return ended == 10; }, 30s);
            CHECK(ended == 10);
            for (const auto& ec : results) CHECK(ec == in_error);
            CHECK(refused_in <= error_state_bound(mode));
            (void)run_until(
                io, [] { return false; }, 100ms);
            CHECK(ended == 10); // once each
        }
    }

    TEST_CASE("a receive that was waiting when the peer's request failed ends within the bound") {
        for (const auto& mode : test::modes_and_polled) {
            CAPTURE(mode_name(mode));
            asio::io_context io(1);
            Pair p(io.get_executor(), mode);
            std::optional<boost::system::error_code> received;
            p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) { received = ec; });
            RemoteMemory bad = p.b.mr.remote();
            bad.rkey ^= 0x00a5a500;
            std::optional<boost::system::error_code> wrote;
            p.a.qp.async_write(p.a.mr.slice(0, 4096), bad, 0,
                               [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
            const auto took = run_until(
                io, [&] { return received.has_value() && wrote.has_value(); }, 30s);
            REQUIRE(received.has_value());
            // Flushed by the provider (posted before the error), or ended by gpuverbs: an error either way.
            CHECK(*received);
            CHECK(took <= error_state_bound(mode));
        }
    }

    TEST_CASE(
        "a rail whose link goes down mid-transfer: the transfer succeeds by failover, every byte and one "
        "notification, every run (GPUVERBS_LIVENESS_RUNS runs, default 2)") {
        const auto wire = test::second_wire();
        if (!wire) return;
        const char* runs_env = std::getenv("GPUVERBS_LIVENESS_RUNS"); // NOLINT(concurrency-mt-unsafe): tests only
        const int runs = runs_env != nullptr ? std::atoi(runs_env) : 2;
        // 16,384 scattered 4 KiB blocks (64 MiB), rail 1's link cut ~300 ms in (issue 33's report).
        constexpr std::size_t blocks = 16384, block = 4096;
        const test::Scatter scattered{blocks, block};
        using Wire = test::RailWire;
        std::vector<std::byte> m0(blocks * block), m1(2 * blocks * block);
        for (std::size_t i = 0; i < m0.size(); ++i) m0[i] = std::byte((i * 2654435761U >> 13) & 0xff);
        int succeeded = 0;
        for (int run = 0; run < runs; ++run) {
            CAPTURE(run);
            asio::io_context io(1);
            std::fill(m1.begin(), m1.end(), std::byte{0});
            Wire rail0("rxe0", "rxe1", io.get_executor(), m0, m1, 256);
            Wire rail1("rxe2", "rxe3", io.get_executor(), m0, m1, 256);
            std::vector<TransferRail> rails{TransferRail{&rail0.qp0, {}, {}}, test::second_rail(rail0, rail1)};
            const TransferPlan plan = scattered.plan(rail0.mr0, rail0.mr1.remote());
            TransferResult got;
            const TransferReport& report = got.report;
            const std::string& failed = got.failed_blocks;
            TransferOptions options;
            options.report_blocks = true;
            options.notify = 33;
            std::optional<std::uint32_t> notified;
            int notifications = 0;
            rail0.qp1.async_receive(rail0.mr1.slice(0, 0), [&](boost::system::error_code ec, Received got) {
                CHECK_FALSE(ec);
                ++notifications;
                notified = got.immediate;
            });
            int calls = 0;
            boost::system::error_code result;
            async_transfer(std::span<const TransferRail>(rails), plan, options,
                           [&](boost::system::error_code ec, TransferResult r) {
                               ++calls;
                               result = ec;
                               got = std::move(r);
                           });
            io.run_for(300ms);
            test::Heal up("rail-up");
            const bool struck = calls == 0 && rail1.qp0.outstanding_sends() > 0;
            REQUIRE(test::fault("rail-down") == 0);
            const auto took = run_until(
                io, [&] { return calls > 0 && notified.has_value(); }, 60s);
            CHECK(calls == 1);
            CHECK_MESSAGE(!result, result.message() << " (" << failed << ")");
            CHECK(notified == 33u);
            CHECK(report.landed == blocks);
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < blocks; ++k)
                wrong += std::memcmp(&m1[scattered.at(k)], &m0[k * block], block) != 0 ? 1 : 0;
            CHECK(wrong == 0);
            io.restart();
            io.run_for(100ms);
            CHECK(calls == 1);
            CHECK(notifications == 1);
            if (calls == 1 && !result && wrong == 0 && notified == 33u) ++succeeded;
            const std::string rail1_failure = report.rails.size() == 2 ? report.rails[1].failure : "";
            if (struck && report.rails.size() == 2 && report.rails[1].error) {
                // The library's words for what it saw, not the provider's for the flush that followed.
                CHECK_MESSAGE(report.rails[1].cause == "port_down", report.rails[1].cause << ": " << rail1_failure);
                CHECK_MESSAGE(rail1_failure.starts_with("its port "), rail1_failure);
            }
            MESSAGE("run " << run << (struck ? " (rail 1 busy when cut)" : " (rail 1 idle when cut)") << ": "
                           << (result ? result.message() : "success") << " " << took.count()
                           << " ms after the fault; rail 0 took over "
                           << (report.rails.size() == 2 ? report.rails[0].took_over : 0)
                           << " requests; the watch declared " << rail1.cq0.async_statistics().queue_pairs_failed
                           << " queue pair(s) failed and ended " << rail1.cq0.async_statistics().completed_by_library
                           << " operation(s) itself; rail 1: " << rail1_failure);
            CHECK(up.now() == 0);
        }
        MESSAGE("rail down mid-transfer: " << succeeded << " of " << runs << " runs succeeded by failover");
        CHECK(succeeded == runs);
    }

    TEST_CASE(
        "a write that the provider would retry forever (retry_count 7 on Soft-RoCE, the peer's queue pair "
        "gone) is declared stalled, moved to error and ends within the bound") {
        for (const auto& mode : {modes[0], modes[1], test::polled_mode}) {
            CAPTURE(mode_name(mode));
            asio::io_context io(1);
            Side a(test::rig_devices()->dev0, io.get_executor(), mode, 1 << 20, {});
            Side b(test::rig_devices()->dev1, io.get_executor(), mode, 1 << 20, {});
            ConnectOptions forever;
            forever.retry_count = 7; // rxe never counts 7 down (SOFTROCE.md): only gpuverbs can end this
            forever.timeout = 12;    // ~16.8 ms a try: the stall bound is 2 x 8 x 16.8 ms + the margin
            const Endpoint ea = a.prepared.endpoint(), eb = b.prepared.endpoint();
            (void)b.prepared.advertise(b.mr);
            a.qp = std::move(a.prepared).connect(eb, forever);
            b.qp = std::move(b.prepared).connect(ea, forever);
            const RemoteMemory target = b.mr.remote();
            b.qp = QueuePair(); // the peer is gone: nothing answers
            std::optional<boost::system::error_code> wrote;
            a.qp.async_write(a.mr.slice(0, 4096), target, 0,
                             [&](boost::system::error_code ec, std::size_t) { wrote = ec; });
            const auto took = run_until(
                io, [&] { return wrote.has_value(); }, 60s);
            REQUIRE(wrote.has_value());
            CHECK(*wrote);
            REQUIRE(a.qp.failure());
            CHECK(a.qp.failure()->cause == QueuePairFailure::Cause::stalled);
            const auto bound = *detail::transport_retry_bound(12, 7) * 2 + mode.stall_margin + 2 * mode.liveness_tick +
                               mode.flush_grace + 1000ms;
            CHECK(took <= bound);
            MESSAGE(mode_name(mode) << ": declared stalled; the write ended after " << took.count() << " ms with '"
                                    << wrote->message() << "' (bound "
                                    << std::chrono::duration_cast<std::chrono::milliseconds>(bound).count() << " ms); "
                                    << a.qp.failure()->describe());
        }
    }
}
