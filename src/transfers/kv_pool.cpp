// KvPool (kv_pool.hpp): registered tensors under a layout, their rails, and
// plans by block id. The layout is kv_layout.cpp, the record a peer loads
// kv_pool_record.cpp.
#include "gpuverbs/transfers/kv_pool.hpp"

#include "transfers/kv_pool_parts.hpp"

#include "random.hpp"
#include "text.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <utility>

namespace gpuverbs {

std::vector<std::byte> KvPool::describe(std::chrono::milliseconds lease_ttl) const {
    std::vector<RemoteMemory> tensors;
    tensors.reserve(regions_.size());
    for (const MemoryRegion* mr : regions_) tensors.push_back(mr->remote());
    return regions_.empty() ? std::vector<std::byte>{}
                            : detail::kv_pool_record(layout_, pool_id_, tensors, made_ns_, lease_ttl, rails());
}

// --- the pool ------------------------------------------------------------------

KvPool KvPool::create_impl(KvLayout layout, std::vector<MemoryRegion> owned, std::vector<const MemoryRegion*> regions,
                           detail::Status& status) {
    const char* verb = "KvPool";
    if (std::string problem = layout.problem(); !problem.empty()) {
        status.fail(errc::invalid_argument, verb, "the layout: " + problem);
        return {};
    }
    if (regions.size() != layout.tensors()) {
        status.fail(errc::invalid_argument, verb,
                    std::to_string(regions.size()) + " memory regions for a layout of " +
                        std::to_string(layout.tensors()) + " tensors (" +
                        (layout.layer_stride == 0 ? "one per layer" : "one for every layer") + ")");
        return {};
    }
    if (regions.size() > UINT16_MAX) {
        status.fail(
            errc::invalid_argument, verb,
            std::to_string(regions.size()) + " tensors; pool metadata carries at most " + std::to_string(UINT16_MAX));
        return {};
    }
    const std::uint64_t need = layout.tensor_bytes();
    for (std::size_t t = 0; t < regions.size(); ++t) {
        if (regions[t] == nullptr || !*regions[t]) {
            status.fail(errc::invalid_argument, verb, "memory region " + std::to_string(t) + " is empty");
            return {};
        }
        if (regions[t]->length() < need) {
            status.fail(errc::invalid_argument, verb,
                        "memory region " + std::to_string(t) + " is " + std::to_string(regions[t]->length()) +
                            " bytes; the layout's tensor is " + std::to_string(need));
            return {};
        }
    }
    {
        std::vector<RemoteMemory> spans; // each tensor's bytes, as the planner addresses them
        spans.reserve(regions.size());
        for (const MemoryRegion* mr : regions) spans.push_back({mr->iova(), layout.tensor_bytes(), 0});
        if (const std::string overlap = detail::tensors_overlap(spans, false); !overlap.empty()) {
            status.fail(errc::invalid_argument, "KvPool", "regions " + overlap.substr(std::string("tensors ").size()));
            return {};
        }
    }
    KvPool pool;
    pool.layout_ = layout;
    pool.owned_.push_back(std::move(owned)); // regions point into its buffer, which the move keeps
    pool.regions_ = std::move(regions);
    do {
        pool.pool_id_ = detail::system_random();
    } while (pool.pool_id_ == 0);
    // When it was made, on the wall clock (a restarted peer's pool is newer across processes).
    pool.made_ns_ = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    return pool;
}

KvPool KvPool::create_owning(KvLayout layout, std::vector<MemoryRegion> owned, detail::Status& status) {
    std::vector<const MemoryRegion*> regions;
    regions.reserve(owned.size());
    for (const MemoryRegion& mr : owned) regions.push_back(&mr);
    return create_impl(layout, std::move(owned), std::move(regions), status);
}

KvPool::KvPool(KvLayout layout, std::vector<MemoryRegion> regions)
    : KvPool(detail::or_throw([&](detail::Status& s) { return create_owning(layout, std::move(regions), s); })) {}

KvPool KvPool::create(KvLayout layout, std::vector<MemoryRegion> regions, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_owning(layout, std::move(regions), s); });
}

KvPool KvPool::create(KvLayout layout, std::vector<MemoryRegion> regions, std::error_code& ec,
                      Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return create_owning(layout, std::move(regions), s); });
}

KvPool::KvPool(KvLayout layout, std::span<const MemoryRegion* const> regions)
    : KvPool(detail::or_throw([&](detail::Status& s) {
          return create_impl(layout, {}, {regions.begin(), regions.end()}, s);
      })) {}

KvPool KvPool::create(KvLayout layout, std::span<const MemoryRegion* const> regions, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) {
        return create_impl(layout, {}, {regions.begin(), regions.end()}, s);
    });
}

KvPool KvPool::create(KvLayout layout, std::span<const MemoryRegion* const> regions, std::error_code& ec,
                      Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        return create_impl(layout, {}, {regions.begin(), regions.end()}, s);
    });
}

// --- rails: the same tensors on other NICs ---------------------------------------

std::size_t KvPool::add_rail_impl(std::vector<MemoryRegion> owned, std::vector<const MemoryRegion*> regions,
                                  detail::Status& status) {
    const char* verb = "KvPool::add_rail";
    auto refuse = [&](std::string what) {
        status.fail(errc::invalid_argument, verb, std::move(what));
        return std::size_t{0};
    };
    if (regions_.empty()) return refuse("the KvPool is empty (create() refused it, or it was moved from)");
    if (rails() >= max_rails) {
        return refuse("the pool has " + std::to_string(rails()) + " rails already; its metadata carries at most " +
                      std::to_string(max_rails));
    }
    const std::size_t tensors = layout_.tensors();
    if (regions.size() != tensors) {
        return refuse(std::to_string(regions.size()) + " memory regions for a pool of " + std::to_string(tensors) +
                      " tensors: give each tensor's region on the new rail");
    }
    const std::uint64_t need = layout_.tensor_bytes();
    for (std::size_t t = 0; t < tensors; ++t) {
        const MemoryRegion* mr = regions[t];
        if (mr == nullptr || !*mr) return refuse("memory region " + std::to_string(t) + " is empty");
        const MemoryRegion& first = *regions_[t];
        if (mr->iova() != first.iova() || mr->length() < need) {
            return refuse("memory region " + std::to_string(t) + " covers " + detail::hex_address(mr->iova()) + " + " +
                          std::to_string(mr->length()) + " bytes; tensor " + std::to_string(t) + " is at " +
                          detail::hex_address(first.iova()) + " + " + std::to_string(need) +
                          " on rail 0 (a rail registers the same bytes in its NIC's protection domain)");
        }
    }
    const std::size_t index = rails();
    regions_.reserve(regions_.size() + tensors); // nothing can fail past here
    owned_.push_back(std::move(owned));          // regions point into its buffer, which the move keeps
    regions_.insert(regions_.end(), regions.begin(), regions.end());
    return index;
}

namespace {
std::vector<const MemoryRegion*> pointers_to(const std::vector<MemoryRegion>& owned) {
    std::vector<const MemoryRegion*> out;
    out.reserve(owned.size());
    for (const MemoryRegion& mr : owned) out.push_back(&mr);
    return out;
}
} // namespace

std::size_t KvPool::add_rail(std::vector<MemoryRegion> regions) {
    return detail::or_throw([&](detail::Status& s) {
        std::vector<const MemoryRegion*> p = pointers_to(regions);
        return add_rail_impl(std::move(regions), std::move(p), s);
    });
}

std::size_t KvPool::add_rail(std::vector<MemoryRegion> regions, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) {
        std::vector<const MemoryRegion*> p = pointers_to(regions);
        return add_rail_impl(std::move(regions), std::move(p), s);
    });
}

std::size_t KvPool::add_rail(std::vector<MemoryRegion> regions, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        std::vector<const MemoryRegion*> p = pointers_to(regions);
        return add_rail_impl(std::move(regions), std::move(p), s);
    });
}

std::size_t KvPool::add_rail(std::span<const MemoryRegion* const> regions) {
    return detail::or_throw([&](detail::Status& s) { return add_rail_impl({}, {regions.begin(), regions.end()}, s); });
}

std::size_t KvPool::add_rail(std::span<const MemoryRegion* const> regions, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) {
        return add_rail_impl({}, {regions.begin(), regions.end()}, s);
    });
}

std::size_t KvPool::add_rail(std::span<const MemoryRegion* const> regions, std::error_code& ec,
                             Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        return add_rail_impl({}, {regions.begin(), regions.end()}, s);
    });
}

TransferRail KvPool::rail_impl(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote,
                               detail::Status& status) const {
    const char* verb = "KvPool::rail";
    if (regions_.empty() || !remote) {
        status.fail(errc::invalid_argument, verb,
                    regions_.empty() ? "the KvPool is empty" : "the RemoteKvPool is empty (load the peer's metadata)");
        return {};
    }
    if (rail >= rails() || rail >= remote.rails()) {
        status.fail(errc::invalid_argument, verb,
                    "rail " + std::to_string(rail) + ": our pool is on " + std::to_string(rails()) +
                        " rails and the peer's on " + std::to_string(remote.rails()) +
                        " (KvPool::add_rail on the side that lacks it, then describe() again)");
        return {};
    }
    TransferRail out{&qp, {}, {}};
    if (rail == 0) return out; // the plan's own keys
    const auto ours = regions(rail);
    for (std::size_t t = 0; t < ours.size(); ++t) out.local(*regions_[t], *ours[t]);
    const auto theirs = remote.tensors(rail);
    const auto first = remote.tensors(0);
    for (std::size_t t = 0; t < theirs.size(); ++t) out.remote(first[t], theirs[t]);
    return out;
}

TransferRail KvPool::rail(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote) const {
    return detail::or_throw([&](detail::Status& s) { return rail_impl(rail, qp, remote, s); });
}

TransferRail KvPool::rail(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote, std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& s) { return rail_impl(rail, qp, remote, s); });
}

std::vector<RemoteBlock> KvPool::remote_blocks_impl(std::span<const std::uint32_t> ids, LayerRange layers,
                                                    detail::Status& status) const {
    const char* verb = "KvPool::remote_blocks";
    auto refuse = [&](std::string what) {
        status.fail(errc::invalid_argument, verb, std::move(what));
        return std::vector<RemoteBlock>{};
    };
    if (regions_.empty()) return refuse("the KvPool is empty (create() refused it, or it was moved from)");
    const KvLayout& l = layout_;
    const std::uint32_t first = layers.first;
    const std::uint64_t end = layers.count == UINT32_MAX ? l.layers : std::uint64_t{first} + layers.count;
    if (layers.count == 0 || first >= l.layers || end > l.layers) {
        return refuse("layers " + std::to_string(first) + " to " + std::to_string(end) +
                      " (exclusive) are not within the pool's " + std::to_string(l.layers));
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= l.blocks) {
            return refuse("id " + std::to_string(ids[i]) + " (index " + std::to_string(i) +
                          ") is outside the pool of " + std::to_string(l.blocks) + " blocks");
        }
    }
    std::vector<RemoteBlock> out;
    out.reserve(ids.size() * l.halves * static_cast<std::size_t>(end - first));
    for (std::uint32_t layer = first; layer < end; ++layer) {
        const RemoteMemory tensor = regions_[l.tensor_of(layer)]->remote();
        for (std::uint32_t half = 0; half < l.halves; ++half) {
            for (const std::uint32_t id : ids) out.push_back({tensor, l.offset(layer, half, id), l.block_bytes});
        }
    }
    return out;
}

std::vector<RemoteBlock> KvPool::remote_blocks(std::span<const std::uint32_t> ids, LayerRange layers) const {
    return detail::or_throw([&](detail::Status& s) { return remote_blocks_impl(ids, layers, s); });
}

std::vector<RemoteBlock> KvPool::remote_blocks(std::span<const std::uint32_t> ids, LayerRange layers,
                                               std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& s) { return remote_blocks_impl(ids, layers, s); });
}

// --- plans by block id ---------------------------------------------------------

TransferPlan KvPool::plan_impl(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                               const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids, LayerRange layers,
                               const TransferLimits& limits, detail::Status& status) const {
    const char* verb = "KvPool::plan";
    auto refuse = [&](std::string what) {
        status.fail(errc::invalid_argument, verb, std::move(what));
        return TransferPlan{};
    };
    if (regions_.empty()) return refuse("the KvPool is empty (create() refused it, or it was moved from)");
    if (!remote) return refuse("the RemoteKvPool is empty (load the peer's metadata first)");
    if (local_ids.size() != remote_ids.size()) {
        return refuse(std::to_string(local_ids.size()) + " local ids and " + std::to_string(remote_ids.size()) +
                      " remote ids: each local block pairs with one remote block");
    }
    if (local_ids.empty()) return refuse("no block ids: a plan moves at least one block");
    const KvLayout& ours = layout_;
    const KvLayout& theirs = remote.layout_;
    if (ours.block_bytes != theirs.block_bytes || ours.halves != theirs.halves) {
        return refuse("our blocks are " + std::to_string(ours.block_bytes) + " bytes in " +
                      std::to_string(ours.halves) + " halves, the peer's " + std::to_string(theirs.block_bytes) +
                      " bytes in " + std::to_string(theirs.halves) + " halves: the two pools must cut blocks alike");
    }
    std::uint32_t end = 0;
    if (layers.count == UINT32_MAX) {
        if (ours.layers != theirs.layers) {
            return refuse("we have " + std::to_string(ours.layers) + " layers, the peer " +
                          std::to_string(theirs.layers) + ": name the layers to move (LayerRange)");
        }
        if (layers.first >= ours.layers) {
            return refuse("layer " + std::to_string(layers.first) + " is past the last (" +
                          std::to_string(ours.layers - 1) + ")");
        }
        end = ours.layers;
    } else {
        if (layers.count == 0 || layers.first > std::min(ours.layers, theirs.layers) ||
            layers.count > std::min(ours.layers, theirs.layers) - layers.first) {
            return refuse("layers " + std::to_string(layers.first) + " to " +
                          std::to_string(std::uint64_t{layers.first} + layers.count) + " (exclusive) are not within " +
                          "both pools (ours has " + std::to_string(ours.layers) + ", the peer's " +
                          std::to_string(theirs.layers) + ")");
        }
        end = layers.first + layers.count;
    }
    for (std::size_t i = 0; i < local_ids.size(); ++i) {
        if (local_ids[i] >= ours.blocks) {
            return refuse("local id " + std::to_string(local_ids[i]) + " (index " + std::to_string(i) +
                          ") is outside our pool of " + std::to_string(ours.blocks) + " blocks");
        }
        if (remote_ids[i] >= theirs.blocks) {
            return refuse("remote id " + std::to_string(remote_ids[i]) + " (index " + std::to_string(i) +
                          ") is outside the peer's pool of " + std::to_string(theirs.blocks) + " blocks");
        }
    }
    // The destination side must not name a block twice (blocks of different
    // ids, halves and layers never overlap: KvLayout::problem() checked it).
    {
        const bool write = direction == TransferDirection::write;
        const std::span<const std::uint32_t> dest = write ? remote_ids : local_ids;
        std::vector<std::uint64_t> seen((write ? theirs.blocks : ours.blocks) / 64 + 1);
        for (std::size_t i = 0; i < dest.size(); ++i) {
            std::uint64_t& word = seen[dest[i] / 64];
            const std::uint64_t bit = std::uint64_t{1} << (dest[i] % 64);
            if ((word & bit) != 0) {
                const auto first =
                    static_cast<std::size_t>(std::find(dest.begin(), dest.end(), dest[i]) - dest.begin());
                return refuse(std::string(write ? "remote" : "local") + " id " + std::to_string(dest[i]) +
                              " is named twice (index " + std::to_string(first) + " and " + std::to_string(i) +
                              "): both would be written, and which lands last is undefined");
            }
            word |= bit;
        }
    }
    // One piece per (layer, half, id), in that order: the planner coalesces
    // neighbours that are contiguous in both pools (consecutive ids of a
    // block-contiguous layout).
    const std::size_t per_id = std::size_t{end - layers.first} * ours.halves;
    if (local_ids.size() > (std::size_t{1} << 40) / per_id) {
        return refuse(std::to_string(local_ids.size()) + " ids over " + std::to_string(per_id) +
                      " layer halves: more pieces than one plan holds");
    }
    // The one-pass planner reads the ids themselves (no list); a block it
    // cannot plan alone (longer than a message) goes through the lists below.
    if (ours.block_bytes <= UINT32_MAX) {
        std::vector<detail::StridedSegment> segments;
        segments.reserve(per_id);
        for (std::uint32_t layer = layers.first; layer < end; ++layer) {
            const MemoryRegion& mr = *regions_[ours.tensor_of(layer)];
            const RemoteMemory& rm = remote.tensors_[theirs.tensor_of(layer)];
            for (std::uint32_t half = 0; half < ours.halves; ++half) {
                segments.push_back({mr.iova() + ours.offset(layer, half, 0), mr.lkey(), mr.iova(),
                                    mr.iova() + mr.length(), rm, theirs.offset(layer, half, 0)});
            }
        }
        const detail::StridedPairs pairs{
            segments,          local_ids,           remote_ids,
            ours.block_stride, theirs.block_stride, static_cast<std::uint32_t>(ours.block_bytes)};
        bool general = false;
        TransferPlan plan = detail::make_strided_plan(direction, pairs, limits, general);
        if (!general) return plan;
    }
    const std::size_t count = local_ids.size() * per_id;
    std::vector<LocalBuffer> local(count);
    std::vector<RemoteBlock> far(count);
    const auto length = static_cast<std::uint32_t>(ours.block_bytes);
    std::size_t k = 0;
    for (std::uint32_t layer = layers.first; layer < end; ++layer) {
        const MemoryRegion& mr = *regions_[ours.tensor_of(layer)];
        const RemoteMemory& rm = remote.tensors_[theirs.tensor_of(layer)];
        const std::uint64_t begin = mr.iova();
        const std::uint64_t region_end = begin + mr.length();
        const std::uint32_t lkey = mr.lkey();
        for (std::uint32_t half = 0; half < ours.halves; ++half) {
            const std::uint64_t ours_base = begin + ours.offset(layer, half, 0);
            const std::uint64_t theirs_base = theirs.offset(layer, half, 0);
            for (std::size_t i = 0; i < local_ids.size(); ++i, ++k) {
                local[k] = LocalBuffer{ours_base + local_ids[i] * ours.block_stride, length, lkey, begin, region_end};
                far[k] = RemoteBlock{rm, theirs_base + remote_ids[i] * theirs.block_stride, ours.block_bytes};
            }
        }
    }
    return detail::make_transfer_plan(direction, local, far, limits, status);
}

TransferPlan KvPool::plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                          const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids, LayerRange layers,
                          const TransferLimits& limits) const {
    return detail::or_throw(
        [&](detail::Status& s) { return plan_impl(direction, local_ids, remote, remote_ids, layers, limits, s); });
}

TransferPlan KvPool::plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                          const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids, LayerRange layers,
                          const TransferLimits& limits, std::error_code& ec) const {
    return detail::or_code(
        ec, [&](detail::Status& s) { return plan_impl(direction, local_ids, remote, remote_ids, layers, limits, s); });
}

TransferPlan KvPool::plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                          const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids, LayerRange layers,
                          const TransferLimits& limits, std::error_code& ec, Diagnostics& diagnostics) const {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        return plan_impl(direction, local_ids, remote, remote_ids, layers, limits, s);
    });
}

} // namespace gpuverbs
