// The typed half of an asynchronous operation: the handler, how the
// completion becomes the handler's arguments, where the handler runs, and the
// named initiations QueuePair's async_* hand to asio::async_initiate.
//
// An operation is lowered (every local check of the posting path) when it is
// initiated, and carries its verbs request and exactly its scatter/gather
// entries, so posting it later — when a slot frees — needs no further checks.
// Its memory comes from a per-thread list of blocks (then a process-wide
// lock-free stack), from the handler's own associated allocator when it has
// one, or — for an operation larger than a block (a handler of more than
// about 700 bytes, or many entries) — from Asio's recycling allocator: a
// steady stream of operations allocates nothing.
// The operation is freed before its handler runs.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/async/async_driver.hpp"
#include "gpuverbs/detail/async/async_fsm.hpp"
#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/error.hpp"

#include <arpa/inet.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/recycling_allocator.hpp>
#include <boost/asio/system_executor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>

namespace gpuverbs::detail {

/// Memory for operations: blocks of block_size bytes, recycled through a
/// per-thread free list and, between threads (an operation freed on another
/// thread than the one that made it), a process-wide lock-free stack: a block
/// is pushed alone (compare-and-swap) and a thread whose list ran dry takes
/// the whole stack at once (one exchange), so no pop can meet an ABA and no
/// path takes a lock.
class OpMemory {
public:
    static constexpr std::size_t block_size = 1024;
    /// Blocks kept in the process-wide stack at most (more are freed).
    static constexpr std::size_t max_pooled = 1024;
    /// Blocks a thread's freed operations fill its own list with before it
    /// shares the rest (a refill from the shared stack may bring it more).
    static constexpr unsigned thread_capacity = 16;

    static void* get() {
        Cache& c = cache();
        if (c.head == nullptr) refill(c);
        if (c.head == nullptr) return ::operator new(block_size);
        void* block = c.head;
        c.head = next_of(block);
        --c.count;
        return block;
    }
    static void put(void* block) noexcept {
        Cache& c = cache();
        if (c.count < thread_capacity) {
            next_of(block) = c.head;
            c.head = block;
            ++c.count;
            return;
        }
        share(block);
    }

private:
    struct Cache {
        void* head = nullptr;
        unsigned count = 0;
        Cache() = default;
        Cache(const Cache&) = delete;
        Cache& operator=(const Cache&) = delete;
        ~Cache() {
            while (head != nullptr) {
                void* block = head;
                head = next_of(block);
                share(block);
            }
        }
    };
    static void*& next_of(void* block) noexcept { return *static_cast<void**>(block); }
    static Cache& cache() noexcept {
        thread_local Cache c;
        return c;
    }
    /// Takes the process-wide stack into `c` (nothing when it is empty).
    static void refill(Cache& c) noexcept;
    /// Pushes `block` on the process-wide stack (frees it when the stack is full).
    static void share(void* block) noexcept;
};

/// The untyped operation: what the driver and the machine handle.
struct AsyncOpBase : AsyncOpLinks {
    /// How the handler is to be called.
    enum class How : std::uint8_t {
        direct, ///< from the CQ's completion processing: run it here if its executor is the CQ's
        post,   ///< post it to its executor (aborts, refusals, cancellations)
        destroy ///< destroy it without calling it (the execution context is going away)
    };
    using Fn = void (*)(AsyncOpBase*, How, std::error_code);

    Fn fn = nullptr;
    /// What it does (send, receive, a transfer's rail): set when it is made.
    const OpBehaviour* behaviour = &send_behaviour;
    QpCore* qp = nullptr;
    AsyncDriver* driver = nullptr;
    /// The handler's executor is the CQ's: it may run directly from the completion processing.
    bool direct_ok = false;
    Opcode opcode = Opcode::send;
    // The completion, once it arrived.
    ibv_wc_status wc_status = IBV_WC_SUCCESS;
    std::uint32_t byte_len = 0;
    std::optional<std::uint32_t> immediate;
    /// Set when a waiting operation's post was refused (delivered as its error).
    std::optional<std::error_code> failure;
    // What the result is made of.
    std::uint64_t bytes = 0;          ///< bytes the request moves (send side)
    std::uint64_t result_address = 0; ///< an atomic's local buffer, where the old value lands

    void record(const ibv_wc& wc) noexcept {
        wc_status = wc.status;
        byte_len = wc.byte_len;
        if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) immediate = ntohl(wc.imm_data);
    }
    void complete(How how, std::error_code ec = {}) noexcept { fn(this, how, ec); }
};

/// A single send or receive: its lowered request, posted as it is when a slot
/// frees. Sized for what it carries — one request (a send's or a receive's,
/// never both) and exactly the scatter/gather entries it has, stored right
/// after the typed operation in the same memory (AsyncOp::entries(); the
/// request's sg_list points there).
struct SingleOp : AsyncOpBase {
    union {
        ibv_send_wr send_wr;
        ibv_recv_wr recv_wr;
    };

    // The request is left unset: lower() or lower_receive() writes every
    // field the verbs read (as for a request on the stack).
    SingleOp() noexcept {} // NOLINT(cppcoreguidelines-pro-type-member-init,hicpp-member-init)
    SingleOp(const SingleOp&) = delete;
    SingleOp& operator=(const SingleOp&) = delete;
    ~SingleOp() = default;

    /// Bytes an operation of `size` bytes needs with `entries` scatter/gather entries after it.
    static constexpr std::size_t bytes_with_sges(std::size_t size, std::size_t entries) noexcept {
        return (size + alignof(ibv_sge) - 1) / alignof(ibv_sge) * alignof(ibv_sge) + entries * sizeof(ibv_sge);
    }
};

template <ResultKind K>
struct ResultOf {
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

/// No associated executor: a handler for which associated_executor picks this.
struct NoExecutor {};
template <class Handler>
inline constexpr bool has_own_executor =
    !std::is_same_v<boost::asio::associated_executor_t<Handler, NoExecutor>, NoExecutor>;

template <class Handler, ResultKind K>
class AsyncOp final : public SingleOp {
public:
    using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
    using Slot = boost::asio::associated_cancellation_slot_t<Handler>;
    /// A handler's own allocator; without one, Asio's recycling allocator (a
    /// per-thread cache) for operations too large for a block.
    using DefaultAllocator = boost::asio::recycling_allocator<void>;
    /// What the operation and its entries are allocated in (aligned for either).
    struct alignas(std::max(alignof(std::max_align_t), alignof(Handler))) Unit {
        unsigned char bytes[alignof(std::max_align_t)];
    };
    using Allocator = typename std::allocator_traits<
        boost::asio::associated_allocator_t<Handler, DefaultAllocator>>::template rebind_alloc<Unit>;
    /// Handlers without an allocator of their own may get a recycled block…
    static constexpr bool may_use_blocks =
        std::is_same_v<boost::asio::associated_allocator_t<Handler>, std::allocator<void>>;
    /// … when the operation and its entries fit in one.
    static constexpr std::size_t entries_in_block = SingleOp::bytes_with_sges(sizeof(AsyncOp), 0) > OpMemory::block_size
                                                        ? 0
                                                        : (OpMemory::block_size -
                                                           SingleOp::bytes_with_sges(sizeof(AsyncOp), 0)) /
                                                              sizeof(ibv_sge);

    AsyncOp(Handler&& handler, std::uint32_t units) : handler_(std::move(handler)), units_(units) {
        fn = &AsyncOp::run;
    }

    /// Its scatter/gather entries: right after it, at a fixed offset (no pointer to load).
    [[nodiscard]] ibv_sge* entries() noexcept {
        return reinterpret_cast<ibv_sge*>( // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
            reinterpret_cast<unsigned char*>(this) + SingleOp::bytes_with_sges(sizeof(AsyncOp), 0));
    }

    /// An operation with room for `entries` scatter/gather entries (at most max_sge_per_request).
    static AsyncOp* create(Handler&& handler, std::size_t entries) {
        void* memory = nullptr;
        std::uint32_t units = 0; // 0: a block
        if (may_use_blocks && entries <= entries_in_block) {
            memory = OpMemory::get();
        } else {
            const std::size_t bytes =
                SingleOp::bytes_with_sges(sizeof(AsyncOp), std::min(entries, max_sge_per_request));
            units = static_cast<std::uint32_t>((bytes + sizeof(Unit) - 1) / sizeof(Unit));
            Allocator alloc(boost::asio::get_associated_allocator(handler, DefaultAllocator()));
            memory = std::allocator_traits<Allocator>::allocate(alloc, units);
        }
        // Moving a handler does not throw (Asio's requirement).
        return ::new (memory) AsyncOp(std::move(handler), units);
    }

    /// Where the handler will run, and its cancellation slot.
    void bind(AsyncDriver& d) {
        driver = &d;
        if constexpr (has_own_executor<Handler>) {
            Executor ex = boost::asio::get_associated_executor(handler_, d.executor());
            if constexpr (std::is_same_v<Executor, boost::asio::any_io_executor>) {
                direct_ok = ex == d.executor(); // e.g. a coroutine on the CQ's own io_context
            }
            if (!direct_ok) work_.emplace(std::move(ex)); // keeps the handler's own context alive
        } else {
            direct_ok = true; // runs on the CQ's executor, which the driver keeps busy while it has work
        }
        slot_ = boost::asio::get_associated_cancellation_slot(handler_);
        if (slot_.is_connected()) slot_.template emplace<Canceller>(&d, this);
    }

private:
    struct Canceller {
        Canceller(AsyncDriver* d, AsyncOpBase* o) noexcept : driver(d), op(o) {}
        AsyncDriver* driver;
        AsyncOpBase* op;
        void operator()(boost::asio::cancellation_type type) const noexcept {
            if (type != boost::asio::cancellation_type::none) driver->cancel(op);
        }
    };

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 reports the moved-from std::optional<work guard> of use_future's
// executor (a shared_ptr inside) as maybe-uninitialized; it is engaged-checked.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
    // Only std::bad_alloc from asio::post (a handler sent to another executor)
    // can escape; an operation cannot complete without it, so termination is
    // the answer rather than a lost handler.
    // NOLINTNEXTLINE(bugprone-exception-escape)
    static void run(AsyncOpBase* base, How how, std::error_code ec) noexcept {
        auto* self = static_cast<AsyncOp*>(base);
        if (self->slot_.is_connected()) self->slot_.clear();
        if (!ec && self->failure) ec = *self->failure;
        // Take what the handler needs, then free the operation before it runs.
        Handler handler(std::move(self->handler_));
        std::optional<boost::asio::executor_work_guard<Executor>> work(std::move(self->work_));
        const bool direct = how == How::direct && self->direct_ok;
        const AsyncDriver* driver = self->driver;
        const bool ok = !ec && self->wc_status == IBV_WC_SUCCESS;
        const boost::system::error_code status =
            ok ? boost::system::error_code() : to_asio_error(ec ? ec : make_wc_error(self->wc_status));
        typename ResultOf<K>::type result{};
        if constexpr (K == ResultKind::bytes) {
            if (ok) result = self->bytes;
        } else if constexpr (K == ResultKind::received) {
            if (ok) result = Received{self->byte_len, self->immediate};
        } else {
            // The atomic's old value is in the local buffer, which the caller's memory region holds.
            if (ok) {
                std::memcpy(&result,
                            reinterpret_cast<const void*>(self->result_address), // NOLINT(performance-no-int-to-ptr)
                            sizeof result);
            }
        }
        const std::uint32_t units = self->units_;
        self->~AsyncOp();
        release(self, units, handler);
        if (how == How::destroy) return;
        if (direct) {
            std::move(handler)(status, std::move(result));
            return;
        }
        // Never inline here: aborts come from destructors, refusals from the initiating function.
        auto executor = work ? work->get_executor() : boost::asio::get_associated_executor(handler, driver->executor());
        boost::asio::post(executor, boost::asio::append(std::move(handler), status, result));
    }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

    static void release(void* memory, std::uint32_t units, Handler& handler) noexcept {
        if (units == 0) {
            OpMemory::put(memory);
        } else {
            Allocator alloc(boost::asio::get_associated_allocator(handler, DefaultAllocator()));
            std::allocator_traits<Allocator>::deallocate(alloc, static_cast<Unit*>(memory), units);
        }
    }

    Handler handler_;
    std::uint32_t units_; ///< allocator units it was allocated in; 0 for a recycled block
    Slot slot_;
    std::optional<boost::asio::executor_work_guard<Executor>> work_;
};

/// Completes `handler` with `ec` without starting anything: posted to its
/// associated executor (else `fallback`, else the system executor), never
/// called from the initiating function.
template <ResultKind K, class Handler>
void refuse(Handler&& handler, std::error_code ec, const boost::asio::any_io_executor& fallback = {}) {
    const boost::asio::any_io_executor where =
        fallback ? fallback : boost::asio::any_io_executor(boost::asio::system_executor());
    auto executor = boost::asio::get_associated_executor(handler, where);
    boost::asio::post(
        executor, boost::asio::append(std::forward<Handler>(handler), to_asio_error(ec), typename ResultOf<K>::type{}));
}

/// Why `qp` cannot run asynchronous operations, if it cannot.
inline std::error_code async_refusal(const QpCore* qp) noexcept {
    if (qp == nullptr) return errc::invalid_argument;
    if (qp->send_cq()->driver() == nullptr) return errc::no_executor;
    if (qp->recv_cq() != qp->send_cq()) return errc::async_needs_one_cq;
    return no_error();
}

/// The body of every send-side async_*: check, lower, submit.
template <ResultKind K, class Handler>
void start_send(Handler&& handler, QpCore* qp, const WorkRequest& request) {
    if (std::error_code ec = async_refusal(qp)) return refuse<K>(std::forward<Handler>(handler), ec);
    using Op = AsyncOp<std::decay_t<Handler>, K>;
    std::decay_t<Handler> own(std::forward<Handler>(handler)); // lvalue handlers are copied
    Op* op = Op::create(std::move(own), request.local().size());
    AsyncDriver& driver = *qp->send_cq()->driver();
    op->bind(driver);
    ibv_sge* sges = op->entries();
    if (std::error_code ec = lower(request, qp->caps(), op->send_wr, sges, &op->bytes)) {
        op->complete(AsyncOpBase::How::post, ec);
        return;
    }
    op->qp = qp;
    op->owner = qp;
    op->queue = &qp->async_send;
    op->opcode = request.opcode();
    op->result_address = op->send_wr.num_sge > 0 ? sges[0].addr : 0;
    op->send_wr.send_flags |= IBV_SEND_SIGNALED; // the completion is what completes the handler
    driver.submit(op);
}

/// The body of async_receive: the same checks as post_receive (an SRQ QP is refused).
template <class Handler>
void start_receive(Handler&& handler, QpCore* qp, std::span<const LocalBuffer> local) {
    constexpr ResultKind K = ResultKind::received;
    if (std::error_code ec = async_refusal(qp)) return refuse<K>(std::forward<Handler>(handler), ec);
    using Op = AsyncOp<std::decay_t<Handler>, K>;
    std::decay_t<Handler> own(std::forward<Handler>(handler));
    Op* op = Op::create(std::move(own), local.size());
    AsyncDriver& driver = *qp->send_cq()->driver();
    op->bind(driver);
    ReceiveTarget target{};
    std::error_code ec = receive_target(*qp, target);
    if (!ec) {
        op->recv_wr = ibv_recv_wr{}; // the union's receive member from now on
        ec = lower_receive(local, target.max_sge, op->recv_wr, op->entries());
    }
    if (ec) {
        op->complete(AsyncOpBase::How::post, ec);
        return;
    }
    op->qp = qp;
    op->owner = qp;
    op->queue = &qp->async_receive;
    op->behaviour = &receive_behaviour;
    op->opcode = Opcode::receive;
    driver.submit(op);
}

/// The named initiations QueuePair's async_* pass to asio::async_initiate: they
/// expose the I/O executor, so asio::bind_executor, cancel_after and friends see it.
///
/// An operation made now and launched later (asio::deferred, a coroutine's
/// operator co_await) must find out then whether the QueuePair still exists,
/// and complete with operation_aborted if it was destroyed meanwhile, as the
/// async rules promise (async.hpp); the initiation never keeps a destroyed
/// QueuePair's queue pair alive. That check costs a weak reference (atomic
/// counts) and a copy of the executor, which an operation started at once
/// does not need: the initiation made by the async_* call refers to the
/// QueuePair's own core, alive for the whole call, and only a copy or a move
/// — what a token that launches later does with it, still inside the call —
/// turns it into a weak reference plus the executor taken then.
class InitiationBase {
public:
    using executor_type = boost::asio::any_io_executor;

    /// The async_* call's own initiation: `core` is the QueuePair's.
    explicit InitiationBase(const std::shared_ptr<QpCore>& core) noexcept : live_(&core) {}
    InitiationBase(const InitiationBase& other) noexcept : weak_(other.weak()), executor_(other.get_executor()) {}
    InitiationBase(InitiationBase&& other) noexcept
        : weak_(other.live_ != nullptr ? other.weak() : std::move(other.weak_)),
          executor_(other.live_ != nullptr ? other.get_executor() : std::move(other.executor_)) {}
    InitiationBase& operator=(const InitiationBase&) = delete;
    InitiationBase& operator=(InitiationBase&&) = delete;
    ~InitiationBase() = default;

    [[nodiscard]] executor_type get_executor() const noexcept {
        if (live_ == nullptr) return executor_;
        AsyncDriver* d = *live_ ? (*live_)->send_cq()->driver() : nullptr;
        return d != nullptr ? d->executor() : executor_type();
    }

protected:
    /// The queue pair's core, or nullptr when it is gone (`hold` keeps a
    /// weakly held one alive while the operation is started).
    [[nodiscard]] QpCore* acquire(std::shared_ptr<QpCore>& hold) const noexcept {
        if (live_ != nullptr) return live_->get();
        hold = weak_.lock();
        return hold.get();
    }

private:
    [[nodiscard]] std::weak_ptr<QpCore> weak() const noexcept {
        return live_ != nullptr ? std::weak_ptr<QpCore>(*live_) : weak_;
    }

    const std::shared_ptr<QpCore>* live_ = nullptr; ///< set only in the call's own initiation
    std::weak_ptr<QpCore> weak_;
    executor_type executor_;
};

template <ResultKind K>
struct InitiateSend : InitiationBase {
    using InitiationBase::InitiationBase;

    template <class Handler>
    void operator()(Handler&& handler, const WorkRequest& request) const {
        std::shared_ptr<QpCore> hold;
        QpCore* qp = acquire(hold);
        if (qp == nullptr) return refuse<K>(std::forward<Handler>(handler), aborted_error(), get_executor());
        start_send<K>(std::forward<Handler>(handler), qp, request);
    }
};

struct InitiateReceive : InitiationBase {
    using InitiationBase::InitiationBase;

    template <class Handler>
    void operator()(Handler&& handler, const LocalBuffer& one) const {
        (*this)(std::forward<Handler>(handler), std::span<const LocalBuffer>(&one, 1));
    }
    template <class Handler>
    void operator()(Handler&& handler, std::span<const LocalBuffer> list) const {
        std::shared_ptr<QpCore> hold;
        QpCore* qp = acquire(hold);
        if (qp == nullptr) {
            return refuse<ResultKind::received>(std::forward<Handler>(handler), aborted_error(), get_executor());
        }
        start_receive(std::forward<Handler>(handler), qp, list);
    }
};

} // namespace gpuverbs::detail
