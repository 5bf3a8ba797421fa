// A registration cache: registering memory is slow (pinning pages, and for
// large regions milliseconds), and services register the same buffers again
// and again. The cache hands back an existing MemoryRegion that covers the
// range with the access asked for, and registers otherwise. It never widens
// what a peer may do: a cached region is handed out only when it grants the
// peers exactly the remote access asked for (local_write may be more).
//
//   gpuverbs::RegistrationCache cache(pd, {.max_regions = 256, .max_bytes = 8ull << 30});
//   auto mr = cache.get(buffer, Access::local_write | Access::remote_write);   // shared_ptr<const MemoryRegion>
//   qp.post_write(mr->slice(...), ...);
//   cache.invalidate(buffer.data(), buffer.size());   // BEFORE freeing host memory: see below
//
// Rules:
//  - a hit needs one cached region covering the whole range with the same
//    remote access and at least the local access asked for; a range that
//    overlaps cached regions of the same remote access without fitting in
//    one is registered as the union of them all, and those regions leave
//    the cache (their holders keep them); regions of other remote access
//    are never merged with it (a read-only request never gets a writable
//    region);
//  - bounded in count and in bytes; the least recently used regions go first
//    (a region still held by the caller stays valid: the shared_ptr owns it);
//  - host memory: the cache cannot see free(). Call invalidate() for a range
//    before freeing or unmapping it (a later allocation at the same address
//    would otherwise get the old pages' registration);
//  - GPU memory (get(GpuMemory)) is checked on every lookup by the buffer id
//    the CUDA driver gives each allocation (CU_POINTER_ATTRIBUTE_BUFFER_ID):
//    a region of a freed buffer whose address came back in a new allocation
//    is dropped (statistics().stale) and the new buffer registered; regions of two
//    GPU allocations are never merged.
#pragma once

#include "gpuverbs/gpu/gpu_buffer.hpp"
#include "gpuverbs/gpu/gpu_direct.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace gpuverbs {

struct RegistrationCacheOptions {
    /// Regions the cache keeps at most.
    std::size_t max_regions = 1024;
    /// Bytes its regions pin at most.
    std::size_t max_bytes = std::size_t{4} << 30;
};

struct RegistrationCacheStatistics {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;        ///< registrations made
    std::uint64_t evictions = 0;     ///< regions dropped for the limits
    std::uint64_t merges = 0;        ///< regions dropped because a new one covers them
    std::uint64_t invalidations = 0; ///< regions dropped by invalidate()
    std::uint64_t stale = 0;         ///< regions dropped because their GPU buffer was freed and its address reused
    std::size_t regions = 0;         ///< regions cached now
    std::size_t bytes_pinned = 0;    ///< bytes they cover
};

/// The names before 0.2 (options and statistics are named so everywhere).
using RegistrationCacheLimits [[deprecated("use RegistrationCacheOptions")]] = RegistrationCacheOptions;
using RegistrationCacheStats [[deprecated("use RegistrationCacheStatistics")]] = RegistrationCacheStatistics;

namespace detail {

/// What a region lets a peer do (and how the NIC orders it): the access bits
/// a cached region must match exactly. Only local_write may be more than
/// asked: it grants the peers nothing.
constexpr Access peer_facing(Access access) noexcept {
    return access & (Access::remote_write | Access::remote_read | Access::remote_atomic | Access::relaxed_ordering);
}

/// The cache's bookkeeping over any handle type, without a device: which
/// cached range serves a request, what a miss registers and replaces, and
/// which entries the limits evict. Unit-tested with plain values.
///
/// Least access: entries are kept apart by what they let a peer do
/// (peer_facing), so a hit never hands out a region a peer can do more
/// with than the caller asked for, and a merge never takes the union of two
/// peers' rights: a request for remote_read next to a cached remote_write
/// region gets a registration of its own.
template <class Handle>
class RegistrationIndex {
public:
    explicit RegistrationIndex(RegistrationCacheOptions limits) : limits_(limits) {}

    /// The handle covering [begin, end) with `access` (the same peer-facing
    /// bits, at least its local ones), counted as a hit; else nothing.
    /// `owner`: the GPU buffer id of the memory now (0 for host memory); an
    /// entry made for another buffer at these addresses is stale and dropped.
    std::optional<Handle> find(std::uint64_t begin, std::uint64_t end, Access access, std::uint64_t owner = 0) {
        const unsigned kind = kind_of(access);
        auto it = entries_.upper_bound(Key{kind, begin});
        if (it == entries_.begin()) return std::nullopt;
        --it;
        if (it->first.first != kind) return std::nullopt;
        Entry& e = it->second;
        if (e.owner != owner && e.end > begin) {
            erase(it);
            ++stats_.stale;
            return std::nullopt;
        }
        if (end > e.end || (e.access & access) != access) return std::nullopt;
        lru_.splice(lru_.begin(), lru_, e.lru);
        ++stats_.hits;
        return e.handle;
    }

    /// What a miss must register: the range and access, grown to cover every
    /// cached entry of the same peer-facing access it overlaps (those are
    /// replaced when it is inserted).
    struct Miss {
        std::uint64_t begin, end;
        Access access;
        std::uint64_t owner = 0; ///< GPU buffer id (0: host memory)
    };
    /// Only entries of the same owner are merged; GPU memory never merges
    /// (two allocations cannot be one registration): entries of other owners
    /// that overlap are stale and dropped by insert().
    [[nodiscard]] Miss plan_miss(std::uint64_t begin, std::uint64_t end, Access access, std::uint64_t owner = 0) const {
        Miss m{begin, end, access, owner};
        const unsigned kind = kind_of(access);
        for (auto it = first_overlapping(kind, begin); in_range(it, kind, end); ++it) {
            if (it->second.owner != owner) continue;
            m.begin = std::min(m.begin, it->first.second);
            m.end = std::max(m.end, it->second.end);
            m.access = m.access | it->second.access; // local bits only: the peer-facing ones are equal
        }
        return m;
    }

    /// Adds a registration made for `m`, dropping what it covers, then evicts
    /// the least recently used entries beyond the limits (never this one).
    void insert(const Miss& m, Handle handle) {
        ++stats_.misses;
        const unsigned kind = kind_of(m.access);
        for (auto it = first_overlapping(kind, m.begin); in_range(it, kind, m.end);) {
            ++(it->second.owner == m.owner ? stats_.merges : stats_.stale);
            it = erase(it);
        }
        const Key key{kind, m.begin};
        lru_.push_front(key);
        entries_.emplace(key, Entry{m.end, m.access, std::move(handle), lru_.begin(), m.owner});
        bytes_ += m.end - m.begin;
        while ((entries_.size() > limits_.max_regions || bytes_ > limits_.max_bytes) && entries_.size() > 1) {
            erase(entries_.find(lru_.back()));
            ++stats_.evictions;
        }
    }

    /// Drops every entry overlapping [begin, end), whatever its access.
    void invalidate(std::uint64_t begin, std::uint64_t end) {
        for (auto next_kind = entries_.begin(); next_kind != entries_.end();) {
            const unsigned kind = next_kind->first.first;
            for (auto it = first_overlapping(kind, begin); in_range(it, kind, end);) {
                it = erase(it);
                ++stats_.invalidations;
            }
            next_kind = entries_.lower_bound(Key{kind + 1, 0});
        }
    }

    [[nodiscard]] RegistrationCacheStatistics statistics() const {
        RegistrationCacheStatistics s = stats_;
        s.regions = entries_.size();
        s.bytes_pinned = bytes_;
        return s;
    }

private:
    /// (peer-facing access, first address): entries of one kind never overlap each other.
    using Key = std::pair<unsigned, std::uint64_t>;
    struct Entry {
        std::uint64_t end;
        Access access;
        Handle handle;
        typename std::list<Key>::iterator lru;
        std::uint64_t owner = 0;
    };
    using Map = std::map<Key, Entry>;

    static unsigned kind_of(Access access) noexcept { return static_cast<unsigned>(peer_facing(access)); }

    // Entries of a kind never overlap each other, so the one before `begin`
    // is the only earlier one that can reach into it.
    template <class It>
    static It first_overlapping(It upper, It first, unsigned kind, std::uint64_t begin) {
        if (upper != first) {
            auto before = std::prev(upper);
            if (before->first.first == kind && before->second.end > begin) return before;
        }
        return upper;
    }
    typename Map::const_iterator first_overlapping(unsigned kind, std::uint64_t begin) const {
        return first_overlapping(entries_.upper_bound(Key{kind, begin}), entries_.begin(), kind, begin);
    }
    typename Map::iterator first_overlapping(unsigned kind, std::uint64_t begin) {
        return first_overlapping(entries_.upper_bound(Key{kind, begin}), entries_.begin(), kind, begin);
    }
    /// Whether `it` is an entry of `kind` starting before `end`.
    template <class It>
    bool in_range(It it, unsigned kind, std::uint64_t end) const {
        return it != entries_.end() && it->first.first == kind && it->first.second < end;
    }
    typename Map::iterator erase(typename Map::iterator it) {
        bytes_ -= it->second.end - it->first.second;
        lru_.erase(it->second.lru);
        return entries_.erase(it);
    }

    RegistrationCacheOptions limits_;
    Map entries_;
    std::list<Key> lru_; // most recent first
    std::size_t bytes_ = 0;
    RegistrationCacheStatistics stats_;
};

} // namespace detail

/// Not thread-safe: one cache per thread, or a lock around it.
class RegistrationCache {
public:
    /// Registers in `pd` (which must outlive the cache).
    explicit RegistrationCache(const ProtectionDomain& pd, RegistrationCacheOptions limits = {})
        : pd_(&pd), index_(limits) {}

    /// A region covering `memory` with `access` (the same remote access, at
    /// least the local): cached, or registered now.
    /// Throws what MemoryRegion's constructor throws.
    std::shared_ptr<const MemoryRegion> get(std::span<std::byte> memory, Access access);
    /// The error_code form: an empty pointer on failure (the cache is unchanged).
    std::shared_ptr<const MemoryRegion> get(std::span<std::byte> memory, Access access, std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    std::shared_ptr<const MemoryRegion> get(std::span<std::byte> memory, Access access, std::error_code& ec,
                                            Diagnostics& diagnostics);
    /// A region covering GPU memory with `access` (as above), registered with
    /// register_gpu_memory(method) on a miss. The allocation's buffer id is
    /// asked of the driver on every call, so a buffer freed and replaced at
    /// the same address is never served the old registration. Throws what
    /// GpuMemory::from_address and register_gpu_memory throw.
    std::shared_ptr<const MemoryRegion> get(const GpuMemory& memory, Access access,
                                            GpuRegistration method = GpuRegistration::automatic);
    /// The error_code forms (register_gpu_memory's reasons in the words).
    std::shared_ptr<const MemoryRegion> get(const GpuMemory& memory, Access access, GpuRegistration method,
                                            std::error_code& ec);
    std::shared_ptr<const MemoryRegion> get(const GpuMemory& memory, Access access, GpuRegistration method,
                                            std::error_code& ec, Diagnostics& diagnostics);

    /// Forgets every region overlapping [address, address + length): call it
    /// before freeing or unmapping host memory.
    void invalidate(const void* address, std::size_t length) {
        auto begin = reinterpret_cast<std::uint64_t>(address);
        index_.invalidate(begin, begin + length);
    }
    [[nodiscard]] RegistrationCacheStatistics statistics() const { return index_.statistics(); }
    /// The name before 0.2.
    [[deprecated("use statistics()")]] [[nodiscard]] RegistrationCacheStatistics stats() const { return statistics(); }

private:
    std::shared_ptr<const MemoryRegion> host_impl(std::span<std::byte> memory, Access access, detail::Status& status);
    std::shared_ptr<const MemoryRegion> gpu_impl(const GpuMemory& memory, Access access, GpuRegistration method,
                                                 detail::Status& status, std::vector<Rejection>* rejections = nullptr);
    const ProtectionDomain* pd_;
    using Index = detail::RegistrationIndex<std::shared_ptr<const MemoryRegion>>;
    /// The registration a miss made, cached under `miss` (or the failure kept in `status`).
    std::shared_ptr<const MemoryRegion> adopt(const Index::Miss& miss, MemoryRegion mr, const std::error_code& ec,
                                              const Diagnostics& words, detail::Status& status);
    Index index_;
};

} // namespace gpuverbs
