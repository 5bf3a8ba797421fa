// The registration cache's bookkeeping without a device: hits, misses that
// grow over what they overlap, least-recently-used eviction within both
// limits, invalidation. Handles are plain numbers here; the rig test runs the
// same index with real MemoryRegions.
#include "gpuverbs/transfers/registration_cache.hpp"

#include <doctest/doctest.h>

#include <random>

using namespace gpuverbs;

namespace {
constexpr Access rw = Access::local_write | Access::remote_write;
using Index = detail::RegistrationIndex<int>;

int fetch(Index& index, std::uint64_t begin, std::uint64_t end, Access access, int& next) {
    if (auto hit = index.find(begin, end, access)) return *hit;
    auto miss = index.plan_miss(begin, end, access);
    index.insert(miss, next);
    return next++;
}
} // namespace

TEST_SUITE("registration cache") {
    TEST_CASE("a covered range with the access asked for is a hit; other remote access or a wider range is a miss") {
        Index index({});
        int next = 1;
        CHECK(fetch(index, 1000, 2000, rw, next) == 1);
        CHECK(fetch(index, 1200, 1300, rw, next) == 1); // inside, the same access
        CHECK(fetch(index, 1000, 2000, rw, next) == 1);
        CHECK(index.statistics().hits == 2);
        CHECK(index.statistics().misses == 1);
        // More remote access: a registration of its own; the remote_write one stays for its users.
        CHECK(fetch(index, 1000, 1500, rw | Access::remote_read, next) == 2);
        CHECK(index.statistics().merges == 0);
        CHECK(fetch(index, 1200, 1300, rw, next) == 1);
        CHECK(fetch(index, 1200, 1300, rw | Access::remote_read, next) == 2);
        // Within one remote access, overlapping ranges merge: [1000, 1500) and [1400, 2000) become one.
        CHECK(fetch(index, 1400, 2000, rw | Access::remote_read, next) == 3);
        CHECK(index.statistics().merges == 1);
        CHECK(fetch(index, 1000, 2000, rw | Access::remote_read, next) == 3);
        CHECK(index.statistics().regions == 2);
        CHECK(index.statistics().bytes_pinned == 2000);
    }

    TEST_CASE("attack: a request for less remote access never gets a region a peer can do more with") {
        // What a peer learns (the rkey of the region handed out) must not let it
        // write where the caller only meant it to read.
        Index index({});
        int next = 1;
        const Access everything =
            Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;
        CHECK(fetch(index, 0, 1 << 20, everything, next) == 1);
        const int read_only = fetch(index, 4096, 8192, Access::remote_read, next);
        CHECK(read_only == 2); // not the writable region 1
        // A read-only request overlapping the writable region is not merged into it either.
        auto miss = index.plan_miss(0, 2 << 20, Access::remote_read);
        CHECK(miss.access == Access::remote_read);
        // local_write is not a peer's right: a local_write region serves a request without it.
        CHECK(fetch(index, 0, 100, Access::local_write | Access::remote_read, next) == 3);
        CHECK(fetch(index, 0, 100, Access::remote_read, next) == 3);
        // ...and relaxed ordering, which changes what a peer sees land, is never added.
        CHECK(fetch(index, 0, 100, Access::local_write | Access::relaxed_ordering, next) == 4);
        CHECK(fetch(index, 0, 100, Access::local_write, next) == 5);
        // Invalidation drops a range in every access.
        index.invalidate(0, 1 << 20);
        CHECK(index.statistics().regions == 0);
        CHECK(index.statistics().bytes_pinned == 0);
    }

    TEST_CASE("a range overlapping several cached regions is registered as their union; neighbours stay apart") {
        Index index({});
        int next = 1;
        fetch(index, 0, 100, rw, next);
        fetch(index, 200, 300, rw, next);
        fetch(index, 300, 400, rw, next); // touches [200, 300) but does not overlap it: separate
        CHECK(index.statistics().regions == 3);
        CHECK(fetch(index, 50, 250, rw, next) == 4); // overlaps the first two
        auto s = index.statistics();
        CHECK(s.regions == 2);
        CHECK(s.merges == 2);
        CHECK(s.bytes_pinned == 300 + 100);
        CHECK(fetch(index, 0, 300, rw, next) == 4);
        CHECK(fetch(index, 300, 400, rw, next) == 3);
    }

    TEST_CASE("GPU memory: an entry of a freed buffer at a reused address is stale; two buffers never merge") {
        Index index({});
        const Access rw = Access::local_write;
        // Buffer 7 at [0x1000, 0x9000) cached.
        index.insert(index.plan_miss(0x1000, 0x9000, rw, 7), 1);
        CHECK(index.find(0x2000, 0x3000, rw, 7) == 1);
        // Freed; buffer 8 now lives at the same addresses: no hit, the old entry is dropped.
        CHECK_FALSE(index.find(0x2000, 0x3000, rw, 8).has_value());
        CHECK(index.statistics().stale == 1);
        CHECK(index.statistics().regions == 0);
        // Buffer 8 is registered for [0x1000, 0x5000); buffer 9 next to it is never merged with it.
        index.insert(index.plan_miss(0x1000, 0x5000, rw, 8), 2);
        auto miss = index.plan_miss(0x4000, 0x6000, rw, 9);
        CHECK(miss.begin == 0x4000); // not grown over buffer 8's entry
        CHECK(miss.end == 0x6000);
        index.insert(miss, 3); // buffer 8's overlapping entry is stale now (its range is buffer 9's)
        CHECK(index.statistics().stale == 2);
        CHECK(index.statistics().merges == 0);
        CHECK(index.find(0x4000, 0x6000, rw, 9) == 3);
        // Host memory (owner 0) and GPU memory never answer for each other.
        CHECK_FALSE(index.find(0x4000, 0x5000, rw, 0).has_value());
    }

    TEST_CASE("least recently used regions are evicted to stay within the count and the bytes") {
        Index index({.max_regions = 3, .max_bytes = 1000});
        int next = 1;
        fetch(index, 0, 100, rw, next);     // 1
        fetch(index, 1000, 1100, rw, next); // 2
        fetch(index, 2000, 2100, rw, next); // 3
        fetch(index, 0, 100, rw, next);     // hit: 1 is now the most recent
        fetch(index, 3000, 3100, rw, next); // 4: evicts 2
        CHECK(index.statistics().evictions == 1);
        CHECK(index.find(1000, 1100, rw) == std::nullopt);
        CHECK(index.find(0, 100, rw) == 1);
        // 900 bytes: evicts 3, then 4 (1 was used by the find above) to pin <= 1000
        fetch(index, 5000, 5900, rw, next);
        auto s = index.statistics();
        CHECK(s.bytes_pinned == 1000);
        CHECK(s.regions == 2);
        CHECK(s.evictions == 3);
        CHECK(index.find(0, 100, rw) == 1);
        CHECK(index.find(3000, 3100, rw) == std::nullopt);
        CHECK(index.find(5000, 5900, rw) == 5);
    }

    TEST_CASE("a region larger than the byte limit is still handed out, alone") {
        Index index({.max_regions = 8, .max_bytes = 100});
        int next = 1;
        fetch(index, 0, 50, rw, next);
        CHECK(fetch(index, 1000, 1500, rw, next) == 2);
        CHECK(index.statistics().regions == 1);
    }

    TEST_CASE("invalidate drops every region the range touches, and only those") {
        Index index({});
        int next = 1;
        fetch(index, 0, 100, rw, next);
        fetch(index, 200, 300, rw, next);
        fetch(index, 400, 500, rw, next);
        index.invalidate(50, 250);
        auto s = index.statistics();
        CHECK(s.invalidations == 2);
        CHECK(s.regions == 1);
        CHECK(index.find(400, 500, rw) == 3);
        CHECK(fetch(index, 0, 100, rw, next) == 4); // registered again
    }

    TEST_CASE("10,000 mixed requests never exceed the bounds, and every answer covers its request") {
        Index index({.max_regions = 32, .max_bytes = 1 << 20});
        std::mt19937 random(7);
        std::map<int, std::pair<std::uint64_t, std::uint64_t>> ranges; // handle -> the range registered for it
        std::map<int, Access> granted;                                 // handle -> the access registered
        int next = 1;
        for (int i = 0; i < 10000; ++i) {
            std::uint64_t begin = (random() % 4096) * 512;
            std::uint64_t end = begin + 1 + random() % 65536;
            const Access kinds[] = {rw, Access::local_write, Access::remote_read,
                                    Access::local_write | Access::remote_read};
            const Access access = kinds[random() % 4];
            int handle = 0;
            if (auto hit = index.find(begin, end, access)) {
                handle = *hit;
            } else {
                auto miss = index.plan_miss(begin, end, access);
                handle = next++;
                ranges[handle] = {miss.begin, miss.end};
                granted[handle] = miss.access;
                index.insert(miss, handle);
            }
            CHECK(detail::peer_facing(granted[handle]) == detail::peer_facing(access));
            CHECK((granted[handle] & access) == access);
            CHECK(ranges[handle].first <= begin);
            CHECK(end <= ranges[handle].second);
            auto s = index.statistics();
            REQUIRE(s.regions <= 32);
            // A single region may exceed the byte bound only when it is the only one cached.
            REQUIRE((s.bytes_pinned <= (1u << 20) || s.regions == 1));
        }
        auto s = index.statistics();
        CHECK(s.hits + s.misses == 10000);
        MESSAGE("10,000 requests: " << s.hits << " hits, " << s.misses << " misses, " << s.evictions << " evictions, "
                                    << s.merges << " merges");
    }
}
