// Striping a plan over rails and summing up where its blocks stand
// (detail/transfers/stripes.hpp).
#include "gpuverbs/detail/transfers/stripes.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuverbs::detail {

Stripes stripe(const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
               std::span<const std::uint64_t> weights) {
    // The rails with a weight share [first, end); one without gets an empty
    // range where it stands. All weights zero: equal shares.
    const auto requests = plan.requests();
    const std::size_t rails = weights.size();
    Stripes out;
    out.bounds.assign(rails + 1, end);
    out.bounds[0] = first;
    out.bytes.assign(rails, 0);
    if (rails == 0) return out;
    std::uint64_t total = 0; // the whole plan's is known; a part's is summed
    if (first == 0 && end == requests.size()) {
        total = plan.bytes();
    } else {
        for (std::uint32_t i = first; i < end; ++i) total += requests[i].remote.length;
    }
    bool any = false;
    for (std::uint64_t w : weights) any = any || w > 0;
    auto weight = [&](std::size_t k) -> std::uint64_t { return any ? weights[k] : 1; };
    __extension__ typedef unsigned __int128 Wide; // NOLINT(modernize-use-using): total x weight needs 128 bits
    Wide sum_weights = 0;
    for (std::size_t k = 0; k < rails; ++k) sum_weights += weight(k);
    // Rail k ends after the request that brings the running total to its
    // cumulative share; at most one boundary per request, so no rail with a
    // weight is left empty before a busy one.
    std::uint32_t i = first;
    std::uint64_t sum = 0, at_bound = 0;
    Wide cumulative = 0;
    std::size_t last = rails; // the last rail with a weight takes the rest
    while (last > 0 && weight(last - 1) == 0) --last;
    for (std::size_t k = 0; k < rails; ++k) {
        out.bounds[k] = i;
        if (weight(k) == 0) continue; // empty: [i, i)
        cumulative += weight(k);
        if (k + 1 == last) {
            i = end;
            sum = total;
        } else {
            const auto target = static_cast<std::uint64_t>(total * cumulative / sum_weights);
            while (i < end) {
                sum += requests[i].remote.length;
                ++i;
                if (sum >= target) break;
            }
        }
        out.bytes[k] = sum - at_bound;
        at_bound = sum;
    }
    out.bounds[rails] = end; // a rail without weight starts where the next one does: empty
    return out;
}

Stripes stripe(const TransferPlan& plan, std::size_t rails) {
    const std::vector<std::uint64_t> equal(rails, 1);
    return stripe(plan, 0, static_cast<std::uint32_t>(plan.requests().size()), equal);
}

void summarize_blocks(const TransferPlan& plan, TransferReport& r) {
    const auto requests = plan.requests();
    r.requests.resize(requests.size(), BlockState::not_posted); // one state per request, whatever was given
    // A block takes the state of its requests: all landed, none posted, or else uncertain.
    constexpr std::uint8_t unseen = 0xff;
    std::vector<std::uint8_t> seen(plan.remote_blocks(), unseen);
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const auto s = static_cast<std::uint8_t>(r.requests[i]);
        for (std::uint32_t b = requests[i].first_remote; b <= requests[i].last_remote; ++b) {
            std::uint8_t& v = seen[b];
            v = v == unseen || v == s ? s : static_cast<std::uint8_t>(BlockState::uncertain);
        }
    }
    r.remote_blocks.resize(seen.size());
    r.landed = r.not_posted = r.uncertain = 0;
    for (std::size_t b = 0; b < seen.size(); ++b) {
        const auto s = seen[b] == unseen ? BlockState::uncertain : static_cast<BlockState>(seen[b]);
        r.remote_blocks[b] = s;
        (s == BlockState::landed ? r.landed : s == BlockState::not_posted ? r.not_posted : r.uncertain) += 1;
    }
}

} // namespace gpuverbs::detail
