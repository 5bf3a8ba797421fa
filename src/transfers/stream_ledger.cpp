// StreamLedger (detail/transfers/stream_ledger.hpp): one rail's accounting,
// with no I/O.
#include "gpuverbs/detail/transfers/stream_ledger.hpp"

#include "gpuverbs/verbs/completion.hpp"

#include <algorithm>

namespace gpuverbs::detail {

void StreamLedger::start(std::uint32_t first, std::uint32_t end, std::uint32_t chain, std::uint32_t ring,
                         std::uint32_t plan_size) {
    first_ = next_ = done_until_ = first;
    end_ = end;
    chain_ = std::max<std::uint32_t>(1, chain);
    plan_size_ = plan_size;
    ring_size_ = std::max<std::uint32_t>(1, ring);
    ring_ = std::make_unique<Chain[]>(ring_size_);
}

void StreamLedger::push(const Chain& c) noexcept {
    ring_[(ring_head_ + in_flight_) % ring_size_] = c;
    ++in_flight_;
}

void StreamLedger::posted(std::uint64_t first_sequence) noexcept {
    const std::uint32_t n = needs();
    if (notify_) { // (armed once every request went out: next_ is end_)
        push(Chain{first_sequence, first_sequence, plan_size_, 0});
        notify_ = false;
        notification_posted_ = true;
        return;
    }
    push(Chain{first_sequence, first_sequence + n - 1, next_, n});
    next_ += n;
}

void StreamLedger::refused(std::error_code ec, std::uint32_t taken) noexcept {
    post_error_ = ec;
    failed_request_ = notify_ ? plan_size_ : next_ + taken;
}

void StreamLedger::closed(std::uint64_t first_sequence, std::uint32_t taken) noexcept {
    // None of them counts as landed: the closing write's success says they completed, not that the refusal
    // left the rail sound (posted_end() keeps them uncertain).
    push(Chain{first_sequence, first_sequence + taken, next_, 0});
}

void StreamLedger::completed(ibv_wc_status status, std::uint64_t sequence) noexcept {
    if (in_flight_ == 0) return; // abandoned: what was in flight ended already
    // Completions come in order: this one belongs to the oldest chain in flight.
    const Chain& c = ring_[ring_head_];
    if (status != IBV_WC_SUCCESS && wc_error_ == IBV_WC_SUCCESS && !post_error_) {
        wc_error_ = status;
        failed_request_ = c.first_request + static_cast<std::uint32_t>(sequence - c.first_sequence);
    }
    if (sequence != c.last_sequence) return; // an unsignaled request that failed; its chain's end follows
    // Chains that completed before any completion error count (also those in flight when a later post failed).
    if (status == IBV_WC_SUCCESS && wc_error_ == IBV_WC_SUCCESS && c.count > 0) done_until_ = c.first_request + c.count;
    ring_head_ = (ring_head_ + 1) % ring_size_;
    --in_flight_;
}

void StreamLedger::abandon(std::error_code ec) noexcept {
    // Whether what it holds is the notification: armed and not yet posted, or
    // posted (then it is all that is in flight: every request had completed).
    const bool notification = notify_ || notification_posted_;
    if (!failed()) {
        abandon_error_ = ec;
        // As if the provider had flushed it (a path's failure: failover may
        // move its requests). Every request before done_until_ completed;
        // those after it were posted and may or may not have landed.
        wc_error_ = IBV_WC_WR_FLUSH_ERR;
        failed_request_ = notification ? plan_size_ : done_until_;
    }
    in_flight_ = 0; // failed from here on: nothing more is posted (needs() is 0), nothing more completes
}

std::uint32_t StreamLedger::landed_end() const noexcept {
    // The notification failed: every request of the plan had completed before it was posted.
    if (notification_failed()) return end_;
    // A completion error names the first request that failed; a queue pair's
    // completions come in order, so every request before it completed.
    if (wc_error_ != IBV_WC_SUCCESS) return failed_request_;
    return done_until_;
}

std::uint32_t StreamLedger::posted_end() const noexcept {
    if (notification_failed()) return end_;
    // A refused post: the refused request and those after it never went out.
    if (post_error_) return failed_request_;
    return next_;
}

std::error_code StreamLedger::error() const noexcept {
    if (post_error_) return post_error_;
    if (abandon_error_) return abandon_error_; // why gpuverbs ended it, rather than the flush it stands for
    if (wc_error_ != IBV_WC_SUCCESS) return make_wc_error(wc_error_);
    return {};
}

} // namespace gpuverbs::detail
