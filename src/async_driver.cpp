#include "gpuverbs/detail/async_driver.hpp"

#include "gpuverbs/queue_pair.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>

#include <array>

namespace gpuverbs::detail {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
// Asio's operation_aborted as a std::error_code: ECANCELED in the system
// category, equal to std::errc::operation_canceled.
std::error_code aborted() {
    return {ECANCELED, std::system_category()};
}
} // namespace

AsyncDriver::AsyncDriver(const asio::any_io_executor& executor, std::shared_ptr<CqCore> cq, const AsyncOptions& options)
    : executor_(executor),
      cq_(std::move(cq)),
      channel_(cq_->channel_core()),
      descriptor_(executor, channel_->channel()->fd),
      options_(options) {
    descriptor_.non_blocking(true);
}

AsyncDriver::~AsyncDriver() {
    // The channel owns the fd; the descriptor must not close it.
    if (descriptor_.is_open()) (void)descriptor_.release();
    destroy_all();
}

void AsyncDriver::submit(AsyncOpBase* op) {
    std::lock_guard lock(mutex_);
    on_submit(op);
}

void AsyncDriver::release_qp(std::shared_ptr<QpCore> qp) noexcept {
    std::shared_ptr<AsyncDriver> self = weak_from_this().lock(); // the QP may hold the last reference to us
    try {
        std::lock_guard lock(mutex_);
        abort_qp(qp.get());
        qp.reset(); // destroys the QP under the lock: no poll can run concurrently
    } catch (...) {
        // Posting an abort handler failed (out of memory): destroy what is left
        // rather than let a destructor throw.
        std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): locking an owned mutex cannot fail here
        destroy_all();
        qp.reset();
    }
}

void AsyncDriver::shutdown() noexcept {
    std::shared_ptr<AsyncDriver> self = weak_from_this().lock(); // dropping the CQ may drop the last reference
    try {
        std::lock_guard lock(mutex_);
        closed_ = true;
        abort_all();
        boost::system::error_code ignored;
        descriptor_.cancel(ignored);
        if (descriptor_.is_open()) (void)descriptor_.release();
    } catch (...) {
        // As in release_qp: never throw from teardown; destroy what is left.
    }
    std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): locking an owned mutex cannot fail here
    destroy_all();                // breaks the CQ <-> driver cycle; the CQ goes when its last QP goes
}

template <class OnOp>
void AsyncDriver::take_each(OnOp&& on_op) {
    for (OpList* list : {&live_, &pending_}) {
        OpList ops = list->take();
        while (!ops.empty()) {
            AsyncOpBase* op = ops.front();
            ops.erase(op);
            if (list == &pending_) op->qp->async_pending = 0;
            on_op(op);
        }
    }
}

void AsyncDriver::destroy_all() noexcept {
    closed_ = true;
    take_each([](AsyncOpBase* op) { op->destroy(); });
    live_count_ = pending_count_ = 0;
    cq_.reset();
}

bool AsyncDriver::has_room(const AsyncOpBase* op) const {
    return op->opcode == Opcode::receive ? op->qp->receive.has_room_for(1) : op->qp->send.has_room_for(1);
}

void AsyncDriver::on_submit(AsyncOpBase* op) {
    if (closed_) {
        op->fail(aborted());
        return;
    }
    // Wait in order behind earlier operations of the same QP, or for room.
    if (op->qp->async_pending > 0 || !has_room(op)) {
        pending_.push_back(op);
        ++pending_count_;
        ++op->qp->async_pending;
        activity();
        return;
    }
    if (std::error_code ec = post_now(op)) {
        op->fail(ec);
        return;
    }
    activity();
}

std::error_code AsyncDriver::post_now(AsyncOpBase* op) {
    QpCore& qp = *op->qp;
    const auto context = reinterpret_cast<std::uintptr_t>(op);
    std::error_code ec;
    if (op->opcode == Opcode::receive) {
        ec = post_receive_to(qp.receive, QueueKind::receive, qp.caps().max_recv_sge, {&op->local, 1}, context,
                             [&qp](ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp.qp(), wr, bad); });
    } else {
        SendDescription d{
            op->opcode,    {&op->local, 1}, &op->remote, op->remote_offset,
            op->immediate, op->compare_add, op->swap,    SendOptions{.context = context, .signaled = true}};
        ibv_send_wr wr;
        std::array<ibv_sge, max_sge_per_request> sges;
        ec = fill_send_request(d, qp.caps(), wr, sges.data());
        if (!ec) ec = post_send_request(qp, wr, context, d.opcode);
    }
    if (!ec) {
        op->posted = true;
        live_.push_back(op);
        ++live_count_;
    }
    return ec;
}

void AsyncDriver::retry_pending() {
    // Post waiting operations in order; once one of a QP's must keep waiting,
    // the later ones of that QP wait too.
    std::array<const QpCore*, 16> blocked{};
    std::size_t blocked_count = 0;
    auto is_blocked = [&](const QpCore* qp) {
        if (blocked_count == blocked.size()) return true;
        for (std::size_t i = 0; i < blocked_count; ++i) {
            if (blocked[i] == qp) return true;
        }
        return false;
    };
    AsyncOpBase* op = pending_.front();
    while (op != nullptr) {
        AsyncOpBase* next = op->next;
        const QpCore* qp = op->qp.get();
        if (!is_blocked(qp)) {
            if (has_room(op)) {
                pending_.erase(op);
                --pending_count_;
                --op->qp->async_pending;
                if (std::error_code ec = post_now(op)) op->fail(ec);
            } else if (blocked_count < blocked.size()) {
                blocked[blocked_count++] = qp;
            }
        }
        op = next;
    }
}

void AsyncDriver::activity() {
    if (closed_ || outstanding() == 0) return;
    if (options_.mode == CompletionMode::adaptive) {
        spin_until_ = Clock::now() + options_.spin;
        if (!spinning_) {
            spinning_ = true;
            asio::post(executor_, [self = shared_from_this()] {
                std::lock_guard lock(self->mutex_);
                self->spin();
            });
        }
        return;
    }
    arm_and_wait();
}

void AsyncDriver::spin() {
    if (closed_) {
        spinning_ = false;
        return;
    }
    // Poll in place for a short while before yielding: a trip through the
    // io_context's scheduler costs far more than a poll of the CQ.
    const auto inline_until = std::min(spin_until_, Clock::now() + std::chrono::microseconds(20));
    std::size_t completed = 0;
    do {
        completed = drain();
    } while (completed == 0 && outstanding() > 0 && Clock::now() < inline_until);
    if (completed > 0) {
        retry_pending();
        spin_until_ = Clock::now() + options_.spin;
    }
    if (outstanding() == 0) {
        spinning_ = false;
        return;
    }
    if (Clock::now() < spin_until_) {
        // Yield to other handlers between polls; the operation is recycled, not allocated.
        asio::post(executor_, [self = shared_from_this()] {
            std::lock_guard lock(self->mutex_);
            self->spin();
        });
        return;
    }
    spinning_ = false;
    arm_and_wait();
}

void AsyncDriver::arm_and_wait() {
    if (closed_ || waiting_) return;
    // Arm, then poll once more: a completion that arrived before arming raises no event.
    for (;;) {
        (void)ibv_req_notify_cq(cq_->cq(), 0);
        if (drain() == 0) break;
        retry_pending();
    }
    if (outstanding() == 0) return;
    waiting_ = true;
    descriptor_.async_wait(asio::posix::stream_descriptor::wait_read,
                           [self = shared_from_this()](const boost::system::error_code& ec) {
                               std::lock_guard lock(self->mutex_);
                               self->on_readable(ec);
                           });
}

void AsyncDriver::on_readable(const boost::system::error_code& ec) {
    waiting_ = false;
    if (closed_ || ec == asio::error::operation_aborted) return;
    // Take every event queued on the channel (acknowledged in batches by the CQ core).
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    while (ibv_get_cq_event(channel_->channel(), &cq, &context) == 0) {
        static_cast<CqCore*>(context)->count_event();
    }
    drain();
    retry_pending();
    activity();
}

std::size_t AsyncDriver::drain() {
    std::array<Completion, 32> batch;
    std::size_t total = 0;
    for (;;) {
        int n = cq_->poll(batch.data(), static_cast<int>(batch.size()));
        if (n <= 0) break;
        for (int i = 0; i < n; ++i) {
            // The context of an asynchronous request is its operation (see post_now).
            auto* op = reinterpret_cast<AsyncOpBase*>( // NOLINT(performance-no-int-to-ptr)
                static_cast<std::uintptr_t>(batch[i].context));
            if (op == nullptr) continue; // a completion of a QP already destroyed
            finish(op, &batch[i], {});
        }
        total += static_cast<std::size_t>(n);
        if (n < static_cast<int>(batch.size())) break;
    }
    return total;
}

void AsyncDriver::finish(AsyncOpBase* op, const Completion* c, std::error_code ec) {
    if (op->posted) {
        live_.erase(op);
        --live_count_;
    }
    if (c != nullptr) {
        op->complete(*c);
    } else {
        op->fail(ec);
    }
}

void AsyncDriver::stop_waiting_if_idle() {
    // A pending wait on the channel keeps the io_context running; with nothing
    // outstanding there is nothing to wait for.
    if (waiting_ && outstanding() == 0) {
        boost::system::error_code ignored;
        descriptor_.cancel(ignored);
    }
}

void AsyncDriver::abort_qp(const QpCore* qp) {
    for (OpList* list : {&live_, &pending_}) {
        AsyncOpBase* op = list->front();
        while (op != nullptr) {
            AsyncOpBase* next = op->next;
            if (op->qp.get() == qp) {
                list->erase(op);
                --(list == &live_ ? live_count_ : pending_count_);
                if (list == &pending_) --op->qp->async_pending;
                op->posted = false;
                op->fail(aborted());
            }
            op = next;
        }
    }
    stop_waiting_if_idle();
}

void AsyncDriver::abort_all() {
    take_each([](AsyncOpBase* op) {
        op->posted = false;
        op->fail(aborted());
    });
    live_count_ = pending_count_ = 0;
}

OpPool& OpPool::instance() {
    // Never destroyed: operations may be freed during static destruction.
    static OpPool* pool = new OpPool;
    return *pool;
}

void* OpPool::get() {
    {
        std::lock_guard lock(mutex_);
        if (free_ != nullptr) {
            void* block = free_;
            free_ = *static_cast<void**>(block);
            --cached_;
            return block;
        }
    }
    return ::operator new(block_size);
}

void OpPool::put(void* block) noexcept {
    {
        std::lock_guard lock(mutex_);
        if (cached_ < max_cached) {
            *static_cast<void**>(block) = free_;
            free_ = block;
            ++cached_;
            return;
        }
    }
    ::operator delete(block);
}

boost::system::error_code to_asio_error(const std::error_code& ec) noexcept {
    if (!ec) return {};
    if (ec.category() == std::system_category()) {
        if (ec.value() == ECANCELED) return asio::error::operation_aborted;
        return {ec.value(), boost::system::system_category()};
    }
    return boost::system::error_code(ec);
}

void AsyncDriverService::add(const std::shared_ptr<AsyncDriver>& driver) {
    std::lock_guard lock(mutex_);
    std::erase_if(drivers_, [](const std::weak_ptr<AsyncDriver>& w) { return w.expired(); });
    drivers_.push_back(driver);
}

void AsyncDriverService::shutdown() {
    std::vector<std::shared_ptr<AsyncDriver>> alive;
    {
        std::lock_guard lock(mutex_);
        for (auto& w : drivers_) {
            if (auto d = w.lock()) alive.push_back(std::move(d));
        }
        drivers_.clear();
    }
    for (auto& d : alive) {
        std::lock_guard lock(d->mutex_);
        d->destroy_all();
    }
}

} // namespace gpuverbs::detail
