// TransferPlan without a device: the checks on two block lists, how
// neighbours coalesce, and how the result is cut to the scatter/gather and
// message limits.
#include "gpuverbs/transfers/transfer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

using namespace gpuverbs;

namespace {

// Local blocks cut from one pretend region [0x10000, 0x10000 + 1 MiB), lkey 5.
constexpr std::uint64_t base = 0x10000;
LocalBuffer local(std::uint64_t offset, std::uint32_t length, std::uint32_t lkey = 5) {
    return LocalBuffer{base + offset, length, lkey, base, base + (1u << 20)};
}
const RemoteMemory peer{0x900000, 1u << 20, 77};
RemoteBlock remote(std::uint64_t offset, std::uint64_t length, const RemoteMemory& m = peer) {
    return RemoteBlock{m, offset, length};
}

std::string refusal(TransferDirection d, const std::vector<LocalBuffer>& l, const std::vector<RemoteBlock>& r,
                    std::error_code expected = errc::invalid_argument) {
    std::error_code ec;
    Diagnostics diagnostics;
    (void)TransferPlan::create(d, l, r, TransferLimits{4}, ec, diagnostics);
    CHECK(ec == expected);
    // The three forms agree: the plain error_code form gives the same code,
    // the throwing form the same words.
    std::error_code plain;
    TransferPlan empty = TransferPlan::create(d, l, r, TransferLimits{4}, plain);
    CHECK(plain == expected);
    CHECK(empty.requests().empty());
    try {
        (void)TransferPlan(d, l, r, TransferLimits{4});
        FAIL("the throwing form accepted what the error_code form refused");
    } catch (const Error& e) {
        CHECK(e.code() == expected);
        CHECK(std::string(e.what()) == diagnostics.message());
    }
    return diagnostics.message();
}

} // namespace

TEST_SUITE("transfer plans") {
    TEST_CASE("one block to one block is one request with one piece") {
        auto plan =
            TransferPlan(TransferDirection::write, std::vector{local(0, 4096)}, std::vector{remote(8192, 4096)});
        REQUIRE(plan.requests().size() == 1);
        CHECK(plan.requests()[0].remote == RemoteMemory{peer.address + 8192, 4096, 77});
        CHECK(plan.pieces().size() == 1);
        CHECK(plan.bytes() == 4096);
        CHECK(plan.blocks_of(0) == "remote block 0 (local block 0 onwards; request 0 of 1)");
    }

    TEST_CASE("neighbours coalesce: contiguous blocks of one region on both sides are one request, one piece") {
        std::vector l{local(0, 100), local(100, 200), local(300, 50)};
        std::vector r{remote(1000, 150), remote(1150, 200)};
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{1});
        REQUIRE(plan.requests().size() == 1);
        CHECK(plan.requests()[0].remote.length == 350);
        REQUIRE(plan.pieces().size() == 1);
        CHECK(plan.pieces()[0].length == 350);
        CHECK(plan.blocks_of(0).find("remote blocks 0 to 1") == 0);
    }

    TEST_CASE("scattered remote blocks each get a request; the local side is cut where they end") {
        std::vector l{local(0, 100), local(500, 300)};    // 400 bytes, two places
        std::vector r{remote(0, 250), remote(4096, 150)}; // 400 bytes, two places
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{4});
        REQUIRE(plan.requests().size() == 2);
        CHECK(plan.requests()[0].remote.length == 250);
        CHECK(plan.requests()[0].piece_count == 2); // 100 from block 0, 150 from block 1
        CHECK(plan.pieces()[0].length == 100);
        CHECK(plan.pieces()[1].address == base + 500);
        CHECK(plan.pieces()[1].length == 150);
        CHECK(plan.requests()[1].remote.address == peer.address + 4096);
        CHECK(plan.pieces()[2].address == base + 650);
        CHECK(plan.pieces()[2].length == 150);
    }

    TEST_CASE("the scatter/gather limit and the message size cut requests") {
        // Five separate local pieces into one contiguous remote range, two pieces per request.
        std::vector l{local(0, 10), local(20, 10), local(40, 10), local(60, 10), local(80, 10)};
        auto plan = TransferPlan(TransferDirection::write, l, std::vector{remote(0, 50)}, TransferLimits{2});
        REQUIRE(plan.requests().size() == 3);
        CHECK(plan.requests()[0].remote.length == 20);
        CHECK(plan.requests()[2].remote.length == 10);
        CHECK(plan.requests()[2].remote.address == peer.address + 40);
        // 10 KiB contiguous with 4 KiB messages.
        auto cut = TransferPlan(TransferDirection::read, std::vector{local(0, 10240)}, std::vector{remote(0, 10240)},
                                TransferLimits{1, 4096});
        REQUIRE(cut.requests().size() == 3);
        CHECK(cut.requests()[1].remote.address == peer.address + 4096);
        CHECK(cut.requests()[2].remote.length == 2048);
        CHECK(cut.pieces()[2].address == base + 8192);
    }

    TEST_CASE("a report's blocks: landed when all their requests landed, not posted when none was, else uncertain") {
        // Blocks 0 and 1 are contiguous on both sides: one request carries
        // both. Blocks 2 and 3 (scattered) are 10,000 bytes each, cut into
        // 4,096-byte messages: three requests each.
        std::vector l{local(0, 100), local(100, 100), local(1000, 10000), local(20000, 10000)};
        std::vector r{remote(0, 100), remote(100, 100), remote(50000, 10000), remote(90000, 10000)};
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{1, 4096});
        REQUIRE(plan.requests().size() == 7);
        REQUIRE(plan.requests()[0].last_remote == 1);
        using S = BlockState;
        TransferReport report;
        report.requests = {S::landed, S::landed, S::uncertain, S::landed, S::landed, S::not_posted, S::not_posted};
        detail::summarize_blocks(plan, report);
        CHECK(report.remote_blocks == std::vector{S::landed, S::landed, S::uncertain, S::uncertain});
        CHECK(report.landed == 2);
        CHECK(report.uncertain == 2); // block 3: part landed, part never posted — not whole either way
        CHECK(report.not_posted == 0);
        report.requests = {S::landed,     S::landed,     S::not_posted, S::not_posted,
                           S::not_posted, S::not_posted, S::not_posted};
        detail::summarize_blocks(plan, report);
        CHECK(report.remote_blocks == std::vector{S::landed, S::landed, S::uncertain, S::not_posted});
        CHECK(report.landed == 2);
        CHECK(report.uncertain == 1);
        CHECK(report.not_posted == 1);
        report.requests.assign(7, S::landed);
        detail::summarize_blocks(plan, report);
        CHECK(report.landed == 4);
        CHECK(report.uncertain + report.not_posted == 0);
    }

    TEST_CASE("blocks of different regions never share a request or a piece") {
        RemoteMemory other{peer.address + peer.length, 4096, 78}; // right after, another rkey
        std::vector l{local(0, 100), local(100, 100, 6)};         // right after, another lkey
        std::vector r{remote(peer.length - 100, 100), remote(0, 100, other)};
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{4});
        REQUIRE(plan.requests().size() == 2);
        CHECK(plan.requests()[1].remote.rkey == 78);
        CHECK(plan.pieces()[1].lkey == 6);
    }

    TEST_CASE("bad lists are refused naming the block") {
        CHECK(refusal(TransferDirection::write, {local(0, 10), local(10, 0)}, {remote(0, 10)}) ==
              "TransferPlan: local block 1 has length 0: leave it out of the list");
        CHECK(refusal(TransferDirection::write, {local(0, 10)}, {remote(0, 10), remote(20, 0)}) ==
              "TransferPlan: remote block 1 has length 0: leave it out of the list");
        CHECK(
            refusal(TransferDirection::write, {local(0, 10)}, {remote(peer.length - 5, 10)},
                    errc::remote_range_outside_region)
                .find("remote block 0 (10 bytes at offset 1048571) lies outside its remote region of 1048576 bytes") !=
            std::string::npos);
        LocalBuffer outside{base + (1u << 20) - 4, 8, 5, base, base + (1u << 20)};
        CHECK(refusal(TransferDirection::write, {outside}, {remote(0, 8)}, errc::local_range_outside_region)
                  .find("local block 0 (8 bytes at") != std::string::npos);
        CHECK(refusal(TransferDirection::write, {local(0, 10)}, {remote(0, 12)})
                  .find("the local blocks hold 10 bytes and the remote blocks 12") != std::string::npos);
        CHECK(refusal(TransferDirection::write, {}, {remote(0, 12)}) ==
              "TransferPlan: a transfer needs at least one local and one remote block");
    }

    TEST_CASE("the destination must not name a byte twice: remote blocks for writes, local blocks for reads") {
        std::vector l{local(0, 10), local(100, 10)};
        std::vector r{remote(0, 10), remote(5, 10)};
        CHECK(refusal(TransferDirection::write, l, r).find("remote blocks 0 and 1 overlap") != std::string::npos);
        // Reading the same remote bytes twice is fine...
        CHECK(TransferPlan(TransferDirection::read, l, r).requests().size() == 2);
        // ... writing the same local bytes twice is not.
        std::vector twice{local(0, 10), local(5, 10)};
        CHECK(refusal(TransferDirection::read, twice, std::vector{remote(0, 10), remote(100, 10)})
                  .find("local blocks 0 and 1 overlap") != std::string::npos);
    }

    TEST_CASE("remote lengths that wrap past 2^64 cannot match a short local list") {
        RemoteMemory huge_a{0, UINT64_MAX, 1};
        RemoteMemory huge_b{0, UINT64_MAX, 2};
        std::uint64_t half = std::uint64_t{1} << 63;
        CHECK(
            refusal(TransferDirection::write, {local(0, 100)}, {remote(0, half, huge_a), remote(0, half + 100, huge_b)})
                .find("remote block 1: the remote blocks add up to more than 2^64 bytes") != std::string::npos);
    }

    TEST_CASE("blocks starting at the same byte overlap; a message cut on a block's end starts the next cleanly") {
        CHECK(refusal(TransferDirection::write, {local(0, 10), local(100, 20)}, {remote(64, 10), remote(64, 20)})
                  .find("remote blocks 0 and 1 overlap") != std::string::npos);
        auto plan = TransferPlan(TransferDirection::write, std::vector{local(0, 8192)},
                                 std::vector{remote(0, 4096), remote(4096, 4096)}, TransferLimits{1, 4096});
        REQUIRE(plan.requests().size() == 2);
        CHECK(plan.requests()[1].remote.address == peer.address + 4096);
        CHECK(plan.requests()[1].first_remote == 1);
        CHECK(plan.requests()[1].remote.length == 4096);
    }

    TEST_CASE("10,000 blocks of mixed sizes: every byte planned once, in order") {
        // Lengths that are multiples of nothing in particular, contiguous locally;
        // remotely even blocks fill a low half and odd blocks a high half.
        std::vector<LocalBuffer> l;
        std::vector<RemoteBlock> r;
        std::uint64_t at = 0, low = 0, high = 600000;
        for (std::uint32_t k = 0; k < 10000; ++k) {
            std::uint32_t n = 1 + (k * 37) % 97;
            l.push_back(local(at, n));
            r.push_back(remote(k % 2 == 0 ? low : high, n));
            (k % 2 == 0 ? low : high) += n;
            at += n;
        }
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{1});
        CHECK(plan.requests().size() == 10000); // alternating halves never coalesce remotely
        std::uint64_t sum = 0;
        std::uint64_t expected_local = base;
        for (const auto& piece : plan.pieces()) {
            CHECK(piece.address == expected_local);
            expected_local += piece.length;
            sum += piece.length;
        }
        CHECK(sum == plan.bytes());
    }

    TEST_CASE("striping over rails: contiguous ranges of about equal bytes, each rail's bytes summed") {
        std::vector<LocalBuffer> l;
        std::vector<RemoteBlock> r;
        for (std::uint32_t k = 0; k < 10; ++k) { // 10 scattered blocks of 1000 bytes
            l.push_back(local(std::uint64_t{k} * 1000, 1000));
            r.push_back(remote(std::uint64_t{9 - k} * 2000, 1000));
        }
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{1});
        REQUIRE(plan.requests().size() == 10);
        auto one = detail::stripe(plan, 1);
        CHECK(one.bounds == std::vector<std::uint32_t>{0, 10});
        CHECK(one.bytes == std::vector<std::uint64_t>{10000});
        auto two = detail::stripe(plan, 2);
        CHECK(two.bounds == std::vector<std::uint32_t>{0, 5, 10});
        CHECK(two.bytes == std::vector<std::uint64_t>{5000, 5000});
        auto three = detail::stripe(plan, 3); // shares at 3,333 and 6,666 bytes: requests end at 4,000 and 7,000
        CHECK(three.bounds == std::vector<std::uint32_t>{0, 4, 7, 10});
        CHECK(three.bytes == std::vector<std::uint64_t>{4000, 3000, 3000});
        // More rails than requests: the last rails get nothing.
        auto plan2 = TransferPlan(TransferDirection::write, std::vector{local(0, 10), local(100, 10)},
                                  std::vector{remote(0, 10), remote(50, 10)}, TransferLimits{1});
        auto four = detail::stripe(plan2, 4);
        CHECK(four.bounds == std::vector<std::uint32_t>{0, 1, 2, 2, 2});
        CHECK(four.bytes == std::vector<std::uint64_t>{10, 10, 0, 0});
        // One large request is never split: bound it with max_message to stripe it.
        auto big = TransferPlan(TransferDirection::write, std::vector{local(0, 1 << 19)},
                                std::vector{remote(0, 1 << 19)}, TransferLimits{1, 1 << 17});
        CHECK(big.requests().size() == 4);
        CHECK(detail::stripe(big, 2).bytes == std::vector<std::uint64_t>{1 << 18, 1 << 18});
    }

    TEST_CASE("striping by weight, over part of a plan: a rail's bytes follow its weight; weight 0 gets nothing") {
        std::vector<LocalBuffer> l;
        std::vector<RemoteBlock> r;
        for (std::uint32_t k = 0; k < 10; ++k) {
            l.push_back(local(std::uint64_t{k} * 1000, 1000));
            r.push_back(remote(std::uint64_t{9 - k} * 2000, 1000));
        }
        auto plan = TransferPlan(TransferDirection::write, l, r, TransferLimits{1});
        using W = std::vector<std::uint64_t>;
        auto three_to_one = detail::stripe(plan, 0, 10, W{3, 1}); // 7,500 bytes, then the rest
        CHECK(three_to_one.bounds == std::vector<std::uint32_t>{0, 8, 10});
        CHECK(three_to_one.bytes == std::vector<std::uint64_t>{8000, 2000});
        auto middle_out = detail::stripe(plan, 0, 10, W{1, 0, 1}); // the failed rail in the middle: empty
        CHECK(middle_out.bounds == std::vector<std::uint32_t>{0, 5, 5, 10});
        CHECK(middle_out.bytes == std::vector<std::uint64_t>{5000, 0, 5000});
        auto first_out = detail::stripe(plan, 0, 10, W{0, 2, 2});
        CHECK(first_out.bounds == std::vector<std::uint32_t>{0, 0, 5, 10});
        auto last_out = detail::stripe(plan, 0, 10, W{2, 2, 0});
        CHECK(last_out.bounds == std::vector<std::uint32_t>{0, 5, 10, 10});
        CHECK(last_out.bytes == std::vector<std::uint64_t>{5000, 5000, 0});
        auto part = detail::stripe(plan, 2, 8, W{1, 1}); // what a failed rail leaves: requests 2 to 7
        CHECK(part.bounds == std::vector<std::uint32_t>{2, 5, 8});
        CHECK(part.bytes == std::vector<std::uint64_t>{3000, 3000});
        auto none = detail::stripe(plan, 0, 10, W{0, 0}); // no weight at all: equal shares
        CHECK(none.bounds == std::vector<std::uint32_t>{0, 5, 10});
        auto empty = detail::stripe(plan, 4, 4, W{1, 1});
        CHECK(empty.bounds == std::vector<std::uint32_t>{4, 4, 4});
        CHECK(empty.bytes == std::vector<std::uint64_t>{0, 0});
    }
}

namespace {

/// Two plans are the same: requests, pieces (as gpuverbs and as the device
/// sees them), bytes and block counts.
void same_plan(const TransferPlan& fast, const TransferPlan& general) {
    REQUIRE(fast.requests().size() == general.requests().size());
    for (std::size_t k = 0; k < fast.requests().size(); ++k) {
        const auto& a = fast.requests()[k];
        const auto& b = general.requests()[k];
        CHECK(a.remote == b.remote);
        CHECK(a.first_piece == b.first_piece);
        CHECK(a.piece_count == b.piece_count);
        CHECK(a.first_local == b.first_local);
        CHECK(a.first_remote == b.first_remote);
        CHECK(a.last_remote == b.last_remote);
    }
    REQUIRE(fast.pieces().size() == general.pieces().size());
    REQUIRE(fast.native_pieces().size() == general.native_pieces().size());
    for (std::size_t k = 0; k < fast.pieces().size(); ++k) {
        const LocalBuffer& a = fast.pieces()[k];
        const LocalBuffer& b = general.pieces()[k];
        CHECK(a.address == b.address);
        CHECK(a.length == b.length);
        CHECK(a.lkey == b.lkey);
        CHECK(a.region_begin == b.region_begin);
        CHECK(a.region_end == b.region_end);
        CHECK(fast.native_pieces()[k].addr == general.native_pieces()[k].addr);
        CHECK(fast.native_pieces()[k].length == general.native_pieces()[k].length);
        CHECK(fast.native_pieces()[k].lkey == general.native_pieces()[k].lkey);
    }
    CHECK(fast.bytes() == general.bytes());
    CHECK(fast.local_blocks() == general.local_blocks());
    CHECK(fast.remote_blocks() == general.remote_blocks());
}

// Plans `l` and `r` both ways: the one-pass planner (taken for paired lists)
// and the general walk must give the same plan, or the same refusal.
void same_plan_both_ways(TransferDirection d, const std::vector<LocalBuffer>& l, const std::vector<RemoteBlock>& r,
                         const TransferLimits& limits) {
    detail::Status fast_status;
    detail::Status general_status;
    const TransferPlan fast = detail::make_transfer_plan(d, l, r, limits, fast_status, detail::Planner::best);
    const TransferPlan general = detail::make_transfer_plan(d, l, r, limits, general_status, detail::Planner::general);
    REQUIRE(fast_status.code == general_status.code);
    CHECK(fast_status.detail == general_status.detail);
    same_plan(fast, general);
}

} // namespace

TEST_SUITE("transfer plans") {
    TEST_CASE("the one-pass planner of paired lists plans exactly what the general walk plans, refusals included") {
        // Pools of slots on both sides; each round picks a shape: in order or
        // shuffled, one block size or several, slots or odd offsets, some
        // neighbours, a second region or key, sometimes an overlap or a bad block.
        std::uint64_t seed = 12345;
        auto next = [&seed](std::uint64_t bound) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            return (seed >> 33) % bound;
        };
        const RemoteMemory other{0xa00000, 1u << 20, 78};
        int rounds_with_refusal = 0;
        for (int round = 0; round < 400; ++round) {
            const std::size_t n = 1 + next(round % 10 == 0 ? 3000 : 40);
            const std::uint64_t unit = std::uint64_t{1} << (3 + next(6)); // 8 … 256 bytes
            const bool uniform = next(2) == 0;
            const bool shuffled = next(2) == 0;
            const bool neighbours = next(3) == 0;
            const bool two_keys = next(8) == 0;
            const bool odd_offsets = next(6) == 0;
            std::vector<std::uint64_t> lslot(4 * n), rslot(4 * n);
            for (std::size_t k = 0; k < lslot.size(); ++k) lslot[k] = rslot[k] = k;
            if (shuffled) {
                for (std::size_t k = lslot.size() - 1; k > 0; --k) {
                    std::swap(lslot[k], lslot[next(k + 1)]);
                    std::swap(rslot[k], rslot[next(k + 1)]);
                }
            }
            std::vector<LocalBuffer> l;
            std::vector<RemoteBlock> r;
            for (std::size_t k = 0; k < n; ++k) {
                const std::uint64_t length = uniform ? unit : unit / 2 + next(unit);
                const std::uint64_t ls = neighbours ? k : lslot[k];
                const std::uint64_t rs = neighbours ? k : rslot[k];
                const std::uint64_t shift = odd_offsets ? next(3) : 0;
                if (ls * 2 * unit + 2 * unit >= (1u << 20) || rs * 2 * unit + 2 * unit >= (1u << 20)) break;
                l.push_back(local(ls * (neighbours ? unit : 2 * unit), static_cast<std::uint32_t>(length),
                                  two_keys && k % 3 == 0 ? 6 : 5));
                r.push_back(
                    remote(rs * (neighbours ? unit : 2 * unit) + shift, length, two_keys && k % 5 == 0 ? other : peer));
            }
            if (l.empty()) continue;
            switch (next(12)) {
                case 0: r.back().offset = r.front().offset; break;   // an overlap on the remote side
                case 1: l.back().address = l.front().address; break; // … on the local side
                case 2: l[next(l.size())].length = 0; break;
                case 3: r[next(r.size())].offset = (1u << 20); break;
                default: break;
            }
            const TransferLimits limits{static_cast<std::uint32_t>(1 + next(4)),
                                        next(4) == 0 ? 64 + next(1024) : std::uint64_t{1} << 31};
            for (TransferDirection d : {TransferDirection::write, TransferDirection::read}) {
                detail::Status s;
                (void)detail::make_transfer_plan(d, l, r, limits, s, detail::Planner::general);
                rounds_with_refusal += s.ok() ? 0 : 1;
                same_plan_both_ways(d, l, r, limits);
            }
        }
        CHECK(rounds_with_refusal > 50); // the refusals were exercised, not only the plans
    }
}

TEST_SUITE("transfer plans") {
    TEST_CASE("planning by stride (a KV pool's ids) makes exactly the plan of the same blocks as lists") {
        // Segments of a pool's layer halves: per-layer tensors, blocks 256 bytes apart (or interleaved halves).
        std::mt19937 random(11);
        for (int round = 0; round < 200; ++round) {
            CAPTURE(round);
            const std::uint32_t blocks = 8 + random() % 120;
            const std::uint32_t length = 64u << (random() % 3);
            const bool interleaved = random() % 2 == 0; // blocks-first: K and V side by side
            const std::uint64_t local_stride = interleaved ? 2 * length : length;
            const std::uint64_t remote_stride = random() % 2 == 0 ? 2 * length : length;
            const std::uint32_t segments_n = 1 + random() % 6;
            const auto direction = random() % 2 == 0 ? TransferDirection::write : TransferDirection::read;
            std::vector<detail::StridedSegment> segments;
            for (std::uint32_t s = 0; s < segments_n; ++s) {
                const std::uint64_t tensor = 0x100000 + std::uint64_t{s / 2} * 0x100000;
                const std::uint64_t base = tensor + (interleaved ? (s % 2) * length : (s % 2) * blocks * length);
                const RemoteMemory far{0x7000000 + std::uint64_t{s / 2} * 0x100000, 4 * blocks * length, 0x55 + s / 2};
                segments.push_back({base, 0x11 + s / 2, tensor, tensor + 2 * blocks * length, far,
                                    (s % 2) * (remote_stride == length ? blocks * length : length)});
            }
            // Ids: runs of consecutive ids and scattered ones, distinct on each side.
            std::vector<std::uint32_t> ours(blocks), theirs(blocks);
            std::iota(ours.begin(), ours.end(), 0u);
            std::iota(theirs.begin(), theirs.end(), 0u);
            if (random() % 3 != 0) std::shuffle(ours.begin(), ours.end(), random);
            if (random() % 3 != 0) std::shuffle(theirs.begin(), theirs.end(), random);
            const std::size_t count = 1 + random() % blocks;
            ours.resize(count);
            theirs.resize(count);
            const TransferLimits limits{1 + static_cast<std::uint32_t>(random() % 4),
                                        random() % 4 == 0 ? std::uint64_t{length} * 3 : std::uint64_t{1} << 31};
            const detail::StridedPairs pairs{segments, ours, theirs, local_stride, remote_stride, length};
            bool general = true;
            const TransferPlan strided = detail::make_strided_plan(direction, pairs, limits, general);
            std::vector<LocalBuffer> local;
            std::vector<RemoteBlock> remote;
            for (const detail::StridedSegment& seg : segments) {
                for (std::size_t i = 0; i < count; ++i) {
                    local.push_back(
                        {seg.local_base + ours[i] * local_stride, length, seg.lkey, seg.region_begin, seg.region_end});
                    remote.push_back({seg.remote, seg.remote_base + theirs[i] * remote_stride, length});
                }
            }
            const TransferPlan lists(direction, local, remote, limits);
            if (general) { // a block the one-pass planner leaves to the general walk: none here
                FAIL("the strided planner refused a plan the lists planner made");
                continue;
            }
            same_plan(strided, lists);
            CHECK(strided.direction() == lists.direction());
        }
    }
}
