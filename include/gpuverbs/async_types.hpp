// The vocabulary of gpuverbs' asynchronous operations that costs nothing to
// include: how a CompletionQueue bound to an executor waits, what an
// asynchronous receive hands back, what the engine counts. The operations
// themselves, their rules and the engine are in async.hpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

// Declared here, defined by Boost (boost/system/error_code.hpp,
// boost/asio/any_io_executor.hpp): signatures name them without the cost of
// their headers; async.hpp includes both.
namespace boost::system {
class error_code;
}
#if defined(BOOST_ASIO_USE_TS_EXECUTOR_AS_DEFAULT)
#include <boost/asio/any_io_executor.hpp>
#else
namespace boost::asio {
class any_io_executor;
}
#endif

namespace gpuverbs {

/// The error type of every asynchronous completion signature (Asio's own, so
/// `ec == boost::asio::error::operation_aborted` works).
using async_error_code = boost::system::error_code;

/// How a CompletionQueue bound to an executor learns of completions.
enum class CompletionMode {
    /// Wait on the completion channel's fd: no CPU while idle, a wake-up per burst.
    event_driven,
    /// After activity, keep polling from the executor for `AsyncOptions::spin`,
    /// then fall back to waiting on the fd: busy-poll latency during bursts,
    /// no core burned when idle. While polling it never touches the channel.
    adaptive,
    /// Never waits and starts no timer: the engine moves only when the owner
    /// calls gpuverbs::progress(io_context) (async.hpp) from its own loop — a
    /// serving engine's step asking "what finished?". progress() reaps the
    /// CQ, posts what waited for room, runs the liveness watch when its tick
    /// is due (the bounds hold while progress() is called at least once per
    /// AsyncOptions::liveness_tick) and runs the handlers; on an idle CQ it
    /// makes no system call.
    polled,
};

/// How a CompletionQueue bound to an executor runs.
struct AsyncOptions {
    CompletionMode mode = CompletionMode::event_driven;
    /// Adaptive mode: how long to keep polling after the last completion.
    std::chrono::microseconds spin{50};
    /// The CQ's executor runs on one thread (an io_context made with
    /// concurrency hint 1 and run by one thread, or a strand), and every
    /// async_* of its queue pairs is started, cancelled and destroyed there:
    /// the engine then takes no lock and its polls no atomic guard
    /// (docs/concepts.md, "Single-threaded mode"). Starting an operation or
    /// destroying a QueuePair or the CompletionQueue from another thread is a
    /// data race. Default: any thread (a spin lock around the engine).
    bool single_threaded = false;
    /// Liveness (docs/transfers.md, "Bounds"): while operations are
    /// outstanding, the engine looks this often at their queue pairs — their
    /// state, their port, whether their send queue still makes progress —
    /// and ends what the provider will not complete. Zero turns the watch
    /// off: an operation then ends only when the provider completes it.
    std::chrono::milliseconds liveness_tick{50};
    /// How long the provider gets to flush a queue pair gpuverbs knows is in
    /// the error state before gpuverbs completes its operations itself.
    std::chrono::milliseconds flush_grace{250};
    /// Added to twice the transport's retry bound ((retry_count + 1) ×
    /// 4.096 µs × 2^timeout) to give how long a send queue with requests
    /// outstanding may go without any completion before it is declared stalled.
    std::chrono::milliseconds stall_margin{500};
    /// How long a send (or a write with immediate) may wait for the peer to
    /// post a receive when rnr_retry_count is 7 — the default, where the
    /// transport retries for as long as the peer takes — before the watch
    /// declares its queue pair stalled (errc::queue_pair_stalled). The
    /// library's own bound on a wait no provider ends; a peer that is gone
    /// fails sooner, by the transport's retries. Zero: never (the wait is the
    /// application's).
    std::chrono::milliseconds receiver_wait{10000};
};

/// What an asynchronous receive hands back.
struct Received {
    std::size_t bytes = 0;                  ///< bytes received (0 for a write with immediate)
    std::optional<std::uint32_t> immediate; ///< the sender's immediate data, host byte order
};

/// What a CompletionQueue's asynchronous engine has done (for tuning and tests).
struct AsyncStatistics {
    std::uint64_t submitted = 0;        ///< operations started
    std::uint64_t waited = 0;           ///< … that waited for room in their queue before being posted
    std::uint64_t completed = 0;        ///< completions delivered to operations
    std::uint64_t aborted = 0;          ///< operations ended with operation_aborted or a refused post
    std::uint64_t cancelled = 0;        ///< waiting operations taken back by a cancellation
    std::uint64_t polls = 0;            ///< ibv_poll_cq calls made by the engine
    std::uint64_t empty_polls = 0;      ///< … that found nothing
    std::uint64_t wakeups = 0;          ///< completion-channel events waited for
    std::uint64_t work_completions = 0; ///< entries polled from the CQ (a transfer signals one per chain)
    /// Queue pairs the liveness watch declared failed (the provider in error, a port down, a stall).
    std::uint64_t queue_pairs_failed = 0;
    /// Operations the watch ended itself because the provider did not complete them in time.
    std::uint64_t completed_by_library = 0;
};

namespace detail {
/// What an asynchronous operation hands back: bytes, a Received, an atomic's old value.
enum class ResultKind { bytes, received, old_value };
} // namespace detail

} // namespace gpuverbs
