// KV-cache pools without a device: where the named layouts put each block,
// what a layout refuses, and what loading a peer's metadata refuses (the
// pools themselves, on registered memory, are tested in the rig).
#include "gpuverbs/transfers/kv_pool.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace gpuverbs;

namespace {

/// A good record: a per-layer pool of 4 layers, 8 blocks of 64 bytes.
const KvLayout small = KvLayout::per_layer(4, 8, 64);

std::vector<RemoteMemory> tensors_for(const KvLayout& layout, std::uint64_t length) {
    std::vector<RemoteMemory> t;
    for (std::uint32_t i = 0; i < layout.tensors(); ++i) t.push_back({0x100000 * (i + 1), length, 40 + i});
    return t;
}

/// The record with byte `at` replaced by `value` (the checksum then no longer matches).
std::vector<std::byte> with_byte(std::vector<std::byte> record, std::size_t at, std::uint8_t value) {
    record.at(at) = std::byte{value};
    return record;
}

} // namespace

TEST_SUITE("KV-cache pools: layouts and metadata") {
    TEST_CASE("the named layouts put each block where the engines' tensors have it") {
        const KvLayout per_layer = KvLayout::per_layer(32, 1000, 16384);
        CHECK(per_layer.tensors() == 32);
        CHECK(per_layer.offset(5, 0, 7) == 7 * 16384);                // K of block 7
        CHECK(per_layer.offset(5, 1, 7) == 1000 * 16384 + 7 * 16384); // V after all of K
        CHECK(per_layer.tensor_of(5) == 5);
        CHECK(per_layer.tensor_bytes() == 2 * 1000 * 16384);

        const KvLayout blocks_first = KvLayout::blocks_first(32, 1000, 16384);
        CHECK(blocks_first.offset(5, 0, 7) == 7 * 2 * 16384); // a block's K, then its V
        CHECK(blocks_first.offset(5, 1, 7) == 7 * 2 * 16384 + 16384);
        CHECK(blocks_first.tensor_bytes() == 2 * 1000 * 16384);

        const KvLayout one = KvLayout::one_tensor(32, 1000, 16384);
        CHECK(one.tensors() == 1);
        CHECK(one.tensor_of(31) == 0);
        CHECK(one.offset(3, 1, 2) == 3 * 2 * 1000 * 16384 + 1000 * 16384 + 2 * 16384);
        CHECK(one.tensor_bytes() == std::uint64_t{32} * 2 * 1000 * 16384);

        const KvLayout mla = KvLayout::per_layer(61, 100, 36864, 1);
        CHECK(mla.tensor_bytes() == 100 * 36864);
        for (const KvLayout& l : {per_layer, blocks_first, one, mla}) CHECK(l.problem().empty());
    }

    TEST_CASE("a layout that cannot hold its blocks says why") {
        struct Case {
            const char* name;
            KvLayout layout;
            std::string problem;
        };
        KvLayout overlapping = KvLayout::per_layer(2, 10, 4096);
        overlapping.block_stride = 2048;
        KvLayout halves_overlap = KvLayout::blocks_first(2, 10, 4096);
        halves_overlap.half_stride = 100;
        const std::vector<Case> cases{
            {"no layers", KvLayout::per_layer(0, 10, 64),
             "a layout needs at least one layer, one block and one byte per block (layers 0, blocks 10, block_bytes "
             "64)"},
            {"three halves", KvLayout::per_layer(2, 10, 64, 3),
             "halves is 3; it is 2 (K and V) or 1 (one tensor per block)"},
            {"a block above 4 GiB", KvLayout::per_layer(1, 1, std::uint64_t{1} << 32),
             "a block of 4294967296 bytes is longer than one work request carries (4294967295)"},
            {"blocks closer than their length", overlapping,
             "its blocks overlap the blocks inside them (block_stride 2048, half_stride 40960, layer_stride 0, "
             "block_bytes 4096)"},
            {"halves inside a block", halves_overlap,
             "its halves overlap the blocks inside them (block_stride 8192, half_stride 100, layer_stride 0, "
             "block_bytes 4096)"},
            {"a tensor past 2^63 bytes", KvLayout{2, 2, 1, 16, std::uint64_t{1} << 63, 0, 0},
             "a tensor of this layout would span more than 2^63 bytes"},
            {"named, and too large to compute", KvLayout::one_tensor(UINT32_MAX, UINT32_MAX, UINT32_MAX),
             "a tensor of this layout would span more than 2^63 bytes"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            CHECK(c.layout.problem() == c.problem);
        }
    }

    TEST_CASE(
        "a pool's metadata is 88 + 20 bytes per tensor on one rail and loads back as it was written, lease terms too") {
        const std::vector<RemoteMemory> tensors = tensors_for(small, small.tensor_bytes());
        const std::vector<std::byte> record =
            detail::kv_pool_record(small, 0x1234, tensors, 1'700'000'000'123'456'789, std::chrono::milliseconds(15000));
        CHECK(record.size() == 88 + 20 * 4);
        test::check_succeeds_clean(
            [&](std::error_code& ec) { CHECK(RemoteKvPool::load(record, ec)); },
            [&](std::error_code& ec, Diagnostics& d) { CHECK(RemoteKvPool::load(record, ec, d)); });
        const RemoteKvPool pool = RemoteKvPool::load(record);
        CHECK(pool.layout() == small);
        CHECK(pool.pool_id() == 0x1234);
        CHECK(pool.made_ns() == 1'700'000'000'123'456'789);
        CHECK(pool.lease_ttl() == std::chrono::milliseconds(15000));
        REQUIRE(pool.tensors().size() == 4);
        for (std::size_t t = 0; t < 4; ++t) CHECK(pool.tensors()[t] == tensors[t]);
        CHECK(pool.rails() == 1);
        CHECK(pool.tensors(1).empty());
        // 16,384 blocks per layer cost no more bytes than 8.
        const KvLayout large = KvLayout::per_layer(4, 16384, 16384);
        CHECK(detail::kv_pool_record(large, 1, tensors_for(large, large.tensor_bytes())).size() == record.size());
    }

    TEST_CASE("bad or stale metadata is refused alike in the three forms, naming the field") {
        const std::vector<std::byte> good = detail::kv_pool_record(small, 7, tensors_for(small, small.tensor_bytes()));
        KvLayout bad_layout = small;
        bad_layout.halves = 0;
        std::vector<std::byte> next_version = good;
        std::vector<RemoteMemory> seventeen_rails;
        for (int k = 0; k < 17; ++k) {
            for (const RemoteMemory& m : tensors_for(small, small.tensor_bytes())) seventeen_rails.push_back(m);
        }
        next_version[5] = std::byte{4};
        struct Case {
            const char* name;
            std::vector<std::byte> bytes;
            std::error_code code;
            std::string what;
        };
        const std::vector<Case> cases{
            {"empty",
             {},
             errc::malformed_record,
             "RemoteKvPool::load: pool metadata: the record is 0 bytes; one of a single tensor is 108 (truncated, or "
             "not pool metadata)"},
            {"another record", with_byte(good, 3, 'X'), errc::malformed_record,
             "RemoteKvPool::load: pool metadata: not gpuverbs pool metadata (wrong magic; expected \"GVKV\")"},
            {"a newer version", next_version, errc::unsupported_version,
             "RemoteKvPool::load: pool metadata has version 4; this gpuverbs reads version 3 (update both engines to "
             "the same gpuverbs release)"},
            {"cut short", std::vector<std::byte>(good.begin(), good.end() - 20), errc::malformed_record,
             "RemoteKvPool::load: pool metadata: the record is 148 bytes; with 4 tensors on 1 rail it is 168 "
             "(truncated)"},
            {"seventeen rails", detail::kv_pool_record(small, 7, seventeen_rails, 0, {}, 17), errc::malformed_record,
             "RemoteKvPool::load: pool metadata: it names 17 rails; a pool has 1 to 16"},
            {"a flipped bit", with_byte(good, 30, 0xff), errc::malformed_record,
             "RemoteKvPool::load: pool metadata: its checksum does not match its bytes (damaged on the way, or cut and "
             "pasted)"},
            {"a layout that cannot be", detail::kv_pool_record(bad_layout, 7, tensors_for(small, small.tensor_bytes())),
             errc::malformed_record,
             "RemoteKvPool::load: pool metadata: its layout: halves is 0; it is 2 (K and V) or 1 (one tensor per "
             "block)"},
            {"fewer tensors than layers",
             detail::kv_pool_record(small, 7, tensors_for(KvLayout::one_tensor(4, 8, 64), 1024)),
             errc::malformed_record, "RemoteKvPool::load: pool metadata: it lists 1 tensors; its layout has 4"},
            {"a tensor too short", detail::kv_pool_record(small, 7, tensors_for(small, 1000)), errc::malformed_record,
             "RemoteKvPool::load: pool metadata: tensor 0 is 1000 bytes; its layout needs 1024"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            const std::string what = test::check_fails_alike(
                c.code, [&] { return RemoteKvPool::load(c.bytes); },
                [&](std::error_code& ec) {
                    const RemoteKvPool none = RemoteKvPool::load(c.bytes, ec);
                    CHECK_FALSE(none);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) { return RemoteKvPool::load(c.bytes, ec, d); });
            CHECK(what == c.what);
        }
    }

    TEST_CASE("metadata older than the one already loaded from the peer is refused alike in the three forms") {
        const std::vector<RemoteMemory> tensors = tensors_for(small, small.tensor_bytes());
        const RemoteKvPool current = RemoteKvPool::load(detail::kv_pool_record(small, 0xbbbb, tensors, 2000));
        const std::vector<std::byte> before_restart = detail::kv_pool_record(small, 0xaaaa, tensors, 1000);
        const std::string what = test::check_fails_alike(
            errc::stale_metadata, [&] { return RemoteKvPool::load(before_restart, current); },
            [&](std::error_code& ec) { return RemoteKvPool::load(before_restart, current, ec); },
            [&](std::error_code& ec, Diagnostics& d) { return RemoteKvPool::load(before_restart, current, ec, d); });
        CHECK(what ==
              "RemoteKvPool::load: pool metadata of pool 0xaaaa made at 1000 ns is not newer than pool 0xbbbb "
              "made at 2000 ns, already loaded from this peer (a record from before the peer made its pool "
              "again): load the peer's current metadata");
        // Another pool made at the same instant is not newer either; the same pool again, or a newer one, loads.
        std::error_code ec;
        CHECK_FALSE(RemoteKvPool::load(detail::kv_pool_record(small, 0xcccc, tensors, 2000), current, ec));
        CHECK(ec == errc::stale_metadata);
        CHECK(
            RemoteKvPool::load(detail::kv_pool_record(small, 0xbbbb, tensors, 2000, std::chrono::seconds(9)), current));
        CHECK(RemoteKvPool::load(detail::kv_pool_record(small, 0xdddd, tensors, 3000), current).pool_id() == 0xdddd);
        CHECK(RemoteKvPool::load(before_restart, RemoteKvPool{})); // nothing loaded before: nothing to compare
        // A version-1 record (gpuverbs before lease terms) is refused, naming both versions.
        std::vector<std::byte> v1 = before_restart;
        v1[5] = std::byte{1}; // big-endian: the version's low byte
        Diagnostics d;
        CHECK_FALSE(RemoteKvPool::load(v1, ec, d));
        CHECK(ec == errc::unsupported_version);
        CHECK(d.detail() ==
              "pool metadata has version 1; this gpuverbs reads version 3 (update both engines to the "
              "same gpuverbs release)");
        // … whatever its size: version 1's record of one tensor (92 bytes) is shorter than version 3's smallest.
        const KvLayout one = KvLayout::one_tensor(2, 8, 64);
        std::vector<std::byte> v1_one = detail::kv_pool_record(one, 5, tensors_for(one, one.tensor_bytes()));
        v1_one.resize(92);
        v1_one[5] = std::byte{1};
        CHECK_FALSE(RemoteKvPool::load(v1_one, ec, d));
        CHECK(ec == errc::unsupported_version);
        // Two tensors sharing bytes under one key: refused (planning by id relies on tensors apart).
        std::vector<RemoteMemory> overlapping = tensors;
        overlapping[2].address = overlapping[1].address + 8;
        overlapping[2].rkey = overlapping[1].rkey;
        CHECK_FALSE(RemoteKvPool::load(detail::kv_pool_record(small, 0xeeee, overlapping, 1), ec, d));
        CHECK(ec == errc::malformed_record);
        CHECK(d.detail() == "pool metadata: tensors 1 and 2 overlap: each layer's blocks need memory of their own");
    }

    TEST_CASE("a pool on two rails carries each tensor's key on each; the plan names rail 0's") {
        std::vector<RemoteMemory> both = tensors_for(small, small.tensor_bytes());
        for (RemoteMemory m : tensors_for(small, small.tensor_bytes())) {
            m.rkey += 0x100; // the same memory, registered on the second NIC
            both.push_back(m);
        }
        const std::vector<std::byte> record = detail::kv_pool_record(small, 0x77, both, 5, {}, 2);
        CHECK(record.size() == 88 + 4 * (16 + 2 * 4));
        const RemoteKvPool pool = RemoteKvPool::load(record);
        REQUIRE(pool.rails() == 2);
        REQUIRE(pool.tensors(1).size() == 4);
        for (std::size_t t = 0; t < 4; ++t) {
            CHECK(pool.tensors()[t] == both[t]);
            CHECK(pool.tensors(0)[t] == both[t]);
            CHECK(pool.tensors(1)[t] == both[4 + t]);
        }
        // A version-2 record (one key per tensor, no rails) is named as such.
        std::vector<std::byte> v2 = record;
        v2[5] = std::byte{2};
        std::error_code ec;
        Diagnostics d;
        CHECK_FALSE(RemoteKvPool::load(v2, ec, d));
        CHECK(ec == errc::unsupported_version);
        CHECK(d.detail().find("pool metadata has version 2; this gpuverbs reads version 3") == 0);
        // Two tensors that overlap under one key of the second rail: refused, naming the rail.
        // (The record carries rail 0's addresses: tensor 2 starts inside tensor 1, apart on rail 0 by key.)
        std::vector<RemoteMemory> overlapping = both;
        overlapping[2].address = overlapping[1].address + 8;
        overlapping[6].rkey = overlapping[5].rkey;
        CHECK_FALSE(RemoteKvPool::load(detail::kv_pool_record(small, 0x77, overlapping, 5, {}, 2), ec, d));
        CHECK(ec == errc::malformed_record);
        CHECK(d.detail() ==
              "pool metadata: on rail 1, tensors 1 and 2 overlap: each layer's blocks need memory of their own");
    }

    TEST_CASE("every truncation and every single-byte change of a record is refused, never read past") {
        const std::vector<std::byte> good = detail::kv_pool_record(small, 9, tensors_for(small, small.tensor_bytes()));
        for (std::size_t n = 0; n < good.size(); ++n) {
            std::error_code ec;
            (void)RemoteKvPool::load(std::span(good).first(n), ec);
            CHECK_MESSAGE(ec, "a record cut to " << n << " bytes was accepted");
        }
        for (std::size_t at = 0; at < good.size(); ++at) {
            std::vector<std::byte> changed = good;
            changed[at] ^= std::byte{0x01};
            std::error_code ec;
            (void)RemoteKvPool::load(changed, ec);
            CHECK_MESSAGE(ec, "a record with byte " << at << " changed was accepted");
        }
    }

    TEST_CASE("an empty pool describes nothing and plans nothing, naming why") {
        const KvPool none;
        CHECK_FALSE(none);
        CHECK(none.describe().empty());
        const RemoteKvPool theirs = RemoteKvPool::load(detail::kv_pool_record(small, 7, tensors_for(small, 1024)));
        const std::uint32_t ids[] = {0};
        CHECK(
            test::check_fails_alike(
                errc::invalid_argument, [&] { return none.plan(TransferDirection::write, ids, theirs, ids); },
                [&](std::error_code& ec) { return none.plan(TransferDirection::write, ids, theirs, ids, {}, {}, ec); },
                [&](std::error_code& ec, Diagnostics& d) {
                    return none.plan(TransferDirection::write, ids, theirs, ids, {}, {}, ec, d);
                }) == "KvPool::plan: the KvPool is empty (create() refused it, or it was moved from)");
        std::error_code ec;
        (void)KvPool::create(small, std::vector<MemoryRegion>{}, ec);
        CHECK(ec == errc::invalid_argument);
        Diagnostics d;
        (void)KvPool::create(small, std::vector<MemoryRegion>{}, ec, d);
        CHECK(d.message() == "KvPool: 0 memory regions for a layout of 4 tensors (one per layer)");
    }
}
