// The asynchronous engine's I/O: the lock, the verbs calls, the completion
// channel's fd and the dispatch of handlers. Every bookkeeping decision is
// AsyncFsm's (include/gpuverbs/detail/async/async_fsm.hpp).
#include "gpuverbs/detail/async/async_driver.hpp"

#include "gpuverbs/async.hpp"

#include "gpuverbs/detail/async/async_op.hpp"
#include "gpuverbs/detail/async/liveness.hpp"
#include "gpuverbs/detail/data_path/completion_path.hpp"
#include "gpuverbs/detail/data_path/posting_path.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <array>
#include <atomic>
#include <mutex>

namespace gpuverbs::detail {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
AsyncOpBase* op_of(AsyncOpLinks* links) noexcept {
    return static_cast<AsyncOpBase*>(links);
}
} // namespace

AsyncDriver::AsyncDriver(const asio::any_io_executor& executor, CqCore& cq, const AsyncOptions& options)
    : executor_(executor),
      mutex_(options.single_threaded),
      cq_(&cq),
      channel_(cq.channel_core()),
      descriptor_(executor, channel_->channel()->fd),
      options_(options),
      watch_timer_(executor) {
    descriptor_.non_blocking(true);
}

AsyncDriver::~AsyncDriver() {
    // The channel owns the fd; the descriptor must not close it.
    if (descriptor_.is_open()) (void)descriptor_.release();
    destroy_all();
}

// --- the behaviours of single operations --------------------------------------

namespace {
// The slot's context is the operation: the completion leads back to it.
std::uint64_t context_of(AsyncOpBase& op) noexcept {
    return reinterpret_cast<std::uintptr_t>(&op);
}
bool send_has_room(const AsyncOpBase& op) noexcept {
    return op.qp->send.has_room_for(1);
}
std::error_code send_post(AsyncOpBase& op) noexcept {
    return submit_send(*op.qp, static_cast<SingleOp&>(op).send_wr, context_of(op), op.opcode);
}
bool receive_has_room(const AsyncOpBase& op) noexcept {
    return op.qp->receive.has_room_for(1);
}
std::error_code receive_post(AsyncOpBase& op) noexcept {
    ReceiveTarget target{};
    if (std::error_code ec = receive_target(*op.qp, target)) return ec; // also checked at initiation
    return submit_receive(target, static_cast<SingleOp&>(op).recv_wr, context_of(op));
}
Completed single_completed(AsyncOpBase& op, const ibv_wc& wc, std::uint64_t /*sequence*/) noexcept {
    if (op.state != OpState::posted) return Completed::still_posted; // aborted or cancelled: it leads nowhere
    op.record(wc);
    return Completed::finished;
}
void single_abandon(AsyncOpBase& op, std::error_code ec) noexcept {
    op.failure = ec;
}
} // namespace

const OpBehaviour send_behaviour{&send_has_room, &send_post, &single_completed, &single_abandon, nullptr};
const OpBehaviour receive_behaviour{&receive_has_room, &receive_post, &single_completed, &single_abandon, nullptr};

void AsyncDriver::completed(AsyncOpBase& op, const ibv_wc& wc, std::uint64_t sequence, OpList& done) noexcept {
    switch (op.behaviour->completed(op, wc, sequence)) {
        case Completed::still_posted: return;
        case Completed::wait_again: fsm_.wait_again(&op); return;
        case Completed::finished:
            if (fsm_.finished(&op)) done.push_back(&op);
            return;
    }
}

// Only std::bad_alloc from Asio (the wait's or the spin's handler) can escape
// here; the driver cannot go on without them, so termination is the answer.
// NOLINTNEXTLINE(bugprone-exception-escape)
void AsyncDriver::submit(AsyncOpBase* op) noexcept {
    std::error_code refused;
    {
        std::lock_guard lock(mutex_);
        if (!watching_) {
            // The watch starts afresh: a tick number no tick takes, so what the
            // last tick of the previous watch saw is a first look again (liveness.hpp).
            ++tick_;
            start_watch();
        }
        switch (fsm_.submit(op, op->behaviour->has_room(*op))) {
            case AsyncFsm::Submit::abort: refused = aborted_error(); break;
            case AsyncFsm::Submit::wait: break;
            case AsyncFsm::Submit::post: {
                // Event-driven and idle: arm before posting, so the completion
                // cannot slip in before the CQ is armed (and no poll is needed).
                if (options_.mode == CompletionMode::event_driven && !waiting_) arm();
                if (std::error_code ec = op->behaviour->post(*op)) {
                    fsm_.post_failed(op);
                    refused = ec;
                    break;
                }
                fsm_.posted(op);
                if (options_.mode == CompletionMode::adaptive) {
                    start_spinning();
                } else if (options_.mode == CompletionMode::event_driven && !waiting_) {
                    waiting_ = true;
                    descriptor_.async_wait(
                        asio::posix::stream_descriptor::wait_read,
                        [self = shared_from_this()](const boost::system::error_code& ec) { self->on_readable(ec); });
                }
                break;
            }
        }
    }
    if (refused) op->complete(AsyncOpBase::How::post, refused);
}

void AsyncDriver::cancel(AsyncOpBase* op) noexcept {
    bool taken = false;
    {
        std::lock_guard lock(mutex_);
        taken = fsm_.cancel(op);
    }
    // Posted, never run inside the emitter of the cancellation signal.
    if (taken) op->complete(AsyncOpBase::How::post, aborted_error());
}

void AsyncDriver::stop(AsyncOpBase& op) noexcept {
    bool taken = false;
    {
        std::lock_guard lock(mutex_);
        if (op.behaviour->stop != nullptr) op.behaviour->stop(op);
        taken = fsm_.cancel(&op);
    }
    if (taken) op.complete(AsyncOpBase::How::post, aborted_error());
}

void AsyncDriver::start_spinning() {
    if (spinning_ || closed_) return;
    spinning_ = true;
    spin_deadline_set_ = false;
    asio::post(executor_, [self = shared_from_this()] { self->spin(); });
}

std::size_t AsyncDriver::drain(OpList& done) noexcept {
    // The same poll as CompletionQueue::poll (completion_path.hpp); a slot's
    // context is the operation the completion finishes.
    constexpr int batch = 32;
    std::size_t total = 0;
    for (;;) {
        auto on = [this, &done](const ibv_wc& wc, WorkQueueState* queue, int) {
            if (queue == nullptr) return; // a completion of a QP already destroyed (its operations were aborted)
            const WorkQueueState::Finished finished = queue->complete(WrId::slot(wc.wr_id));
            auto* op = reinterpret_cast<AsyncOpBase*>( // NOLINT(performance-no-int-to-ptr)
                static_cast<std::uintptr_t>(finished.context));
            if (op != nullptr) completed(*op, wc, finished.sequence, done);
        };
        // One thread: no QP can be destroyed during this poll, no guard needed.
        const int n = options_.single_threaded ? poll_completions<false>(cq_->cq(), cq_->registry(), batch, on)
                                               : poll_completions<true>(cq_->cq(), cq_->registry(), batch, on);
        ++polls_;
        if (n <= 0) {
            if (total == 0) ++empty_polls_;
            break;
        }
        total += static_cast<std::size_t>(n);
        work_completions_ += static_cast<std::uint64_t>(n);
        if (n < batch) break;
    }
    return total;
}

void AsyncDriver::post_ready(OpList& done) noexcept {
    if (fsm_.waiting_count() == 0) return;
    fsm_.begin_pass();
    while (AsyncOpLinks* links =
               fsm_.next_ready([](AsyncOpLinks* l) { return op_of(l)->behaviour->has_room(*op_of(l)); })) {
        AsyncOpBase* op = op_of(links);
        if (std::error_code ec = op->behaviour->post(*op)) {
            fsm_.post_failed(op);
            op->failure = ec; // deliver() hands it to the handler
            done.push_back(op);
            continue;
        }
        fsm_.posted(op);
    }
}

void AsyncDriver::arm_and_wait(OpList& done) {
    if (closed_ || waiting_) return;
    // Armed once: a completion that arrives after this raises an event; one
    // that came before is found by the drain. A drain that finds completions
    // needs no second arm — those that came after arming raised an event
    // already (at worst the wake-up finds the CQ empty and arms again).
    arm();
    if (drain(done) > 0) post_ready(done);
    if (fsm_.outstanding() == 0) return;
    waiting_ = true;
    descriptor_.async_wait(asio::posix::stream_descriptor::wait_read,
                           [self = shared_from_this()](const boost::system::error_code& ec) { self->on_readable(ec); });
}

void AsyncDriver::on_readable(const boost::system::error_code& ec) {
    OpList done;
    {
        std::lock_guard lock(mutex_);
        waiting_ = false;
        if (closed_) return;
        // A cancelled wait (a QueuePair was released while nothing else was
        // outstanding) goes on like any other: an operation submitted since
        // saw waiting_ and relied on this wait, so the CQ is drained and, if
        // anything is outstanding, armed and waited on again.
        (void)ec;
        // Take the event (acknowledged in batches by the CQ core). One read:
        // the channel is this CQ's own (made with it) and is armed only when
        // no event is outstanding (arm()), so it holds at most one; the drain
        // below finds every completion whatever the events say.
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(channel_->channel(), &cq, &context) == 0) {
            static_cast<CqCore*>(context)->count_event();
            ++wakeups_;
            armed_ = false; // an event disarms the CQ
        }
        drain(done);
        post_ready(done);
        // Operations still outstanding need the next event (adaptive: polling
        // again); a dependent chain's next operation arms for itself when its
        // handler starts it.
        if (fsm_.outstanding() > 0) {
            if (options_.mode == CompletionMode::adaptive) {
                start_spinning();
            } else {
                arm_and_wait(done);
            }
        }
    }
    deliver(done);
}

void AsyncDriver::spin() {
    // Polls from the executor, running handlers between polls, until nothing
    // is outstanding, or nothing completed for options_.spin (then it waits on
    // the fd). Yields to the executor's other work every rounds_per_yield polls.
    constexpr int rounds_per_yield = 64;
    for (int round = 0; round < rounds_per_yield; ++round) {
        OpList done;
        bool keep_spinning = true;
        {
            std::lock_guard lock(mutex_);
            if (closed_) {
                spinning_ = false;
                return;
            }
            const std::size_t n = drain(done);
            post_ready(done);
            if (n > 0) {
                spin_deadline_set_ = false;
            } else if (fsm_.outstanding() == 0) {
                spinning_ = keep_spinning = false; // a handler starting a new operation spins again
            } else {
                // The clock is read only when a poll found nothing.
                const auto now = Clock::now();
                if (!spin_deadline_set_) {
                    spin_deadline_ = now + options_.spin;
                    spin_deadline_set_ = true;
                } else if (now >= spin_deadline_) {
                    spinning_ = keep_spinning = false;
                    arm_and_wait(done);
                }
            }
        }
        deliver(done);
        if (!keep_spinning) return;
    }
    asio::post(executor_, [self = shared_from_this()] { self->spin(); });
}

void AsyncDriver::deliver(OpList& done) noexcept {
    while (AsyncOpLinks* links = done.pop_front()) op_of(links)->complete(AsyncOpBase::How::direct);
}

void AsyncDriver::abort(OpList& ops) noexcept {
    while (AsyncOpLinks* links = ops.pop_front()) op_of(links)->complete(AsyncOpBase::How::post, aborted_error());
}

void AsyncDriver::stop_waiting_if_idle() noexcept {
    // A pending wait on the channel keeps the io_context running; with nothing
    // outstanding there is nothing to wait for.
    if (waiting_ && fsm_.outstanding() == 0) {
        boost::system::error_code ignored;
        descriptor_.cancel(ignored);
    }
}

// --- liveness (liveness.hpp) ------------------------------------------------

void AsyncDriver::start_watch() {
    if (watching_ || closed_ || options_.liveness_tick.count() <= 0) return;
    watching_ = true;
    if (polled()) { // progress() looks when the tick is due: no timer on the owner's context
        watch_due_ = Clock::now() + options_.liveness_tick;
        return;
    }
    watch_timer_.expires_after(options_.liveness_tick);
    watch_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) { self->on_watch(ec); });
}

// Only std::bad_alloc from Asio (the next wait's handler) can escape: as submit().
// NOLINTNEXTLINE(bugprone-exception-escape)
void AsyncDriver::on_watch(const boost::system::error_code& ec) {
    OpList done;
    {
        std::lock_guard lock(mutex_);
        watching_ = false;
        // Nothing outstanding: the watch stops (the next submit starts it), so
        // an idle CQ keeps no timer and lets its io_context's run() return.
        if (ec || closed_ || fsm_.outstanding() == 0) return;
        watch(done);
        post_ready(done);
        stop_waiting_if_idle();
        if (fsm_.outstanding() > 0) start_watch();
    }
    deliver(done);
}

std::size_t AsyncDriver::progress() noexcept {
    OpList done;
    {
        std::lock_guard lock(mutex_);
        if (closed_) return 0;
        if (fsm_.outstanding() == 0) {
            watching_ = false; // idle: the next submit starts the watch afresh
            return 0;
        }
        drain(done);
        post_ready(done);
        if (watching_) {
            const auto now = Clock::now();
            if (fsm_.outstanding() == 0) {
                watching_ = false; // the next submit starts it again
            } else if (now >= watch_due_) {
                watch(done);
                post_ready(done);
                watch_due_ = now + options_.liveness_tick;
            }
        }
    }
    std::size_t finished = 0;
    for (AsyncOpLinks* l = done.front(); l != nullptr; l = l->next) ++finished;
    deliver(done);
    return finished;
}

void AsyncDriver::watch(OpList& done) noexcept {
    ++tick_;
    ports_seen_count_ = 0;
    const auto now = Clock::now();
    // The queue pairs whose operations gpuverbs ends now: collected first (ending them edits the lists walked).
    std::array<QpCore*, 16> ending{};
    std::size_t n = 0;
    for (AsyncOpLinks* list : {fsm_.first_posted(), fsm_.first_waiting()}) {
        for (AsyncOpLinks* l = list; l != nullptr; l = l->next) {
            QpCore* qp = op_of(l)->qp;
            if (qp == nullptr || qp->watch.stamp == tick_) continue;
            const bool first_look = qp->watch.stamp + 1 != tick_; // the last tick did not look at it
            qp->watch.stamp = tick_;
            // Every queue pair is looked at (its clock and sightings stay continuous);
            // more than 16 to end at once: the rest on the next tick (judge() says so again).
            if (examine(*qp, now, first_look) && n < ending.size())
                ending[n++] = qp; // more than 16 at once: the rest on the next tick
        }
    }
    for (std::size_t k = 0; k < n; ++k) complete_by_library(*ending[k], done);
}

bool AsyncDriver::examine(QpCore& qp, Clock::time_point now, bool first_look) noexcept {
    QpWatch& w = qp.watch;
    if (qp.qp()->qp_type != IBV_QPT_RC) return false; // a datagram queue pair has no connection to lose
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (!w.timers_known &&
        ibv_query_qp(qp.qp(), &attr, IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, &init) == 0) {
        w.port = attr.port_num;
        w.timeout = attr.timeout;
        w.retry_count = attr.retry_cnt;
        w.rnr_retry = attr.rnr_retry;
        w.timers_known = true;
    }
    // Progress seen without asking the device: the queue pair finished
    // requests since the last look, so it is not stalled and its port carried
    // them. Only what judge() would record of such a look is recorded (its
    // port and state are read again on the first look without progress), so
    // a tick of a busy engine costs no verbs call.
    if (!first_look && w.timers_known && !qp.health.failed() && w.last_progress != Clock::time_point{} &&
        qp.send.retired() != w.last_retired) {
        w.last_retired = qp.send.retired();
        w.last_progress = now;
        w.port_down_looks = 0;
        w.query_failures = 0;
        return false;
    }
    QpSight sight;
    sight.first_look = first_look;
    sight.known_failed = qp.health.failed();
    if (!sight.known_failed) {
        attr = {};
        if (ibv_query_qp(qp.qp(), &attr, IBV_QP_STATE | IBV_QP_SQ_PSN, &init) == 0) {
            sight.provider_error = attr.qp_state == IBV_QPS_ERR || attr.qp_state == IBV_QPS_SQE;
            sight.sq_psn = attr.sq_psn & 0xffffffU;
        } else {
            sight.query_failed = true;
        }
        sight.send_outstanding = qp.send.outstanding();
        sight.send_retired = qp.send.retired();
        if (sight.send_outstanding > 0) {
            sight.port_active = port_active(qp);
            if (w.timers_known)
                sight.stall_after =
                    stall_bound(w, qp.send.oldest_opcode(), options_.stall_margin, options_.receiver_wait);
        }
    }
    using Cause = QueuePairFailure::Cause;
    auto move_to_error = [&] {
        // The provider flushes what it holds (or, if it does not, the flush
        // grace ends it) and nothing more of this queue pair goes on the
        // wire. Refused, it is tried again on every tick until the library
        // completes its operations (they end all the same).
        w.moved_to_error = qp.move_to_error() == 0;
        w.move_pending = !w.moved_to_error;
    };
    if (sight.known_failed && w.move_pending) move_to_error();
    switch (judge(w, sight, now, options_.flush_grace)) {
        case LivenessVerdict::healthy:
        case LivenessVerdict::wait_for_flush: return false;
        case LivenessVerdict::provider_error:
            if (qp.health.fail(Cause::provider_reports_error, 0)) ++declared_failed_;
            return false;
        case LivenessVerdict::port_down:
            if (qp.health.fail(Cause::port_down, w.port)) ++declared_failed_;
            move_to_error();
            return false;
        case LivenessVerdict::stalled:
            if (qp.health.fail(Cause::stalled, 0)) ++declared_failed_;
            move_to_error();
            return false;
        case LivenessVerdict::complete_by_library: return true;
    }
    return false;
}

bool AsyncDriver::port_active(QpCore& qp) noexcept {
    ibv_context* context = qp.qp()->context;
    const std::uint8_t port = qp.watch.port;
    if (port == 0) return true;
    for (std::size_t k = 0; k < ports_seen_count_; ++k) {
        if (ports_seen_[k].context == context && ports_seen_[k].port == port) return ports_seen_[k].active;
    }
    ibv_port_attr attr{};
    // A port that cannot be read is not known to be up (judge() acts only on a second sighting).
    const bool active = ibv_query_port(context, port, &attr) == 0 && attr.state == IBV_PORT_ACTIVE;
    if (ports_seen_count_ < ports_seen_.size()) ports_seen_[ports_seen_count_++] = {context, port, active};
    return active;
}

void AsyncDriver::complete_by_library(QpCore& qp, OpList& done) noexcept {
    std::error_code ec = errc::queue_pair_in_error;
    if (qp.health.cause() == QueuePairFailure::Cause::port_down) ec = errc::port_down;
    if (qp.health.cause() == QueuePairFailure::Cause::stalled) ec = errc::queue_pair_stalled;
    OpList ops = fsm_.release(&qp);
    while (AsyncOpLinks* links = ops.pop_front()) {
        AsyncOpBase* op = op_of(links);
        op->behaviour->abandon(*op, ec);
        ++completed_by_library_;
        done.push_back(op);
    }
    // What the provider delivers later finds no operation (they are freed once their handlers ran).
    qp.send.forget_outstanding();
    if (qp.srq() == nullptr) qp.receive.forget_outstanding();
}

void AsyncDriver::release_qp(std::shared_ptr<QpCore> qp) noexcept {
    std::shared_ptr<AsyncDriver> self = weak_from_this().lock(); // the QP may hold the last reference to us
    OpList ops;
    {
        std::lock_guard lock(mutex_);
        ops = fsm_.release(qp.get());
        stop_waiting_if_idle();
        qp.reset(); // destroys the QP under the lock: no poll runs concurrently
    }
    // Completed once the lock is released: a transfer's rail may fail over
    // and submit to this very driver (no library code runs under the lock).
    abort(ops);
}

bool AsyncDriver::fail_queue_pair_of(const AsyncOpBase& op, QueuePairFailure::Cause cause) noexcept {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    // Only while the operation is posted: one that completed (or is being
    // completed) leaves its queue pair alone. Its queue pair lives while it is posted.
    bool posted = false;
    for (AsyncOpLinks* l = fsm_.first_posted(); l != nullptr && !posted; l = l->next) posted = op_of(l) == &op;
    if (!posted || op.qp == nullptr) return false;
    QpCore& qp = *op.qp;
    if (qp.health.fail(cause, 0)) ++declared_failed_;
    // Refused, the watch tries again on every tick; the flush grace ends the operation all the same.
    qp.watch.moved_to_error = qp.move_to_error() == 0;
    qp.watch.move_pending = !qp.watch.moved_to_error;
    return true;
}

bool AsyncDriver::has_operations(const QpCore& qp) noexcept {
    std::lock_guard lock(mutex_);
    return qp.async_send.waiting + qp.async_receive.waiting > 0 || qp.send.outstanding() > 0 ||
           (qp.srq() == nullptr && qp.receive.outstanding() > 0);
}

void AsyncDriver::shutdown() noexcept {
    std::shared_ptr<AsyncDriver> self = weak_from_this().lock(); // dropping the CQ may drop the last reference
    OpList ops;
    {
        std::lock_guard lock(mutex_);
        closed_ = true;
        ops = fsm_.shutdown();
        boost::system::error_code ignored;
        descriptor_.cancel(ignored);
        try {
            watch_timer_.cancel(); // throws only where the reactor cannot cancel, which a timer never meets
        } catch (...) {
            // NOLINT(bugprone-empty-catch): a watch left pending ends as closed_ says
        }
        if (descriptor_.is_open()) (void)descriptor_.release();
    }
    abort(ops); // after the lock, as release_qp
}

void AsyncDriver::destroy_all() noexcept {
    OpList ops = close_all();
    destroy(ops);
}

OpList AsyncDriver::close_all() noexcept {
    closed_ = true;
    return fsm_.shutdown();
}

void AsyncDriver::destroy(OpList& ops) noexcept {
    while (AsyncOpLinks* links = ops.pop_front()) op_of(links)->complete(AsyncOpBase::How::destroy);
}

AsyncStatistics AsyncDriver::statistics() noexcept {
    std::lock_guard lock(mutex_);
    const AsyncCounters& c = fsm_.counters();
    return {c.submitted,  c.waited, c.finished,        c.aborted,        c.cancelled,          polls_,
            empty_polls_, wakeups_, work_completions_, declared_failed_, completed_by_library_};
}

void AsyncDriverService::add(const std::shared_ptr<AsyncDriver>& driver) {
    std::lock_guard lock(mutex_);
    std::erase_if(drivers_, [](const std::weak_ptr<AsyncDriver>& w) { return w.expired(); });
    drivers_.push_back(driver);
    if (driver->polled()) {
        std::erase_if(polled_, [](const std::weak_ptr<AsyncDriver>& w) { return w.expired(); });
        polled_.push_back(driver);
    }
}

std::size_t AsyncDriverService::progress() noexcept {
    // The drivers are taken under the list's lock, a few at a time, and run
    // without it: a handler may make a CQ (add() takes the lock), and the
    // last reference to a driver may go here. A driver added meanwhile is
    // reached on this pass or the next.
    std::size_t finished = 0;
    std::array<std::shared_ptr<AsyncDriver>, 8> batch;
    for (std::size_t k = 0;;) {
        std::size_t n = 0;
        {
            std::lock_guard lock(mutex_);
            for (; k < polled_.size() && n < batch.size(); ++k) {
                if (auto d = polled_[k].lock()) batch[n++] = std::move(d);
            }
        }
        for (std::size_t i = 0; i < n; ++i) {
            finished += batch[i]->progress();
            batch[i].reset();
        }
        if (n < batch.size()) break;
    }
    return finished;
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
        OpList ops;
        {
            std::lock_guard lock(d->mutex_);
            ops = d->close_all();
        }
        AsyncDriver::destroy(ops);
    }
}

} // namespace gpuverbs::detail

namespace gpuverbs {

namespace {
/// How deep this thread is in progress() (a handler that calls it again).
thread_local int progress_depth = 0;
} // namespace

std::size_t progress(boost::asio::io_context& io) {
    // Every CQ bound to io made the service; without one it is made empty here.
    std::size_t ran = boost::asio::use_service<detail::AsyncDriverService>(io).progress();
    // What was posted (an abort, a handler bound elsewhere that came back, a
    // timer that fired): with no outstanding work io_context::poll returns at
    // once, so an idle context costs no system call. Called from a handler
    // that progress() is running, only the CQs: io_context::restart must not
    // run inside its own poll.
    if (progress_depth > 0) return ran;
    ++progress_depth;
    struct Leave {
        ~Leave() { --progress_depth; }
    } leave;
    if (io.stopped()) io.restart(); // a poll that found no work stopped it
    ran += io.poll();               // a handler's exception comes out here, as from io_context::poll
    return ran;
}

} // namespace gpuverbs
