// RailGroup (transfers/rail_group.hpp): which rails a transfer uses, by
// what weights, and what each transfer teaches about them.
#include "gpuverbs/transfers/rail_group.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpuverbs {

RailGroup::RailGroup(std::vector<TransferRail> rails, RailGroupOptions options)
    : RailGroup(std::move(rails), options, detail::Outcome{}) {}

RailGroup::RailGroup(std::vector<TransferRail> rails, RailGroupOptions options, detail::Outcome outcome)
    : rails_(std::move(rails)), options_(options) {
    detail::Status status;
    if (rails_.empty()) {
        status.fail(errc::invalid_argument, "RailGroup", "a group needs at least one rail");
    } else if (!(options_.smoothing > 0 && options_.smoothing <= 1)) {
        status.fail(errc::invalid_argument, "RailGroup",
                    "smoothing must be above 0 and at most 1 (it is " + std::to_string(options_.smoothing) + ")");
    }
    if (!status.ok()) rails_.clear(); // a group that failed has no rails: transfers over it are refused
    health_.resize(rails_.size());
    generation_.resize(rails_.size(), 0);
    outcome.settle(status);
}

RailHealth RailGroup::health(std::size_t k) const {
    std::lock_guard lock(mutex_);
    if (k >= health_.size()) {
        throw Error(make_error_code(errc::invalid_argument), "RailGroup::health",
                    "no rail " + std::to_string(k) + " (the group has " + std::to_string(health_.size()) + ")");
    }
    RailHealth h = health_[k];
    h.cooling = h.cooling && std::chrono::steady_clock::now() - h.failed_at < options_.cooldown;
    return h;
}

void RailGroup::replace(std::size_t k, TransferRail rail) {
    std::lock_guard lock(mutex_);
    if (k >= rails_.size()) {
        throw Error(make_error_code(errc::invalid_argument), "RailGroup::replace",
                    "no rail " + std::to_string(k) + " (the group has " + std::to_string(rails_.size()) + ")");
    }
    rails_[k] = std::move(rail);
    health_[k] = RailHealth{};
    ++generation_[k];
}

boost::asio::any_io_executor RailGroup::executor() const {
    std::lock_guard lock(mutex_);
    for (const TransferRail& r : rails_) {
        if (r.qp != nullptr && *r.qp) return r.qp->get_executor();
    }
    return {};
}

RailGroup::Selection RailGroup::select() {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    Selection out;
    auto usable = [&](std::size_t k) { return rails_[k].qp != nullptr && *rails_[k].qp; };
    for (std::size_t k = 0; k < rails_.size(); ++k) {
        RailHealth& h = health_[k];
        if (h.cooling && now - h.failed_at >= options_.cooldown) h.cooling = false; // tried again
        if (!h.cooling && usable(k)) out.index.push_back(k);
    }
    if (out.index.empty()) { // every rail cooling: all of those still there
        for (std::size_t k = 0; k < rails_.size(); ++k) {
            if (usable(k)) out.index.push_back(k);
        }
    }
    bool measured = options_.stripe_by_health && out.index.size() > 1;
    for (std::size_t k : out.index) {
        out.rails.push_back(rails_[k]);
        out.generation.push_back(generation_[k]);
        measured = measured && health_[k].bytes_per_second > 0;
    }
    if (measured) {
        for (std::size_t k : out.index)
            out.weights.push_back(std::max<std::uint64_t>(1, std::llround(health_[k].bytes_per_second)));
    }
    return out;
}

void RailGroup::record(const Selection& selection, const TransferReport& report) {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < selection.index.size() && i < report.rails.size(); ++i) {
        const std::size_t k = selection.index[i];
        // A rail replaced meanwhile is another rail: what this transfer saw is not its health.
        if (k >= rails_.size() || generation_[k] != selection.generation[i]) continue;
        RailHealth& h = health_[k];
        const TransferReport::Rail& r = report.rails[i];
        h.bytes += r.bytes;
        h.busy += r.busy;
        h.requests_moved_away += r.taken_over;
        h.requests_taken_over += r.took_over;
        if (r.bytes > 0 || r.error) ++h.transfers;
        if (r.error) {
            ++h.failures;
            h.cooling = true;
            h.failed_at = now;
            h.last_error = r.error;
            h.last_failure = r.failure;
            h.last_cause = r.cause;
            continue;
        }
        if (r.bytes >= options_.min_measured_bytes && r.busy.count() > 0) {
            const double rate = static_cast<double>(r.bytes) * 1e9 / static_cast<double>(r.busy.count());
            h.bytes_per_second = h.bytes_per_second == 0
                                     ? rate
                                     : (1 - options_.smoothing) * h.bytes_per_second + options_.smoothing * rate;
        }
    }
}

} // namespace gpuverbs
