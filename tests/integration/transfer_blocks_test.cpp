// Block-list transfers on rxe0 <-> rxe1: scattered blocks of mixed sizes
// written and read in one operation, every byte checked; a wrong key named by
// its block; a queue pair destroyed mid-transfer; deadlines, cancellation and
// a peer that goes away, each checked against what the report says landed.
#include "rig.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <array>
#include <thread>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

using test::Layout;
using test::layout;
using test::pattern;
using test::write_lists;
using test::wrong_bytes;

/// One test's pair, a write from a's memory to b's planned for a's queue
/// pair, and what the transfer's handler received: its result's report and
/// failed blocks.
struct Write {
    asio::io_context io;
    test::Pair p;
    TransferPlan plan;
    test::Outcome out;
    TransferReport& report = out.transfer.report;
    std::string& why = out.transfer.failed_blocks;

    /// Layout `l`'s blocks, with the pattern of `seed` on the source and
    /// `room` bytes to spare beyond twice the layout.
    Write(const Layout& l, std::size_t room, std::uint32_t seed) : Write(l.bytes * 2 + room) {
        for (std::size_t i = 0; i < l.bytes; ++i) p.a.memory[i] = pattern(i, seed);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
    }
    /// `s`'s blocks, one request each, with the pattern of `seed` on the
    /// source and 0xEE at the destination.
    Write(const test::Scatter& s, std::uint32_t seed) : Write(s.span()) {
        s.fill(p.a.memory, seed);
        std::fill(p.b.memory.begin(), p.b.memory.end(), std::byte{0xEE});
        plan = s.plan(p.a.mr, p.b.mr.remote());
    }
    Write(const Write&) = delete;
    Write& operator=(const Write&) = delete;
    ~Write() = default;

    /// Options that ask for the blocks' report.
    static TransferOptions reporting() {
        TransferOptions o;
        o.report_blocks = true;
        return o;
    }

private:
    explicit Write(std::size_t bytes) : p(test::transfer_pair(io.get_executor(), bytes)) {}
};

/// Runs one transfer of `blocks` blocks and checks every byte; the bytes moved.
std::size_t move_blocks(TransferDirection direction, std::size_t blocks, std::size_t max_block, std::uint32_t seed) {
    asio::io_context io;
    Layout l = layout(blocks, max_block, seed);
    std::size_t span = l.bytes * 2 + 4 * blocks + 16;
    test::Pair p = test::transfer_pair(io.get_executor(), span);
    // The data starts on the writer's side (a for writes, b for reads), contiguous.
    std::vector<std::byte>& from = direction == TransferDirection::write ? p.a.memory : p.b.memory;
    std::vector<std::byte>& to = direction == TransferDirection::write ? p.b.memory : p.a.memory;
    for (std::size_t i = 0; i < l.bytes; ++i) from[i] = pattern(i, seed);
    // a's list: for writes the sources, for reads the destinations (scattered).
    std::vector<LocalBuffer> local;
    std::vector<RemoteBlock> remote;
    for (std::size_t k = 0; k < blocks; ++k) {
        if (direction == TransferDirection::write) {
            local.push_back(p.a.mr.slice(l.source[k], l.lengths[k]));
            remote.push_back({p.b.mr.remote(), l.destination[k], l.lengths[k]});
        } else {
            local.push_back(p.a.mr.slice(l.destination[k], l.lengths[k]));
            remote.push_back({p.b.mr.remote(), l.source[k], l.lengths[k]});
        }
    }
    TransferPlan plan = TransferPlan(direction, local, remote, p.a.qp.capabilities());
    CHECK(plan.bytes() == l.bytes);
    test::Outcome out;
    out.transfer.report.landed = 12345; // overwritten
    TransferOptions options;
    options.report_blocks = true;
    async_transfer(p.a.qp, plan, options, out.handler());
    io.run_for(60s);
    CHECK(out.calls == 1);
    CHECK_MESSAGE(!out.result, out.result.message());
    CHECK(out.moved == l.bytes);
    CHECK(wrong_bytes(l, to, seed) == 0);
    // Success: the report says every block landed.
    const TransferReport& report = out.transfer.report;
    CHECK(out.transfer.failed_blocks.empty());
    CHECK(report.landed == blocks);
    CHECK(report.uncertain + report.not_posted == 0);
    CHECK(report.requests.size() == plan.requests().size());
    std::string kind = direction == TransferDirection::write ? "write" : "read";
    MESSAGE(blocks << " blocks, " << l.bytes << " bytes, " << plan.requests().size() << " requests (" << kind << ")");
    return out.moved;
}

/// What a write of scattered blocks that did not finish leaves at the
/// destination: every block it calls landed is there, byte for byte (`wrong`),
/// and every block it never posted is untouched (`touched`).
void check_against_report(const Write& w, const test::Scatter& s, std::uint32_t seed) {
    CHECK(s.wrong(w.p.b.memory, seed, &w.report) == 0);
    CHECK(s.touched(w.p.b.memory, w.report, BlockState::not_posted) == 0);
}

} // namespace

TEST_SUITE("block-list transfers" * doctest::skip(!test::rig_present())) {
    TEST_CASE("1, 2, 1,000 and 10,000 blocks of mixed sizes, written and read, every byte verified") {
        struct Row {
            std::size_t blocks, max_block;
            std::uint32_t seed;
        };
        const Row rows[] = {{1, 5000, 1},
                            {2, 5000, 2},
                            {1000, 4099, 3}, // far more requests than the send queue holds (128)
                            {10000, 300, 4}};
        for (TransferDirection d : {TransferDirection::write, TransferDirection::read}) {
            for (const Row& row : rows) {
                CAPTURE(row.blocks);
                CAPTURE(d == TransferDirection::write ? "write" : "read");
                move_blocks(d, row.blocks, row.max_block, row.seed);
            }
        }
    }

    TEST_CASE("requests go out in chains of doorbell_batch, one signaled each; a queue smaller than a chain works") {
        for (std::uint32_t batch : {1U, 7U, 32U, 64U}) {
            CAPTURE(batch);
            const Layout l = layout(1000, 700, 11 + batch);
            Write w(l, 4000, batch);
            const std::uint64_t before = w.p.a.cq.async_statistics().work_completions;
            TransferOptions options;
            options.doorbell_batch = batch;
            async_transfer(w.p.a.qp, w.plan, options, w.out.handler());
            w.io.run_for(30s);
            CHECK(w.out.calls == 1);
            CHECK_FALSE(w.out.result);
            const std::size_t requests = w.plan.requests().size();
            const std::uint64_t signaled = w.p.a.cq.async_statistics().work_completions - before;
            CHECK(signaled == (requests + batch - 1) / batch);
            CHECK(wrong_bytes(l, w.p.b.memory, batch) == 0);
            MESSAGE("doorbell_batch " << batch << ": " << requests << " requests, " << signaled << " completions");
        }
        // A send queue of 8 slots with chains of 32: chains are cut to what the queue holds.
        asio::io_context io;
        Device d0 = Device::open(test::rig_devices()->dev0), d1 = Device::open(test::rig_devices()->dev1);
        ProtectionDomain pd0(d0), pd1(d1);
        CompletionQueue cq0(d0, 64, io.get_executor()), cq1(d1, 64);
        std::vector<std::byte> m0(1 << 16), m1(1 << 16);
        MemoryRegion mr0(pd0, m0, Access::local_write), mr1(pd1, m1, Access::local_write | Access::remote_write);
        QueuePairOptions small;
        small.max_send_wr = 8;
        PreparedQueuePair a(pd0, cq0, cq0, small), b(pd1, cq1, cq1);
        (void)b.advertise(mr1); // a advertises nothing: b may write nothing to it
        Endpoint ea = a.endpoint(), eb = b.endpoint();
        QueuePair qa = std::move(a).connect(eb), qb = std::move(b).connect(ea);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < 100; ++k) {
            for (std::size_t i = 0; i < 100; ++i) m0[k * 100 + i] = std::byte(k + i);
            local.push_back(mr0.slice(k * 100, 100));
            remote.push_back({mr1.remote(), (99 - k) * 300, 100});
        }
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, qa.capabilities());
        test::Outcome out;
        async_transfer(qa, plan, out.handler());
        io.run_for(10s);
        CHECK(out.calls == 1);
        CHECK_FALSE(out.result);
        std::size_t bad = 0;
        for (std::size_t k = 0; k < 100; ++k) {
            for (std::size_t i = 0; i < 100; ++i) bad += m1[(99 - k) * 300 + i] != std::byte(k + i) ? 1 : 0;
        }
        CHECK(bad == 0);
    }

    TEST_CASE("a transfer shares its send queue with other operations: both finish, every byte lands") {
        const Layout l = layout(3000, 500, 21);
        Write w(l, 12000 + std::size_t{300} * 64, 21);
        test::Pair& p = w.p;
        async_transfer(p.a.qp, w.plan, w.out.handler());
        // 300 single writes into a separate area, submitted while the transfer holds the queue.
        const std::size_t area = p.b.memory.size() - std::size_t{300} * 64;
        int writes = 0;
        for (std::size_t k = 0; k < 300; ++k) {
            for (std::size_t i = 0; i < 64; ++i) p.a.memory[area + k * 64 + i] = std::byte(k ^ i);
            p.a.qp.async_write(p.a.mr.slice(area + k * 64, 64), p.b.mr.remote(), area + k * 64,
                               [&](boost::system::error_code ec, std::size_t) {
                                   CHECK_FALSE(ec);
                                   ++writes;
                               });
        }
        w.io.run_for(30s);
        CHECK(w.out.calls == 1);
        CHECK_FALSE(w.out.result);
        CHECK(writes == 300);
        std::size_t bad = wrong_bytes(l, p.b.memory, 21);
        for (std::size_t k = 0; k < std::size_t{300} * 64; ++k)
            bad += p.b.memory[area + k] != p.a.memory[area + k] ? 1 : 0;
        CHECK(bad == 0);
    }

    TEST_CASE("a notification after the last block: when the peer's receive completes, every block has landed") {
        const Layout l = layout(1000, 3000, 5);
        Write w(l, 8000, 5);
        std::optional<std::uint32_t> immediate;
        std::size_t bad_at_notification = 1;
        w.p.b.qp.async_receive(w.p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received r) {
            REQUIRE_FALSE(ec);
            immediate = r.immediate;
            bad_at_notification = wrong_bytes(l, w.p.b.memory, 5);
        });
        TransferOptions options;
        options.notify = 0xC0FFEEu;
        async_transfer(w.p.a.qp, w.plan, options, w.out.handler());
        w.io.run_for(20s);
        CHECK(w.out.calls == 1);
        CHECK_FALSE(w.out.result);
        CHECK(w.out.moved == l.bytes);
        CHECK(immediate == 0xC0FFEEu);
        CHECK(bad_at_notification == 0);
    }

    TEST_CASE(
        "a lease on the owner's blocks: the reader reads under it and releases it with the notification; "
        "an unreleased lease expires; a stale list is refused") {
        // b owns the blocks (prefill), a reads them (decode).
        asio::io_context io;
        Layout l = layout(500, 3000, 23);
        test::Pair p = test::transfer_pair(io.get_executor(), l.bytes * 2 + 8000);
        // The owner's blocks hold the pattern at the layout's destination slots.
        for (std::size_t k = 0; k < l.lengths.size(); ++k) {
            for (std::size_t i = 0; i < l.lengths[k]; ++i)
                p.b.memory[l.destination[k] + i] = pattern(l.source[k] + i, 23);
        }
        BlockLeasesOptions lo;
        lo.ttl = 5s;
        lo.grace = 100ms;
        BlockLeases leases(lo);
        std::vector<RemoteBlock> offered;
        for (std::size_t k = 0; k < l.lengths.size(); ++k)
            offered.push_back({p.b.mr.remote(), l.destination[k], l.lengths[k]});
        const std::vector<std::byte> bytes = wire::serialize(leases.grant(offered, /*reader*/ 1));
        CHECK(leases.held(offered[7]));
        CHECK(leases.active() == 1);
        Diagnostics busy;
        CHECK(leases.claim(offered, busy) == errc::blocks_leased); // the owner may not reuse them yet
        CHECK_MESSAGE(busy.detail().find("block 0 (") == 0, busy.message());

        // The reader: the list as it arrives, checked, then one read with the lease's deadline and its notification.
        const auto received = std::chrono::steady_clock::now();
        LeasedBlockList list = wire::parse_leased_block_list(bytes);
        LeaseReader reader;
        REQUIRE_FALSE(reader.accept(1, list));
        std::vector<LocalBuffer> mine;
        for (std::size_t k = 0; k < l.lengths.size(); ++k) mine.push_back(p.a.mr.slice(l.source[k], l.lengths[k]));
        TransferPlan read = TransferPlan(TransferDirection::read, mine, list.blocks, p.a.qp.capabilities());
        std::optional<std::uint32_t> released;
        std::size_t unread_at_release = 1;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received r) {
            REQUIRE_FALSE(ec);
            released = r.immediate;
            // Every block was read before the owner hears of it.
            std::size_t bad = 0;
            for (std::size_t k = 0; k < l.lengths.size(); ++k) {
                for (std::size_t i = 0; i < l.lengths[k]; ++i)
                    bad += p.a.memory[l.source[k] + i] != pattern(l.source[k] + i, 23) ? 1 : 0;
            }
            unread_at_release = bad;
            CHECK_FALSE(leases.release(r.immediate.value_or(0), /*reader*/ 1)); // on the queue pair to reader 1
        });
        TransferOptions options;
        options.notify = list.lease;
        options.deadline = LeaseReader::deadline(list, received);
        std::optional<boost::system::error_code> result;
        async_transfer(p.a.qp, read, options, [&](boost::system::error_code ec, std::size_t) { result = ec; });
        test::run_until(
            io, [&] { return result && released; }, 20s);
        REQUIRE(result.has_value());
        CHECK_MESSAGE(!*result, result->message());
        CHECK(released == list.lease);
        CHECK(unread_at_release == 0);
        CHECK_FALSE(leases.held(offered[7])); // released: the owner may reuse its blocks
        CHECK_FALSE(leases.claim(offered));
        CHECK(leases.active() == 0);
        CHECK(leases.release(list.lease, 1) == errc::lease_unknown); // once

        // A reader that never releases holds the blocks until ttl + grace.
        BlockLeasesOptions quick;
        quick.ttl = 100ms;
        quick.grace = 50ms;
        BlockLeases short_leases(quick);
        const LeasedBlockList forgotten = short_leases.grant({offered[3]}, 1);
        CHECK(short_leases.held(offered[3]));
        CHECK_FALSE(short_leases.held(offered[4]));
        std::this_thread::sleep_for(200ms);
        CHECK_FALSE(short_leases.held(offered[3]));
        CHECK(short_leases.expire().empty()); // held() dropped it already

        // An older list from the same owner is refused; another owner's is not.
        LeasedBlockList older = list;
        older.version = list.version - 1;
        Diagnostics stale;
        CHECK(reader.accept(1, older, stale) == errc::stale_block_list);
        CHECK(stale.detail() == "block list version " + std::to_string(older.version) +
                                    " from owner 1 is not newer than version " + std::to_string(list.version) +
                                    " already accepted from it: its blocks may have been reused since");
        CHECK(reader.accept(1, list) == errc::stale_block_list); // the same list twice: stale too
        CHECK_FALSE(reader.accept(2, older));
        (void)forgotten;
    }

    TEST_CASE("a wrong remote key fails the transfer once, naming the block; the plan refuses a range outside") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 1 << 16);
        auto [local, remote] = test::lists_with_wrong_key(p.a.mr, p.b.mr.remote());
        for (std::size_t i = 0; i < 40 * 100; ++i) p.a.memory[i] = pattern(i, 5);
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        test::Outcome out;
        TransferOptions options;
        options.report_blocks = true;
        async_transfer(p.a.qp, plan, options, out.handler());
        io.run_for(10s);
        const std::string& failed = out.transfer.failed_blocks;
        const TransferReport& report = out.transfer.report;
        CHECK(out.calls == 1);
        CHECK(out.result == detail::to_asio_error(make_wc_error(IBV_WC_REM_ACCESS_ERR)));
        CHECK_MESSAGE(failed.find("remote block 23 ") == 0, failed);
        // What is known: blocks 0 to 22 completed before the refused one (a
        // queue pair's completions come in order), 23 and the rest were posted
        // and flushed — uncertain; none was left unposted (one chain of 32, one of 8).
        REQUIRE(report.remote_blocks.size() == 40);
        CHECK(report.landed == 23);
        CHECK(report.uncertain == 17);
        CHECK(report.not_posted == 0);
        for (std::size_t k = 0; k < 40; ++k) {
            CAPTURE(k);
            CHECK(report.remote_blocks[k] == (k < 23 ? BlockState::landed : BlockState::uncertain));
        }
        // Every block reported landed is at the peer, byte for byte.
        for (std::size_t k = 0; k < 23; ++k) {
            for (std::size_t i = 0; i < 100; ++i) REQUIRE(p.b.memory[k * 200 + i] == pattern(k * 100 + i, 5));
        }

        remote[17].offset = p.b.mr.remote().length - 50; // 100 bytes from 50 before the end
        try {
            (void)TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
            FAIL("a range outside the remote region was planned");
        } catch (const Error& e) {
            CHECK(e.code() == errc::remote_range_outside_region);
            CHECK(std::string(e.what()).find("remote block 17 (100 bytes at offset 65486)") != std::string::npos);
        }
    }

    TEST_CASE("without report_blocks the result's report is empty, and its bytes are the plan's") {
        const Layout l = layout(500, 300, 31);
        Write w(l, 1000, 31);
        async_transfer(w.p.a.qp, w.plan, TransferOptions{}, w.out.handler());
        w.io.run_for(30s);
        REQUIRE(w.out.calls == 1);
        CHECK_MESSAGE(!w.out.result, w.out.result.message());
        CHECK(w.out.transfer.bytes == w.plan.bytes());
        CHECK(wrong_bytes(l, w.p.b.memory, 31) == 0);
        CHECK(w.why.empty());
        // Nothing built that was not asked for: one rail, no blocks' report.
        CHECK(w.report.requests.empty());
        CHECK(w.report.remote_blocks.empty());
        CHECK(w.report.landed + w.report.not_posted + w.report.uncertain == 0);
        CHECK(w.report.rails.empty());
    }

    TEST_CASE("0.1's output pointers still receive what the result says: the same bytes, words and report") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 1 << 16);
        auto [local, remote] = test::lists_with_wrong_key(p.a.mr, p.b.mr.remote());
        const TransferPlan plan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        std::array<std::uint64_t, 1> rail_bytes{};
        std::string failed;
        TransferReport report;
        TransferOptions options;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" // the deprecated outputs are what this checks
        options.rail_bytes = rail_bytes;
        options.failed_blocks = &failed;
        options.report = &report; // asks for the blocks' report, as report_blocks does
#pragma GCC diagnostic pop
        test::Outcome out;
        async_transfer(p.a.qp, plan, options, out.handler());
        io.run_for(10s);
        REQUIRE(out.calls == 1);
        CHECK(out.result == detail::to_asio_error(make_wc_error(IBV_WC_REM_ACCESS_ERR)));
        const TransferResult& result = out.transfer;
        CHECK_MESSAGE(result.failed_blocks.find("remote block 23 ") == 0, result.failed_blocks);
        CHECK(failed == result.failed_blocks);
        CHECK(rail_bytes[0] == result.bytes);
        CHECK(result.bytes == 23 * 100);
        CHECK(result.report.landed == 23);
        CHECK(report.requests == result.report.requests);
        CHECK(report.remote_blocks == result.report.remote_blocks);
        CHECK(report.landed == result.report.landed);
        CHECK(report.uncertain == result.report.uncertain);
        CHECK(report.not_posted == result.report.not_posted);
        REQUIRE(report.rails.size() == 1);
        REQUIRE(result.report.rails.size() == 1);
        CHECK(report.rails[0].bytes == result.report.rails[0].bytes);
        CHECK(result.report.rails[0].bytes == result.bytes);
        CHECK(report.rails[0].error == result.report.rails[0].error);
    }

    TEST_CASE("destroying the queue pair mid-transfer completes the handler once with operation_aborted") {
        const Layout l = layout(5000, 200, 9);
        Write w(l, 20000, 9);
        async_transfer(w.p.a.qp, w.plan, w.reporting(), w.out.handler());
        // The first 128 requests are with the device, the rest wait for slots;
        // (one turn of the io_context can finish the whole transfer on rxe, so
        // none is given).
        CHECK(w.p.a.qp.outstanding_sends() > 0);
        w.p.a.qp = QueuePair();
        w.io.run_for(5s);
        CHECK(w.out.calls == 1);
        CHECK(w.out.result == asio::error::operation_aborted);
        // Nothing completed before the queue pair went; what was posted is
        // uncertain, the rest never moved, and the three add up to the plan.
        const TransferReport& report = w.report;
        REQUIRE(report.remote_blocks.size() == l.lengths.size());
        CHECK(report.landed == 0);
        CHECK(report.landed + report.uncertain + report.not_posted == l.lengths.size());
        CHECK(report.uncertain > 0);
        CHECK(report.not_posted > 0);
        CHECK(report.remote_blocks.back() == BlockState::not_posted);
    }

    TEST_CASE(
        "a deadline that passes mid-transfer stops it: timed_out once the device is done, and the report "
        "says which blocks landed (each verified) and which never moved") {
        const test::Scatter s{4000, 16384};
        Write w(s, 5);
        test::Pair& p = w.p;
        const TransferReport& report = w.report;
        TransferOptions options = w.reporting();
        options.notify = 9; // never sent: the transfer did not finish
        // Far enough that it passes mid-transfer, not before the transfer starts (a deadline already
        // passed refuses it, nothing posted: under the sanitizers' emulated CPUs 3 ms could pass first).
        options.deadline = std::chrono::steady_clock::now() + 100ms;
        async_transfer(p.a.qp, w.plan, options, w.out.handler([&] {
            // The device is done with every request it took before the handler runs.
            CHECK(p.a.qp.outstanding_sends() == 0);
        }));
        const auto ran_from = std::chrono::steady_clock::now();
        const std::size_t handlers = w.io.run_for(30s);
        if (w.out.calls != 1) {
            // What the engine saw, so that a lost handler explains itself.
            const AsyncStatistics st = p.a.cq.async_statistics();
            MESSAGE(
                "run_for returned after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - ran_from)
                       .count()
                << " ms, " << handlers << " handlers run, stopped " << w.io.stopped() << "; submitted " << st.submitted
                << ", completed " << st.completed << ", aborted " << st.aborted << ", cancelled " << st.cancelled
                << ", wakeups " << st.wakeups << ", work completions " << st.work_completions << ", outstanding sends "
                << p.a.qp.outstanding_sends());
        }
        REQUIRE(w.out.calls == 1);
        CHECK_MESSAGE(w.out.result == boost::system::errc::timed_out, w.out.result.message());
        CHECK_MESSAGE(w.why.find("the deadline passed") == 0, w.why);
        // A healthy peer: what was posted completed, so nothing is uncertain.
        CHECK(report.uncertain == 0);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.not_posted == s.blocks);
        CHECK(w.out.moved == report.landed * s.block);
        CHECK(s.wrong(p.b.memory, 5, &report) == 0);
        MESSAGE("deadline 3 ms: " << report.landed << " of " << s.blocks << " blocks landed, " << report.not_posted
                                  << " never posted");

        // A deadline in the future changes nothing: every block, and the notification.
        std::optional<std::uint32_t> notified;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received got) {
            CHECK_FALSE(ec);
            notified = got.immediate;
        });
        options.deadline = std::chrono::steady_clock::now() + 60s;
        w.out = {};
        async_transfer(p.a.qp, w.plan, options, w.out.handler());
        test::run_until(
            w.io, [&] { return w.out.calls > 0 && notified; }, 30s);
        CHECK(w.out.calls == 1);
        CHECK_MESSAGE(!w.out.result, w.out.result.message());
        CHECK(w.out.moved == w.plan.bytes());
        CHECK(report.landed == s.blocks);
        CHECK(notified == 9u);
        // The timer was cancelled when the transfer finished: the io_context
        // runs out of work (with the 60 s wait pending it would not stop).
        w.io.restart();
        w.io.run_for(2s);
        CHECK(w.io.stopped());
    }

    TEST_CASE(
        "a transfer refused as it starts completes its handler inside a plain io.run(), nothing else keeping the "
        "io_context busy (the refusal's work is let go only after its handler is posted)") {
        const test::Scatter s{64, 4096};
        Write w(s, 3);
        TransferOptions options;
        options.deadline = std::chrono::steady_clock::now() - 1ms; // refused at once: nothing posted
        async_transfer(w.p.a.qp, w.plan, options, w.out.handler());
        // Before the fix, the io_context counted no work once the refusal let
        // its guard go, stopped, and run() returned at once with the handler queued.
        CHECK_FALSE(w.io.stopped());
        CHECK(w.io.run() == 1);
        REQUIRE(w.out.calls == 1);
        CHECK(w.out.result == boost::system::errc::timed_out);
        CHECK(w.why == "the deadline had passed when the transfer started (nothing was posted)");
        // The same for a refusal of another kind (an empty rail list is refused in the initiation too).
        w.io.restart();
        w.out = {};
        async_transfer(std::span<const TransferRail>(), w.plan, {}, asio::bind_executor(w.io, w.out.handler()));
        CHECK(w.io.run() == 1);
        CHECK(w.out.calls == 1);
        CHECK(static_cast<std::error_code>(w.out.result) == errc::invalid_argument);
    }

    TEST_CASE("a deadline bounds a transfer whose peer is gone: timed_out, landed 0, nothing left with the device") {
        const Layout l = layout(2000, 4000, 17);
        Write w(l, 20000, 17);
        w.p.b.qp = QueuePair(); // what a crashed peer looks like: nothing answers
        TransferOptions options = w.reporting();
        options.deadline = std::chrono::steady_clock::now() + 100ms;
        const auto t0 = std::chrono::steady_clock::now();
        std::chrono::steady_clock::duration took{};
        async_transfer(w.p.a.qp, w.plan, options, w.out.handler([&] {
            took = std::chrono::steady_clock::now() - t0;
            CHECK(w.p.a.qp.outstanding_sends() == 0);
        }));
        test::run_until(
            w.io, [&] { return w.out.calls > 0; }, 30s);
        REQUIRE(w.out.calls == 1);
        // The deadline came first (the transport's retries, 7 x ~67 ms, end the posted requests after it).
        CHECK_MESSAGE(w.out.result == boost::system::errc::timed_out, w.out.result.message());
        const TransferReport& report = w.report;
        CHECK(report.landed == 0);
        CHECK(report.uncertain > 0);
        CHECK(report.not_posted > 0);
        CHECK(report.uncertain + report.not_posted == l.lengths.size());
        MESSAGE("peer gone, deadline 100 ms: the handler ran after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms, " << report.uncertain
                << " blocks uncertain, " << report.not_posted << " never posted");
    }

    TEST_CASE(
        "two rails on one completion queue: destroying one rail's queue pair mid-transfer moves its requests "
        "to the other (the abort runs under the CQ's lock: the takeover is submitted after it)") {
        const test::Scatter s{4000, 4096};
        Write w(s, 37);
        test::Pair& p = w.p;
        PreparedQueuePair a2(p.a.pd, p.a.cq, p.a.cq, test::transfer_qp_options());
        PreparedQueuePair b2(p.b.pd, p.b.cq, p.b.cq, test::transfer_qp_options());
        auto [second, second_peer] = test::connect_advertised(a2, p.a.mr, b2, p.b.mr);
        std::vector<TransferRail> rails{TransferRail{&p.a.qp, {}, {}}, TransferRail{&second, {}, {}}};
        TransferOptions options = w.reporting();
        options.notify = 5;
        std::optional<std::uint32_t> notified;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received got) {
            CHECK_FALSE(ec);
            notified = got.immediate;
        });
        async_transfer(std::span<const TransferRail>(rails), w.plan, options, w.out.handler());
        REQUIRE(second.outstanding_sends() > 0);
        second = QueuePair(); // aborts rail 1 under the CQ's lock; rail 0 takes over on the same CQ
        test::run_until(
            w.io, [&] { return w.out.calls > 0 && notified; }, 30s);
        REQUIRE(w.out.calls == 1);
        CHECK_MESSAGE(!w.out.result, w.out.result.message());
        CHECK(notified == 5u);
        CHECK(w.report.landed == s.blocks);
        REQUIRE(w.report.rails.size() == 2);
        CHECK(w.report.rails[1].taken_over > 0);
        CHECK(w.report.rails[0].took_over == w.report.rails[1].taken_over);
        CHECK(s.wrong(p.b.memory, 37) == 0);
    }

    TEST_CASE(
        "with the default settings, a transfer whose peer's queue pair disappears mid-way fails once, naming "
        "the blocks, within seconds; the report matches the peer's memory") {
        const test::Scatter s{10000, 4096};
        Write w(s, 13);
        const TransferReport& report = w.report;
        const auto t0 = std::chrono::steady_clock::now();
        std::chrono::steady_clock::duration took{};
        // No deadline: the transport's retries bound it.
        async_transfer(w.p.a.qp, w.plan, w.reporting(),
                       w.out.handler([&] { took = std::chrono::steady_clock::now() - t0; }));
        w.io.run_for(20ms);
        REQUIRE(w.out.calls == 0);
        w.p.b.qp = QueuePair(); // the peer's queue pair disappears (what a killed process leaves on the wire)
        while (w.out.calls == 0 && std::chrono::steady_clock::now() - t0 < 60s) w.io.run_for(20ms);
        w.io.run_for(100ms);
        REQUIRE(w.out.calls == 1);
        CHECK_MESSAGE(w.out.result == detail::to_asio_error(make_wc_error(IBV_WC_RETRY_EXC_ERR)),
                      w.out.result.message());
        CHECK_MESSAGE(w.why.find("remote block") == 0, w.why);
        // The documented bound: (retry_count + 1) x 4.096 us x 2^timeout, ~0.47 s with the defaults (6, 14), plus
        // the requests ahead of it: seconds, never forever.
        CHECK(took < 10s);
        CHECK(report.landed + report.uncertain + report.not_posted == s.blocks);
        check_against_report(w, s, 13);
        MESSAGE("peer's queue pair destroyed, default settings: failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms with '"
                << w.out.result.message() << "' at " << w.why << "; " << report.landed << " landed, "
                << report.uncertain << " uncertain, " << report.not_posted << " never posted");
    }

    TEST_CASE(
        "a peer that stops answering (every packet dropped): the deadline ends the transfer with timed_out "
        "within the retry time; the report matches the peer's memory") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig)");
            return;
        }
        const test::Scatter s{10000, 4096};
        Write w(s, 19);
        const TransferReport& report = w.report;
        TransferOptions options = w.reporting();
        const auto deadline = std::chrono::steady_clock::now() + 200ms;
        options.deadline = deadline;
        std::chrono::steady_clock::time_point ended;
        async_transfer(w.p.a.qp, w.plan, options, w.out.handler([&] { ended = std::chrono::steady_clock::now(); }));
        w.io.run_for(10ms);
        REQUIRE(w.out.calls == 0);
        test::Heal heal("drop-off");
        REQUIRE(test::fault("drop-on") == 0); // the peer stops answering
        test::run_until(
            w.io, [&] { return w.out.calls > 0; }, 30s);
        CHECK(heal.now() == 0);
        REQUIRE(w.out.calls == 1);
        CHECK_MESSAGE(w.out.result == boost::system::errc::timed_out, w.out.result.message());
        // At the deadline nothing more is posted; what is in flight ends with the transport's retries
        // (~0.47 s with the defaults): the handler runs within that of the deadline.
        const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(ended - deadline);
        CHECK(ended >= deadline);
        CHECK(late < 3s);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.uncertain + report.not_posted == s.blocks);
        check_against_report(w, s, 19);
        MESSAGE("every packet dropped, deadline 200 ms: timed_out "
                << late.count() << " ms after the deadline; " << report.landed << " landed, " << report.uncertain
                << " uncertain, " << report.not_posted << " never posted");
    }

    TEST_CASE(
        "cancelling a transfer through its slot: operation_aborted once the device is done, the report adds "
        "up; a signal emitted after completion does nothing") {
        const test::Scatter s{10000, 4096};
        Write w(s, 29);
        const TransferReport& report = w.report;
        REQUIRE(w.plan.requests().size() == s.blocks); // no two coalesce
        const TransferOptions options = w.reporting();
        asio::cancellation_signal signal;
        auto done = w.out.handler([&] { CHECK(w.p.a.qp.outstanding_sends() == 0); });
        async_transfer(w.p.a.qp, w.plan, options, asio::bind_cancellation_slot(signal.slot(), done));
        w.io.run_for(2ms); // some chains complete
        REQUIRE(w.out.calls == 0);
        signal.emit(asio::cancellation_type::terminal);
        signal.emit(asio::cancellation_type::terminal); // twice: still one completion
        w.io.run_for(30s);
        REQUIRE(w.out.calls == 1);
        CHECK(w.out.result == asio::error::operation_aborted);
        CHECK(report.uncertain == 0);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.not_posted == s.blocks);
        CHECK(w.out.moved == report.landed * s.block);
        // Against the peer's memory: what landed is there, what was never posted was never touched.
        check_against_report(w, s, 29);
        CHECK(s.touched(w.p.b.memory, report, BlockState::uncertain) == 0);
        MESSAGE("cancelled: " << report.landed << " of " << s.blocks << " blocks landed");

        // Bound again, run to the end; the signal afterwards finds no handler.
        w.out = {};
        async_transfer(w.p.a.qp, w.plan, options, asio::bind_cancellation_slot(signal.slot(), w.out.handler()));
        w.io.restart();
        w.io.run_for(30s);
        REQUIRE(w.out.calls == 1);
        CHECK_FALSE(w.out.result);
        signal.emit(asio::cancellation_type::terminal);
        w.io.restart();
        w.io.run_for(10ms);
        CHECK(w.out.calls == 1);
        CHECK(report.landed == s.blocks);
    }

    TEST_CASE(
        "a deferred transfer (the default token) launched after its queue pair was destroyed completes once with "
        "operation_aborted; launched while it lives, it moves every byte") {
        const Layout l = layout(300, 200, 11);
        Write w(l, 20000, 11);
        test::Pair& p = w.p;

        auto live = async_transfer(p.a.qp, w.plan); // asio::deferred: nothing is posted yet
        std::optional<boost::system::error_code> live_result;
        std::size_t moved = 0;
        std::move(live)([&](boost::system::error_code ec, std::size_t bytes) { // 0.1's handler: the result's bytes
            live_result = ec;
            moved = bytes;
        });
        w.io.run_for(10s);
        REQUIRE(live_result.has_value());
        CHECK_FALSE(*live_result);
        CHECK(moved == w.plan.bytes());
        CHECK(wrong_bytes(l, p.b.memory, 11) == 0);

        auto late = async_transfer(p.a.qp, w.plan);
        p.a.qp = QueuePair(); // the rail is bound weakly: no dangling queue pair
        std::move(late)(w.out.handler());
        CHECK(w.out.calls == 0); // never inside the launch
        w.io.restart();
        w.io.run_for(5s);
        CHECK(w.out.calls == 1);
        CHECK(w.out.moved == 0);
        CHECK(w.out.result == asio::error::operation_aborted);
    }
}
