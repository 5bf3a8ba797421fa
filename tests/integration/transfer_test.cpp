// Block-list transfers on rxe0 <-> rxe1: scattered blocks of mixed sizes
// written and read in one operation, every byte checked; a wrong key named by
// its block; a queue pair destroyed mid-transfer.
#include "process_resources.hpp"
#include "prometheus_parse.hpp"
#include "rig.hpp"
#include "rig_faults.hpp"
#include "rig_rails.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

struct Side {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::vector<std::byte> memory;
    MemoryRegion mr;
    PreparedQueuePair prepared;
    QueuePair qp;
    Side(const std::string& name, const asio::any_io_executor& ex, std::size_t bytes)
        : device(Device::open(name)),
          pd(device),
          cq(device, 4096, ex, AsyncOptions{CompletionMode::event_driven, {}}),
          memory(bytes),
          mr(pd, memory, Access::local_write | Access::remote_write | Access::remote_read),
          prepared(pd, cq, cq, options()) {}
    static QueuePairOptions options() {
        QueuePairOptions o = test::test_qp_options();
        o.max_send_wr = 128;
        o.max_send_sge = 4;
        return o;
    }
};

struct Pair {
    Side a, b;
    Pair(const asio::any_io_executor& ex, std::size_t bytes)
        : a(test::rig_devices()->dev0, ex, bytes), b(test::rig_devices()->dev1, ex, bytes) {
        Endpoint ea = a.prepared.endpoint(), eb = b.prepared.endpoint();
        (void)a.prepared.advertise(a.mr);
        (void)b.prepared.advertise(b.mr);
        a.qp = std::move(a.prepared).connect(eb);
        b.qp = std::move(b.prepared).connect(ea);
    }
};

/// `count` blocks of mixed sizes (1 .. max_block, multiples of nothing), laid
/// out contiguously on the source, and a shuffled placement on the
/// destination with gaps (so that few neighbours coalesce).
struct Layout {
    std::vector<std::size_t> lengths, source, destination;
    std::size_t bytes = 0;
};
Layout layout(std::size_t count, std::size_t max_block, std::uint32_t seed) {
    Layout l;
    std::mt19937 random(seed);
    for (std::size_t k = 0; k < count; ++k) l.lengths.push_back(1 + random() % max_block);
    std::size_t at = 0;
    for (std::size_t n : l.lengths) {
        l.source.push_back(at);
        at += n;
    }
    l.bytes = at;
    std::vector<std::size_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random);
    l.destination.resize(count);
    at = 0;
    for (std::size_t k : order) {
        l.destination[k] = at;
        at += l.lengths[k] + 1 + random() % 3; // a gap of 1-3 bytes
    }
    return l;
}

TransferOptions options_of(std::optional<std::uint32_t> notify, std::string* failed_blocks) {
    TransferOptions o;
    o.notify = notify;
    o.failed_blocks = failed_blocks;
    return o;
}

std::byte pattern(std::size_t i, std::uint32_t seed) {
    return std::byte((i * 131 + seed) % 251);
}

/// The lists of a write of layout `l`: its source blocks in `from`, its
/// destination blocks in `to`.
struct Lists {
    std::vector<LocalBuffer> local;
    std::vector<RemoteBlock> remote;
};
Lists write_lists(const Layout& l, const MemoryRegion& from, const RemoteMemory& to) {
    Lists out;
    for (std::size_t k = 0; k < l.lengths.size(); ++k) {
        out.local.push_back(from.slice(l.source[k], l.lengths[k]));
        out.remote.push_back({to, l.destination[k], l.lengths[k]});
    }
    return out;
}

/// Destination bytes of layout `l` in `to` that differ from the pattern written with `seed`.
std::size_t wrong_bytes(const Layout& l, std::span<const std::byte> to, std::uint32_t seed) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < l.lengths.size(); ++k) {
        for (std::size_t i = 0; i < l.lengths[k]; ++i) {
            bad += to[l.destination[k] + i] != pattern(l.source[k] + i, seed) ? 1 : 0;
        }
    }
    return bad;
}

/// Runs one transfer of `blocks` blocks and checks every byte; the bytes moved.
std::size_t move_blocks(TransferDirection direction, std::size_t blocks, std::size_t max_block, std::uint32_t seed) {
    asio::io_context io;
    Layout l = layout(blocks, max_block, seed);
    std::size_t span = l.bytes * 2 + 4 * blocks + 16;
    Pair p(io.get_executor(), span);
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
    boost::system::error_code result;
    std::size_t moved = 0;
    int calls = 0;
    TransferReport report;
    report.landed = 12345; // overwritten
    TransferOptions options;
    options.report = &report;
    async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t n) {
        ++calls;
        result = ec;
        moved = n;
    });
    io.run_for(60s);
    CHECK(calls == 1);
    CHECK_MESSAGE(!result, result.message());
    CHECK(moved == l.bytes);
    CHECK(wrong_bytes(l, to, seed) == 0);
    // Success: the report says every block landed.
    CHECK(report.landed == blocks);
    CHECK(report.uncertain + report.not_posted == 0);
    CHECK(report.requests.size() == plan.requests().size());
    std::string kind = direction == TransferDirection::write ? "write" : "read";
    MESSAGE(blocks << " blocks, " << l.bytes << " bytes, " << plan.requests().size() << " requests (" << kind << ")");
    return moved;
}

} // namespace

TEST_SUITE("block-list transfers" * doctest::skip(!test::rig_present())) {
    TEST_CASE("1, 2, 1,000 and 10,000 blocks of mixed sizes, written and read, every byte verified") {
        for (TransferDirection d : {TransferDirection::write, TransferDirection::read}) {
            move_blocks(d, 1, 5000, 1);
            move_blocks(d, 2, 5000, 2);
            move_blocks(d, 1000, 4099, 3); // far more requests than the send queue holds (128)
            move_blocks(d, 10000, 300, 4);
        }
    }

    TEST_CASE("requests go out in chains of doorbell_batch, one signaled each; a queue smaller than a chain works") {
        for (std::uint32_t batch : {1U, 7U, 32U, 64U}) {
            asio::io_context io;
            Layout l = layout(1000, 700, 11 + batch);
            Pair p(io.get_executor(), l.bytes * 2 + 4000);
            for (std::size_t i = 0; i < l.bytes; ++i) p.a.memory[i] = pattern(i, batch);
            auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
            const std::uint64_t before = p.a.cq.async_statistics().work_completions;
            int calls = 0;
            boost::system::error_code result;
            TransferOptions options;
            options.doorbell_batch = batch;
            async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
                ++calls;
                result = ec;
            });
            io.run_for(30s);
            CHECK(calls == 1);
            CHECK_FALSE(result);
            const std::size_t requests = plan.requests().size();
            const std::uint64_t signaled = p.a.cq.async_statistics().work_completions - before;
            CHECK(signaled == (requests + batch - 1) / batch);
            CHECK(wrong_bytes(l, p.b.memory, batch) == 0);
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
        (void)b.advertise(mr1);
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
        int calls = 0;
        boost::system::error_code result;
        async_transfer(qa, plan, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
        });
        io.run_for(10s);
        CHECK(calls == 1);
        CHECK_FALSE(result);
        std::size_t bad = 0;
        for (std::size_t k = 0; k < 100; ++k) {
            for (std::size_t i = 0; i < 100; ++i) bad += m1[(99 - k) * 300 + i] != std::byte(k + i) ? 1 : 0;
        }
        CHECK(bad == 0);
    }

    TEST_CASE("a transfer shares its send queue with other operations: both finish, every byte lands") {
        asio::io_context io;
        Layout l = layout(3000, 500, 21);
        Pair p(io.get_executor(), l.bytes * 2 + 12000 + std::size_t{300} * 64);
        for (std::size_t i = 0; i < l.bytes; ++i) p.a.memory[i] = pattern(i, 21);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        int calls = 0;
        boost::system::error_code result;
        async_transfer(p.a.qp, plan, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
        });
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
        io.run_for(30s);
        CHECK(calls == 1);
        CHECK_FALSE(result);
        CHECK(writes == 300);
        std::size_t bad = wrong_bytes(l, p.b.memory, 21);
        for (std::size_t k = 0; k < std::size_t{300} * 64; ++k)
            bad += p.b.memory[area + k] != p.a.memory[area + k] ? 1 : 0;
        CHECK(bad == 0);
    }

    TEST_CASE("a notification after the last block: when the peer's receive completes, every block has landed") {
        asio::io_context io;
        Layout l = layout(1000, 3000, 5);
        Pair p(io.get_executor(), l.bytes * 2 + 8000);
        for (std::size_t i = 0; i < l.bytes; ++i) p.a.memory[i] = pattern(i, 5);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        std::optional<std::uint32_t> immediate;
        std::size_t bad_at_notification = 1;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received r) {
            REQUIRE_FALSE(ec);
            immediate = r.immediate;
            bad_at_notification = wrong_bytes(l, p.b.memory, 5);
        });
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        int calls = 0;
        boost::system::error_code result;
        async_transfer(p.a.qp, plan, options_of(0xC0FFEEu, nullptr), [&](boost::system::error_code ec, std::size_t n) {
            ++calls;
            result = ec;
            CHECK(n == l.bytes);
        });
        io.run_for(20s);
        CHECK(calls == 1);
        CHECK_FALSE(result);
        CHECK(immediate == 0xC0FFEEu);
        CHECK(bad_at_notification == 0);
    }

    TEST_CASE(
        "a lease on the owner's blocks: the reader reads under it and releases it with the notification; "
        "an unreleased lease expires; a stale list is refused") {
        // b owns the blocks (prefill), a reads them (decode).
        asio::io_context io;
        Layout l = layout(500, 3000, 23);
        Pair p(io.get_executor(), l.bytes * 2 + 8000);
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
        std::string busy;
        CHECK(leases.claim(offered, &busy) == errc::blocks_leased); // the owner may not reuse them yet
        CHECK_MESSAGE(busy.find("block 0 (") == 0, busy);

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
        const auto t0 = std::chrono::steady_clock::now();
        while ((!result || !released) && std::chrono::steady_clock::now() - t0 < 20s) io.run_for(10ms);
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
        std::string stale;
        CHECK(reader.accept(1, older, &stale) == errc::stale_block_list);
        CHECK(stale == "block list version " + std::to_string(older.version) +
                           " from owner 1 is not newer than version " + std::to_string(list.version) +
                           " already accepted from it: its blocks may have been reused since");
        CHECK(reader.accept(1, list) == errc::stale_block_list); // the same list twice: stale too
        CHECK_FALSE(reader.accept(2, older));
        (void)forgotten;
    }

    TEST_CASE("a wrong remote key fails the transfer once, naming the block; the plan refuses a range outside") {
        asio::io_context io;
        Pair p(io.get_executor(), 1 << 16);
        RemoteMemory wrong = p.b.mr.remote();
        wrong.rkey ^= 0x5a5a00;
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < 40; ++k) {
            local.push_back(p.a.mr.slice(k * 100, 100));
            remote.push_back({k == 23 ? wrong : p.b.mr.remote(), k * 200, 100});
        }
        for (std::size_t i = 0; i < 40 * 100; ++i) p.a.memory[i] = pattern(i, 5);
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        std::string failed;
        boost::system::error_code result;
        int calls = 0;
        TransferReport report;
        TransferOptions options = options_of(std::nullopt, &failed);
        options.report = &report;
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
        });
        io.run_for(10s);
        CHECK(calls == 1);
        CHECK(result == detail::to_asio_error(make_wc_error(IBV_WC_REM_ACCESS_ERR)));
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

    TEST_CASE("destroying the queue pair mid-transfer completes the handler once with operation_aborted") {
        asio::io_context io;
        Layout l = layout(5000, 200, 9);
        Pair p(io.get_executor(), l.bytes * 2 + 20000);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        boost::system::error_code result;
        int calls = 0;
        TransferReport report;
        TransferOptions options;
        options.report = &report;
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
        });
        // The first 128 requests are with the device, the rest wait for slots;
        // (one turn of the io_context can finish the whole transfer on rxe, so
        // none is given).
        CHECK(p.a.qp.outstanding_sends() > 0);
        p.a.qp = QueuePair();
        io.run_for(5s);
        CHECK(calls == 1);
        CHECK(result == asio::error::operation_aborted);
        // Nothing completed before the queue pair went; what was posted is
        // uncertain, the rest never moved, and the three add up to the plan.
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
        asio::io_context io;
        constexpr std::size_t blocks = 4000, block = 16384;
        Pair p(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(p.a.mr.slice(k * block, block));
            remote.push_back({p.b.mr.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        for (std::size_t i = 0; i < blocks * block; ++i) p.a.memory[i] = pattern(i, 5);
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        TransferReport report;
        std::string why;
        TransferOptions options;
        options.report = &report;
        options.failed_blocks = &why;
        options.notify = 9; // never sent: the transfer did not finish
        options.deadline = std::chrono::steady_clock::now() + 3ms;
        int calls = 0;
        boost::system::error_code result;
        std::size_t moved = 0;
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t n) {
            ++calls;
            result = ec;
            moved = n;
            // The device is done with every request it took before the handler runs.
            CHECK(p.a.qp.outstanding_sends() == 0);
        });
        io.run_for(30s);
        REQUIRE(calls == 1);
        CHECK_MESSAGE(result == boost::system::errc::timed_out, result.message());
        CHECK_MESSAGE(why.find("the deadline passed") == 0, why);
        // A healthy peer: what was posted completed, so nothing is uncertain.
        CHECK(report.uncertain == 0);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.not_posted == blocks);
        CHECK(moved == report.landed * block);
        std::size_t wrong = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            if (report.remote_blocks[k] != BlockState::landed) continue;
            const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
            for (std::size_t i = 0; i < block; ++i) wrong += p.b.memory[at + i] != pattern(k * block + i, 5) ? 1 : 0;
        }
        CHECK(wrong == 0);
        MESSAGE("deadline 3 ms: " << report.landed << " of " << blocks << " blocks landed, " << report.not_posted
                                  << " never posted");

        // A deadline in the future changes nothing: every block, and the notification.
        std::optional<std::uint32_t> notified;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received got) {
            CHECK_FALSE(ec);
            notified = got.immediate;
        });
        options.deadline = std::chrono::steady_clock::now() + 60s;
        calls = 0;
        const auto t0 = std::chrono::steady_clock::now();
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t n) {
            ++calls;
            result = ec;
            moved = n;
        });
        io.restart();
        while ((calls == 0 || !notified) && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(10ms);
        CHECK(calls == 1);
        CHECK_MESSAGE(!result, result.message());
        CHECK(moved == plan.bytes());
        CHECK(report.landed == blocks);
        CHECK(notified == 9u);
        // The timer was cancelled when the transfer finished: the io_context
        // runs out of work (with the 60 s wait pending it would not stop).
        io.restart();
        io.run_for(2s);
        CHECK(io.stopped());
    }

    TEST_CASE("a deadline bounds a transfer whose peer is gone: timed_out, landed 0, nothing left with the device") {
        asio::io_context io;
        Layout l = layout(2000, 4000, 17);
        Pair p(io.get_executor(), l.bytes * 2 + 20000);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());
        p.b.qp = QueuePair(); // what a crashed peer looks like: nothing answers
        TransferReport report;
        TransferOptions options;
        options.report = &report;
        options.deadline = std::chrono::steady_clock::now() + 100ms;
        int calls = 0;
        boost::system::error_code result;
        const auto t0 = std::chrono::steady_clock::now();
        std::chrono::steady_clock::duration took{};
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
            took = std::chrono::steady_clock::now() - t0;
            CHECK(p.a.qp.outstanding_sends() == 0);
        });
        while (calls == 0 && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(10ms);
        REQUIRE(calls == 1);
        // The deadline came first (the transport's retries, 7 x ~67 ms, end the posted requests after it).
        CHECK_MESSAGE(result == boost::system::errc::timed_out, result.message());
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
        asio::io_context io;
        constexpr std::size_t blocks = 4000, block = 4096;
        Pair p(io.get_executor(), 2 * blocks * block);
        PreparedQueuePair a2(p.a.pd, p.a.cq, p.a.cq, Side::options()), b2(p.b.pd, p.b.cq, p.b.cq, Side::options());
        const Endpoint ea2 = a2.endpoint(), eb2 = b2.endpoint();
        (void)a2.advertise(p.a.mr);
        (void)b2.advertise(p.b.mr);
        QueuePair second = std::move(a2).connect(eb2);
        QueuePair second_peer = std::move(b2).connect(ea2);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(p.a.mr.slice(k * block, block));
            remote.push_back({p.b.mr.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        for (std::size_t i = 0; i < blocks * block; ++i) p.a.memory[i] = pattern(i, 37);
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        std::vector<TransferRail> rails{TransferRail{&p.a.qp, {}, {}}, TransferRail{&second, {}, {}}};
        TransferReport report;
        TransferOptions options;
        options.report = &report;
        options.notify = 5;
        std::optional<std::uint32_t> notified;
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received got) {
            CHECK_FALSE(ec);
            notified = got.immediate;
        });
        std::optional<boost::system::error_code> result;
        async_transfer(std::span<const TransferRail>(rails), plan, options,
                       [&](boost::system::error_code ec, std::size_t) { result = ec; });
        REQUIRE(second.outstanding_sends() > 0);
        second = QueuePair(); // aborts rail 1 under the CQ's lock; rail 0 takes over on the same CQ
        const auto t0 = std::chrono::steady_clock::now();
        while ((!result || !notified) && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(10ms);
        REQUIRE(result.has_value());
        CHECK_MESSAGE(!*result, result->message());
        CHECK(notified == 5u);
        CHECK(report.landed == blocks);
        REQUIRE(report.rails.size() == 2);
        CHECK(report.rails[1].taken_over > 0);
        CHECK(report.rails[0].took_over == report.rails[1].taken_over);
        std::size_t wrong = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
            for (std::size_t i = 0; i < block; ++i) wrong += p.b.memory[at + i] != pattern(k * block + i, 37) ? 1 : 0;
        }
        CHECK(wrong == 0);
    }

    TEST_CASE(
        "with the default settings, a transfer whose peer's queue pair disappears mid-way fails once, naming "
        "the blocks, within seconds; the report matches the peer's memory") {
        asio::io_context io;
        constexpr std::size_t blocks = 10000, block = 4096;
        Pair p(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(p.a.mr.slice(k * block, block));
            remote.push_back({p.b.mr.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        for (std::size_t i = 0; i < blocks * block; ++i) p.a.memory[i] = pattern(i, 13);
        std::fill(p.b.memory.begin(), p.b.memory.end(), std::byte{0xEE});
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        TransferReport report;
        std::string why;
        TransferOptions options; // no deadline: the transport's retries bound it
        options.report = &report;
        options.failed_blocks = &why;
        int calls = 0;
        boost::system::error_code result;
        const auto t0 = std::chrono::steady_clock::now();
        std::chrono::steady_clock::duration took{};
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
            took = std::chrono::steady_clock::now() - t0;
        });
        io.run_for(20ms);
        REQUIRE(calls == 0);
        p.b.qp = QueuePair(); // the peer's queue pair disappears (what a killed process leaves on the wire)
        while (calls == 0 && std::chrono::steady_clock::now() - t0 < 60s) io.run_for(20ms);
        io.run_for(100ms);
        REQUIRE(calls == 1);
        CHECK_MESSAGE(result == detail::to_asio_error(make_wc_error(IBV_WC_RETRY_EXC_ERR)), result.message());
        CHECK_MESSAGE(why.find("remote block") == 0, why);
        // The documented bound: (retry_count + 1) x 4.096 us x 2^timeout, ~0.47 s with the defaults (6, 14), plus
        // the requests ahead of it: seconds, never forever.
        CHECK(took < 10s);
        CHECK(report.landed + report.uncertain + report.not_posted == blocks);
        std::size_t wrong = 0, touched = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
            if (report.remote_blocks[k] == BlockState::landed) {
                for (std::size_t i = 0; i < block; ++i)
                    wrong += p.b.memory[at + i] != pattern(k * block + i, 13) ? 1 : 0;
            } else if (report.remote_blocks[k] == BlockState::not_posted) {
                for (std::size_t i = 0; i < block; ++i) touched += p.b.memory[at + i] != std::byte{0xEE} ? 1 : 0;
            }
        }
        CHECK(wrong == 0);
        CHECK(touched == 0);
        MESSAGE("peer's queue pair destroyed, default settings: failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms with '"
                << result.message() << "' at " << why << "; " << report.landed << " landed, " << report.uncertain
                << " uncertain, " << report.not_posted << " never posted");
    }

    TEST_CASE(
        "a peer that stops answering (every packet dropped): the deadline ends the transfer with timed_out "
        "within the retry time; the report matches the peer's memory") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig)");
            return;
        }
        asio::io_context io;
        constexpr std::size_t blocks = 10000, block = 4096;
        Pair p(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(p.a.mr.slice(k * block, block));
            remote.push_back({p.b.mr.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        for (std::size_t i = 0; i < blocks * block; ++i) p.a.memory[i] = pattern(i, 19);
        std::fill(p.b.memory.begin(), p.b.memory.end(), std::byte{0xEE});
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        TransferReport report;
        TransferOptions options;
        options.report = &report;
        const auto deadline = std::chrono::steady_clock::now() + 200ms;
        options.deadline = deadline;
        int calls = 0;
        boost::system::error_code result;
        std::chrono::steady_clock::time_point ended;
        async_transfer(p.a.qp, plan, options, [&](boost::system::error_code ec, std::size_t) {
            ++calls;
            result = ec;
            ended = std::chrono::steady_clock::now();
        });
        io.run_for(10ms);
        REQUIRE(calls == 0);
        test::Heal heal("drop-off");
        REQUIRE(test::fault("drop-on") == 0); // the peer stops answering
        const auto t0 = std::chrono::steady_clock::now();
        while (calls == 0 && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(20ms);
        CHECK(heal.now() == 0);
        REQUIRE(calls == 1);
        CHECK_MESSAGE(result == boost::system::errc::timed_out, result.message());
        // At the deadline nothing more is posted; what is in flight ends with the transport's retries
        // (~0.47 s with the defaults): the handler runs within that of the deadline.
        const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(ended - deadline);
        CHECK(ended >= deadline);
        CHECK(late < 3s);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.uncertain + report.not_posted == blocks);
        std::size_t wrong = 0, touched = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
            if (report.remote_blocks[k] == BlockState::landed) {
                for (std::size_t i = 0; i < block; ++i)
                    wrong += p.b.memory[at + i] != pattern(k * block + i, 19) ? 1 : 0;
            } else if (report.remote_blocks[k] == BlockState::not_posted) {
                for (std::size_t i = 0; i < block; ++i) touched += p.b.memory[at + i] != std::byte{0xEE} ? 1 : 0;
            }
        }
        CHECK(wrong == 0);
        CHECK(touched == 0);
        MESSAGE("every packet dropped, deadline 200 ms: timed_out "
                << late.count() << " ms after the deadline; " << report.landed << " landed, " << report.uncertain
                << " uncertain, " << report.not_posted << " never posted");
    }

    TEST_CASE(
        "cancelling a transfer through its slot: operation_aborted once the device is done, the report adds "
        "up; a signal emitted after completion does nothing") {
        asio::io_context io;
        constexpr std::size_t blocks = 10000, block = 4096;
        Pair p(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(p.a.mr.slice(k * block, block));
            remote.push_back({p.b.mr.remote(), (2 * blocks - 1 - 2 * k) * block, block}); // no two coalesce
        }
        for (std::size_t i = 0; i < blocks * block; ++i) p.a.memory[i] = pattern(i, 29);
        std::fill(p.b.memory.begin(), p.b.memory.end(), std::byte{0xEE});
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        REQUIRE(plan.requests().size() == blocks);
        TransferReport report;
        TransferOptions options;
        options.report = &report;
        asio::cancellation_signal signal;
        int calls = 0;
        boost::system::error_code result;
        std::size_t moved = 0;
        async_transfer(p.a.qp, plan, options,
                       asio::bind_cancellation_slot(signal.slot(), [&](boost::system::error_code ec, std::size_t n) {
                           ++calls;
                           result = ec;
                           moved = n;
                           CHECK(p.a.qp.outstanding_sends() == 0);
                       }));
        io.run_for(2ms); // some chains complete
        REQUIRE(calls == 0);
        signal.emit(asio::cancellation_type::terminal);
        signal.emit(asio::cancellation_type::terminal); // twice: still one completion
        io.run_for(30s);
        REQUIRE(calls == 1);
        CHECK(result == asio::error::operation_aborted);
        CHECK(report.uncertain == 0);
        CHECK(report.not_posted > 0);
        CHECK(report.landed + report.not_posted == blocks);
        CHECK(moved == report.landed * block);
        // Against the peer's memory: what landed is there, what was never posted was never touched.
        std::size_t wrong = 0, touched = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
            const bool landed = report.remote_blocks[k] == BlockState::landed;
            for (std::size_t i = 0; i < block; ++i) {
                if (landed) {
                    wrong += p.b.memory[at + i] != pattern(k * block + i, 29) ? 1 : 0;
                } else {
                    touched += p.b.memory[at + i] != std::byte{0xEE} ? 1 : 0;
                }
            }
        }
        CHECK(wrong == 0);
        CHECK(touched == 0);
        MESSAGE("cancelled: " << report.landed << " of " << blocks << " blocks landed");

        // Bound again, run to the end; the signal afterwards finds no handler.
        calls = 0;
        async_transfer(p.a.qp, plan, options,
                       asio::bind_cancellation_slot(signal.slot(), [&](boost::system::error_code ec, std::size_t) {
                           ++calls;
                           result = ec;
                       }));
        io.restart();
        io.run_for(30s);
        REQUIRE(calls == 1);
        CHECK_FALSE(result);
        signal.emit(asio::cancellation_type::terminal);
        io.restart();
        io.run_for(10ms);
        CHECK(calls == 1);
        CHECK(report.landed == blocks);
    }

    TEST_CASE(
        "a deferred transfer (the default token) launched after its queue pair was destroyed completes once with "
        "operation_aborted; launched while it lives, it moves every byte") {
        asio::io_context io;
        Layout l = layout(300, 200, 11);
        Pair p(io.get_executor(), l.bytes * 2 + 20000);
        auto [local, remote] = write_lists(l, p.a.mr, p.b.mr.remote());
        for (std::size_t i = 0; i < l.bytes; ++i) p.a.memory[i] = pattern(i, 11);
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, p.a.qp.capabilities());

        auto live = async_transfer(p.a.qp, plan); // asio::deferred: nothing is posted yet
        std::optional<boost::system::error_code> live_result;
        std::size_t moved = 0;
        std::move(live)([&](boost::system::error_code ec, std::size_t bytes) {
            live_result = ec;
            moved = bytes;
        });
        io.run_for(10s);
        REQUIRE(live_result.has_value());
        CHECK_FALSE(*live_result);
        CHECK(moved == plan.bytes());
        CHECK(wrong_bytes(l, p.b.memory, 11) == 0);

        auto late = async_transfer(p.a.qp, plan);
        p.a.qp = QueuePair(); // the rail is bound weakly: no dangling queue pair
        int calls = 0;
        boost::system::error_code late_result;
        std::move(late)([&](boost::system::error_code ec, std::size_t bytes) {
            ++calls;
            late_result = ec;
            CHECK(bytes == 0);
        });
        CHECK(calls == 0); // never inside the launch
        io.restart();
        io.run_for(5s);
        CHECK(calls == 1);
        CHECK(late_result == asio::error::operation_aborted);
    }
}

namespace {

using test::Rails;

} // namespace

TEST_SUITE("transfers across rails" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "one transfer striped over two rails: each rail's bytes reported, every byte verified; a rail "
        "that goes down mid-transfer fails it once, naming the rail") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig): the second wire cannot be made");
            return;
        }
        REQUIRE(test::fault("rails-up") == 0);
        test::Heal down("rails-down");
        {
            asio::io_context io;
            Layout l = layout(2000, 9000, 31);
            Rails r(io.get_executor(), l.bytes * 2 + 8000);
            for (std::size_t i = 0; i < l.bytes; ++i) r.m0[i] = pattern(i, 31);
            auto [local, remote] = write_lists(l, r.rail0.mr0, r.rail0.mr1.remote());
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
            std::optional<std::uint32_t> notified;
            r.rail0.qp1.async_receive(r.rail0.mr1.slice(0, 0), [&](boost::system::error_code ec, Received got) {
                CHECK_FALSE(ec);
                notified = got.immediate;
            });
            std::vector<TransferRail> rails = r.spec();
            std::array<std::uint64_t, 2> per_rail{};
            TransferOptions options;
            options.rail_bytes = per_rail;
            options.notify = 42;
            int calls = 0;
            boost::system::error_code result;
            std::size_t moved = 0;
            async_transfer(std::span<const TransferRail>(rails), plan, options,
                           [&](boost::system::error_code ec, std::size_t n) {
                               ++calls;
                               result = ec;
                               moved = n;
                           });
            io.run_for(60s);
            CHECK(calls == 1);
            CHECK_MESSAGE(!result, result.message());
            CHECK(moved == l.bytes);
            CHECK(per_rail[0] + per_rail[1] == l.bytes);
            // Halves of equal bytes, to within one block.
            CHECK(per_rail[0] > l.bytes / 2 - 9000);
            CHECK(per_rail[1] > l.bytes / 2 - 9000);
            CHECK(notified == 42u);
            CHECK(wrong_bytes(l, r.m1, 31) == 0);
            MESSAGE("2 rails: " << plan.requests().size() << " requests, rail 0 " << per_rail[0] << " bytes, rail 1 "
                                << per_rail[1] << " bytes");

            // A rail without its own keys, on another device, is refused before anything is posted.
            std::vector<TransferRail> unmapped{TransferRail{&r.rail0.qp0, {}, {}}, TransferRail{&r.rail1.qp0, {}, {}}};
            std::string why;
            TransferOptions refused;
            refused.failed_blocks = &why;
            calls = 0;
            async_transfer(std::span<const TransferRail>(unmapped), plan, refused,
                           [&](boost::system::error_code ec, std::size_t) {
                               ++calls;
                               result = ec;
                           });
            io.restart();
            io.run_for(1s);
            CHECK(calls == 1);
            CHECK(result == detail::to_asio_error(make_error_code(errc::invalid_argument)));
            CHECK_MESSAGE(why.find("rail 1's queue pair is on another protection domain") == 0, why);
        }
        {
            // A large transfer; the second wire goes down while it runs.
            asio::io_context io;
            constexpr std::size_t blocks = 3000, block = 16384;
            Rails r(io.get_executor(), 2 * blocks * block);
            std::vector<LocalBuffer> local;
            std::vector<RemoteBlock> remote;
            for (std::size_t k = 0; k < blocks; ++k) {
                local.push_back(r.rail0.mr0.slice(k * block, block));
                remote.push_back({r.rail0.mr1.remote(), (2 * blocks - 1 - 2 * k) * block, block});
            }
            for (std::size_t i = 0; i < blocks * block; ++i) r.m0[i] = pattern(i, 77);
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
            std::vector<TransferRail> rails = r.spec();
            std::array<std::uint64_t, 2> per_rail{};
            std::string failed;
            TransferReport report;
            TransferOptions options;
            options.rail_bytes = per_rail;
            options.failed_blocks = &failed;
            options.report = &report;
            options.failover = false; // fail fast: the next case moves the requests instead
            int calls = 0;
            boost::system::error_code result;
            async_transfer(std::span<const TransferRail>(rails), plan, options,
                           [&](boost::system::error_code ec, std::size_t) {
                               ++calls;
                               result = ec;
                           });
            // Let the first chains go out, then cut the wire while rail 1 still has requests with the device
            // (waiting longer let rail 1 finish its half first in one run: nothing left to fail).
            io.run_for(10ms);
            REQUIRE(calls == 0);
            REQUIRE(r.rail1.qp0.outstanding_sends() > 0);
            test::Heal up("rail-up");
            REQUIRE(test::fault("rail-down") == 0);
            const auto t0 = std::chrono::steady_clock::now();
            while (calls == 0 && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(50ms);
            const auto waited =
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
            CHECK(calls == 1);
            CHECK(result);
            CHECK_MESSAGE(failed.find("on rail 1") != std::string::npos, failed);
            CHECK(per_rail[0] + per_rail[1] < blocks * block);
            // Some blocks may or may not have landed: the report adds up to the
            // plan, its landed blocks are the bytes reported, and every block
            // it calls landed is at the peer, byte for byte.
            CHECK(report.landed + report.uncertain + report.not_posted == blocks);
            CHECK(report.landed > 0);
            CHECK(report.uncertain > 0);
            CHECK(report.landed * block == per_rail[0] + per_rail[1]); // bytes count what landed
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < blocks; ++k) {
                if (report.remote_blocks[k] != BlockState::landed) continue;
                const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
                for (std::size_t i = 0; i < block; ++i) wrong += r.m1[at + i] != pattern(k * block + i, 77) ? 1 : 0;
            }
            CHECK(wrong == 0);
            MESSAGE("report: " << report.landed << " blocks landed, " << report.uncertain << " uncertain, "
                               << report.not_posted << " not posted");
            MESSAGE("rail 1 down: the transfer failed after " << waited.count() << " ms with '" << result.message()
                                                              << "' (" << failed << "); rail 0 moved " << per_rail[0]
                                                              << " bytes, rail 1 " << per_rail[1]);
            io.run_for(100ms);
            CHECK(calls == 1);
            CHECK(up.now() == 0);
        }
    }

    TEST_CASE(
        "failover: a rail whose queue pair is destroyed, or whose link goes down, mid-transfer hands its "
        "unfinished requests to the other rail; the transfer succeeds, every byte verified, and the report "
        "names the rail and why") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig): the second wire cannot be made");
            return;
        }
        REQUIRE(test::fault("rails-up") == 0);
        test::Heal down("rails-down");
        constexpr std::size_t blocks = 10000, block = 4096;
        // Runs one transfer over both rails; `fault` strikes rail 1 once it has requests with the device.
        auto run = [&](const std::string& what, auto&& fault) {
            asio::io_context io;
            Rails r(io.get_executor(), 2 * blocks * block);
            std::vector<LocalBuffer> local;
            std::vector<RemoteBlock> remote;
            for (std::size_t k = 0; k < blocks; ++k) {
                local.push_back(r.rail0.mr0.slice(k * block, block));
                remote.push_back({r.rail0.mr1.remote(), (2 * blocks - 1 - 2 * k) * block, block});
            }
            for (std::size_t i = 0; i < blocks * block; ++i) r.m0[i] = pattern(i, 91);
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
            std::vector<TransferRail> rails = r.spec();
            std::array<std::uint64_t, 2> per_rail{};
            TransferReport report;
            std::string failed;
            TransferOptions options;
            options.rail_bytes = per_rail;
            options.report = &report;
            options.failed_blocks = &failed;
            options.notify = 77;
            std::optional<std::uint32_t> notified;
            r.rail0.qp1.async_receive(r.rail0.mr1.slice(0, 0), [&](boost::system::error_code ec, Received got) {
                CHECK_FALSE(ec);
                notified = got.immediate;
            });
            int calls = 0;
            boost::system::error_code result;
            std::size_t moved = 0;
            async_transfer(std::span<const TransferRail>(rails), plan, options,
                           [&](boost::system::error_code ec, std::size_t n) {
                               ++calls;
                               result = ec;
                               moved = n;
                           });
            io.run_for(10ms);
            REQUIRE(calls == 0);
            REQUIRE(r.rail1.qp0.outstanding_sends() > 0);
            fault(r);
            const auto t0 = std::chrono::steady_clock::now();
            while ((calls == 0 || !notified) && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(20ms);
            const auto waited =
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
            CHECK(calls == 1);
            CHECK_MESSAGE(!result, result.message() << " (" << failed << ")");
            CHECK(moved == blocks * block);
            CHECK(per_rail[0] + per_rail[1] == blocks * block);
            CHECK(notified == 77u);
            CHECK(report.landed == blocks);
            REQUIRE(report.rails.size() == 2);
            CHECK_FALSE(report.rails[0].error);
            CHECK(report.rails[1].error);
            CHECK_MESSAGE(report.rails[1].failure.find("on rail 1") != std::string::npos, report.rails[1].failure);
            CHECK(report.rails[1].taken_over > 0);
            CHECK(report.rails[0].took_over == report.rails[1].taken_over);
            CHECK(report.rails[0].bytes == per_rail[0]);
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < blocks; ++k) {
                const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
                for (std::size_t i = 0; i < block; ++i) wrong += r.m1[at + i] != pattern(k * block + i, 91) ? 1 : 0;
            }
            CHECK(wrong == 0);
            MESSAGE(what << ": the transfer succeeded " << waited.count() << " ms later; rail 0 moved " << per_rail[0]
                         << " bytes, rail 1 " << per_rail[1] << "; rail 0 took over " << report.rails[0].took_over
                         << " requests; rail 1: " << report.rails[1].failure);
        };
        run("rail 1's queue pair destroyed", [](Rails& r) { r.rail1.qp0 = QueuePair(); });
        {
            test::Heal up("rail-up");
            run("rail 1's link down", [](Rails&) { REQUIRE(test::fault("rail-down") == 0); });
            CHECK(up.now() == 0);
        }
        {
            // Both links down: no rail is left; the transfer fails once, naming both.
            asio::io_context io;
            Rails r(io.get_executor(), 2 * blocks * block);
            std::vector<LocalBuffer> local;
            std::vector<RemoteBlock> remote;
            for (std::size_t k = 0; k < blocks; ++k) {
                local.push_back(r.rail0.mr0.slice(k * block, block));
                remote.push_back({r.rail0.mr1.remote(), (2 * blocks - 1 - 2 * k) * block, block});
            }
            for (std::size_t i = 0; i < blocks * block; ++i) r.m0[i] = pattern(i, 93);
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
            std::vector<TransferRail> rails = r.spec();
            TransferReport report;
            std::string failed;
            TransferOptions options;
            options.report = &report;
            options.failed_blocks = &failed;
            int calls = 0;
            boost::system::error_code result;
            async_transfer(std::span<const TransferRail>(rails), plan, options,
                           [&](boost::system::error_code ec, std::size_t) {
                               ++calls;
                               result = ec;
                           });
            io.run_for(10ms);
            REQUIRE(calls == 0);
            test::Heal up0("link-up"), up1("rail-up");
            REQUIRE(test::fault("rail-down") == 0);
            REQUIRE(test::fault("link-down") == 0);
            const auto t0 = std::chrono::steady_clock::now();
            while (calls == 0 && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(20ms);
            io.run_for(100ms);
            CHECK(calls == 1);
            CHECK(result);
            CHECK_MESSAGE(failed.find("every rail failed: rail 0: ") == 0, failed);
            CHECK_MESSAGE(failed.find("; rail 1: ") != std::string::npos, failed);
            REQUIRE(report.rails.size() == 2);
            CHECK(report.rails[0].error);
            CHECK(report.rails[1].error);
            CHECK(report.landed + report.uncertain + report.not_posted == blocks);
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < blocks; ++k) {
                if (report.remote_blocks[k] != BlockState::landed) continue;
                const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
                for (std::size_t i = 0; i < block; ++i) wrong += r.m1[at + i] != pattern(k * block + i, 93) ? 1 : 0;
            }
            CHECK(wrong == 0);
            MESSAGE("both links down: " << failed << "; " << report.landed << " blocks landed, " << report.uncertain
                                        << " uncertain, " << report.not_posted << " never posted");
            CHECK(up0.now() == 0);
            CHECK(up1.now() == 0);
        }
    }

    TEST_CASE(
        "a rail group: a rail that failed is left out until its cooldown has passed, then tried again; "
        "replace() brings a reconnected rail back; health counts each rail's bytes, failures and throughput") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig): the second wire cannot be made");
            return;
        }
        REQUIRE(test::fault("rails-up") == 0);
        test::Heal down("rails-down");
        constexpr std::size_t blocks = 1000, block = 16384;
        asio::io_context io;
        Rails r(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(r.rail0.mr0.slice(k * block, block));
            remote.push_back({r.rail0.mr1.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        RailGroupOptions go;
        // Long enough that transfers 2 and 3 fit in it even under ASan (300 ms did not, in one CI run).
        go.cooldown = 4s;
        go.min_measured_bytes = 1 << 20;
        RailGroup group(r.spec(), go);
        std::array<std::uint64_t, 2> per_rail{};
        TransferReport report;
        auto transfer = [&](std::uint32_t seed) {
            for (std::size_t i = 0; i < blocks * block; ++i) r.m0[i] = pattern(i, seed);
            TransferOptions options;
            options.rail_bytes = per_rail;
            options.report = &report;
            std::optional<boost::system::error_code> result;
            async_transfer(group, plan, options, [&](boost::system::error_code ec, std::size_t n) {
                result = ec;
                CHECK(n == blocks * block);
            });
            io.restart();
            const auto t0 = std::chrono::steady_clock::now();
            while (!result && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(20ms);
            REQUIRE(result.has_value());
            CHECK_MESSAGE(!*result, result->message());
            std::size_t wrong = 0;
            for (std::size_t k = 0; k < blocks; ++k) {
                const std::size_t at = (2 * blocks - 1 - 2 * k) * block;
                for (std::size_t i = 0; i < block; i += 97)
                    wrong += r.m1[at + i] != pattern(k * block + i, seed) ? 1 : 0;
            }
            CHECK(wrong == 0);
            CHECK(per_rail[0] + per_rail[1] == blocks * block);
            REQUIRE(report.rails.size() == 2); // in the group's numbering
        };

        transfer(1); // both healthy: both carry bytes and are measured
        CHECK(per_rail[0] > 0);
        CHECK(per_rail[1] > 0);
        CHECK(group.health(0).transfers == 1);
        CHECK(group.health(1).bytes == per_rail[1]);
        CHECK(group.health(0).bytes_per_second > 0);
        CHECK(group.health(1).bytes_per_second > 0);

        {
            test::Heal up("rail-up");
            REQUIRE(test::fault("rail-down") == 0);
            transfer(2); // rail 1 fails at once; rail 0 takes its share over
            CHECK(report.rails[1].error);
            const RailHealth h = group.health(1);
            CHECK(h.cooling);
            CHECK(h.failures == 1);
            CHECK(h.last_error == report.rails[1].error);
            CHECK_MESSAGE(h.last_failure.find("on rail 1") != std::string::npos, h.last_failure);

            transfer(3); // within the cooldown: rail 1 is left out, rail 0 carries everything
            CHECK(per_rail[1] == 0);
            CHECK(per_rail[0] == blocks * block);
            CHECK_FALSE(report.rails[1].error);
            CHECK(group.health(1).failures == 1);

            std::this_thread::sleep_until(group.health(1).failed_at + go.cooldown + 50ms);
            CHECK_FALSE(group.health(1).cooling);
            transfer(4); // tried again: its queue pair is in the error state, so it fails again; rail 0 takes over
            CHECK(group.health(1).failures == 2);
            CHECK(up.now() == 0);
        }

        // Reconnected: a new queue pair on the same devices replaces rail 1.
        Rails::Wire fresh("rxe2", "rxe3", io.get_executor(), r.m0, r.m1);
        TransferRail again{&fresh.qp0, {}, {}};
        again.local(r.rail0.mr0, fresh.mr0).remote(r.rail0.mr1.remote(), fresh.mr1.remote());
        group.replace(1, again);
        CHECK(group.health(1).failures == 0);
        transfer(5);
        CHECK(per_rail[1] > 0);
        CHECK_FALSE(report.rails[1].error);
        MESSAGE("measured: rail 0 " << group.health(0).bytes_per_second / 1e6 << " MB/s, rail 1 "
                                    << group.health(1).bytes_per_second / 1e6 << " MB/s");
        CHECK_THROWS_WITH_AS(group.health(2), "RailGroup::health: no rail 2 (the group has 2)", Error);
    }

    TEST_CASE(
        "observable: a queue pair's and a rail group's counters match the work done, and their Prometheus "
        "text parses with the reference parser") {
        if (!test::faults_available()) {
            MESSAGE("no fault injector (run in the rig): the second wire cannot be made");
            return;
        }
        REQUIRE(test::fault("rails-up") == 0);
        test::Heal down("rails-down");
        constexpr std::size_t blocks = 2000, block = 4096;
        asio::io_context io;
        Rails r(io.get_executor(), 2 * blocks * block);
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t k = 0; k < blocks; ++k) {
            local.push_back(r.rail0.mr0.slice(k * block, block));
            remote.push_back({r.rail0.mr1.remote(), (2 * blocks - 1 - 2 * k) * block, block});
        }
        TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
        RailGroup group(r.spec());
        const QueuePairCounters before = r.rail0.qp0.counters();
        std::array<std::uint64_t, 2> per_rail{};
        for (int round = 0; round < 3; ++round) {
            TransferOptions options;
            options.rail_bytes = per_rail;
            std::optional<boost::system::error_code> result;
            async_transfer(group, plan, options, [&](boost::system::error_code ec, std::size_t) { result = ec; });
            io.restart();
            const auto t0 = std::chrono::steady_clock::now();
            while (!result && std::chrono::steady_clock::now() - t0 < 30s) io.run_for(10ms);
            REQUIRE(result.has_value());
            REQUIRE_FALSE(*result);
        }
        // Rail 0's queue pair posted its share of each transfer, one request per block, and all completed.
        const QueuePairCounters c = r.rail0.qp0.counters();
        const RailHealth h0 = group.health(0), h1 = group.health(1);
        CHECK(h0.bytes + h1.bytes == 3 * blocks * block);
        CHECK(h0.transfers == 3);
        CHECK(c.sends_posted - before.sends_posted == h0.bytes / block);
        CHECK(c.sends_completed == c.sends_posted);
        CHECK(c.errors[IBV_WC_REM_ACCESS_ERR] == 0);
        // One write to a wrong key: one REM_ACCESS_ERR (the queue pair then goes to the error state).
        RemoteMemory wrong = r.rail0.mr1.remote();
        wrong.rkey ^= 0x5a5a00;
        std::optional<boost::system::error_code> failed;
        r.rail0.qp0.async_write(r.rail0.mr0.slice(0, 64), wrong, 0,
                                [&](boost::system::error_code ec, std::size_t) { failed = ec; });
        io.restart();
        const auto t0 = std::chrono::steady_clock::now();
        while (!failed && std::chrono::steady_clock::now() - t0 < 10s) io.run_for(10ms);
        REQUIRE(failed.has_value());
        CHECK(*failed);
        const QueuePairCounters after = r.rail0.qp0.counters();
        CHECK(after.errors[IBV_WC_REM_ACCESS_ERR] == 1);
        CHECK(after.sends_posted == c.sends_posted + 1);

        PrometheusText metrics;
        metrics.add("rail0", r.rail0.qp0);
        metrics.add("kv", group);
        metrics.add_port(r.rail0.d0);
        const std::string text = metrics.text();
        const test::ParsedMetrics parsed = test::parse_prometheus(text);
        REQUIRE_MESSAGE(parsed.error.empty(), parsed.error << "\n" << text);
        auto at = [&](const std::string& key) {
            auto it = parsed.samples.find(key);
            if (it == parsed.samples.end()) FAIL_CHECK("no sample " << key);
            return it == parsed.samples.end() ? -1.0 : it->second;
        };
        CHECK(at(R"(gpuverbs_qp_requests_posted_total{qp="rail0",queue="send"})") ==
              static_cast<double>(after.sends_posted));
        CHECK(at(R"(gpuverbs_qp_requests_completed_total{qp="rail0",queue="send"})") ==
              static_cast<double>(after.sends_completed));
        CHECK(at(R"(gpuverbs_qp_errors_total{qp="rail0",status="REM_ACCESS_ERR"})") == 1);
        CHECK(at(R"(gpuverbs_rail_bytes_total{group="kv",rail="0"})") == static_cast<double>(h0.bytes));
        CHECK(at(R"(gpuverbs_rail_bytes_total{group="kv",rail="1"})") == static_cast<double>(h1.bytes));
        CHECK(at(R"(gpuverbs_rail_transfers_total{group="kv",rail="1"})") == 3);
        CHECK(at(R"(gpuverbs_rail_failures_total{group="kv",rail="0"})") == 0);
        CHECK(at(R"(gpuverbs_rail_busy_seconds_total{group="kv",rail="0"})") > 0);
        CHECK(at(R"(gpuverbs_rail_throughput_bytes_per_second{group="kv",rail="0"})") == h0.bytes_per_second);
        std::size_t hw = 0;
        for (const auto& [key, value] : parsed.samples) hw += key.rfind("gpuverbs_port_hw_counter{", 0) == 0 ? 1 : 0;
        CHECK(hw > 0); // rxe exports its own counters (sent_pkts, retry_exceeded_err, ...)
        MESSAGE(parsed.samples.size() << " samples parsed, " << hw << " of them the device's hardware counters");
    }
}

TEST_SUITE("the staged path" * doctest::skip(!test::rig_present())) {
    TEST_CASE("host memory through staging buffers to a peer: every byte, any length; it says which path and why") {
        Device d0 = Device::open(test::rig_devices()->dev0), d1 = Device::open(test::rig_devices()->dev1);
        ProtectionDomain pd0(d0), pd1(d1);
        CompletionQueue cq0(d0, 64), cq1(d1, 64);
        const std::size_t size = (10 << 20) + 12345;
        std::vector<std::byte> source(size), target(size + 4096);
        for (std::size_t i = 0; i < size; ++i) source[i] = pattern(i, 41);
        MemoryRegion landing(pd1, target, Access::local_write | Access::remote_write);
        PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
        (void)b.advertise(landing);
        Endpoint ea = a.endpoint(), eb = b.endpoint();
        QueuePair qa = std::move(a).connect(eb), qb = std::move(b).connect(ea);
        StagingOptions o;
        o.chunk = 1 << 20;
        o.depth = 3;
        StagedWriter writer(pd0, o, "the test asked for it");
        MESSAGE(writer.path());
        CHECK(writer.path().find("staged: ") == 0);
        CHECK(writer.path().find("3 ") != std::string::npos);
        CHECK(writer.path().find("host buffers of 1 MiB -> RDMA write (GPUDirect RDMA is not used: the test asked "
                                 "for it)") != std::string::npos);
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(writer.write(qa, cq0, source, landing.remote(), 4096) == size);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) bad += target[4096 + i] != source[i] ? 1 : 0;
        CHECK(bad == 0);
        MESSAGE("staged " << size << " bytes in 11 chunks: " << seconds << " s");
        // A range that does not fit the peer's region is refused before anything is posted.
        try {
            (void)writer.write(qa, cq0, source, landing.remote(), 8192);
            FAIL("an oversized write was accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::remote_range_outside_region);
            CHECK(std::string(e.what()).find("do not fit the remote region") != std::string::npos);
        }
        // Bad options are named.
        StagingOptions none;
        none.depth = 0;
        try {
            StagedWriter bad_writer(pd0, none, "x");
            FAIL("depth 0 accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(std::string(e.what()).find("chunk and depth must be > 0") != std::string::npos);
        }
        // A completion that is not the writer's (the CQ is shared) is an error, never taken for a chunk's.
        SendOptions mine;
        mine.context = 7;
        std::vector<std::byte> small(64);
        MemoryRegion small_mr(pd0, small, Access::local_write);
        REQUIRE_FALSE(qa.post_write(small_mr.slice(0, 64), landing.remote(), 0, mine));
        try {
            (void)writer.write(qa, cq0, std::span(source).first(1000), landing.remote(), 0);
            FAIL("a foreign completion was taken for the chunk's");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("a completion of another request came on the CQ") != std::string::npos);
        }
        // A wrong remote key fails the write naming the chunk.
        RemoteMemory wrong = landing.remote();
        wrong.rkey ^= 0x5a5a00;
        try {
            (void)writer.write(qa, cq0, std::span(source).first(3 << 20), wrong, 0);
            FAIL("a wrong key was not reported");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("chunk 0 (1048576 bytes at offset 0)") != std::string::npos);
        }
    }
}

TEST_SUITE("registration cache on a real device" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "a registration the device refuses: the error_code forms return no region and the words, the throwing "
        "form throws them, the cache stays as it was") {
        asio::io_context io;
        Pair p(io.get_executor(), 1 << 20);
        RegistrationCache cache(p.a.pd);
        // An address range nothing is mapped at: ibv_reg_mr fails with EFAULT.
        std::span<std::byte> unmapped(reinterpret_cast<std::byte*>(std::uintptr_t{0x10000}), 4096); // NOLINT
        std::error_code ec;
        CHECK(cache.get(unmapped, Access::local_write, ec) == nullptr);
        CHECK(ec == std::errc::bad_address);
        Diagnostics words;
        CHECK(cache.get(unmapped, Access::local_write, ec, words) == nullptr);
        CHECK(words.verb() == "ibv_reg_mr");
        try {
            (void)cache.get(unmapped, Access::local_write);
            FAIL("registered unmapped memory");
        } catch (const Error& e) {
            CHECK(e.code() == ec);
            CHECK(std::string(e.what()) == words.message());
        }
        CHECK(cache.statistics().regions == 0);
        // and it still works.
        CHECK(cache.get(std::span(p.a.memory).first(4096), Access::local_write) != nullptr);
        CHECK(cache.statistics().regions == 1);
    }

    TEST_CASE("attack: a peer given the key of a read-only request from the cache cannot write through it") {
        asio::io_context io;
        Pair p(io.get_executor(), 1 << 20);
        RegistrationCache cache(p.a.pd);
        std::span<std::byte> memory(p.a.memory);
        // The owner's own use registered everything a peer could do...
        auto everything = cache.get(memory, access_all);
        // ...then it advertises a part for reading only.
        auto readable = cache.get(memory.subspan(4096, 4096), Access::remote_read);
        REQUIRE(readable != nullptr);
        CHECK(readable != everything);
        CHECK(readable->access() == Access::remote_read);
        // The peer tries to write with the key it was given.
        std::fill(p.a.memory.begin() + 4096, p.a.memory.begin() + 8192, std::byte{0x11});
        RemoteMemory advertised = readable->remote();
        const std::error_code posted = p.b.qp.post_write(p.b.mr.slice(0, 4096), advertised, 0);
        REQUIRE_MESSAGE(!posted, posted.message());
        Completion c;
        for (auto until = std::chrono::steady_clock::now() + 10s; p.b.cq.poll({&c, 1}) == 0;) {
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "the write did not complete");
        }
        MESSAGE("the peer's write: " << c.status.message());
        CHECK(c.status.raw() == IBV_WC_REM_ACCESS_ERR);
        CHECK(std::all_of(p.a.memory.begin() + 4096, p.a.memory.begin() + 8192,
                          [](std::byte b) { return b == std::byte{0x11}; }));
    }

    TEST_CASE("hits hand back the same region; data moves through it; 10,000 mixed requests stay within the bounds") {
        asio::io_context io;
        Pair p(io.get_executor(), 32 << 20);
        const int baseline = test::registered_regions();
        REQUIRE_MESSAGE(baseline >= 0, "rdma (iproute2) is needed to count registrations");
        RegistrationCache cache(p.a.pd, {.max_regions = 16, .max_bytes = 8 << 20});
        std::span<std::byte> memory(p.a.memory);
        const Access rw = Access::local_write | Access::remote_read;

        auto first = cache.get(memory.subspan(4096, 65536), rw);
        auto again = cache.get(memory.subspan(8192, 4096), rw);
        CHECK(first == again); // covered, with the same access: the same registration
        CHECK(cache.statistics().hits == 1);
        CHECK(cache.statistics().misses == 1);

        // A write from memory registered through the cache.
        for (std::size_t i = 0; i < 4096; ++i) p.a.memory[8192 + i] = std::byte(i % 253);
        REQUIRE_FALSE(p.a.qp.post_write(again->slice(8192 - 4096, 4096), p.b.mr.remote(), 0));
        Completion c;
        for (auto until = std::chrono::steady_clock::now() + 10s; p.a.cq.poll({&c, 1}) == 0;) {
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "the write did not complete");
        }
        CHECK(c.ok());
        CHECK(std::equal(p.b.memory.begin(), p.b.memory.begin() + 4096, p.a.memory.begin() + 8192));

        // invalidate before the memory goes away: the next request registers again.
        cache.invalidate(memory.data() + 4096, 65536);
        CHECK(cache.statistics().invalidations == 1);
        auto fresh = cache.get(memory.subspan(8192, 4096), Access::local_write);
        CHECK(fresh != again);
        first.reset();
        again.reset();
        fresh.reset();

        std::mt19937 random(11);
        int most = 0;
        for (int i = 0; i < 10000; ++i) {
            std::size_t begin = (random() % 8192) * 4096;
            std::size_t length = 1 + random() % (256 << 10);
            if (begin + length > memory.size()) length = memory.size() - begin;
            Access access = random() % 3 == 0 ? rw : Access::local_write;
            auto mr = cache.get(memory.subspan(begin, length), access);
            std::size_t offset = reinterpret_cast<std::uintptr_t>(memory.data() + begin) -
                                 reinterpret_cast<std::uintptr_t>(mr->address());
            auto covers = mr->slice(offset, length);
            REQUIRE(covers.in_region());
            REQUIRE(cache.statistics().regions <= 16);
            if (i % 50 == 49) most = std::max(most, test::registered_regions() - baseline);
        }
        auto s = cache.statistics();
        MESSAGE("10,000 requests: " << s.hits << " hits, " << s.misses << " misses, " << s.evictions << " evictions, "
                                    << s.merges << " merges; at most " << most << " regions registered at once; "
                                    << s.bytes_pinned << " bytes pinned at the end");
        CHECK(most <= 16);
        CHECK((s.bytes_pinned <= (8u << 20) || s.regions == 1)); // a single region may exceed the bound alone
        CHECK(s.hits + s.misses == 10000 + 3);
    }
}
