// The GVKV record (kv_pool.hpp): what KvPool::describe writes and
// RemoteKvPool::load reads — a peer's bytes, checked before anything is
// sized from them (tests/fuzz/kv_pool_record_fuzz.cpp).
#include "gpuverbs/transfers/kv_pool.hpp"

#include "transfers/kv_pool_parts.hpp"

#include "connections/wire_codec.hpp"
#include "text.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace gpuverbs {

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
        if (const std::string overlap = detail::tensors_overlap(pool.tensors(k), true); !overlap.empty()) {
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

} // namespace gpuverbs
