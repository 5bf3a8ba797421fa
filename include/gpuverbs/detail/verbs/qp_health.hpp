// What gpuverbs knows of a queue pair's state, from what it has seen itself:
// a failed completion, a move to the error state (by the user or by
// gpuverbs), the provider reporting the error state, the port going down, or
// requests that made no progress for longer than the transport's retry bound.
//
// Why: a provider does not always deliver the completions that tell of an
// error. Soft-RoCE on kernel 6.1 never completes a receive posted on a queue
// pair already in the error state, and a queue pair whose port went down may
// stay RTS with its requests outstanding for minutes. Posting on a queue pair
// known to be in error is refused at once (errc::queue_pair_in_error), and
// the asynchronous engine's watch (async_driver.hpp) completes what the
// provider does not (liveness.hpp decides when).
//
// Threads: any thread may read it and mark it failed (the first mark wins);
// it is cleared only when the queue pair goes back to RESET.
#pragma once

#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gpuverbs::detail {

class QpHealth {
public:
    using Cause = QueuePairFailure::Cause;

    /// Whether the queue pair is known to be in the error state. One load: the posting path reads it.
    [[nodiscard]] bool failed() const noexcept { return state_.load(std::memory_order_acquire) == known; }

    /// Marks it failed for `cause` (`detail`: the work completion's status, or the port number). The first
    /// mark wins; true when this one did.
    bool fail(Cause cause, int detail) noexcept {
        std::uint8_t expected = healthy;
        if (!state_.compare_exchange_strong(expected, marking, std::memory_order_acq_rel)) return false;
        cause_ = cause;
        detail_ = detail;
        since_ = std::chrono::steady_clock::now();
        state_.store(known, std::memory_order_release);
        return true;
    }
    /// Back to health: the queue pair went back to RESET (nothing is outstanding then).
    void clear() noexcept { state_.store(healthy, std::memory_order_release); }

    /// What is known, once failed() (meaningless before).
    [[nodiscard]] Cause cause() const noexcept { return cause_; }
    [[nodiscard]] int detail() const noexcept { return detail_; }
    [[nodiscard]] std::chrono::steady_clock::time_point since() const noexcept { return since_; }

private:
    static constexpr std::uint8_t healthy = 0;
    static constexpr std::uint8_t marking = 1; ///< a mark is being written
    static constexpr std::uint8_t known = 2;
    std::atomic<std::uint8_t> state_{healthy};
    Cause cause_ = Cause::completion_failed;
    int detail_ = 0;
    std::chrono::steady_clock::time_point since_{};
};

/// The asynchronous engine's per-queue-pair watch (guarded by the driver's lock).
struct QpWatch {
    std::uint64_t stamp = 0;        ///< the last tick that examined it
    bool timers_known = false;      ///< timeout, retry and port below were read (ibv_query_qp)
    std::uint8_t port = 0;          ///< its port (0: unknown)
    std::uint8_t timeout = 0;       ///< the local ACK timeout exponent
    std::uint8_t retry_count = 0;   ///< transport retries
    std::uint8_t rnr_retry = 0;     ///< receiver-not-ready retries (7: for as long as the peer takes)
    bool moved_to_error = false;    ///< gpuverbs moved it to the error state
    bool move_pending = false;      ///< gpuverbs failed it but the provider refused the move: tried again each tick
    std::uint64_t last_retired = 0; ///< send requests known finished at the last tick
    std::chrono::steady_clock::time_point last_progress{}; ///< when its send queue last moved (or was idle)
    /// The furthest send PSN the provider reported (ibv_query_qp's sq_psn: the
    /// next packet its requester sends; it steps back on a retransmission).
    std::uint32_t furthest_psn = 0;
    bool psn_known = false;
    std::uint8_t port_down_looks = 0;                ///< consecutive ticks that saw its port not ACTIVE (or unreadable)
    std::uint8_t query_failures = 0;                 ///< consecutive ticks whose ibv_query_qp failed
    std::chrono::steady_clock::time_point learned{}; ///< when the watch first saw it failed
    bool learned_set = false;
};

} // namespace gpuverbs::detail
