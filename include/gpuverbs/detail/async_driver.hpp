// The engine behind gpuverbs' asynchronous operations: one AsyncDriver per
// completion queue bound to an executor.
//
// All of a driver's state is guarded by one mutex: operations are posted,
// completions polled and dispatched, queue pairs and the CQ torn down under
// it. So posting never races polling, and a completion can never reach an
// operation that was already aborted or freed:
// - each async operation is signaled and its slot's context is the operation;
// - destroying a QueuePair aborts that QP's operations (operation_aborted) and
//   destroys the QP under the lock;
// - destroying the CompletionQueue aborts everything still outstanding;
// - handlers are always posted to their executors, never run under the lock;
// - if the execution context is destroyed with operations outstanding, the
//   service below destroys them without invoking them (Asio's rule).
// (A mutex rather than a strand: a strand costs several allocations per
// operation in Asio's plumbing, a mutex none.)
#pragma once

#include "gpuverbs/completion.hpp"
#include "gpuverbs/detail/queue_cores.hpp"
#include "gpuverbs/memory_region.hpp"
#include "gpuverbs/queue_pair_types.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// How a CompletionQueue bound to an executor learns of completions.
enum class CompletionMode {
    /// Wait on the completion channel's fd: no CPU while idle, a wake-up per burst.
    event_driven,
    /// After activity, keep polling for `AsyncOptions::spin`, then fall back to
    /// waiting on the fd: busy-poll latency during bursts, no core burned when idle.
    adaptive,
};

struct AsyncOptions {
    CompletionMode mode = CompletionMode::event_driven;
    /// Adaptive mode: how long to keep polling after the last completion.
    std::chrono::microseconds spin{50};
};

namespace detail {

class AsyncDriver;

/// One asynchronous operation, allocated with its handler's allocator.
struct AsyncOpBase {
    // What to post.
    Opcode opcode = Opcode::send;
    LocalBuffer local;
    RemoteMemory remote;
    std::uint64_t remote_offset = 0;
    std::uint32_t immediate = 0;
    std::uint64_t compare_add = 0;
    std::uint64_t swap = 0;
    std::shared_ptr<QpCore> qp; // keeps the QP alive while the operation is
    // Intrusive links: the driver's live list or a pending FIFO.
    AsyncOpBase* prev = nullptr;
    AsyncOpBase* next = nullptr;
    bool posted = false;

    /// Invokes (completion != nullptr or ec set) or only destroys the operation.
    using Fn = void (*)(AsyncOpBase*, const Completion* completion, std::error_code ec, bool destroy_only);
    Fn fn = nullptr;

    void complete(const Completion& c) { fn(this, &c, {}, false); }
    void fail(std::error_code ec) { fn(this, nullptr, ec, false); }
    void destroy() { fn(this, nullptr, {}, true); }
};

/// An intrusive doubly linked list of operations (no allocation).
class OpList {
public:
    [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
    [[nodiscard]] AsyncOpBase* front() const noexcept { return head_; }
    void push_back(AsyncOpBase* op) noexcept {
        op->prev = tail_;
        op->next = nullptr;
        (tail_ != nullptr ? tail_->next : head_) = op;
        tail_ = op;
    }
    void erase(AsyncOpBase* op) noexcept {
        (op->prev != nullptr ? op->prev->next : head_) = op->next;
        (op->next != nullptr ? op->next->prev : tail_) = op->prev;
        op->prev = op->next = nullptr;
    }
    /// Moves every operation out (to abort or destroy them).
    OpList take() noexcept {
        OpList out;
        out.head_ = head_;
        out.tail_ = tail_;
        head_ = tail_ = nullptr;
        return out;
    }

private:
    AsyncOpBase* head_ = nullptr;
    AsyncOpBase* tail_ = nullptr;
};

class AsyncDriver : public std::enable_shared_from_this<AsyncDriver> {
    friend class AsyncDriverService;

public:
    AsyncDriver(const boost::asio::any_io_executor& executor, std::shared_ptr<CqCore> cq, const AsyncOptions& options);
    AsyncDriver(const AsyncDriver&) = delete;
    AsyncDriver& operator=(const AsyncDriver&) = delete;
    ~AsyncDriver();

    [[nodiscard]] const boost::asio::any_io_executor& executor() const noexcept { return executor_; }

    /// Takes an operation (any thread); it is posted at once, or waits in
    /// order while its QP's send or receive queue is full.
    void submit(AsyncOpBase* op);
    /// The user dropped a QueuePair: abort its operations, destroy it (any thread).
    void release_qp(std::shared_ptr<QpCore> qp) noexcept;
    /// The user dropped the CompletionQueue: abort everything (any thread).
    void shutdown() noexcept;
    /// Destroys every operation without invoking it (the execution context is going away).
    void destroy_all() noexcept;

    /// Operations submitted and not yet completed (call with the lock held).
    [[nodiscard]] std::size_t outstanding() const noexcept { return live_count_ + pending_count_; }

private:
    void on_submit(AsyncOpBase* op);
    std::error_code post_now(AsyncOpBase* op);
    bool has_room(const AsyncOpBase* op) const;
    void retry_pending();
    void activity();
    void arm_and_wait();
    void on_readable(const boost::system::error_code& ec);
    void spin();
    /// Polls and dispatches until the CQ is empty; returns how many completed.
    std::size_t drain();
    void abort_qp(const QpCore* qp);
    void stop_waiting_if_idle();
    void abort_all();
    /// Empties the live and pending lists, handing each operation to `on_op`.
    template <class OnOp>
    void take_each(OnOp&& on_op);
    void finish(AsyncOpBase* op, const Completion* c, std::error_code ec);

    boost::asio::any_io_executor executor_;
    std::mutex mutex_;
    std::shared_ptr<CqCore> cq_;
    std::shared_ptr<ChannelCore> channel_;
    boost::asio::posix::stream_descriptor descriptor_;
    AsyncOptions options_;
    OpList live_;    // posted, waiting for their completion
    OpList pending_; // waiting for room in their queue, in submission order
    std::size_t live_count_ = 0;
    std::size_t pending_count_ = 0;
    bool waiting_ = false;
    bool spinning_ = false;
    bool closed_ = false;
    std::chrono::steady_clock::time_point spin_until_;
};

/// Keeps track of every driver of an execution context so that, when the
/// context is destroyed, operations that never ran are destroyed, not leaked.
class AsyncDriverService : public boost::asio::execution_context::service {
public:
    using key_type = AsyncDriverService;
    // Asio's service identity idiom; id's constructor does nothing (it is just not marked noexcept).
    static inline boost::asio::execution_context::id id; // NOLINT(cert-err58-cpp)

    explicit AsyncDriverService(boost::asio::execution_context& context)
        : boost::asio::execution_context::service(context) {}
    void add(const std::shared_ptr<AsyncDriver>& driver);
    void shutdown() override;

private:
    std::mutex mutex_;
    std::vector<std::weak_ptr<AsyncDriver>> drivers_;
};

} // namespace detail
} // namespace gpuverbs
