// Progress without a loop on rxe0 <-> rxe1: CQs made in CompletionMode::polled
// move only inside gpuverbs::progress(io), called from the test's own loop as
// a serving engine's step would; nobody runs the io_context. Transfers end
// (PendingTransfer::done), handlers run on the calling thread, the bounds
// hold, and an idle context does nothing. The cost of an idle call is
// benchmarks/progress-idle's.
#include "rig.hpp"
#include "rig_pair.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

const AsyncOptions polled{.mode = CompletionMode::polled, .single_threaded = true};

/// Calls progress() until `done` or `limit`; how long it took, and how many calls.
template <class Done>
std::pair<std::chrono::milliseconds, std::uint64_t> step_until(asio::io_context& io, Done&& done,
                                                               std::chrono::milliseconds limit) {
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t calls = 0;
    while (!done() && std::chrono::steady_clock::now() - t0 < limit) {
        (void)gpuverbs::progress(io);
        ++calls;
    }
    return {std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0), calls};
}

} // namespace

TEST_SUITE("progress without a loop on real RDMA" * doctest::skip(!test::rig_present())) {
    TEST_CASE("a transfer of 512 scattered blocks moves only inside progress(), and done() says when it ended") {
        asio::io_context io(1);
        test::Pair p(io.get_executor(), polled, 1 << 20, test::transfer_qp_options(), {},
                     Access::local_write | Access::remote_write | Access::remote_read);
        const test::Layout layout = test::layout(512, 1024, 7);
        std::vector<std::byte> src(layout.bytes), dst(layout.bytes * 2, std::byte{0xEE});
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = test::pattern(i, 9);
        MemoryRegion smr(p.a.pd, src, Access::local_write);
        MemoryRegion dmr(p.b.pd, dst, Access::local_write | Access::remote_write);
        const test::Lists lists = test::write_lists(layout, smr, dmr.remote());
        const TransferPlan plan(TransferDirection::write, lists.local, lists.remote, p.a.qp.capabilities());

        PendingTransfer t = start_transfer(p.a.qp, plan);
        REQUIRE(t);
        // Nothing completes while nobody calls progress(): the requests land,
        // but no completion is reaped and no handler runs.
        std::this_thread::sleep_for(200ms);
        CHECK_FALSE(t.done());
        CHECK(p.a.cq.async_statistics().completed == 0);

        const auto [took, calls] = step_until(
            io, [&] { return t.done(); }, 30s);
        REQUIRE(t.done());
        CHECK_MESSAGE(!t.error(), t.error().message());
        CHECK(t.result().bytes == layout.bytes);
        CHECK(test::wrong_bytes(layout, dst, 9) == 0);
        const AsyncStatistics s = p.a.cq.async_statistics();
        CHECK(s.wakeups == 0); // never woken by the channel: reaped by progress()
        CHECK(s.completed > 0);
        MESSAGE("512 blocks ended after " << calls << " calls to progress() in " << took.count() << " ms");

        // Idle again: progress() finds nothing and runs nothing.
        const AsyncStatistics before = p.a.cq.async_statistics();
        for (int i = 0; i < 1000; ++i) CHECK(gpuverbs::progress(io) == 0);
        const AsyncStatistics after = p.a.cq.async_statistics();
        CHECK(after.polls == before.polls); // an idle CQ is not even polled
    }

    TEST_CASE(
        "operations started on another thread while this one calls progress(): each completes once, its handler on "
        "the progress thread, every byte written (run under TSan too)") {
        asio::io_context io(1);
        // Not single_threaded: another thread starts operations (the rule: progress from one thread at a time).
        const AsyncOptions shared{.mode = CompletionMode::polled};
        test::Pair p(io.get_executor(), shared, 1 << 20);
        for (std::size_t i = 0; i < 64 * 64; ++i) p.a.memory[i] = test::pattern(i, 21);
        std::fill(p.b.memory.begin(), p.b.memory.begin() + 64 * 64, std::byte{0});
        constexpr int n = 400;
        const std::thread::id progress_thread = std::this_thread::get_id();
        std::atomic<int> completed{0}, failed{0}, elsewhere{0};
        std::thread starter([&] {
            for (int i = 0; i < n; ++i) {
                const std::size_t at = static_cast<std::size_t>(i % 64) * 64;
                p.a.qp.async_write(p.a.mr.slice(at, 64), p.b.mr.remote(), at,
                                   [&](boost::system::error_code ec, std::size_t bytes) {
                                       if (ec || bytes != 64) failed.fetch_add(1);
                                       if (std::this_thread::get_id() != progress_thread) elsewhere.fetch_add(1);
                                       completed.fetch_add(1);
                                   });
                if (i % 50 == 0) std::this_thread::yield();
            }
        });
        const auto [took, calls] = step_until(
            io, [&] { return completed.load() == n; }, 60s);
        starter.join();
        (void)step_until(
            io, [] { return false; }, 50ms); // a second completion of any would show here
        CHECK(completed.load() == n);
        CHECK(failed.load() == 0);
        CHECK(elsewhere.load() == 0);
        CHECK(std::equal(p.a.memory.begin(), p.a.memory.begin() + 64 * 64, p.b.memory.begin()));
        MESSAGE(n << " writes started on another thread completed in " << took.count() << " ms over " << calls
                  << " progress() calls");
    }

    TEST_CASE("a handler runs inside progress(), on the thread that called it; a deadline ends a transfer too") {
        asio::io_context io(1);
        test::Pair p(io.get_executor(), polled);
        std::optional<std::thread::id> ran_on;
        std::optional<Received> received;
        p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received r) {
            CHECK_FALSE(ec);
            ran_on = std::this_thread::get_id();
            received = r;
        });
        std::optional<boost::system::error_code> sent;
        p.a.qp.async_send_with_imm(p.a.mr.slice(0, 64), 77,
                                   [&](boost::system::error_code ec, std::size_t) { sent = ec; });
        (void)step_until(
            io, [&] { return received && sent; }, 30s);
        REQUIRE(received);
        REQUIRE(sent);
        CHECK_FALSE(*sent);
        CHECK(received->immediate == 77u);
        CHECK(ran_on == std::this_thread::get_id());

        // A deadline already passed: the transfer posts nothing and ends with
        // timed_out inside progress() (a refusal is posted to io_context, which progress() polls).
        std::vector<LocalBuffer> mine = {p.a.mr.slice(0, 4096)};
        std::vector<RemoteBlock> theirs = {{p.b.mr.remote(), 0, 4096}};
        const TransferPlan plan(TransferDirection::write, mine, theirs, p.a.qp.capabilities());
        PendingTransfer t =
            start_transfer(p.a.qp, plan, TransferOptions{.deadline = std::chrono::steady_clock::now() - 1ms});
        (void)step_until(
            io, [&] { return t.done(); }, 10s);
        REQUIRE(t.done());
        CHECK(t.error() == std::errc::timed_out);
        CHECK(t.result().bytes == 0);
        CHECK(t.result().failed_blocks == "the deadline had passed when the transfer started (nothing was posted)");
        CHECK(p.a.qp.outstanding_sends() == 0);
    }
}
