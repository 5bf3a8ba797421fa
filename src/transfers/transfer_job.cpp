// The job behind async_transfer (detail/transfers/transfer_job.hpp): it
// binds the rails, sets up one stream per rail, feeds TransferFsm every
// event and performs what it decides.
#include "gpuverbs/detail/access.hpp"
#include "gpuverbs/transfers/transfer.hpp"

#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/detail/deadline.hpp"

#include "text.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <utility>

namespace gpuverbs::detail {

namespace {

/// A rail's failure in gpuverbs' own words where gpuverbs failed its queue
/// pair itself or its port is down (empty words: a completion failed, whose
/// words are the provider's), and its cause as one word.
struct Reason {
    std::string words;
    const char* cause = "completion";
};

Reason library_reason(QpCore& qp, std::chrono::steady_clock::time_point started) {
    const QpHealth& health = qp.health;
    if (!health.failed()) return {};
    using Cause = QueuePairFailure::Cause;
    const auto at = std::chrono::duration_cast<std::chrono::milliseconds>(health.since() - started).count();
    const std::string when = at >= 0 ? " at +" + std::to_string(at) + " ms" : " before the transfer started";
    switch (health.cause()) {
        case Cause::port_down:
            return {"its port " + std::to_string(health.detail()) + " went down" + when +
                        " (gpuverbs moved its queue pair to the error state)",
                    "port_down"};
        case Cause::stalled:
            return {
                "its requests made no progress for longer than the stall bound; gpuverbs moved its queue pair "
                "to the error state" +
                    when,
                "stalled"};
        case Cause::notification_not_taken:
            return {
                "the peer did not take the notification in time; gpuverbs moved its queue pair to the error "
                "state" +
                    when,
                "notification_not_taken"};
        case Cause::provider_reports_error:
            return {"its queue pair was found in the error state" + when +
                        " (the peer answered with an error, or disconnected)",
                    "queue_pair_error"};
        case Cause::moved_to_error:
            return {"its queue pair was moved to the error state (force_error)" + when, "queue_pair_error"};
        case Cause::completion_failed: {
            // The provider's words are the reason, unless they only say the
            // request was flushed or inconsistent (rxe's word for a link that
            // went down): then the port, if it is down, is the cause.
            const auto status = static_cast<ibv_wc_status>(health.detail());
            if (status != IBV_WC_WR_FLUSH_ERR && status != IBV_WC_LOC_QP_OP_ERR) return {};
            ibv_qp_attr attr{};
            ibv_qp_init_attr init{};
            ibv_port_attr port{};
            if (ibv_query_qp(qp.qp(), &attr, IBV_QP_PORT, &init) != 0) return {};
            if (ibv_query_port(qp.qp()->context, attr.port_num, &port) == 0 && port.state == IBV_PORT_ACTIVE) return {};
            return {"its port " + std::to_string(attr.port_num) + " is down (its requests failed" + when + ")",
                    "port_down"};
        }
    }
    return {};
}

} // namespace

std::vector<BoundRail> bind_rails(std::span<const TransferRail> rails) {
    std::vector<BoundRail> out;
    out.reserve(rails.size());
    for (const TransferRail& r : rails) {
        BoundRail b;
        if (r.qp != nullptr && *r.qp) {
            b.qp = access::core(static_cast<const DataPath&>(*r.qp));
            b.given = true;
        }
        b.local_keys = r.local_keys;
        b.remote_keys = r.remote_keys;
        out.push_back(std::move(b));
    }
    return out;
}

bool TransferJobBase::setup(std::span<const BoundRail> bound, const TransferPlan& plan, const TransferOptions& options,
                            bool every_rail, std::error_code& ec, std::string& why) {
    plan_ = &plan;
    notify_ = options.notify;
    // 0.1's outputs, through their values (reading them there is not the deprecated use).
    old_failed_blocks_ = options.failed_blocks.value;
    rail_bytes_ = options.rail_bytes.value;
    old_report_ = options.report.value;
    report_blocks_ = options.report_blocks || old_report_ != nullptr;
    deadline_at_ = options.deadline;
    notification_timeout_ = options.notification_timeout;
    auto refuse = [&](std::error_code code, std::string text) {
        ec = code;
        why = std::move(text);
        return false;
    };
    // The queue pairs, held for the set-up; the streams then refer to them
    // as every asynchronous operation does (a QP destroyed later aborts them).
    std::vector<LockedRail> rails(bound.size());
    for (std::size_t k = 0; k < bound.size(); ++k) rails[k] = {bound[k].qp.lock(), &bound[k]};
    if (rails.empty()) return refuse(errc::invalid_argument, "a transfer needs at least one rail");
    if (plan.requests().empty()) return refuse(errc::invalid_argument, "an empty plan");
    // Nothing may be posted after the deadline: one already passed posts nothing.
    if (deadline_at_ && *deadline_at_ <= std::chrono::steady_clock::now()) {
        return refuse(std::make_error_code(std::errc::timed_out),
                      "the deadline had passed when the transfer started (nothing was posted)");
    }
    if (!options.notify_message.empty()) {
        if (!notify_) return refuse(errc::invalid_argument, "notify_message needs notify (the immediate it goes with)");
        if (options.notify_message.size() > notify_message_.size()) {
            return refuse(errc::invalid_argument, "notify_message has " +
                                                      std::to_string(options.notify_message.size()) +
                                                      " bytes; a notification carries at most 64");
        }
        notify_message_size_ = static_cast<std::uint32_t>(options.notify_message.size());
        std::memcpy(notify_message_.data(), options.notify_message.data(), notify_message_size_);
    }
    if (options.doorbell_batch == 0 || options.doorbell_batch > max_transfer_chain) {
        return refuse(errc::invalid_argument, "doorbell_batch must be 1 to " + std::to_string(max_transfer_chain));
    }
    if (!rail_bytes_.empty() && rail_bytes_.size() != rails.size()) {
        return refuse(errc::invalid_argument, "rail_bytes has " + std::to_string(rail_bytes_.size()) + " entries for " +
                                                  std::to_string(rails.size()) + " rails");
    }
    for (std::size_t k = 0; k < rails.size(); ++k) {
        if (!bound[k].given) {
            return refuse(errc::invalid_argument, "rail " + std::to_string(k) + " has no queue pair");
        }
        if (!rails[k].qp) {
            return refuse(aborted_error(),
                          "rail " + std::to_string(k) + "'s queue pair was destroyed before the transfer started");
        }
        if (std::error_code refusal = async_refusal(rails[k].qp.get())) {
            return refuse(refusal, "rail " + std::to_string(k) + ": " +
                                       (refusal == errc::no_executor ? "the QP's CQ has no executor"
                                                                     : "the QP cannot run asynchronous operations"));
        }
        // Any rail may carry the notification (failover): each must take the message inline.
        if (notify_message_size_ > rails[k].qp->caps().max_inline_data) {
            return refuse(
                errc::invalid_argument,
                "the notification's message of " + std::to_string(notify_message_size_) +
                    " bytes goes inline, and rail " + std::to_string(k) + "'s queue pair has max_inline_data " +
                    std::to_string(rails[k].qp->caps().max_inline_data) +
                    ": make it with QueuePairOptions::max_inline_data >= " + std::to_string(notify_message_size_));
        }
    }
    for (std::size_t k = 1; k < rails.size(); ++k) {
        if (rails[k].qp->pd() != rails[0].qp->pd() &&
            (rails[k].rail->local_keys.empty() || rails[k].rail->remote_keys.empty())) {
            return refuse(errc::invalid_argument,
                          "rail " + std::to_string(k) +
                              "'s queue pair is on another protection domain than rail 0's, whose keys the plan "
                              "holds: give the same memory's keys on that rail (TransferRail::local and ::remote)");
        }
    }
    if (!options.rail_weights.empty() && options.rail_weights.size() != rails.size()) {
        return refuse(errc::invalid_argument, "rail_weights has " + std::to_string(options.rail_weights.size()) +
                                                  " entries for " + std::to_string(rails.size()) + " rails");
    }
    for (std::uint64_t& b : rail_bytes_) b = 0;
    const std::vector<std::uint64_t> equal(options.rail_weights.empty() ? rails.size() : 0, 1);
    const Stripes stripes =
        stripe(plan, 0, static_cast<std::uint32_t>(plan.requests().size()),
               options.rail_weights.empty() ? std::span<const std::uint64_t>(equal) : options.rail_weights);
    rail_count_ = rails.size();
    rails_ = std::make_unique<RailStream[]>(rail_count_);
    for (std::size_t k = 0; k < rail_count_; ++k) {
        RailStream& r = rails_[k];
        r.fn = &TransferJobBase::rail_done;
        r.job = this;
        r.index = k;
        std::string text;
        if (std::error_code e =
                r.setup(*rails[k].qp, plan, stripes.bounds[k], stripes.bounds[k + 1], stripes.bytes[k],
                        rails[k].rail->local_keys, rails[k].rail->remote_keys, options.doorbell_batch, text)) {
            return refuse(e, "rail " + std::to_string(k) + ": " + text);
        }
        r.driver = rails[k].qp->send_cq()->driver();
    }
    executor_ = rails_[0].driver->executor();
    chain_ = options.doorbell_batch;
    failover_ = options.failover && rail_count_ > 1;
    bound_.assign(bound.begin(), bound.end()); // to take over, and to fail an overdue notification's queue pair
    if (failover_) {
        usable_.resize(rail_count_);
        usable_now_.resize(rail_count_);
    }
    // Which rails have a key for the remote region the notification goes to (the plan's last remote byte).
    reaches_.resize(rail_count_);
    if (!plan.requests().empty()) {
        for (std::size_t k = 0; k < rail_count_; ++k)
            reaches_[k] = rails_[k].reaches_remote(plan.requests().back().remote.rkey) ? 1 : 0;
    }
    // Per rail what it did: kept with several rails (failover needs it), or when asked for.
    if (rail_count_ > 1 || report_blocks_ || every_rail) outcomes_.resize(rail_count_);
    return true;
}

/// The deadline's timer and the job it may stop. The timer's handler holds
/// this (not the job, which finishes without waiting for the timer): under
/// its lock the job is either still there, and may be pinned open, or gone.
struct TransferJobBase::Deadline {
    Deadline(const boost::asio::any_io_executor& executor, TransferJobBase* j) : timer(executor), job(j) {}
    std::mutex mutex;
    boost::asio::steady_timer timer;
    TransferJobBase* job;
};

/// What the machine is told of the rails at an event, computed under the
/// job's lock just before it: with failover, which rails are usable (their
/// queue pair alive and accepting asynchronous operations; each held in
/// usable_ until the event's streams are submitted), and which reach the
/// notification's region (read at the start).
class TransferJobBase::Probe final : public TransferFsm::Rails {
public:
    explicit Probe(TransferJobBase& job) noexcept : job_(job) {
        if (job.failover_) {
            for (std::size_t k = 0; k < job.rail_count_; ++k) {
                std::shared_ptr<QpCore>& qp = job.usable_[k];
                qp = job.bound_[k].qp.lock();
                job.usable_now_[k] = qp && !async_refusal(qp.get()) ? 1 : 0;
            }
        }
        usable = job.usable_now_;
        reaches = job.reaches_;
    }
    void stripe(std::uint32_t first, std::uint32_t end, std::span<const std::uint64_t> weights,
                std::span<std::uint32_t> bounds) override {
        job_.stripes_ = detail::stripe(*job_.plan_, first, end, weights);
        std::copy(job_.stripes_.bounds.begin(), job_.stripes_.bounds.end(), bounds.begin());
    }

private:
    TransferJobBase& job_;
};

void TransferJobBase::start() {
    // The rails with requests (by weight, an empty one may sit between
    // two). Counted before the first submit, and the last one found: once it
    // is submitted the job may already be gone (finished on another thread,
    // or refused at once), so nothing of `this` is read after it.
    RailStream* const rails = rails_.get();
    std::size_t n = 0, last = 0;
    {
        std::lock_guard lock(mutex_);
        std::vector<std::uint32_t> bounds(rail_count_ + 1);
        for (std::size_t k = 0; k < rail_count_; ++k) bounds[k] = rails[k].first();
        bounds[rail_count_] = rails[rail_count_ - 1].end();
        // Started first: a rail refused at once must not finish the job while others are still to start.
        Probe probe(*this);
        fsm_.start(bounds, failover_, notify_.has_value(), probe); // submit them (setup refused an empty plan)
        for (std::size_t k = 0; k < rail_count_; ++k) {
            if (!fsm_.streams()[k].running) continue;
            ++n;
            last = k;
        }
        started_at_ = std::chrono::steady_clock::now();
    }
    if (deadline_at_) {
        // Started before the rails: a deadline that passes while they are
        // submitted stops those not yet submitted as they are.
        deadline_ = std::make_shared<Deadline>(executor_, this);
        arm(deadline_, *deadline_at_);
    }
    for (std::size_t k = 0; k <= last && n > 0; ++k) {
        if (rails[k].first() < rails[k].end()) rails[k].driver->submit(&rails[k]); // rails[last] goes last
    }
}

void TransferJobBase::arm(const std::shared_ptr<Deadline>& d, std::chrono::steady_clock::time_point at) {
    std::lock_guard hold(d->mutex); // its handler and the finish wait until the wait is started
    d->timer.expires_at(at);
    d->timer.async_wait([d](const boost::system::error_code& ec) {
        if (ec) return; // cancelled: the transfer finished first
        TransferJobBase* job = nullptr;
        {
            std::lock_guard lock(d->mutex);
            job = d->job;
            if (job == nullptr || !job->pin(std::make_error_code(std::errc::timed_out))) return;
        }
        job->stop_pinned();
    });
}

bool TransferJobBase::pin(std::error_code reason) {
    std::lock_guard lock(mutex_);
    if (fsm_.phase() == TransferFsm::Phase::notifying) {
        abandon_notification(reason);
        return false;
    }
    // Finishing (nothing running), destroyed, or stopped already: nothing to do.
    if (!fsm_.stoppable()) return false;
    // The words first: if they cannot be allocated, nothing has changed.
    if (!fsm_.error()) {
        result_.failed_blocks = reason == std::errc::timed_out
                                    ? "the deadline passed before every block had moved (nothing more was posted)"
                                    : "the transfer was cancelled (nothing more was posted)";
    }
    fsm_.stop(reason); // taken (stoppable): held open until stop_pinned() has stopped every stream
    return true;
}

void TransferJobBase::abandon_notification(std::error_code reason) {
    // The words first (used if the notification then fails): if they cannot be allocated, nothing has changed.
    const auto now = std::chrono::steady_clock::now();
    std::string when;
    if (reason != std::errc::timed_out) {
        when = "the transfer was cancelled";
    } else if (deadline_at_ && now >= *deadline_at_) {
        when = "the deadline passed";
    } else {
        when = "notification_timeout (" + std::to_string(notification_timeout_.count()) + " ms) passed";
    }
    std::string words = "every block landed, but " + when +
                        " before the peer took the notification (no receive posted at the peer?): gpuverbs moved "
                        "rail " +
                        std::to_string(fsm_.notification_rail()) +
                        "'s queue pair to the error state (its send queue waited behind the notification)";
    const TransferFsm::Action a = fsm_.abandon_notification(reason);
    if (a.kind != TransferFsm::Action::Kind::abandon_notification) return;
    abandon_words_ = std::move(words);
    // Under our lock (the driver never calls into a job under its own): the
    // notification's stream is still ours. The driver fails its queue pair
    // only while the notification is posted; one that completed meanwhile
    // ends the transfer as it ended (the peer has it).
    RailStream& notify = rails_[a.rail];
    (void)notify.driver->fail_queue_pair_of(notify, QueuePairFailure::Cause::notification_not_taken);
}

// Only std::bad_alloc (the words of the reason) can escape: termination rather than a lost stop.
// NOLINTNEXTLINE(bugprone-exception-escape)
void TransferJobBase::stop(std::error_code reason) noexcept {
    if (pin(reason)) stop_pinned();
}

// NOLINTNEXTLINE(bugprone-exception-escape): as finished_one
void TransferJobBase::stop_pinned() noexcept {
    // Each stream stops under its driver's lock; a waiting one finishes here
    // (finished_one), never the job: the pin holds it open. The streams are
    // listed under the lock (takeovers add to them).
    std::vector<RailStream*> streams;
    {
        std::lock_guard lock(mutex_);
        // Not those that finished: their queue pair (and driver) may be gone since.
        const auto all = fsm_.streams();
        for (std::uint32_t id = 0; id < all.size(); ++id) {
            if (all[id].running) streams.push_back(&stream(id));
        }
    }
    for (RailStream* s : streams) s->driver->stop(*s);
    std::unique_lock lock(mutex_);
    Probe probe(*this);
    const TransferFsm::Action a = fsm_.unpin(probe);
    explain(a.why, {});
    perform(lock, a);
}

// Only std::bad_alloc (the words of an error, the handler's post) can escape;
// an operation cannot complete without them, so termination is the answer.
// NOLINTNEXTLINE(bugprone-exception-escape)
void TransferJobBase::rail_done(AsyncOpBase* op, AsyncOpBase::How how, std::error_code ec) noexcept {
    auto* rail = static_cast<RailStream*>(op);
    rail->job->finished_one(*rail, how, ec);
}

void TransferJobBase::refused(std::string why) {
    result_.failed_blocks = std::move(why);
    fill_old_outputs();
}

void TransferJobBase::fill_report() {
    TransferReport& r = result_.report;
    if (report_blocks_) {
        // A request's state over every stream that carried it (the machine's).
        const std::size_t n = plan_->requests().size();
        std::vector<RequestState> states(n);
        fsm_.request_states(states);
        r.requests.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            r.requests[i] = states[i] == RequestState::landed      ? BlockState::landed
                            : states[i] == RequestState::uncertain ? BlockState::uncertain
                                                                   : BlockState::not_posted;
        }
        summarize_blocks(*plan_, r);
    }
    // Per rail what the machine decided (none kept: one rail, not asked for).
    r.rails = std::move(outcomes_);
    const auto rails = fsm_.rails();
    for (std::size_t k = 0; k < r.rails.size() && k < rails.size(); ++k) {
        r.rails[k].error = rails[k].error;
        r.rails[k].taken_over = rails[k].taken_over;
        r.rails[k].took_over = rails[k].took_over;
    }
}

void TransferJobBase::fill_old_outputs() const {
    if (old_failed_blocks_ != nullptr) *old_failed_blocks_ = result_.failed_blocks;
    if (old_report_ != nullptr) *old_report_ = result_.report;
}

RailStream& TransferJobBase::stream(std::uint32_t id) const noexcept {
    return id < rail_count_ ? rails_[id] : *extra_[id - rail_count_];
}

std::uint32_t TransferJobBase::stream_id(const RailStream& s) const noexcept {
    if (s.index < rail_count_ && &rails_[s.index] == &s) return static_cast<std::uint32_t>(s.index);
    std::size_t i = 0; // a takeover: few, and only after a failure
    while (extra_[i].get() != &s) ++i;
    return static_cast<std::uint32_t>(rail_count_ + i);
}

bool TransferJobBase::make_takeover(const TransferFsm::Action& action, Holds& hold) {
    std::vector<std::unique_ptr<RailStream>> made;
    for (std::uint32_t id = action.first_stream; id < action.end_stream; ++id) {
        const TransferFsm::Stream& t = fsm_.streams()[id];
        QpCore& qp = *usable_[t.rail]; // the machine asked: alive and usable
        auto s = std::make_unique<RailStream>();
        s->fn = &TransferJobBase::rail_done;
        s->job = this;
        s->index = t.rail;
        std::string why;
        if (s->setup(qp, *plan_, t.first, t.end, stripes_.bytes[t.rail], bound_[t.rail].local_keys,
                     bound_[t.rail].remote_keys, chain_, why)) {
            return false; // a key it cannot translate: checked at the start only for its own share
        }
        s->driver = qp.send_cq()->driver();
        made.push_back(std::move(s));
    }
    for (auto& s : made) { // kept once every stream could be made, in the machine's order
        hold.push_back(usable_[s->index]);
        extra_.push_back(std::move(s));
    }
    return true;
}

void TransferJobBase::finished_one(RailStream& rail, AsyncOpBase::How how, std::error_code ec) {
    const std::size_t k = rail.index;
    Holds hold; // the takeovers' queue pairs, alive until submitted
    std::unique_lock lock(mutex_);
    // Every completion, an abort's too, comes after its driver released its
    // lock (async_driver.hpp): takeovers are submitted from here directly.
    std::error_code e = rail.error();
    if (!e && rail.failure) e = *rail.failure;
    if (!e) e = ec;
    const std::uint64_t moved = rail.bytes();
    result_.bytes += moved;
    if (!rail_bytes_.empty()) rail_bytes_[k] += moved;
    if (!outcomes_.empty()) {
        outcomes_[k].bytes += moved;
        outcomes_[k].busy = std::chrono::steady_clock::now() - started_at_;
    }
    std::string text;
    if (e) {
        const bool stopping = fsm_.phase() == TransferFsm::Phase::stopping;
        if (rail.notification_failed()) {
            text = "the notification after the last block";
        } else if (rail.failed()) {
            text = plan_->blocks_of(rail.failed_request());
        } else if (!stopping && e == aborted_error()) {
            text = "its queue pair or completion queue was destroyed";
        } else {
            text = "the transfer was stopped (" + e.message() + ")";
        }
        if (rail_count_ > 1) text += " on rail " + std::to_string(k);
    }
    TransferFsm::StreamEnd end;
    end.stream = stream_id(rail);
    end.landed_end = rail.landed_end();
    end.posted_end = rail.posted_end();
    end.error = e;
    end.failure = classify_stream_failure(e, rail.wc_status(), rail.post_refused(), rail.notification_failed());
    end.own_failure = rail.failed();
    end.destroyed = how == AsyncOpBase::How::destroy;
    Probe probe(*this);
    TransferFsm::Action a = fsm_.stream_finished(end, probe);
    if (a.kind == TransferFsm::Action::Kind::make_streams) a = fsm_.takeover_made(make_takeover(a, hold), probe);
    // A rail that failed while the transfer was stopping failed all the same
    // (its group should know). Where gpuverbs failed its queue pair itself
    // (its port went down, it stalled, a notification was abandoned), that is
    // the reason, not the provider's words for the flush that followed.
    if (a.record_failure && !outcomes_.empty()) {
        std::shared_ptr<QpCore> qp = bound_[rail.index].qp.lock();
        Reason why = qp ? library_reason(*qp, started_at_) : Reason{};
        if (why.words.empty() && e == aborted_error()) why.cause = "aborted";
        outcomes_[k].failure =
            why.words.empty() ? e.message() + ": " + text : why.words + " (" + e.message() + ": " + text + ")";
        outcomes_[k].cause = why.cause;
        hold.push_back(std::move(qp)); // let go after the lock
    }
    explain(a.why, std::move(text));
    perform(lock, a); // `hold` outlives the submissions
}

void TransferJobBase::explain(TransferFsm::Why why, std::string text) {
    std::string& words = result_.failed_blocks;
    switch (why) {
        case TransferFsm::Why::none:
        case TransferFsm::Why::stopped: return; // pin() wrote them before the stop was taken
        case TransferFsm::Why::notification_abandoned: words = std::move(abandon_words_); return;
        case TransferFsm::Why::stream_failed: words = std::move(text); return;
        case TransferFsm::Why::every_rail_failed: {
            // No rail was left to take its requests: name every rail that failed, and why.
            std::string all = "every rail failed:";
            const auto rails = fsm_.rails();
            for (std::size_t j = 0; j < rail_count_; ++j) {
                if (rails[j].error) all += " rail " + std::to_string(j) + ": " + outcomes_[j].failure + ";";
            }
            all.pop_back();
            words = std::move(all);
            return;
        }
        case TransferFsm::Why::no_rail_for_notification:
            words =
                "every block landed, but no rail that has not failed reaches the notification's "
                "remote region (give its key on another rail: TransferRail::remote)";
            return;
    }
}

void TransferJobBase::submit_stream(RailStream* s) {
    // Never under a driver's lock: every completion, aborts included, reaches
    // the job after the driver released it, so a takeover may go to any driver.
    s->driver->submit(s);
}

void TransferJobBase::perform(std::unique_lock<std::mutex>& lock, const TransferFsm::Action& action) {
    using Kind = TransferFsm::Action::Kind;
    // The queue pairs the machine looked at are not held past this event, but those about to be submitted to.
    // They are let go after the job's lock (the last reference destroys a
    // queue pair, which waits for its CQ's pollers: never under our lock).
    std::shared_ptr<QpCore> notify_qp;
    if (action.kind == Kind::notify && failover_) notify_qp = std::move(usable_[action.rail]);
    Holds released(usable_.size());
    released.swap(usable_);
    switch (action.kind) {
        case Kind::wait:
        case Kind::make_streams:         // answered in finished_one
        case Kind::stop_streams:         // performed by stop_pinned
        case Kind::abandon_notification: // performed by pin
            lock.unlock();
            return;
        case Kind::submit: {
            // Listed under the lock; once the last is submitted the job may be gone.
            std::vector<RailStream*> streams;
            const auto all = fsm_.streams();
            for (std::uint32_t id = action.first_stream; id < action.end_stream; ++id) {
                if (all[id].running) streams.push_back(&stream(id));
            }
            lock.unlock();
            for (RailStream* s : streams) submit_stream(s);
            return;
        }
        case Kind::notify: {
            // On the first rail that has not failed and reaches the plan's last remote block.
            RailStream* notify = &rails_[action.rail];
            const std::uint32_t immediate = *notify_;
            // The notification's own bound, when it ends before the deadline:
            // the peer may never post a receive, and rnr_retry_count 7 waits for ever.
            std::shared_ptr<Deadline> timer;
            const auto due = deadline_after(notification_timeout_);
            if (notification_timeout_.count() > 0) {
                if (!deadline_at_ || due < *deadline_at_) {
                    notification_timer_ = std::make_shared<Deadline>(executor_, this);
                    timer = notification_timer_;
                }
            }
            lock.unlock();
            if (timer) arm(timer, due); // before the submission: the finish finds it armed
            notify->reset_for_resubmit();
            notify->arm_notification(immediate, std::span(notify_message_).first(notify_message_size_));
            submit_stream(notify);
            return;
        }
        case Kind::finish: break;
    }
    error_ = fsm_.error();
    const bool destroy = fsm_.destroyed();
    lock.unlock();
    for (const std::shared_ptr<Deadline>& d : {deadline_, notification_timer_}) {
        if (!d) continue;
        // The timer's handler finds no job from here on; a pending wait ends
        // early (not while the execution context is being destroyed: its
        // services are shutting down, and the wait is destroyed with them).
        std::lock_guard held(d->mutex);
        d->job = nullptr;
        if (!destroy) d->timer.cancel();
    }
    if (!destroy) {
        fill_report();
        fill_old_outputs();
    }
    finish_(this, destroy);
}

} // namespace gpuverbs::detail
