// KvPool: a layout over registered tensors, its metadata record, and plans by
// block id (kv_pool.hpp).
#include "gpuverbs/transfers/kv_pool.hpp"

#include "connections/wire_codec.hpp"
#include "random.hpp"
#include "text.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <utility>

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

// --- the metadata record ----------------------------------------------------------
//
//   "GVKV" u16 version u16 tensors | u32 layers | u32 blocks | u32 halves | u32 lease ttl (ms) |
//   u64 block_bytes | u64 block_stride | u64 half_stride | u64 layer_stride | u64 pool id |
//   u64 made (ns since the epoch) | u32 rails | u32 reserved (0) |
//   tensors x (u64 address | u64 length | rails x u32 rkey) | u64 FNV-1a of every byte before it
// Version 1 (gpuverbs 0.2's first KV pools) had no lease ttl (a reserved 0) and no time made;
// version 2 no rails (one rkey per tensor).

namespace {

constexpr std::array<char, 4> kv_magic{'G', 'V', 'K', 'V'};
constexpr std::uint16_t kv_version = 3;
constexpr std::size_t kv_header_size = 80;
constexpr std::size_t kv_check_size = 8;

std::size_t kv_record_size(std::size_t tensors, std::size_t rails) {
    return kv_header_size + tensors * (16 + 4 * rails) + kv_check_size;
}

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
    std::uint64_t h = 14695981039346656037ull;
    for (std::byte b : bytes) {
        h ^= std::to_integer<std::uint64_t>(b);
        h *= 1099511628211ull;
    }
    return h;
}

/// Empty when no two tensors share a byte; otherwise which two, in words.
/// (Planning by id checks ids, not addresses: it relies on this.) Remote
/// tensors overlap only under one rkey.
std::string tensors_overlap(std::span<const RemoteMemory> tensors, bool by_key) {
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

} // namespace

RemoteKvPool RemoteKvPool::load_impl(std::span<const std::byte> bytes, detail::Status& status) {
    const char* verb = "RemoteKvPool::load";
    auto refuse = [&](std::string what) {
        status.fail(errc::malformed_record, verb, "pool metadata: " + std::move(what));
        return RemoteKvPool{};
    };
    // The magic and version first (8 bytes): a record of another version is named as such, whatever its size.
    if (bytes.size() >= 8) {
        wire::codec::Reader head(bytes.first(8));
        if (!head.magic(kv_magic)) return refuse("not gpuverbs pool metadata (wrong magic; expected \"GVKV\")");
        if (const std::uint16_t v = head.u16(); v != kv_version) {
            status.fail(errc::unsupported_version, verb,
                        "pool metadata has version " + std::to_string(v) + "; this gpuverbs reads version " +
                            std::to_string(kv_version) + " (update both engines to the same gpuverbs release)");
            return {};
        }
    }
    if (bytes.size() < kv_record_size(1, 1)) {
        return refuse("the record is " + std::to_string(bytes.size()) + " bytes; one of a single tensor is " +
                      std::to_string(kv_record_size(1, 1)) + " (truncated, or not pool metadata)");
    }
    wire::codec::Reader r(bytes);
    (void)r.magic(kv_magic);
    (void)r.u16();
    const std::uint16_t tensors = r.u16();
    if (tensors == 0) return refuse("it lists no tensor");
    std::uint32_t rails = 0;
    {
        wire::codec::Reader at(bytes.subspan(kv_header_size - 8, 4));
        rails = at.u32();
    }
    if (rails == 0 || rails > KvPool::max_rails) {
        return refuse("it names " + std::to_string(rails) + " rails; a pool has 1 to " +
                      std::to_string(KvPool::max_rails));
    }
    if (bytes.size() != kv_record_size(tensors, rails)) {
        const std::size_t want = kv_record_size(tensors, rails);
        return refuse("the record is " + std::to_string(bytes.size()) + " bytes; with " + std::to_string(tensors) +
                      " tensors on " + std::to_string(rails) + (rails == 1 ? " rail" : " rails") + " it is " +
                      std::to_string(want) + (bytes.size() < want ? " (truncated)" : " (trailing bytes)"));
    }
    wire::codec::Reader tail(bytes.subspan(bytes.size() - kv_check_size));
    if (const std::uint64_t sum = tail.u64(), want = fnv1a(bytes.first(bytes.size() - kv_check_size)); sum != want) {
        return refuse("its checksum does not match its bytes (damaged on the way, or cut and pasted)");
    }
    RemoteKvPool pool;
    KvLayout& l = pool.layout_;
    l.layers = r.u32();
    l.blocks = r.u32();
    l.halves = r.u32();
    pool.lease_ttl_ = std::chrono::milliseconds(r.u32());
    l.block_bytes = r.u64();
    l.block_stride = r.u64();
    l.half_stride = r.u64();
    l.layer_stride = r.u64();
    pool.pool_id_ = r.u64();
    pool.made_ns_ = r.u64();
    (void)r.u32(); // rails, read above
    (void)r.u32(); // reserved
    if (std::string problem = l.problem(); !problem.empty()) return refuse("its layout: " + problem);
    if (tensors != l.tensors()) {
        return refuse("it lists " + std::to_string(tensors) + " tensors; its layout has " +
                      std::to_string(l.tensors()));
    }
    const std::uint64_t need = l.tensor_bytes();
    pool.tensors_.resize(std::size_t{tensors} * rails);
    pool.rails_ = rails;
    for (std::uint32_t t = 0; t < tensors; ++t) {
        RemoteMemory m;
        m.address = r.u64();
        m.length = r.u64();
        if (m.length < need) {
            return refuse("tensor " + std::to_string(t) + " is " + std::to_string(m.length) +
                          " bytes; its layout needs " + std::to_string(need));
        }
        if (m.address > UINT64_MAX - m.length) {
            return refuse("tensor " + std::to_string(t) + " wraps past the end of the address space");
        }
        for (std::uint32_t k = 0; k < rails; ++k) {
            m.rkey = r.u32();
            pool.tensors_[std::size_t{k} * tensors + t] = m;
        }
    }
    for (std::uint32_t k = 0; k < rails; ++k) {
        if (const std::string overlap = tensors_overlap(pool.tensors(k), true); !overlap.empty()) {
            return refuse(rails == 1 ? overlap : "on rail " + std::to_string(k) + ", " + overlap);
        }
    }
    return pool;
}

RemoteKvPool RemoteKvPool::load_newer_impl(std::span<const std::byte> metadata, const RemoteKvPool& previous,
                                           detail::Status& status) {
    RemoteKvPool pool = load_impl(metadata, status);
    if (!status.ok() || !previous) return pool;
    if (pool.made_ns_ < previous.made_ns_ ||
        (pool.made_ns_ == previous.made_ns_ && pool.pool_id_ != previous.pool_id_)) {
        status.fail(errc::stale_metadata, "RemoteKvPool::load",
                    "pool metadata of pool " + detail::hex_address(pool.pool_id_) + " made at " +
                        std::to_string(pool.made_ns_) + " ns is not newer than pool " +
                        detail::hex_address(previous.pool_id_) + " made at " + std::to_string(previous.made_ns_) +
                        " ns, already loaded from this peer (a record from before the peer made its pool again): "
                        "load the peer's current metadata");
        return {};
    }
    return pool;
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata, const RemoteKvPool& previous) {
    return detail::or_throw([&](detail::Status& s) { return load_newer_impl(metadata, previous, s); });
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata, const RemoteKvPool& previous,
                                std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return load_newer_impl(metadata, previous, s); });
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata, const RemoteKvPool& previous, std::error_code& ec,
                                Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return load_newer_impl(metadata, previous, s); });
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata) {
    return detail::or_throw([&](detail::Status& s) { return load_impl(metadata, s); });
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return load_impl(metadata, s); });
}

RemoteKvPool RemoteKvPool::load(std::span<const std::byte> metadata, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return load_impl(metadata, s); });
}

std::vector<std::byte> detail::kv_pool_record(const KvLayout& layout, std::uint64_t pool_id,
                                              std::span<const RemoteMemory> tensors, std::uint64_t made_ns,
                                              std::chrono::milliseconds lease_ttl, std::size_t rails) {
    const std::size_t count = rails == 0 ? 0 : tensors.size() / rails;
    std::vector<std::byte> out(kv_record_size(count, rails));
    wire::codec::Writer w(out);
    w.header(kv_magic, kv_version, static_cast<std::uint16_t>(count));
    w.u32(layout.layers);
    w.u32(layout.blocks);
    w.u32(layout.halves);
    w.u32(static_cast<std::uint32_t>(std::clamp<std::int64_t>(lease_ttl.count(), 0, UINT32_MAX)));
    w.u64(layout.block_bytes);
    w.u64(layout.block_stride);
    w.u64(layout.half_stride);
    w.u64(layout.layer_stride);
    w.u64(pool_id);
    w.u64(made_ns);
    w.u32(static_cast<std::uint32_t>(rails));
    w.u32(0);
    for (std::size_t t = 0; t < count; ++t) {
        w.u64(tensors[t].address);
        w.u64(tensors[t].length);
        for (std::size_t k = 0; k < rails; ++k) w.u32(tensors[k * count + t].rkey);
    }
    const std::uint64_t sum = fnv1a(std::span<const std::byte>(out).first(out.size() - kv_check_size));
    wire::codec::Writer tail(std::span<std::byte>(out).subspan(out.size() - kv_check_size));
    tail.u64(sum);
    return out;
}

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
        if (const std::string overlap = tensors_overlap(spans, false); !overlap.empty()) {
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
