// Leases on advertised blocks (transfers/leases.hpp): the owner's table and
// the reader's stale-list check. The read under a lease and its release by
// the notification run on Soft-RoCE (integration/transfer_blocks_test.cpp).
#include "gpuverbs/transfers/leases.hpp"

#include "allocation_counter.hpp"
#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <thread>

using namespace gpuverbs;
using namespace std::chrono_literals;

TEST_SUITE("leases") {
    const RemoteMemory pool{0x10000, 1 << 20, 5};
    const RemoteMemory other{0x10000, 1 << 20, 6}; // same addresses, another region (rkey)

    constexpr BlockLeases::Reader reader_a = 1, reader_b = 2;

    TEST_CASE("a lease holds exactly its bytes until its reader releases it; versions grow, ids are distinct") {
        BlockLeases leases;
        const LeasedBlockList a = leases.grant({{pool, 0, 4096}, {pool, 8192, 4096}}, reader_a);
        const LeasedBlockList b = leases.grant({{pool, 4096, 4096}}, reader_b);
        CHECK(a.lease != 0);
        CHECK(a.lease != b.lease);
        CHECK(b.version > a.version);
        CHECK(a.ttl == BlockLeasesOptions{}.ttl);
        CHECK(leases.active() == 2);
        CHECK(leases.held({pool, 100, 1}));
        CHECK(leases.held({pool, 8191, 2})); // overlaps the second block by one byte
        CHECK_FALSE(leases.held({pool, 12288, 100}));
        CHECK_FALSE(leases.release(a.lease, reader_a));
        CHECK(leases.release(a.lease, reader_a) == errc::lease_unknown); // once
        CHECK(leases.release(999, reader_a) == errc::lease_unknown);
        CHECK_FALSE(leases.held({pool, 100, 1}));
        CHECK(leases.held({pool, 4096, 1})); // b still holds its block
        CHECK(leases.active() == 1);
        // The owner's attempt to reuse: refused while b holds a block, in words.
        Diagnostics why;
        const std::vector<RemoteBlock> reuse{{pool, 0, 4096}, {pool, 4096, 4096}};
        CHECK(leases.claim(reuse, why) == errc::blocks_leased);
        CHECK_MESSAGE(
            why.detail().find("block 1 (4096 bytes at offset 4096) is under lease " + std::to_string(b.lease) +
                              " (list version " + std::to_string(b.version) + "): wait for the reader's release") == 0,
            why.message());
        CHECK(why.verb() == "BlockLeases::claim");
        CHECK(why.message() == "BlockLeases::claim: " + why.detail());
        CHECK_FALSE(leases.release(b.lease, reader_b));
        CHECK_FALSE(leases.claim(reuse, why));
        CHECK(why.message().empty()); // cleared: the blocks are free
        const BlockLeasesStatistics s = leases.statistics();
        CHECK(s.granted == 2);
        CHECK(s.released == 2);
        CHECK(s.unknown_releases == 2);
        CHECK(s.refused_releases == 0);
    }

    TEST_CASE("attack: a reader's notification carrying another reader's lease id is refused, the blocks stay held") {
        BlockLeases leases;
        const LeasedBlockList victims = leases.grant({{pool, 0, 4096}}, reader_b);
        const LeasedBlockList mine = leases.grant({{pool, 4096, 4096}}, reader_a);
        // Reader a guesses b's id the way sequential ids made easy: its own, one less, one more...
        for (std::uint32_t guess : {mine.lease - 1, mine.lease + 1, victims.lease}) {
            const std::error_code ec = leases.release(guess, reader_a);
            CHECK(ec);
            CHECK(ec != std::error_code{});
        }
        CHECK(leases.release(victims.lease, reader_a) == errc::lease_not_yours);
        CHECK(make_error_code(errc::lease_not_yours) == std::errc::permission_denied);
        CHECK(leases.held({pool, 0, 4096})); // b's blocks were never freed under it
        const std::vector<RemoteBlock> victims_blocks{{pool, 0, 4096}};
        CHECK(leases.claim(victims_blocks) == errc::blocks_leased);
        CHECK(leases.statistics().refused_releases == 2);
        // b's own release still works.
        CHECK_FALSE(leases.release(victims.lease, reader_b));
        CHECK_FALSE(leases.held({pool, 0, 4096}));
    }

    TEST_CASE("lease ids are not a sequence: 1,000 grants give 1,000 distinct ids with no run of neighbours") {
        BlockLeases leases;
        std::set<std::uint32_t> ids;
        int neighbours = 0;
        std::uint32_t last = 0;
        for (int i = 0; i < 1000; ++i) {
            const LeasedBlockList l = leases.grant({{pool, 0, 64}}, reader_a);
            CHECK(l.lease != 0);
            ids.insert(l.lease);
            neighbours += (l.lease == last + 1) ? 1 : 0;
            last = l.lease;
        }
        CHECK(ids.size() == 1000);
        CHECK(neighbours < 3); // a sequence would give 999
    }

    TEST_CASE(
        "attack: held and claim compare address ranges, and a block that wraps or leaves its region fails closed") {
        BlockLeases leases;
        (void)leases.grant({{pool, 0, 4096}}, reader_a);
        // The same memory named through another rkey is the same memory.
        CHECK(leases.held({other, 0, 4096}));
        CHECK(leases.held({other, 4095, 1}));
        // A length that would wrap first + length around 2^64 (0 before: "not held").
        CHECK(leases.held({pool, 0, UINT64_MAX}));
        CHECK(leases.held({pool, 4096, UINT64_MAX - 100}));
        // An offset or length past the region: not a block of it, never "free".
        CHECK(leases.held({pool, (1 << 20) + 1, 1}));
        Diagnostics why;
        const std::vector<RemoteBlock> wrap{{pool, 0, UINT64_MAX}};
        CHECK(leases.claim(wrap, why) == errc::invalid_argument);
        CHECK_MESSAGE(why.detail().find("does not lie inside its region of 1048576 bytes") != std::string::npos,
                      why.message());
        const std::vector<RemoteBlock> region_wraps{{RemoteMemory{UINT64_MAX - 10, 100, 5}, 0, 1}};
        CHECK(leases.claim(region_wraps, why) == errc::invalid_argument);
        const std::vector<RemoteBlock> other_key{{other, 0, 10}};
        CHECK(leases.claim(other_key, why) == errc::blocks_leased);
        // A block beside the lease is free.
        const std::vector<RemoteBlock> beside{{other, 4096, 4096}};
        CHECK_FALSE(leases.claim(beside));
    }

    TEST_CASE("the owner revokes a lease itself; the deprecated forms still compile and mean that") {
        BlockLeases leases;
        const LeasedBlockList a = leases.grant({{pool, 0, 64}}, reader_a);
        CHECK(leases.revoke(a.lease));
        CHECK_FALSE(leases.revoke(a.lease));
        CHECK(leases.statistics().revoked == 1);
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
        const LeasedBlockList old = leases.grant({{pool, 0, 64}});
        CHECK(leases.release(old.lease, 0) == errc::lease_not_yours); // granted to nobody: no reader releases it
        CHECK(leases.release(old.lease));
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
        CHECK(leases.active() == 0);
    }

    TEST_CASE("an unreleased lease expires after ttl + grace; expire() names it") {
        BlockLeasesOptions o;
        o.ttl = 100ms;
        o.grace = 200ms;
        BlockLeases leases(o);
        const auto granted = std::chrono::steady_clock::now();
        const LeasedBlockList a = leases.grant({{pool, 0, 64}}, 1);
        std::this_thread::sleep_for(150ms); // past the ttl, within the grace: still held
        // (A host so loaded that the sleep overran the grace cannot see that.)
        if (std::chrono::steady_clock::now() - granted < o.ttl + o.grace) {
            CHECK(leases.active() == 1);
        } else {
            MESSAGE("this host slept past ttl + grace: the grace could not be checked");
        }
        std::this_thread::sleep_until(granted + o.ttl + o.grace + 20ms);
        const std::vector<std::uint32_t> gone = leases.expire();
        REQUIRE(gone.size() == 1);
        CHECK(gone[0] == a.lease);
        CHECK_FALSE(leases.held({pool, 0, 64}));
        CHECK(leases.release(a.lease, 1) == errc::lease_unknown);
        CHECK(leases.statistics().expired == 1);
    }

    TEST_CASE("bad input: a list the wire would refuse, a lease time that is not positive") {
        BlockLeases leases;
        CHECK_THROWS_WITH_AS(leases.grant({}, 1), "BlockLeases::grant: a block list has 1 to 1048576 blocks, not 0",
                             Error);
        CHECK_THROWS_WITH_AS(leases.grant({{pool, (1 << 20) - 1, 2}}, 1),
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

    TEST_CASE(
        "a lease table with a lease time that is not positive fails alike in the three forms, and grants nothing") {
        BlockLeasesOptions negative;
        negative.grace = -1ms;
        CHECK(test::check_fails_alike(
                  errc::invalid_argument, [&] { return BlockLeases{negative}; },
                  [&](std::error_code& ec) { return BlockLeases::create(negative, ec); },
                  [&](std::error_code& ec, Diagnostics& d) { return BlockLeases::create(negative, ec, d); }) ==
              "BlockLeases: ttl must be positive and grace not negative (ttl 10000 ms, grace -1 ms)");
        std::error_code ec;
        BlockLeases refused = BlockLeases::create(negative, ec);
        CHECK(ec == errc::invalid_argument);
        CHECK_FALSE(refused);
        CHECK_THROWS_WITH_AS(refused.grant({{pool, 0, 4096}}, reader_a),
                             "BlockLeases::grant: this lease table was refused when created: ttl must be positive and "
                             "grace not negative (ttl 10000 ms, grace -1 ms)",
                             Error);
        CHECK(refused.active() == 0);
        const std::vector<RemoteBlock> one{{pool, 0, 4096}};
        CHECK(refused.claim(one) == std::error_code()); // it holds nothing

        test::check_succeeds_clean(
            [&](std::error_code& e) {
                const BlockLeases made = BlockLeases::create({}, e);
                CHECK(static_cast<bool>(made));
            },
            [&](std::error_code& e, Diagnostics& d) {
                const BlockLeases made = BlockLeases::create({}, e, d);
                CHECK(static_cast<bool>(made));
            });
    }

    TEST_CASE("the reader refuses a list not newer than one it accepted from the same owner") {
        LeaseReader reader;
        LeasedBlockList l;
        l.version = 5;
        CHECK_FALSE(reader.accept(7, l));
        CHECK(reader.accept(7, l) == errc::stale_block_list);
        l.version = 4;
        Diagnostics why;
        const std::error_code stale = reader.accept(7, l, why);
        CHECK(stale == errc::stale_block_list);
        CHECK(stale.message().find("older than one already received") != std::string::npos);
        CHECK(why.verb() == "LeaseReader::accept");
        CHECK(why.detail() ==
              "block list version 4 from owner 7 is not newer than version 5 already accepted from it: its "
              "blocks may have been reused since");
        CHECK_FALSE(reader.accept(8, l)); // another owner
        l.version = 6;
        CHECK_FALSE(reader.accept(7, l));
        l.ttl = 250ms;
        const auto now = std::chrono::steady_clock::now();
        CHECK(LeaseReader::deadline(l, now) == now + 250ms);
    }

    TEST_CASE(
        "a grant of a list the wire would refuse fails alike in the three forms of both grants; nothing is leased") {
        struct Case {
            const char* name;
            std::vector<RemoteBlock> blocks;
            std::string what;
        };
        const std::vector<Case> cases{
            {"an empty list", {}, "BlockLeases::grant: a block list has 1 to 1048576 blocks, not 0"},
            {"a block of length 0", {{pool, 0, 4096}, {pool, 4096, 0}}, "BlockLeases::grant: block 1 has length 0"},
            {"a block outside its region",
             {{pool, (1 << 20) - 1, 2}},
             "BlockLeases::grant: block 0 (2 bytes at offset 1048575) lies outside its region of 1048576 bytes"},
        };
        const ProtectionDomain no_pd; // never reached: the list is refused first
        for (const Case& c : cases) {
            CAPTURE(c.name);
            BlockLeases leases;
            CHECK(test::check_fails_alike(
                      errc::invalid_argument, [&] { return leases.grant(c.blocks, reader_a); },
                      [&](std::error_code& ec) { return leases.grant(c.blocks, reader_a, ec); },
                      [&](std::error_code& ec, Diagnostics& d) { return leases.grant(c.blocks, reader_a, ec, d); }) ==
                  c.what);
            CHECK(test::check_fails_alike(
                      errc::invalid_argument,
                      [&] { return leases.grant(c.blocks, reader_a, no_pd, Access::remote_read); },
                      [&](std::error_code& ec) {
                          return leases.grant(c.blocks, reader_a, no_pd, Access::remote_read, ec);
                      },
                      [&](std::error_code& ec, Diagnostics& d) {
                          return leases.grant(c.blocks, reader_a, no_pd, Access::remote_read, ec, d);
                      }) == c.what);
            CHECK(leases.active() == 0);
            CHECK(leases.statistics().granted == 0);
        }
    }

    TEST_CASE(
        "a grant through lease regions whose registration fails fails alike in the three forms; nothing is leased") {
        BlockLeases leases;
        std::vector<std::byte> memory(8192);
        const RemoteMemory host{reinterpret_cast<std::uint64_t>(memory.data()), memory.size(), 9};
        const std::vector<RemoteBlock> blocks{{host, 0, 4096}};
        const ProtectionDomain no_pd; // an empty domain: the registration is refused
        const std::string what = test::check_fails_alike(
            errc::invalid_argument, [&] { return leases.grant(blocks, reader_a, no_pd, Access::remote_read); },
            [&](std::error_code& ec) { return leases.grant(blocks, reader_a, no_pd, Access::remote_read, ec); },
            [&](std::error_code& ec, Diagnostics& d) {
                return leases.grant(blocks, reader_a, no_pd, Access::remote_read, ec, d);
            });
        CHECK_MESSAGE(what.starts_with("BlockLeases::grant: cannot register a region of the lease over 4096 bytes"),
                      what);
        CHECK(what.ends_with("nothing was leased"));
        CHECK(leases.active() == 0);
    }

    TEST_CASE("a grant that leases clears the error_code and the Diagnostics and returns the list") {
        BlockLeases leases;
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                CHECK(leases.grant({{pool, 0, 4096}}, reader_a, ec).lease != 0);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                CHECK(leases.grant({{pool, 4096, 4096}}, reader_b, ec, d).lease != 0);
            });
        CHECK(leases.active() == 2);
    }

    TEST_CASE("the plain claim and accept refuse without building words: no allocation, the same codes") {
        BlockLeases leases;
        (void)leases.grant({{pool, 0, 4096}}, reader_a);
        const std::vector<RemoteBlock> held{{pool, 0, 4096}};
        const std::vector<RemoteBlock> outside{{pool, 1 << 20, 1}};
        LeaseReader reader;
        LeasedBlockList list;
        list.version = 3;
        REQUIRE_FALSE(reader.accept(7, list));
        std::size_t before = test::allocations();
        const std::error_code claimed = leases.claim(held);
        const std::error_code refused = leases.claim(outside);
        const std::error_code stale = reader.accept(7, list);
        const std::size_t allocated = test::allocations() - before;
        CHECK(claimed == errc::blocks_leased);
        CHECK(refused == errc::invalid_argument);
        CHECK(stale == errc::stale_block_list);
        CHECK(allocated == 0);
        // The Diagnostics forms still carry the words.
        Diagnostics why;
        CHECK(leases.claim(held, why) == errc::blocks_leased);
        CHECK(why.detail().find("is under lease") != std::string::npos);
        CHECK(reader.accept(7, list, why) == errc::stale_block_list);
        CHECK(why.detail().find("is not newer than version 3") != std::string::npos);
    }
}
