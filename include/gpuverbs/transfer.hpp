// Block-list transfers: move many scattered blocks in one operation — the
// KV-cache hand-off of disaggregated inference (a request's blocks in one
// paged pool land in another pool's, differently scattered blocks).
//
//   std::vector<gpuverbs::LocalBuffer> mine = {pool.slice(7 * B, B), pool.slice(2 * B, B)};
//   std::vector<gpuverbs::RemoteBlock> theirs = {{peer_pool, 40 * B, B}, {peer_pool, 41 * B, B}};
//   auto plan = gpuverbs::TransferPlan::make(gpuverbs::TransferDirection::write, mine, theirs, qp.capabilities());
//   gpuverbs::async_transfer(qp, plan, {.notify = request_id}, [](boost::system::error_code ec, std::size_t bytes) {});
//   // the peer: a receive completes with immediate == request_id once every block has landed
//
// The two lists describe the same bytes in order, cut differently: any
// lengths on either side. TransferPlan checks them (no zero-length block,
// every block inside its region, equal totals, no two blocks writing the same
// bytes), coalesces neighbours (contiguous blocks of one region become one
// request) and cuts the result into work requests that respect the queue
// pair's scatter/gather limit and the message size. Errors name the block.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/memory_region.hpp"
#include "gpuverbs/queue_pair.hpp"
#include "gpuverbs/queue_pair_types.hpp"
#include "gpuverbs/work_request.hpp"

#include "gpuverbs/detail/async_op.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpuverbs {

enum class TransferDirection : std::uint8_t {
    write, ///< local blocks → remote blocks (RDMA write)
    read,  ///< remote blocks → local blocks (RDMA read)
};

/// What bounds one work request of a transfer.
struct TransferLimits {
    /// Local pieces one request may gather or scatter (the QP's max_send_sge).
    std::uint32_t max_sge = 1;
    /// The largest message (RoCE and InfiniBand allow 2^31 bytes).
    std::uint64_t max_message = std::uint64_t{1} << 31;
};

class TransferPlan;
namespace detail {
TransferPlan make_transfer_plan(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, Status& status);
} // namespace detail

/// A checked, coalesced, chunked transfer: the work requests to post.
class TransferPlan {
public:
    /// One work request: a contiguous remote range and its local pieces.
    struct Request {
        RemoteMemory remote;           ///< the exact remote range (address, length, rkey)
        std::uint32_t first_piece = 0; ///< into pieces()
        std::uint32_t piece_count = 0;
        std::uint32_t first_local = 0;  ///< the local block where it starts (for messages)
        std::uint32_t first_remote = 0; ///< the remote block where it starts
        std::uint32_t last_remote = 0;  ///< the remote block where it ends
    };

    /// Checks and plans; throws gpuverbs::Error (errc::invalid_argument) naming the block.
    static TransferPlan make(TransferDirection direction, std::span<const LocalBuffer> local,
                             std::span<const RemoteBlock> remote, const TransferLimits& limits = {});
    /// … limits from a queue pair's capabilities (max_send_sge).
    static TransferPlan make(TransferDirection direction, std::span<const LocalBuffer> local,
                             std::span<const RemoteBlock> remote, const QueuePairCapabilities& caps) {
        return make(direction, local, remote, TransferLimits{caps.max_send_sge});
    }
    /// The error_code form: the words in `diagnostics`.
    static TransferPlan make(TransferDirection direction, std::span<const LocalBuffer> local,
                             std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec,
                             Diagnostics& diagnostics);

    [[nodiscard]] TransferDirection direction() const noexcept { return direction_; }
    [[nodiscard]] std::span<const Request> requests() const noexcept { return requests_; }
    [[nodiscard]] std::span<const LocalBuffer> pieces() const noexcept { return pieces_; }
    [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
    [[nodiscard]] std::size_t local_blocks() const noexcept { return local_blocks_; }
    [[nodiscard]] std::size_t remote_blocks() const noexcept { return remote_blocks_; }
    /// The work request for request `i` (refers to this plan: keep it alive until posted).
    [[nodiscard]] WorkRequest work_request(std::size_t i) const noexcept;
    /// "remote block 17" or "remote blocks 17 to 19 (local block 4 onwards)", for request `i`.
    [[nodiscard]] std::string blocks_of(std::size_t i) const;

private:
    friend TransferPlan detail::make_transfer_plan(TransferDirection, std::span<const LocalBuffer>,
                                                   std::span<const RemoteBlock>, const TransferLimits&,
                                                   detail::Status&);
    TransferDirection direction_ = TransferDirection::write;
    std::vector<Request> requests_;
    std::vector<LocalBuffer> pieces_;
    std::uint64_t bytes_ = 0;
    std::size_t local_blocks_ = 0;
    std::size_t remote_blocks_ = 0;
};

namespace detail {

/// The state of one async_transfer: counts the requests' completions (which
/// may run on several threads) and completes the user's handler once, with
/// the first error or the bytes moved.
template <class Handler>
struct TransferState {
    using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
    TransferState(Handler h, const boost::asio::any_io_executor& fallback)
        : handler(std::move(h)), work(boost::asio::get_associated_executor(handler, fallback)) {}
    Handler handler;
    boost::asio::executor_work_guard<Executor> work;
    std::mutex mutex;
    std::size_t left = 0;
    std::uint64_t bytes = 0;
    boost::system::error_code first_error;

    /// Records one completion; true when it was the last.
    bool complete_one(boost::system::error_code ec, std::uint64_t moved, std::string* failed,
                      const std::function<std::string()>& which) {
        std::lock_guard lock(mutex);
        if (ec && !first_error) {
            first_error = ec;
            if (failed != nullptr) *failed = which();
        }
        if (!ec) bytes += moved;
        return --left == 0;
    }
    void finish() {
        auto executor = work.get_executor();
        work.reset();
        boost::asio::post(executor, boost::asio::append(std::move(handler), first_error, std::size_t(bytes)));
    }
};
} // namespace detail

/// How async_transfer finishes and reports.
struct TransferOptions {
    /// Writes only: after the last block, a zero-byte write with this
    /// immediate (a transfer id) consumes one receive at the peer. RC delivers
    /// in order, so when the peer's receive completes every block has landed.
    std::optional<std::uint32_t> notify;
    /// Receives plan.blocks_of() for the first request that failed.
    std::string* failed_blocks = nullptr;
};

/// Posts every request of `plan` on `qp` (asynchronously: the QP's CQ must be
/// bound to an executor; requests wait for free slots in order) and completes
/// once: void(boost::system::error_code, std::size_t bytes). The error is the
/// first request's that failed (a device status; operation_aborted when the
/// QP was destroyed; errc::invalid_argument for an empty plan or a
/// notification on a read; errc::no_executor). The notification is posted
/// only once every request has completed without error, so a peer never
/// hears of a transfer that did not land. `qp`, `plan`, its memory and
/// `options.failed_blocks` must live until completion.
template <class Token>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, const TransferOptions& options, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [&qp, &plan, options](auto handler) {
            using Handler = decltype(handler);
            // Without an executor (the CQ is not bound to one) the refusal still completes, on the system executor.
            boost::asio::any_io_executor fallback = qp.get_executor();
            if (!fallback) fallback = boost::asio::system_executor();
            auto state = std::make_shared<detail::TransferState<Handler>>(std::move(handler), fallback);
            auto refuse = [&](std::error_code code, const char* why) {
                state->first_error = detail::to_asio_error(code);
                if (options.failed_blocks != nullptr) *options.failed_blocks = why;
                state->finish();
            };
            if (!qp.get_executor()) return refuse(make_error_code(errc::no_executor), "the QP's CQ has no executor");
            if (plan.requests().empty()) return refuse(make_error_code(errc::invalid_argument), "an empty plan");
            if (options.notify && plan.direction() == TransferDirection::read) {
                return refuse(make_error_code(errc::invalid_argument),
                              "a read needs no notification: the reader knows when it is done");
            }
            const std::size_t count = plan.requests().size();
            state->left = count;
            std::string* failed = options.failed_blocks;
            for (std::size_t i = 0; i < count; ++i) {
                qp.async_post(plan.work_request(i), [state, i, &plan, &qp, failed, notify = options.notify](
                                                        boost::system::error_code ec, std::size_t) {
                    bool last = state->complete_one(ec, plan.requests()[i].remote.length, failed,
                                                    [&] { return plan.blocks_of(i); });
                    if (!last) return;
                    if (state->first_error || !notify) return state->finish();
                    // Every block has landed (each request completed): now the notification.
                    {
                        std::lock_guard lock(state->mutex);
                        state->left = 1;
                    }
                    const TransferPlan::Request& end = plan.requests().back();
                    LocalBuffer none = plan.pieces().front();
                    none.length = 0;
                    qp.async_post(WorkRequest::write_with_imm(none, end.remote, 0, *notify),
                                  [state, failed](boost::system::error_code nec, std::size_t) {
                                      if (state->complete_one(nec, 0, failed, [] {
                                              return std::string("the notification after the last block");
                                          })) {
                                          state->finish();
                                      }
                                  });
                });
            }
        },
        token);
}

/// … without a notification.
template <class Token>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, Token&& token) {
    return async_transfer(qp, plan, TransferOptions{}, std::forward<Token>(token));
}

} // namespace gpuverbs
