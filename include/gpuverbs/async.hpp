// The asynchronous vocabulary of gpuverbs: how a CompletionQueue bound to an
// executor waits for completions, what an asynchronous receive hands back,
// the default completion token, and the rules every async_* follows.
//
// The rules, stated once for every QueuePair::async_* operation:
//
// Completion signature: the first argument is always boost::system::error_code
//   (Asio's own, so `ec == boost::asio::error::operation_aborted` works); it
//   holds a gpuverbs::errc (a local check refused the request: nothing was
//   posted), a work-completion status (wc_category(): the device failed it),
//   an errno value, or operation_aborted. The second argument is the
//   operation's result: bytes moved (std::size_t), a Received, or an atomic's
//   old value (std::uint64_t).
// Completion token: any Asio token for that signature — a callback,
//   asio::use_awaitable, asio::use_future, asio::deferred (the default when
//   the executor has none), asio::bind_executor/bind_cancellation_slot, …
// Object lifetimes: the memory behind every LocalBuffer must stay valid and
//   registered until the operation completes (the NIC reads or writes it
//   until then). A scatter/gather list itself is copied when the operation is
//   initiated. The QueuePair and CompletionQueue may be destroyed at any
//   time: outstanding operations then complete with operation_aborted, and so
//   does an operation made before and launched after the QueuePair was
//   destroyed (asio::deferred): the initiation holds the queue pair weakly,
//   never keeping it alive and never reaching it once destroyed.
// Executor: the handler runs on its associated executor, or the
//   CompletionQueue's executor when it has none; never inside the initiating
//   function. When it is the CQ's executor, it runs directly from the
//   completion processing (no second trip through the scheduler).
// Cancellation: per operation, through the handler's cancellation slot
//   (asio::bind_cancellation_slot, asio::cancel_after where Asio has it,
//   awaitable operators): an operation still waiting for a slot in its queue
//   (never posted) completes with operation_aborted. An operation already
//   posted cannot be recalled from the device and ignores the request; to end
//   all of a queue pair's operations, destroy the QueuePair (they complete
//   with operation_aborted and the QP is destroyed, so the NIC stops using
//   the buffers).
// Thread safety: operations may be initiated from any thread; the CQ's
//   completions are processed on its executor. When a send or receive queue
//   is full, operations wait in submission order and are posted as slots free.
#pragma once

#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace gpuverbs {

/// How a CompletionQueue bound to an executor learns of completions.
enum class CompletionMode {
    /// Wait on the completion channel's fd: no CPU while idle, a wake-up per burst.
    event_driven,
    /// After activity, keep polling from the executor for `AsyncOptions::spin`,
    /// then fall back to waiting on the fd: busy-poll latency during bursts,
    /// no core burned when idle. While polling it never touches the channel.
    adaptive,
};

/// How a CompletionQueue bound to an executor runs.
struct AsyncOptions {
    CompletionMode mode = CompletionMode::event_driven;
    /// Adaptive mode: how long to keep polling after the last completion.
    std::chrono::microseconds spin{50};
};

/// What an asynchronous receive hands back.
struct Received {
    std::size_t bytes = 0;                  ///< bytes received (0 for a write with immediate)
    std::optional<std::uint32_t> immediate; ///< the sender's immediate data, host byte order
};

/// The error type of every asynchronous completion signature.
using async_error_code = boost::system::error_code;

/// The completion token async_* use when none is given: the executor's
/// default, or asio::deferred when it has none (Boost 1.81's any_io_executor).
template <class Executor>
using default_token_t = std::conditional_t<std::is_void_v<boost::asio::default_completion_token_t<Executor>>,
                                           boost::asio::deferred_t, boost::asio::default_completion_token_t<Executor>>;

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
};

} // namespace gpuverbs
