// Leases on advertised blocks (transfers/leases.hpp): the owner's table and
// the reader's stale-list check. The read under a lease and its release by
// the notification run on Soft-RoCE (integration/transfer_test.cpp).
#include "gpuverbs/transfers/leases.hpp"

#include <doctest/doctest.h>

#include <string>
#include <thread>

using namespace gpuverbs;
using namespace std::chrono_literals;

TEST_SUITE("leases") {
    const RemoteMemory pool{0x10000, 1 << 20, 5};
    const RemoteMemory other{0x10000, 1 << 20, 6}; // same addresses, another region (rkey)

    TEST_CASE("a lease holds exactly its bytes until released; versions grow, ids are distinct") {
        BlockLeases leases;
        const LeasedBlockList a = leases.grant({{pool, 0, 4096}, {pool, 8192, 4096}});
        const LeasedBlockList b = leases.grant({{pool, 4096, 4096}});
        CHECK(a.lease != 0);
        CHECK(a.lease != b.lease);
        CHECK(b.version > a.version);
        CHECK(a.ttl == BlockLeasesOptions{}.ttl);
        CHECK(leases.active() == 2);
        CHECK(leases.held({pool, 100, 1}));
        CHECK(leases.held({pool, 8191, 2}));        // overlaps the second block by one byte
        CHECK_FALSE(leases.held({other, 0, 4096})); // another region
        CHECK_FALSE(leases.held({pool, 12288, 100}));
        CHECK(leases.release(a.lease));
        CHECK_FALSE(leases.release(a.lease));
        CHECK_FALSE(leases.release(999));
        CHECK_FALSE(leases.held({pool, 100, 1}));
        CHECK(leases.held({pool, 4096, 1})); // b still holds its block
        CHECK(leases.active() == 1);
        // The owner's attempt to reuse: refused while b holds a block, in words.
        std::string why;
        const std::vector<RemoteBlock> reuse{{pool, 0, 4096}, {pool, 4096, 4096}};
        CHECK(leases.claim(reuse, &why) == errc::blocks_leased);
        CHECK_MESSAGE(why.find("block 1 (4096 bytes at offset 4096) is under lease " + std::to_string(b.lease) +
                               " (list version " + std::to_string(b.version) + "): wait for the reader's release") == 0,
                      why);
        CHECK(leases.release(b.lease));
        CHECK_FALSE(leases.claim(reuse, &why));
    }

    TEST_CASE("an unreleased lease expires after ttl + grace; expire() names it") {
        BlockLeasesOptions o;
        o.ttl = 30ms;
        o.grace = 20ms;
        BlockLeases leases(o);
        const LeasedBlockList a = leases.grant({{pool, 0, 64}});
        std::this_thread::sleep_for(35ms); // past the ttl, within the grace: still held
        CHECK(leases.active() == 1);
        std::this_thread::sleep_for(30ms);
        const std::vector<std::uint32_t> gone = leases.expire();
        REQUIRE(gone.size() == 1);
        CHECK(gone[0] == a.lease);
        CHECK_FALSE(leases.held({pool, 0, 64}));
        CHECK_FALSE(leases.release(a.lease));
    }

    TEST_CASE("bad input: a list the wire would refuse, a lease time that is not positive") {
        BlockLeases leases;
        CHECK_THROWS_WITH_AS(leases.grant({}), "BlockLeases::grant: a block list has 1 to 1048576 blocks, not 0",
                             Error);
        CHECK_THROWS_WITH_AS(leases.grant({{pool, (1 << 20) - 1, 2}}),
                             "BlockLeases::grant: block 0 (2 bytes at offset 1048575) lies outside its region of "
                             "1048576 bytes",
                             Error);
        CHECK(leases.active() == 0);
        BlockLeasesOptions zero;
        zero.ttl = 0ms;
        CHECK_THROWS_WITH_AS(BlockLeases{zero},
                             "BlockLeases: ttl must be positive and grace not negative (ttl 0 ms, grace 5000 ms)",
                             Error);
    }

    TEST_CASE("the reader refuses a list not newer than one it accepted from the same owner") {
        LeaseReader reader;
        LeasedBlockList l;
        l.version = 5;
        CHECK_FALSE(reader.accept(7, l));
        CHECK(reader.accept(7, l) == errc::stale_block_list);
        l.version = 4;
        std::string why;
        const std::error_code stale = reader.accept(7, l, &why);
        CHECK(stale == errc::stale_block_list);
        CHECK(stale.message().find("older than one already received") != std::string::npos);
        CHECK(why ==
              "block list version 4 from owner 7 is not newer than version 5 already accepted from it: its "
              "blocks may have been reused since");
        CHECK_FALSE(reader.accept(8, l)); // another owner
        l.version = 6;
        CHECK_FALSE(reader.accept(7, l));
        l.ttl = 250ms;
        const auto now = std::chrono::steady_clock::now();
        CHECK(LeaseReader::deadline(l, now) == now + 250ms);
    }
}
