// Cutting a plan over rails (striping) and summing up where its blocks
// stand when a transfer ends: pure functions of a plan, no Asio (unit-tested).
#pragma once

#include "gpuverbs/transfers/transfer_options.hpp"
#include "gpuverbs/transfers/transfer_plan.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gpuverbs::detail {

/// Fills report.remote_blocks and the counts from report.requests (one state
/// per request of `plan`): a block is landed when every request carrying
/// part of it landed, not_posted when none was posted, else uncertain.
void summarize_blocks(const TransferPlan& plan, TransferReport& report);

/// A plan cut into contiguous ranges of requests, one per rail.
struct Stripes {
    std::vector<std::uint32_t> bounds; ///< rail k runs requests [bounds[k], bounds[k + 1])
    std::vector<std::uint64_t> bytes;  ///< … and moves this many bytes
};
/// Splits the plan's requests into `rails` contiguous ranges of about equal
/// bytes: rail k ends at the first request boundary at or past k+1 shares of
/// the total (a request is never split: bound one with TransferLimits::max_message);
/// at most one boundary per request, so empty rails come only at the end.
Stripes stripe(const TransferPlan& plan, std::size_t rails);
/// Splits requests [first, end) of the plan into weights.size() contiguous
/// ranges whose bytes are about proportional to the weights, by the same
/// rule; a rail of weight 0 gets an empty range (all 0: equal shares).
Stripes stripe(const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
               std::span<const std::uint64_t> weights);

} // namespace gpuverbs::detail
