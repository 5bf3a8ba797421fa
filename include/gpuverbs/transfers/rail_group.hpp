// Rails that outlive one transfer: a RailGroup keeps, per rail, a moving
// estimate of its throughput and its failures, stripes each new transfer by
// that health (a rail running at half speed gets about half the bytes), and
// leaves a rail that failed out of new transfers until a cooldown has passed.
//
//   gpuverbs::RailGroup rails({gpuverbs::TransferRail{&qp0}, rail1});
//   gpuverbs::async_transfer(rails, plan, options, handler); // as with a span of rails
//   if (rails.health(1).cooling) { /* reconnect it, then */ rails.replace(1, reconnected); }
//
// Within one transfer, failover (TransferOptions::failover) moves a failed
// rail's requests to the others; the group remembers the failure for the
// transfers that follow.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/transfers/transfer.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associator.hpp>
#include <boost/asio/async_result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// What a RailGroup knows of one rail.
struct RailHealth {
    /// Moving estimate of the bytes per second it moves when busy (0: not measured yet).
    double bytes_per_second = 0;
    std::uint64_t transfers = 0; ///< transfers it carried part of
    std::uint64_t failures = 0;  ///< of them, those in which it failed
    std::uint64_t bytes = 0;     ///< bytes it moved in all
    /// Time it spent moving them: per transfer, from the start until its last request finished.
    std::chrono::nanoseconds busy{};
    std::uint64_t requests_moved_away = 0; ///< its requests that other rails posted again (failover)
    std::uint64_t requests_taken_over = 0; ///< requests of failed rails it posted
    /// It failed less than the cooldown ago: new transfers leave it out.
    bool cooling = false;
    std::chrono::steady_clock::time_point failed_at{};
    std::error_code last_error;
    std::string last_failure; ///< in words: the status and the blocks
    std::string last_cause;   ///< as one word (TransferReport::Rail::cause)
};

struct RailGroupOptions {
    /// How long a rail that failed is left out of new transfers; then it is tried again.
    std::chrono::milliseconds cooldown{5000};
    /// Weight of the newest measurement in the moving estimate (0 to 1).
    double smoothing = 0.3;
    /// A rail's throughput is measured only from transfers that gave it at
    /// least this many bytes (smaller ones measure latency, not bandwidth).
    std::uint64_t min_measured_bytes = 1 << 20;
    /// Stripe by measured throughput (false: equal bytes per rail).
    bool stripe_by_health = true;
};

class RailGroup {
public:
    /// A group of `rails` (a rail's queue pair may be missing for now:
    /// replace() it later). Throws gpuverbs::Error (errc::invalid_argument)
    /// for no rails at all, or options.smoothing outside (0, 1].
    explicit RailGroup(std::vector<TransferRail> rails, RailGroupOptions options = {});
    /// The same without throwing: on failure `ec` is set and the group has no
    /// rails (a transfer over it is refused). Not movable, the group is
    /// returned in place: `RailGroup group = RailGroup::create(rails, {}, ec);`.
    static RailGroup create(std::vector<TransferRail> rails, RailGroupOptions options, std::error_code& ec) {
        return RailGroup(std::move(rails), options, detail::Outcome{&ec, nullptr});
    }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static RailGroup create(std::vector<TransferRail> rails, RailGroupOptions options, std::error_code& ec,
                            Diagnostics& diagnostics) {
        return RailGroup(std::move(rails), options, detail::Outcome{&ec, &diagnostics});
    }
    RailGroup(const RailGroup&) = delete;
    RailGroup& operator=(const RailGroup&) = delete;
    ~RailGroup() = default;

    [[nodiscard]] std::size_t size() const noexcept { return rails_.size(); }
    [[nodiscard]] RailHealth health(std::size_t k) const;
    [[nodiscard]] const RailGroupOptions& options() const noexcept { return options_; }
    /// Replaces rail `k` (e.g. a queue pair reconnected after a failure) and
    /// forgets what was known of it: it takes part in the next transfer.
    void replace(std::size_t k, TransferRail rail);

    /// The rails a transfer started now uses, with their weights: those not
    /// cooling whose queue pair is there (when every rail is cooling, all of
    /// them: trying beats refusing); weights from throughput when every rail
    /// chosen was measured, else equal. Used by async_transfer.
    struct Selection {
        std::vector<std::size_t> index; ///< into the group
        std::vector<TransferRail> rails;
        std::vector<std::uint64_t> weights;    ///< empty: equal bytes
        std::vector<std::uint64_t> generation; ///< of each rail (replace() starts a new one)
    };
    [[nodiscard]] Selection select();
    /// The executor of the first rail whose queue pair is there: where a
    /// transfer over the group completes a handler without an executor of
    /// its own (empty when no rail has a queue pair).
    [[nodiscard]] boost::asio::any_io_executor executor() const;
    /// Learns from a finished transfer over `selection` (its report).
    void record(const Selection& selection, const TransferReport& report);

private:
    RailGroup(std::vector<TransferRail> rails, RailGroupOptions options, detail::Outcome outcome);

    mutable std::mutex mutex_;
    std::vector<TransferRail> rails_;
    std::vector<RailHealth> health_;
    std::vector<std::uint64_t> generation_;
    RailGroupOptions options_;
};

namespace detail {

/// What a transfer over a group carries to its completion.
struct GroupTransferState {
    RailGroup* group = nullptr;
    RailGroup::Selection selection;
    // TransferOptions' deprecated outputs (0.1), in the group's numbering until 0.3.
    TransferReport* old_report = nullptr;
    std::span<std::uint64_t> old_rail_bytes;
};

/// Completes a transfer over a group: the group learns from the result's
/// rails, which are then renumbered as the group's (and the deprecated
/// outputs filled), then the handler runs with the result.
template <class Handler>
struct GroupTransferHandler {
    std::shared_ptr<GroupTransferState> state; ///< allocated with the handler's allocator
    Handler handler;

    void operator()(async_error_code ec, TransferResult result) {
        GroupTransferState& s = *state;
        std::vector<TransferReport::Rail>& selected = result.report.rails;
        s.group->record(s.selection, result.report);
        // The report's rails are the selection's; the caller's are the group's.
        std::vector<TransferReport::Rail> rails(s.group->size());
        for (std::size_t i = 0; i < s.selection.index.size() && i < selected.size(); ++i)
            rails[s.selection.index[i]] = std::move(selected[i]);
        selected = std::move(rails);
        for (std::size_t k = 0; k < s.old_rail_bytes.size(); ++k)
            s.old_rail_bytes[k] = k < selected.size() ? selected[k].bytes : 0;
        if (s.old_report != nullptr) *s.old_report = result.report;
        state.reset();
        std::move(handler)(ec, std::move(result));
    }
};

struct InitiateGroupTransfer {
    RailGroup* group;
    const TransferPlan* plan;
    TransferOptions options;

    /// The group's executor (its first rail's), as async_transfer over rails
    /// has its first rail's: a handler without one of its own completes there.
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const { return group->executor(); }

    template <class Handler>
    void operator()(Handler&& handler) const {
        // The state lives until the handler runs: with the handler's allocator.
        using Allocator = typename std::allocator_traits<
            boost::asio::associated_allocator_t<std::decay_t<Handler>>>::template rebind_alloc<GroupTransferState>;
        auto state =
            std::allocate_shared<GroupTransferState>(Allocator(boost::asio::get_associated_allocator(handler)));
        state->group = group;
        state->selection = group->select();
        // 0.1's outputs, through their values (reading them there is not the deprecated use).
        state->old_report = options.report.value;
        state->old_rail_bytes = options.rail_bytes.value;
        TransferOptions o = options;
        o.report_blocks = options.report_blocks || state->old_report != nullptr;
        o.report.value = nullptr;
        o.rail_bytes.value = {};
        o.rail_weights = state->selection.weights;
        boost::asio::any_io_executor executor;
        const auto& rails = state->selection.rails;
        if (!rails.empty() && rails.front().qp != nullptr) executor = rails.front().qp->get_executor();
        InitiateTransfer initiate{bind_rails(rails), plan, o, executor, true};
        // The selection lives in the state, which the handler owns until it runs.
        initiate(GroupTransferHandler<std::decay_t<Handler>>{std::move(state), std::forward<Handler>(handler)});
    }
};

} // namespace detail

/// async_transfer over a group's rails: those not cooling, striped by
/// health (RailGroupOptions); afterwards the group learns each rail's
/// throughput and failures. Completion signature:
/// void(async_error_code, TransferResult); the result's report.rails is
/// always there, one per rail of the group, in its numbering (a rail left
/// out moved 0 bytes). The group must outlive the transfer. Otherwise as
/// async_transfer over a span of rails.
template <boost::asio::completion_token_for<void(async_error_code, TransferResult)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(RailGroup& group, const TransferPlan& plan, const TransferOptions& options,
                    Token&& token = Token()) {
    return boost::asio::async_initiate<Token, void(async_error_code, TransferResult)>(
        detail::InitiateGroupTransfer{&group, &plan, options}, token);
}

} // namespace gpuverbs

/// The handler's executor, allocator and cancellation slot are the caller's.
template <template <class, class> class Associator, class Handler, class DefaultCandidate>
struct boost::asio::associator<Associator, gpuverbs::detail::GroupTransferHandler<Handler>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
    static typename Associator<Handler, DefaultCandidate>::type get(
        const gpuverbs::detail::GroupTransferHandler<Handler>& h) noexcept {
        return Associator<Handler, DefaultCandidate>::get(h.handler);
    }
    static auto get(const gpuverbs::detail::GroupTransferHandler<Handler>& h, const DefaultCandidate& c) noexcept
        -> decltype(Associator<Handler, DefaultCandidate>::get(h.handler, c)) {
        return Associator<Handler, DefaultCandidate>::get(h.handler, c);
    }
};
