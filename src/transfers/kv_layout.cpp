// KvLayout (kv_pool.hpp): the shapes of a KV cache's tensors, what a layout
// must satisfy, and the rule every pool's tensors keep (no two overlap).
#include "gpuverbs/transfers/kv_pool.hpp"

#include "transfers/kv_pool_parts.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace gpuverbs {

// --- the layout ----------------------------------------------------------------

namespace {
/// a * b, or UINT64_MAX where it overflows (a layout that large is then refused by problem()).
std::uint64_t times(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
} // namespace

KvLayout KvLayout::per_layer(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                             std::uint32_t halves) noexcept {
    return KvLayout{layers, blocks, halves, block_bytes, block_bytes, times(blocks, block_bytes), 0};
}

KvLayout KvLayout::blocks_first(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                                std::uint32_t halves) noexcept {
    return KvLayout{layers, blocks, halves, block_bytes, times(halves, block_bytes), block_bytes, 0};
}

KvLayout KvLayout::one_tensor(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                              std::uint32_t halves) noexcept {
    const std::uint64_t half = times(blocks, block_bytes);
    return KvLayout{layers, blocks, halves, block_bytes, block_bytes, half, times(halves, half)};
}

namespace {

/// One dimension of a tensor: how many and how far apart.
struct Dimension {
    const char* name;
    std::uint64_t count;
    std::uint64_t stride;
};

/// The end of the last block from a tensor's first byte, and the first
/// dimension whose elements overlap the ones inside it (nullptr: none); 0 for
/// an end past 2^63.
std::pair<std::uint64_t, const char*> extent_of(const KvLayout& l) {
    std::array<Dimension, 3> dims{{{"blocks", l.blocks, l.block_stride},
                                   {"halves", l.halves, l.half_stride},
                                   {"layers", l.layer_stride == 0 ? 1u : l.layers, l.layer_stride}}};
    std::sort(dims.begin(), dims.end(), [](const Dimension& a, const Dimension& b) { return a.stride < b.stride; });
    std::uint64_t extent = l.block_bytes;
    const char* overlapping = nullptr;
    for (const Dimension& d : dims) {
        if (d.count <= 1) continue;
        if (d.stride < extent && overlapping == nullptr) overlapping = d.name;
        std::uint64_t span = 0;
        if (__builtin_mul_overflow(d.stride, d.count - 1, &span) || __builtin_add_overflow(span, extent, &extent)) {
            return {0, overlapping};
        }
    }
    if (extent > (std::uint64_t{1} << 63)) return {0, overlapping};
    return {extent, overlapping};
}

} // namespace

std::uint64_t KvLayout::tensor_bytes() const noexcept {
    return extent_of(*this).first;
}

std::string KvLayout::problem() const {
    if (layers == 0 || blocks == 0 || block_bytes == 0) {
        return "a layout needs at least one layer, one block and one byte per block (layers " + std::to_string(layers) +
               ", blocks " + std::to_string(blocks) + ", block_bytes " + std::to_string(block_bytes) + ")";
    }
    if (halves != 1 && halves != 2) {
        return "halves is " + std::to_string(halves) + "; it is 2 (K and V) or 1 (one tensor per block)";
    }
    if (block_bytes > UINT32_MAX) {
        return "a block of " + std::to_string(block_bytes) + " bytes is longer than one work request carries (" +
               std::to_string(UINT32_MAX) + ")";
    }
    const auto [extent, overlapping] = extent_of(*this);
    if (overlapping != nullptr) {
        return std::string("its ") + overlapping + " overlap the blocks inside them (block_stride " +
               std::to_string(block_stride) + ", half_stride " + std::to_string(half_stride) + ", layer_stride " +
               std::to_string(layer_stride) + ", block_bytes " + std::to_string(block_bytes) + ")";
    }
    if (extent == 0) return "a tensor of this layout would span more than 2^63 bytes";
    return {};
}

// --- the rule every pool's tensors keep ---------------------------------------------

std::string detail::tensors_overlap(std::span<const RemoteMemory> tensors, bool by_key) {
    std::vector<std::size_t> order(tensors.size());
    for (std::size_t t = 0; t < order.size(); ++t) order[t] = t;
    auto key = [&](std::size_t t) { return std::pair(by_key ? tensors[t].rkey : 0U, tensors[t].address); };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    for (std::size_t k = 1; k < order.size(); ++k) {
        const RemoteMemory& a = tensors[order[k - 1]];
        const RemoteMemory& b = tensors[order[k]];
        if ((!by_key || a.rkey == b.rkey) && b.address < a.address + a.length) {
            return "tensors " + std::to_string(std::min(order[k - 1], order[k])) + " and " +
                   std::to_string(std::max(order[k - 1], order[k])) +
                   " overlap: each layer's blocks need memory of their own";
        }
    }
    return {};
}

} // namespace gpuverbs
