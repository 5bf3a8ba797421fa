// The liveness decisions (detail/async/liveness.hpp) and the bookkeeping they
// rely on (QpHealth, WorkQueueState::forget_outstanding), without a device.
// The rig tests the same code on Soft-RoCE (tests/integration/liveness_test.cpp).
#include "gpuverbs/detail/async/liveness.hpp"
#include "gpuverbs/async_types.hpp"
#include "gpuverbs/detail/verbs/qp_health.hpp"
#include "gpuverbs/detail/verbs/work_queue_state.hpp"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using namespace std::chrono_literals;
using gpuverbs::Opcode;
using gpuverbs::QueuePairFailure;
using namespace gpuverbs::detail;

namespace {
QpWatch watch_with(std::uint8_t timeout, std::uint8_t retry, std::uint8_t rnr) {
    QpWatch w;
    w.timers_known = true;
    w.timeout = timeout;
    w.retry_count = retry;
    w.rnr_retry = rnr;
    return w;
}
} // namespace

TEST_CASE("the transport's retry bound is (retry_count + 1) x 4.096 us x 2^timeout, and none for timeout 0") {
    CHECK(transport_retry_bound(14, 6) == std::chrono::nanoseconds(4096LL << 14) * 7); // ~470 ms: the default
    CHECK(transport_retry_bound(1, 0) == std::chrono::nanoseconds(8192));
    CHECK(transport_retry_bound(14, 9) == std::chrono::nanoseconds(4096LL << 14) * 8); // at most 7 retries
    CHECK_FALSE(transport_retry_bound(0, 3).has_value());
}

TEST_CASE(
    "a stall is judged after twice the retry bound plus the margin; a send waiting for the peer's receive with "
    "rnr_retry 7 after receiver_wait (never when it is zero)") {
    const QpWatch w = watch_with(14, 6, 7);
    const auto bound = *transport_retry_bound(14, 6);
    CHECK(stall_bound(w, Opcode::write, 500ms, 10s) == bound * 2 + 500ms);
    CHECK(stall_bound(w, Opcode::read, 0ms, 10s) == bound * 2);
    // rnr_retry 7: a request that needs the peer's receive waits receiver_wait (the library's bound), or for
    // ever when that is zero.
    CHECK(stall_bound(w, Opcode::send, 500ms, 10s) == std::chrono::nanoseconds(10s));
    CHECK(stall_bound(w, Opcode::send_with_imm, 500ms, 3s) == std::chrono::nanoseconds(3s));
    CHECK(stall_bound(w, Opcode::write_with_imm, 500ms, 10s) == std::chrono::nanoseconds(10s));
    CHECK_FALSE(stall_bound(w, Opcode::send, 500ms, 0s).has_value());
    CHECK(stall_bound(w, Opcode::write, 500ms, 0s) == bound * 2 + 500ms); // a write needs no receive
    CHECK(stall_bound(watch_with(14, 6, 6), Opcode::send, 500ms, 0s) ==
          bound * 2 + 500ms); // a finite RNR count: the transport's bound
    CHECK_FALSE(stall_bound(watch_with(0, 6, 6), Opcode::write, 500ms, 10s).has_value());
    CHECK(gpuverbs::AsyncOptions{}.receiver_wait == 10s); // docs/transfers.md states it (scripts/check-docs)
}

TEST_CASE("judge: a healthy queue pair that keeps completing is never declared failed") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight s;
    s.send_outstanding = 10;
    s.stall_after = 1s;
    for (int k = 0; k < 100; ++k) {
        s.send_retired = static_cast<std::uint64_t>(k); // progress on every tick
        CHECK(judge(w, s, t0 + k * 500ms, 250ms) == LivenessVerdict::healthy);
    }
}

TEST_CASE("judge: outstanding sends with no progress past the stall bound are declared stalled, not before") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight s;
    s.send_outstanding = 3;
    s.send_retired = 5;
    s.stall_after = 1s;
    CHECK(judge(w, s, t0, 250ms) == LivenessVerdict::healthy); // the first look starts the clock
    CHECK(judge(w, s, t0 + 999ms, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, s, t0 + 1001ms, 250ms) == LivenessVerdict::stalled);
    // An idle send queue is progress: the clock starts again.
    QpSight idle = s;
    idle.send_outstanding = 0;
    CHECK(judge(w, idle, t0 + 2s, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, s, t0 + 2500ms, 250ms) == LivenessVerdict::healthy);
    // No stall bound (an RNR wait that may last): never stalled.
    QpSight waiting = s;
    waiting.stall_after.reset();
    CHECK(judge(w, waiting, t0 + 1h, 250ms) == LivenessVerdict::healthy);
}

TEST_CASE("judge: the provider's error state and a port that is down with sends outstanding fail the queue pair") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight s;
    s.provider_error = true;
    CHECK(judge(w, s, t0, 250ms) == LivenessVerdict::provider_error);
    QpSight down;
    down.port_active = false;
    CHECK(judge(w, down, t0, 250ms) == LivenessVerdict::healthy); // only receives wait: the port may come back
    down.send_outstanding = 1;
    CHECK(judge(w, down, t0, 250ms) == LivenessVerdict::healthy); // one reading may catch a transition
    CHECK(judge(w, down, t0 + 50ms, 250ms) == LivenessVerdict::port_down);
}

TEST_CASE("judge: a port seen down once between two ACTIVE readings does not fail the queue pair") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight up;
    up.send_outstanding = 1;
    QpSight down = up;
    down.port_active = false;
    for (int k = 0; k < 10; ++k) {
        CHECK(judge(w, down, t0 + k * 100ms, 250ms) == LivenessVerdict::healthy);
        CHECK(judge(w, up, t0 + k * 100ms + 50ms, 250ms) == LivenessVerdict::healthy);
    }
    CHECK(judge(w, down, t0 + 2s, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, down, t0 + 2050ms, 250ms) == LivenessVerdict::port_down);
}

TEST_CASE(
    "judge: one sighting before an idle period and one after are not two in a row (a first look starts the "
    "count again)") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight down;
    down.send_outstanding = 1;
    down.port_active = false;
    QpSight unreadable;
    unreadable.send_outstanding = 1;
    unreadable.query_failed = true;
    CHECK(judge(w, down, t0, 250ms) == LivenessVerdict::healthy);
    // The watch stopped looking (idle); the next tick is a first look, its port down again.
    QpSight down_again = down;
    down_again.first_look = true;
    CHECK(judge(w, down_again, t0 + 5s, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, down, t0 + 5050ms, 250ms) == LivenessVerdict::port_down);
    // The same for a queue pair that could not be read.
    QpWatch v = watch_with(14, 6, 7);
    CHECK(judge(v, unreadable, t0, 250ms) == LivenessVerdict::healthy);
    QpSight unreadable_again = unreadable;
    unreadable_again.first_look = true;
    CHECK(judge(v, unreadable_again, t0 + 5s, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(v, unreadable, t0 + 5050ms, 250ms) == LivenessVerdict::provider_error);
}

TEST_CASE("judge: a queue pair whose state cannot be read twice in a row is failed, once is not") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight unreadable;
    unreadable.query_failed = true;
    unreadable.send_outstanding = 1;
    QpSight fine;
    fine.send_outstanding = 1;
    CHECK(judge(w, unreadable, t0, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, fine, t0 + 50ms, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, unreadable, t0 + 100ms, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, unreadable, t0 + 150ms, 250ms) == LivenessVerdict::provider_error);
}

TEST_CASE("judge: a queue pair the last tick did not look at starts its clock afresh (an idle period is no stall)") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight busy;
    busy.send_outstanding = 1;
    busy.send_retired = 7;
    busy.stall_after = 1s;
    CHECK(judge(w, busy, t0, 250ms) == LivenessVerdict::healthy);
    // 3 s unwatched (idle, its last completion not seen by a tick), then busy again with the same count retired.
    QpSight again = busy;
    again.first_look = true;
    CHECK(judge(w, again, t0 + 3s, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, busy, t0 + 3900ms, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(w, busy, t0 + 4001ms, 250ms) == LivenessVerdict::stalled); // and the bound still holds after it
    // Without the first look the same sequence is (wrongly) a stall: the test can fail.
    QpWatch stale = watch_with(14, 6, 7);
    CHECK(judge(stale, busy, t0, 250ms) == LivenessVerdict::healthy);
    CHECK(judge(stale, busy, t0 + 3s, 250ms) == LivenessVerdict::stalled);
}

TEST_CASE("judge: a requester sending new packets is progress without a completion; retransmissions are not") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight s;
    s.send_outstanding = 1; // one signaled request ends a long chain
    s.send_retired = 0;
    s.stall_after = 1s;
    std::uint32_t psn = 0xfffff0; // wraps past 2^24 on the way
    for (int k = 0; k < 100; ++k) {
        s.sq_psn = psn;
        CHECK(judge(w, s, t0 + k * 100ms, 250ms) == LivenessVerdict::healthy);
        psn = (psn + 3) & 0xffffffU;
    }
    // Retransmitting: the PSN steps back and climbs to where it was, never past it.
    const std::uint32_t furthest = (psn - 3) & 0xffffffU;
    const auto t1 = t0 + 100 * 100ms;
    for (int k = 0; k < 10; ++k) {
        s.sq_psn = (furthest - 2 + static_cast<std::uint32_t>(k % 3)) & 0xffffffU;
        CHECK(judge(w, s, t1 + k * 100ms, 250ms) == LivenessVerdict::healthy);
    }
    s.sq_psn = furthest;
    CHECK(judge(w, s, t1 + 1200ms, 250ms) == LivenessVerdict::stalled);
    CHECK(psn_after(5, 0xfffffe));
    CHECK_FALSE(psn_after(0xfffffe, 5));
    CHECK_FALSE(psn_after(9, 9));
    // Half the sequence space ahead is as far as "after" reaches; exactly half is ambiguous, so not after.
    CHECK(psn_after(0x7fffff, 0));
    CHECK_FALSE(psn_after(0x800000, 0));
}

TEST_CASE("judge: a failed queue pair gets the flush grace from when it was learned, then gpuverbs completes it") {
    QpWatch w = watch_with(14, 6, 7);
    const auto t0 = LivenessClock::now();
    QpSight s;
    s.known_failed = true;
    CHECK(judge(w, s, t0, 250ms) == LivenessVerdict::wait_for_flush);
    CHECK(judge(w, s, t0 + 249ms, 250ms) == LivenessVerdict::wait_for_flush);
    CHECK(judge(w, s, t0 + 250ms, 250ms) == LivenessVerdict::complete_by_library);
}

TEST_CASE("QpHealth: the first mark wins and says when and why; clear() makes it healthy again") {
    QpHealth h;
    CHECK_FALSE(h.failed());
    CHECK(h.fail(QueuePairFailure::Cause::port_down, 2));
    CHECK_FALSE(h.fail(QueuePairFailure::Cause::stalled, 0));
    CHECK(h.failed());
    CHECK(h.cause() == QueuePairFailure::Cause::port_down);
    CHECK(h.detail() == 2);
    CHECK(h.since() <= std::chrono::steady_clock::now());
    h.clear();
    CHECK_FALSE(h.failed());
    // Many threads marking at once: exactly one wins.
    std::atomic<int> wins{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&h, &wins, t] {
            if (h.fail(QueuePairFailure::Cause::completion_failed, t)) ++wins;
        });
    }
    for (auto& t : threads) t.join();
    CHECK(wins == 1);
    CHECK(h.failed());
}

TEST_CASE("forget_outstanding: every outstanding slot leads nowhere and a late completion retires nothing new") {
    WorkQueueState q(8);
    for (std::uint32_t i = 0; i < 5; ++i) q.record(i, 100 + i, Opcode::write);
    q.commit(5);
    (void)q.complete(1); // requests 0 and 1 finished
    CHECK(q.outstanding() == 3);
    CHECK(q.oldest_opcode() == Opcode::write);
    q.forget_outstanding();
    CHECK(q.outstanding() == 0);
    CHECK(q.has_room_for(8));
    // The provider flushes them after all: no context, and the count stays.
    for (std::uint32_t slot = 2; slot < 5; ++slot) {
        const WorkQueueState::Finished f = q.complete(slot);
        CHECK(f.context == 0);
        CHECK(q.outstanding() == 0);
    }
}
