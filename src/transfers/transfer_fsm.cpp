// TransferFsm (detail/transfers/transfer_fsm.hpp): the transfer's decisions,
// with no I/O. The order of the checks is the order the job made them in
// before they moved here (tests/integration/transfer_blocks_test.cpp and
// transfer_rails_test.cpp hold the job to it on a device;
// tests/unit/transfer_fsm_test.cpp holds the machine to its promises
// without one).
#include "gpuverbs/detail/transfers/transfer_fsm.hpp"

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/error.hpp"

#include <algorithm>
#include <cassert>

namespace gpuverbs::detail {

StreamFailure classify_stream_failure(std::error_code ec, ibv_wc_status status, bool post_refused,
                                      bool notification_failed) noexcept {
    if (!ec) return StreamFailure::none;
    if (notification_failed) return StreamFailure::notification; // it consumes a receive: never posted twice
    if (post_refused) return StreamFailure::path;                // the provider refused its queue pair
    switch (status) {
        case IBV_WC_SUCCESS: break;
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR:
        case IBV_WC_WR_FLUSH_ERR:
        case IBV_WC_LOC_QP_OP_ERR: // Soft-RoCE: its port's link is down
        case IBV_WC_FATAL_ERR:
        case IBV_WC_RESP_TIMEOUT_ERR:
        case IBV_WC_GENERAL_ERR:
        case IBV_WC_REM_ABORT_ERR: return StreamFailure::path;
        default: // the request's keys, ranges or operation: as wrong on any rail
            return StreamFailure::request;
    }
    // No completion failed: its queue pair (or CQ) was destroyed, or gpuverbs
    // found the queue pair broken (in error, stalled, its port down) and ended it.
    if (ec == aborted_error() || ec == errc::queue_pair_in_error || ec == errc::queue_pair_stalled ||
        ec == errc::port_down) {
        return StreamFailure::path;
    }
    return StreamFailure::request;
}

TransferFsm::Action TransferFsm::start(std::span<const std::uint32_t> bounds, bool failover, bool notify,
                                       Rails& rails) {
    assert(phase_ == Phase::idle && bounds.size() >= 2);
    const std::size_t n = bounds.size() - 1;
    streams_.reserve(n);
    rails_.assign(n, Rail{});
    failover_ = failover && n > 1;
    notify_ = notify;
    phase_ = Phase::running;
    for (std::size_t k = 0; k < n; ++k) {
        const bool busy = bounds[k] < bounds[k + 1];
        streams_.push_back(Stream{static_cast<std::uint32_t>(k), bounds[k], bounds[k + 1], bounds[k], bounds[k], busy});
        participants_ += busy ? 1 : 0;
    }
    if (failover_) {
        weights_.assign(n, 0);
        bounds_.assign(n + 1, 0);
    }
    Action a;
    a.kind = Action::Kind::submit;
    a.end_stream = static_cast<std::uint32_t>(n);
    return settle(a, rails); // nothing to run (an empty plan): notify or finish at once
}

TransferFsm::Action TransferFsm::stream_finished(const StreamEnd& end, Rails& rails) {
    // A late or doubled end (a stream that is not running, or one while a takeover awaits its answer)
    // changes nothing: the first end counted.
    if (end.stream >= streams_.size() || !streams_[end.stream].running || proposing_) return Action{};
    Stream& s = streams_[end.stream];
    s.running = false;
    --participants_;
    if (end.destroyed) destroyed_ = true;
    // The notification's stream keeps what its requests did: every one had landed.
    if (phase_ != Phase::notifying || end.stream != notify_rail_) {
        s.landed_end = end.landed_end;
        s.posted_end = end.posted_end;
    }
    if (!end.error) return settle(Action{}, rails);
    ending_ = end;
    // Not once the notification is armed (every block has landed, and it is
    // never posted twice), stopping, destroyed, or failed already.
    const bool could_move = failover_ && phase_ == Phase::running && !destroyed_ && end.failure == StreamFailure::path;
    if (!could_move) return conclude(Settled::stream_failed, rails, Action{});
    // The rails that have not failed and can still run, weighted equally.
    bool any = false;
    for (std::size_t j = 0; j < rails_.size(); ++j) {
        weights_[j] = 0;
        if (j == s.rail || rails_[j].error || rails.usable[j] == 0) continue;
        weights_[j] = 1;
        any = true;
    }
    if (!any) return conclude(Settled::every_rail_failed, rails, Action{});
    if (s.landed_end == s.end)
        return conclude(Settled::moved_on, rails, Action{}); // every request of it landed (it failed after them)
    // Never from its start: what landed is not posted again.
    rails.stripe(s.landed_end, s.end, weights_, bounds_);
    const auto first = static_cast<std::uint32_t>(streams_.size());
    for (std::size_t j = 0; j < rails_.size(); ++j) {
        if (bounds_[j] < bounds_[j + 1]) {
            streams_.push_back(
                Stream{static_cast<std::uint32_t>(j), bounds_[j], bounds_[j + 1], bounds_[j], bounds_[j], false});
        }
    }
    proposed_ = first;
    proposing_ = true;
    Action a;
    a.kind = Action::Kind::make_streams;
    a.first_stream = first;
    a.end_stream = static_cast<std::uint32_t>(streams_.size());
    return a;
}

TransferFsm::Action TransferFsm::takeover_made(bool made, Rails& rails) {
    if (!proposing_) return Action{}; // no make_streams awaits an answer
    proposing_ = false;
    const std::uint32_t first = proposed_;
    if (!made) {
        streams_.resize(first); // counted once every stream could be made: nothing is
        return conclude(Settled::every_rail_failed, rails, Action{});
    }
    std::uint32_t moved = 0;
    for (std::size_t i = first; i < streams_.size(); ++i) {
        Stream& t = streams_[i];
        t.running = true;
        ++participants_;
        rails_[t.rail].took_over += t.end - t.first;
        moved += t.end - t.first;
    }
    rails_[streams_[ending_.stream].rail].taken_over += moved;
    Action a;
    a.kind = Action::Kind::submit;
    a.first_stream = first;
    a.end_stream = static_cast<std::uint32_t>(streams_.size());
    return conclude(Settled::moved_on, rails, a);
}

TransferFsm::Action TransferFsm::conclude(Settled how, Rails& rails, Action a) {
    const StreamEnd& end = ending_;
    Rail& rail = rails_[streams_[end.stream].rail];
    // A rail that failed while the transfer was stopping failed all the same
    // (its group should know); one only stopped did not. The first failure stays.
    if (!rail.error && (phase_ != Phase::stopping || end.own_failure)) {
        rail.error = end.error;
        a.record_failure = true;
    }
    if (how != Settled::moved_on && !error_) {
        if (phase_ == Phase::notifying && abandoned_) {
            // The notification failed because it was abandoned: the reason is why.
            error_ = abandon_reason_;
            a.why = Why::notification_abandoned;
        } else {
            error_ = end.error;
            // No rail was left to take its requests: the words name every rail that failed.
            a.why = how == Settled::every_rail_failed ? Why::every_rail_failed : Why::stream_failed;
        }
        if (phase_ == Phase::running) phase_ = Phase::draining;
    }
    return settle(a, rails);
}

TransferFsm::Action TransferFsm::settle(Action a, Rails& rails) {
    if (participants_ > 0) return a;
    if (!destroyed_ && !error_ && notify_ && phase_ == Phase::running) {
        // On the first rail that has not failed and reaches the plan's last remote block.
        for (std::size_t j = 0; j < rails_.size(); ++j) {
            if (rails_[j].error) continue;
            if (failover_ && rails.usable[j] == 0) continue;
            if (rails.reaches[j] == 0) continue;
            phase_ = Phase::notifying;
            notify_rail_ = j;
            streams_[j].running = true; // the rail's own stream carries it
            participants_ = 1;
            a.kind = Action::Kind::notify;
            a.rail = j;
            return a;
        }
        error_ = errc::invalid_argument;
        a.why = Why::no_rail_for_notification;
    }
    phase_ = Phase::finished;
    a.kind = Action::Kind::finish;
    return a;
}

TransferFsm::Action TransferFsm::stop(std::error_code reason) {
    if (!stoppable()) return Action{};
    Action a;
    a.kind = Action::Kind::stop_streams;
    if (!error_) {
        error_ = reason;
        a.why = Why::stopped;
    }
    phase_ = Phase::stopping;
    pinned_ = true;
    ++participants_; // the pin: held open until every listed stream was stopped
    return a;
}

TransferFsm::Action TransferFsm::abandon_notification(std::error_code reason) {
    if (phase_ != Phase::notifying || abandoned_ || destroyed_) return Action{};
    abandoned_ = true;
    abandon_reason_ = reason;
    Action a;
    a.kind = Action::Kind::abandon_notification;
    a.rail = notify_rail_;
    return a;
}

TransferFsm::Action TransferFsm::unpin(Rails& rails) {
    if (!pinned_) return Action{}; // no stop's pin is held (a late or doubled release)
    pinned_ = false;
    --participants_;
    return settle(Action{}, rails);
}

void TransferFsm::request_states(std::span<RequestState> out) const noexcept {
    std::fill(out.begin(), out.end(), RequestState::not_posted);
    // [first, landed_end) landed, [landed_end, posted_end) uncertain; the rest stays not posted.
    for (const Stream& s : streams_) {
        const std::size_t landed = std::min<std::size_t>(s.landed_end, out.size());
        const std::size_t posted = std::min<std::size_t>(s.posted_end, out.size());
        for (std::size_t i = s.first; i < landed; ++i) out[i] = RequestState::landed;
        for (std::size_t i = landed; i < posted; ++i) out[i] = std::max(out[i], RequestState::uncertain);
    }
}

} // namespace gpuverbs::detail
