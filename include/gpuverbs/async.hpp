// gpuverbs' asynchronous operations: include this header to use
// QueuePair's async_* (it brings the engine; queue_pair.hpp alone compiles
// none of it). The vocabulary is in async_types.hpp, the token machinery in
// detail/async/async_token.hpp. Every async_* of the library follows one recipe
// (docs/concepts.md, "One recipe for every asynchronous operation"); here are
// the rules, stated once for every QueuePair::async_* operation:
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

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/detail/async/async_token.hpp"

// The asynchronous forms of QueuePair (data_path.hpp declares them; a program
// that includes only queue_pair.hpp compiles none of the engine).
#include "gpuverbs/detail/async/async_forms.hpp"

#include <cstddef>

namespace boost::asio {
class io_context;
}

namespace gpuverbs {

/// Progress without a loop: advances every CompletionQueue made with
/// CompletionMode::polled on `io`'s executor (reaps it, posts what waited
/// for room, runs the liveness watch when its tick is due), then runs what
/// `io` has ready without blocking (io_context::poll). Handlers run here, on
/// the calling thread. Returns how many operations finished and handlers
/// ran. Call it from one thread at a time per io_context (operations may be
/// started from any thread unless the CQs are single_threaded). Called again
/// from inside a handler it runs, it advances the CQs only. An exception a
/// handler throws comes out of it, as from io_context::poll. With nothing
/// outstanding it makes no system call (benchmarks/progress-idle measures it):
///
///   boost::asio::io_context io(1);
///   gpuverbs::CompletionQueue cq(device, 1024, io.get_executor(), {.mode = gpuverbs::CompletionMode::polled});
///   ...
///   for (;;) {                       // the engine's step loop
///       gpuverbs::progress(io);      // never blocks, never sleeps
///       if (transfer.done()) ...
///   }
std::size_t progress(boost::asio::io_context& io);

} // namespace gpuverbs
