// The typed half of an asynchronous operation: the handler, its executor work
// guard, and how the completion becomes the handler's arguments. Allocated
// with the handler's associated allocator (Asio's recycling allocator by
// default, so steady state does no heap allocation) and freed before the
// handler runs.
#pragma once

#include "gpuverbs/detail/async_driver.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/recycling_allocator.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

namespace gpuverbs {

/// What an asynchronous receive hands back.
struct Received {
    std::size_t bytes = 0;                  ///< bytes received (0 for a write with immediate)
    std::optional<std::uint32_t> immediate; ///< the sender's immediate data, host byte order
};

/// The completion token async_* use when none is given: the executor's
/// default, or asio::deferred when it has none (Boost 1.81's any_io_executor).
template <class Executor>
using default_token_t = std::conditional_t<std::is_void_v<boost::asio::default_completion_token_t<Executor>>,
                                           boost::asio::deferred_t, boost::asio::default_completion_token_t<Executor>>;

namespace detail {

enum class ResultKind { bytes, received, old_value };

/// Recycled blocks for operation state when the handler brings no allocator of
/// its own: a steady stream of operations then allocates nothing. Process-wide
/// and thread-safe; keeps at most `max_cached` free blocks.
class OpPool {
public:
    static constexpr std::size_t block_size = 512;
    static constexpr std::size_t max_cached = 1024;
    static OpPool& instance();
    void* get();
    void put(void* block) noexcept;

private:
    std::mutex mutex_;
    void* free_ = nullptr;
    std::size_t cached_ = 0;
};

/// Asio's error_code for what the driver reports: operation_aborted exactly
/// (users compare with boost::asio::error::operation_aborted), errno values in
/// Boost's system category, gpuverbs' and work-completion categories wrapped.
boost::system::error_code to_asio_error(const std::error_code& ec) noexcept;

template <ResultKind K>
struct ResultOf;
template <>
struct ResultOf<ResultKind::bytes> {
    using type = std::size_t;
};
template <>
struct ResultOf<ResultKind::received> {
    using type = Received;
};
template <>
struct ResultOf<ResultKind::old_value> {
    using type = std::uint64_t;
};

template <class Handler, ResultKind K>
class AsyncOp final : public AsyncOpBase {
public:
    using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
    using Allocator = typename std::allocator_traits<boost::asio::associated_allocator_t<
        Handler, boost::asio::recycling_allocator<void>>>::template rebind_alloc<AsyncOp>;

    AsyncOp(Handler&& handler, const boost::asio::any_io_executor& io_executor)
        : handler_(std::move(handler)),
          work_(boost::asio::make_work_guard(boost::asio::get_associated_executor(handler_, io_executor))) {
        fn = &AsyncOp::run;
    }

    /// Handlers without an allocator of their own get a pooled block.
    static constexpr bool pooled = std::is_same_v<boost::asio::associated_allocator_t<Handler>, std::allocator<void>> &&
                                   sizeof(AsyncOp) <= OpPool::block_size;

    static AsyncOp* create(Handler&& handler, const boost::asio::any_io_executor& io_executor) {
        void* memory = nullptr;
        if constexpr (pooled) {
            memory = OpPool::instance().get();
        } else {
            Allocator alloc(boost::asio::get_associated_allocator(handler, boost::asio::recycling_allocator<void>()));
            memory = std::allocator_traits<Allocator>::allocate(alloc, 1);
        }
        try {
            return ::new (memory) AsyncOp(std::move(handler), io_executor);
        } catch (...) {
            release(memory, handler);
            throw;
        }
    }

private:
    static void run(AsyncOpBase* base, const Completion* c, std::error_code ec, bool destroy_only) {
        auto* self = static_cast<AsyncOp*>(base);
        // Take what the handler needs, then free the operation before it runs.
        Handler handler(std::move(self->handler_));
        auto work = std::move(self->work_);
        const std::error_code status = c != nullptr ? c->status : ec;
        typename ResultOf<K>::type result{};
        if constexpr (K == ResultKind::bytes) {
            result = status ? 0 : self->local.length;
        } else if constexpr (K == ResultKind::received) {
            if (c != nullptr) result = Received{c->byte_length, c->immediate};
        } else {
            // The atomic's old value is in the local buffer, which the caller's memory region holds.
            if (!status) {
                std::memcpy(&result,
                            reinterpret_cast<const void*>(self->local.address), // NOLINT(performance-no-int-to-ptr)
                            sizeof result);
            }
        }
        self->~AsyncOp();
        release(self, handler);
        if (destroy_only) return;
        // Never inline: the handler runs on its own executor, never inside the driver.
        auto executor = work.get_executor();
        boost::asio::post(executor, boost::asio::append(std::move(handler), to_asio_error(status), result));
    }

    static void release(void* memory, Handler& handler) noexcept {
        if constexpr (pooled) {
            (void)handler;
            OpPool::instance().put(memory);
        } else {
            Allocator alloc(boost::asio::get_associated_allocator(handler, boost::asio::recycling_allocator<void>()));
            std::allocator_traits<Allocator>::deallocate(alloc, static_cast<AsyncOp*>(memory), 1);
        }
    }

    Handler handler_;
    boost::asio::executor_work_guard<Executor> work_;
};

/// Starts an operation on `qp`'s driver, or completes it at once (posted) when
/// the QP cannot run asynchronous operations.
template <ResultKind K, class Handler>
void start_async(Handler&& handler, const std::shared_ptr<QpCore>& qp, const AsyncOpBase& request) {
    AsyncDriver* driver = qp ? qp->send_cq()->driver() : nullptr;
    std::error_code refused;
    if (!qp) {
        refused = errc::invalid_argument;
    } else if (driver == nullptr) {
        refused = errc::no_executor;
    } else if (qp->recv_cq() != qp->send_cq()) {
        refused = errc::async_needs_one_cq;
    }
    if (refused) {
        auto executor = boost::asio::get_associated_executor(handler, boost::asio::system_executor());
        typename ResultOf<K>::type nothing{};
        boost::asio::post(executor,
                          boost::asio::append(std::forward<Handler>(handler), to_asio_error(refused), nothing));
        return;
    }
    std::decay_t<Handler> own(std::forward<Handler>(handler)); // lvalue handlers are copied
    auto* op = AsyncOp<std::decay_t<Handler>, K>::create(std::move(own), driver->executor());
    op->opcode = request.opcode;
    op->local = request.local;
    op->remote = request.remote;
    op->remote_offset = request.remote_offset;
    op->immediate = request.immediate;
    op->compare_add = request.compare_add;
    op->swap = request.swap;
    op->qp = qp;
    driver->submit(op);
}

} // namespace detail
} // namespace gpuverbs
