// Block-list transfers: move many scattered blocks in one operation — the
// KV-cache hand-off of disaggregated inference (a request's blocks in one
// paged pool land in another pool's, differently scattered blocks).
//
//   std::vector<gpuverbs::LocalBuffer> mine = {pool.slice(7 * B, B), pool.slice(2 * B, B)};
//   std::vector<gpuverbs::RemoteBlock> theirs = {{peer_pool, 40 * B, B}, {peer_pool, 41 * B, B}};
//   auto plan = gpuverbs::TransferPlan(gpuverbs::TransferDirection::write, mine, theirs, qp.capabilities());
//   gpuverbs::async_transfer(qp, plan, {.notify = request_id}, [](auto ec, gpuverbs::TransferResult r) {
//       // r.bytes; on failure r.failed_blocks names the blocks
//   });
//   // the peer: a receive completes with immediate == request_id once every block has landed
//
// Planning is transfer_plan.hpp (no Asio); the rails, options and result
// are transfer_options.hpp; the engine is detail/transfers/transfer_job.hpp.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/transfers/transfer_options.hpp"
#include "gpuverbs/transfers/transfer_plan.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/transfers/transfer_job.hpp"

#include <boost/asio/async_result.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>

namespace gpuverbs {

/// Moves `plan` over one or several rails (asynchronously: every rail's CQ
/// must be bound to an executor) and completes once:
/// void(async_error_code, TransferResult) — the bytes moved, on failure
/// which blocks in words, and the report (its blocks' part when
/// options.report_blocks asks). Requests are striped
/// over the rails by bytes (contiguous ranges), each rail posted in chains of
/// options.doorbell_batch with the last signaled, refilled from its own
/// completions. The error is the first that happened (a device status;
/// operation_aborted when a queue pair or CQ was destroyed; errc::invalid_argument
/// for an empty plan, no rail, or a key a rail cannot
/// translate; errc::no_executor). `plan` and its memory (and the options'
/// deprecated outputs) must live until completion; the rails' queue pairs are held
/// weakly from when the operation is made (a deferred transfer launched after
/// one was destroyed completes with operation_aborted; one destroyed while it
/// runs aborts it). The job is allocated with the handler's associated
/// allocator. options.deadline bounds it (std::errc::timed_out). Cancellation
/// (the handler's cancellation slot, any type): nothing more is posted,
/// waiting rails are taken back, and the handler runs with
/// operation_aborted once the device is done with every request it took —
/// never while a posted request may still touch the memory; the result's
/// report then says which blocks landed. When the execution
/// context of one rail is destroyed with the transfer running, the handler
/// is destroyed without being called (Asio's rule), whatever the other rails do.
template <boost::asio::completion_token_for<void(async_error_code, TransferResult)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(std::span<const TransferRail> rails, const TransferPlan& plan, const TransferOptions& options,
                    Token&& token = Token()) {
    boost::asio::any_io_executor executor;
    if (!rails.empty() && rails.front().qp != nullptr) executor = rails.front().qp->get_executor();
    return boost::asio::async_initiate<Token, void(async_error_code, TransferResult)>(
        detail::InitiateTransfer{detail::bind_rails(rails), &plan, options, executor}, token);
}

/// … on one queue pair.
template <boost::asio::completion_token_for<void(async_error_code, TransferResult)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, const TransferOptions& options, Token&& token = Token()) {
    const TransferRail rail{&qp, {}, {}};
    return async_transfer(std::span<const TransferRail>(&rail, 1), plan, options, std::forward<Token>(token));
}

/// … on one queue pair, without options.
template <boost::asio::completion_token_for<void(async_error_code, TransferResult)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, Token&& token = Token()) {
    return async_transfer(qp, plan, TransferOptions{}, std::forward<Token>(token));
}

/// A transfer its owner asks about from its own loop instead of handing it
/// a handler: with CQs made in CompletionMode::polled, nothing moves between
/// calls to gpuverbs::progress (async.hpp), and nothing runs on another thread.
///
///   gpuverbs::PendingTransfer t = gpuverbs::start_transfer(qp, plan, {.deadline = at});
///   while (!t.done()) gpuverbs::progress(io);     // or once per step of the engine's loop
///   if (t.error()) log(t.result().failed_blocks);
///
/// The plan and its memory must live until done(). Dropping the
/// PendingTransfer does not stop the transfer (it runs to its end unseen).
class PendingTransfer {
public:
    PendingTransfer() = default;
    /// False for a default-made one.
    explicit operator bool() const noexcept { return state_ != nullptr; }
    /// Whether the transfer has ended (its handler ran); any thread.
    [[nodiscard]] bool done() const noexcept { return state_ && state_->done.load(std::memory_order_acquire); }
    /// Once done(): the transfer's error (empty on success).
    [[nodiscard]] const async_error_code& error() const noexcept { return state_->error; }
    /// Once done(): what it moved and, on failure, what failed.
    [[nodiscard]] const TransferResult& result() const noexcept { return state_->result; }

private:
    struct State {
        std::atomic<bool> done{false};
        async_error_code error;
        TransferResult result;
    };
    friend PendingTransfer start_transfer(std::span<const TransferRail> rails, const TransferPlan& plan,
                                          const TransferOptions& options);
    std::shared_ptr<State> state_;
};

/// async_transfer on these rails, ended into a PendingTransfer.
inline PendingTransfer start_transfer(std::span<const TransferRail> rails, const TransferPlan& plan,
                                      const TransferOptions& options) {
    PendingTransfer t;
    t.state_ = std::make_shared<PendingTransfer::State>();
    async_transfer(rails, plan, options, [state = t.state_](async_error_code ec, TransferResult result) noexcept {
        state->error = ec;
        state->result = std::move(result);
        state->done.store(true, std::memory_order_release);
    });
    return t;
}

/// … on one queue pair.
inline PendingTransfer start_transfer(QueuePair& qp, const TransferPlan& plan, const TransferOptions& options = {}) {
    const TransferRail rail{&qp, {}, {}};
    return start_transfer(std::span<const TransferRail>(&rail, 1), plan, options);
}

} // namespace gpuverbs
