// KV-cache pools on rxe0 <-> rxe1: two engines' caches registered once, their
// metadata carried as bytes, blocks moved by id across every layer, every
// byte checked; the owner's notification arrives only after every read.
#include "rig.hpp"
#include "rig_pair.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <array>
#include <numeric>
#include <optional>
#include <random>
#include <string>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

/// One engine's cache: a tensor per layer (or one for all), host memory
/// registered once each, and the pool over them.
struct Engine {
    std::vector<std::vector<std::byte>> tensors;
    KvPool pool;

    Engine(const ProtectionDomain& pd, const KvLayout& layout, std::byte fill) {
        std::vector<MemoryRegion> regions;
        for (std::uint32_t t = 0; t < layout.tensors(); ++t) {
            tensors.emplace_back(layout.tensor_bytes(), fill);
            regions.emplace_back(pd, tensors.back(), Access::local_write | Access::remote_write | Access::remote_read);
        }
        pool = KvPool(layout, std::move(regions));
    }
    /// The same tensors registered in `pd` (another NIC's domain) as the pool's next rail.
    std::size_t add_rail(const ProtectionDomain& pd) {
        std::vector<MemoryRegion> regions;
        for (auto& t : tensors) regions.emplace_back(pd, t, Access::local_write | Access::remote_read);
        return pool.add_rail(std::move(regions));
    }
    /// The bytes of block `id` of `half` of `layer`.
    [[nodiscard]] std::span<std::byte> block(std::uint32_t layer, std::uint32_t half, std::uint32_t id) {
        const KvLayout& l = pool.layout();
        return std::span(tensors[l.tensor_of(layer)]).subspan(l.offset(layer, half, id), l.block_bytes);
    }
    /// Each block's bytes say which (layer, half, id) it is, with `seed`.
    void fill_pattern(std::uint32_t seed) {
        const KvLayout& l = pool.layout();
        for (std::uint32_t layer = 0; layer < l.layers; ++layer) {
            for (std::uint32_t half = 0; half < l.halves; ++half) {
                for (std::uint32_t id = 0; id < l.blocks; ++id) {
                    std::span<std::byte> b = block(layer, half, id);
                    for (std::size_t i = 0; i < b.size(); ++i)
                        b[i] = test::pattern(i, seed + layer * 7919 + half * 131 + id);
                }
            }
        }
    }
};

/// `count` distinct ids of `blocks`, in a random order.
std::vector<std::uint32_t> scattered(std::uint32_t blocks, std::size_t count, std::uint32_t seed) {
    std::vector<std::uint32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    ids.resize(count);
    return ids;
}

/// How many blocks of `to` (ids `to_ids`, layers [first, end)) differ from the
/// blocks `from_ids` of `from`, and how many blocks outside `to_ids` are no longer `fill`.
std::pair<std::size_t, std::size_t> compare(Engine& from, std::span<const std::uint32_t> from_ids, Engine& to,
                                            std::span<const std::uint32_t> to_ids, std::uint32_t first,
                                            std::uint32_t end, std::byte fill) {
    std::size_t wrong = 0;
    std::size_t touched = 0;
    const KvLayout& l = to.pool.layout();
    std::vector<bool> moved(l.blocks, false);
    for (std::uint32_t id : to_ids) moved[id] = true;
    for (std::uint32_t layer = 0; layer < l.layers; ++layer) {
        const bool in_range = layer >= first && layer < end;
        for (std::uint32_t half = 0; half < l.halves; ++half) {
            if (in_range) {
                for (std::size_t i = 0; i < to_ids.size(); ++i) {
                    std::span<std::byte> got = to.block(layer, half, to_ids[i]);
                    std::span<std::byte> want = from.block(layer, half, from_ids[i]);
                    wrong += std::equal(got.begin(), got.end(), want.begin()) ? 0 : 1;
                }
            }
            for (std::uint32_t id = 0; id < l.blocks; ++id) {
                if (in_range && moved[id]) continue;
                std::span<std::byte> b = to.block(layer, half, id);
                touched += std::all_of(b.begin(), b.end(), [&](std::byte x) { return x == fill; }) ? 0 : 1;
            }
        }
    }
    return {wrong, touched};
}

} // namespace

TEST_SUITE("KV-cache pools on real RDMA") {
    TEST_CASE(
        "decode reads 1,000 scattered blocks of prefill's 32 layers by id; the notification comes after every "
        "read; every byte verified, nothing else touched") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 4096);
        const KvLayout layout = KvLayout::per_layer(32, 2048, 64);
        Engine decode(p.a.pd, layout, std::byte{0xEE});
        Engine prefill(p.b.pd, layout, std::byte{0});
        prefill.fill_pattern(3);

        // The handshake: prefill's metadata as bytes, loaded by decode.
        const std::vector<std::byte> metadata = prefill.pool.describe();
        CHECK(metadata.size() == 88 + 20 * 32);
        const RemoteKvPool theirs = RemoteKvPool::load(metadata);
        CHECK(theirs.pool_id() == prefill.pool.pool_id());

        const std::vector<std::uint32_t> prefill_ids = scattered(2048, 1000, 11);
        const std::vector<std::uint32_t> decode_ids = scattered(2048, 1000, 12);
        const TransferPlan plan = decode.pool.plan(TransferDirection::read, decode_ids, theirs, prefill_ids, {},
                                                   TransferLimits{p.a.qp.capabilities().max_send_sge});
        CHECK(plan.bytes() == 1000u * 32 * 2 * 64);
        CHECK(plan.local_blocks() == 1000u * 32 * 2);

        // Prefill frees its blocks when decode's notification arrives: by then
        // every read must have completed.
        std::optional<std::uint32_t> notified;
        std::pair<std::size_t, std::size_t> at_notification{1, 1};
        p.b.qp.async_receive(p.b.mr.slice(0, 0), [&](boost::system::error_code ec, Received r) {
            REQUIRE_FALSE(ec);
            notified = r.immediate;
            at_notification = compare(prefill, prefill_ids, decode, decode_ids, 0, 32, std::byte{0xEE});
        });
        TransferOptions options;
        options.notify = 42u; // the request id
        test::Outcome out;
        async_transfer(p.a.qp, plan, options, out.handler());
        io.run_for(60s);
        CHECK(out.calls == 1);
        CHECK_MESSAGE(!out.result, out.result.message());
        CHECK(out.moved == plan.bytes());
        CHECK(notified == 42u);
        CHECK(at_notification.first == 0);  // every block landed before the owner heard
        CHECK(at_notification.second == 0); // and nothing else changed
    }

    TEST_CASE("prefill writes a layer range into a decode pool of another layout; consecutive ids coalesce") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 4096);
        Engine prefill(p.a.pd, KvLayout::per_layer(8, 512, 128), std::byte{0});
        Engine decode(p.b.pd, KvLayout::blocks_first(8, 512, 128), std::byte{0xEE});
        prefill.fill_pattern(5);
        const RemoteKvPool theirs = RemoteKvPool::load(decode.pool.describe());

        const std::vector<std::uint32_t> from = scattered(512, 300, 21);
        const std::vector<std::uint32_t> to = scattered(512, 300, 22);
        const LayerRange layers{2, 4};
        const TransferPlan plan = prefill.pool.plan(TransferDirection::write, from, theirs, to, layers,
                                                    TransferLimits{p.a.qp.capabilities().max_send_sge});
        test::Outcome out;
        async_transfer(p.a.qp, plan, out.handler());
        io.run_for(60s);
        CHECK(out.calls == 1);
        CHECK_MESSAGE(!out.result, out.result.message());
        const auto [wrong, touched] = compare(prefill, from, decode, to, 2, 6, std::byte{0xEE});
        CHECK(wrong == 0);
        CHECK(touched == 0);

        // Ids 0..99 on both sides of per-layer pools: one request per layer and half.
        Engine other(p.b.pd, KvLayout::per_layer(8, 512, 128), std::byte{0xEE});
        std::vector<std::uint32_t> run(100);
        std::iota(run.begin(), run.end(), 0u);
        const TransferPlan coalesced =
            prefill.pool.plan(TransferDirection::write, run, RemoteKvPool::load(other.pool.describe()), run, {},
                              TransferLimits{p.a.qp.capabilities().max_send_sge});
        CHECK(coalesced.requests().size() == 8 * 2);
        CHECK(coalesced.local_blocks() == 100 * 8 * 2);
    }

    TEST_CASE(
        "bad input on real pools: an id outside a pool, another block size, layers past the end, short "
        "memory") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 4096);
        Engine ours(p.a.pd, KvLayout::per_layer(4, 16, 256), std::byte{0});
        Engine peer(p.b.pd, KvLayout::per_layer(4, 16, 256), std::byte{0});
        Engine other_size(p.b.pd, KvLayout::per_layer(4, 16, 512), std::byte{0});
        const RemoteKvPool theirs = RemoteKvPool::load(peer.pool.describe());
        const std::uint32_t good[] = {1, 2};
        const std::uint32_t outside[] = {1, 16};
        auto refused = [&](auto&& plan) {
            std::error_code ec;
            Diagnostics d;
            (void)plan(ec, d);
            CHECK(ec == errc::invalid_argument);
            return d.message();
        };
        CHECK(refused([&](std::error_code& ec, Diagnostics& d) {
                  return ours.pool.plan(TransferDirection::write, good, theirs, outside, {}, {}, ec, d);
              }) == "KvPool::plan: remote id 16 (index 1) is outside the peer's pool of 16 blocks");
        CHECK(refused([&](std::error_code& ec, Diagnostics& d) {
                  return ours.pool.plan(TransferDirection::write, good, RemoteKvPool::load(other_size.pool.describe()),
                                        good, {}, {}, ec, d);
              }) ==
              "KvPool::plan: our blocks are 256 bytes in 2 halves, the peer's 512 bytes in 2 halves: the two "
              "pools must cut blocks alike");
        CHECK(refused([&](std::error_code& ec, Diagnostics& d) {
                  return ours.pool.plan(TransferDirection::write, good, theirs, good, LayerRange{3, 2}, {}, ec, d);
              }) == "KvPool::plan: layers 3 to 5 (exclusive) are not within both pools (ours has 4, the peer's 4)");
        // The destination named twice: a write's remote ids, a read's local ids (a source read twice is fine).
        const std::uint32_t twice[] = {3, 7, 3};
        const std::uint32_t three[] = {1, 2, 4};
        CHECK(refused([&](std::error_code& ec, Diagnostics& d) {
                  return ours.pool.plan(TransferDirection::write, three, theirs, twice, {}, {}, ec, d);
              }) ==
              "KvPool::plan: remote id 3 is named twice (index 0 and 2): both would be written, and which "
              "lands last is undefined");
        CHECK(refused([&](std::error_code& ec, Diagnostics& d) {
                  return ours.pool.plan(TransferDirection::read, twice, theirs, three, {}, {}, ec, d);
              }) ==
              "KvPool::plan: local id 3 is named twice (index 0 and 2): both would be written, and which "
              "lands last is undefined");
        CHECK(ours.pool.plan(TransferDirection::read, three, theirs, twice).local_blocks() == 3 * 4 * 2);

        std::vector<std::byte> small(1000);
        std::vector<MemoryRegion> regions;
        regions.emplace_back(p.a.pd, small, Access::local_write);
        std::error_code ec;
        Diagnostics d;
        const KvPool none = KvPool::create(KvLayout::one_tensor(4, 16, 256), std::move(regions), ec, d);
        CHECK_FALSE(none);
        CHECK(d.message() == "KvPool: memory region 0 is 1000 bytes; the layout's tensor is 32768");
    }

    TEST_CASE(
        "a read over two rails notifies the owner with the request id only after every read on both rails "
        "completed: the owner reuses the blocks the moment it hears, and no read sees it (20 rounds, event-driven "
        "and polled); the lease is released by the notification") {
        for (const AsyncOptions& mode : {test::modes[0], test::polled_mode}) {
            CAPTURE(test::mode_name(mode));
            asio::io_context io(1);
            QueuePairOptions o = test::transfer_qp_options();
            o.max_inline_data = 64;
            test::Pair p(io.get_executor(), mode, 4096, o, {},
                         Access::local_write | Access::remote_write | Access::remote_read);
            // A second rail between the same devices and domains: its reads are not
            // ordered with the first rail's send, so only gpuverbs' wait keeps them before it.
            PreparedQueuePair a2(p.a.pd, p.a.cq, p.a.cq, test::test_qp_options(o));
            PreparedQueuePair b2(p.b.pd, p.b.cq, p.b.cq, test::test_qp_options(o));
            auto [qa2, qb2] = test::connect_advertised(a2, p.a.mr, b2, p.b.mr);
            const std::vector<TransferRail> rails{TransferRail{&p.a.qp, {}, {}}, TransferRail{&qa2, {}, {}}};

            const KvLayout layout = KvLayout::per_layer(8, 1024, 512);
            Engine decode(p.a.pd, layout, std::byte{0xEE});
            Engine prefill(p.b.pd, layout, std::byte{0});
            NotificationInbox inbox(p.b.qp, p.b.pd, 8);
            NotificationInbox inbox2(qb2, p.b.pd, 8); // a notification arrives on the rail that carried it
            BlockLeases leases;
            constexpr BlockLeases::Reader reader = 7;
            const RemoteKvPool theirs = RemoteKvPool::load(prefill.pool.describe());
            std::vector<RemoteBlock> leased;
            for (const RemoteMemory& t : theirs.tensors()) leased.push_back({t, 0, t.length});

            int intact = 0;
            for (std::uint32_t round = 0; round < 20; ++round) {
                CAPTURE(round);
                prefill.fill_pattern(100 + round);
                const std::vector<std::vector<std::byte>> before = prefill.tensors;
                const std::vector<std::uint32_t> from = scattered(1024, 200, 30 + round);
                const std::vector<std::uint32_t> to = scattered(1024, 200, 60 + round);
                const LeasedBlockList list = leases.grant(leased, reader);
                const TransferPlan plan = decode.pool.plan(TransferDirection::read, to, theirs, from, {},
                                                           TransferLimits{p.a.qp.capabilities().max_send_sge});
                const std::string request = "request-" + std::to_string(round) + "-of-engine-7";
                TransferOptions options;
                options.notify = list.lease;
                options.notify_message = std::as_bytes(std::span(request));
                test::Outcome out;
                async_transfer(std::span<const TransferRail>(rails), plan, options, out.handler());

                // The owner reuses every block the moment the notification arrives.
                std::optional<Notification> heard;
                std::error_code released = errc::invalid_argument;
                inbox.async_wait([&](async_error_code ec, Notification n) {
                    CHECK_FALSE(ec);
                    heard = n;
                    for (auto& t : prefill.tensors) std::fill(t.begin(), t.end(), std::byte{0xDD});
                    released = leases.release(*n.immediate, reader);
                });
                (void)test::run_until(
                    io, [&] { return heard.has_value() && out.calls == 1; }, 60s);
                REQUIRE(heard.has_value());
                REQUIRE(out.calls == 1);
                CHECK_MESSAGE(!out.result, out.result.message() << ": " << out.transfer.failed_blocks);
                CHECK(out.transfer.report.rails.size() == 2);
                CHECK(heard->immediate == list.lease);
                CHECK(std::string(reinterpret_cast<const char*>(heard->message().data()), heard->size) == request);
                CHECK(heard->qp_num == p.b.qp.qp_num());
                CHECK_FALSE(released);
                CHECK_FALSE(leases.held(leased.front()));
                CHECK(inbox2.unread() == 0);

                // What decode read is what prefill held before it heard: no read came after.
                std::size_t wrong = 0;
                for (std::uint32_t layer = 0; layer < layout.layers; ++layer) {
                    for (std::uint32_t half = 0; half < layout.halves; ++half) {
                        for (std::size_t i = 0; i < to.size(); ++i) {
                            std::span<const std::byte> got = decode.block(layer, half, to[i]);
                            std::span<const std::byte> want =
                                std::span(before[layout.tensor_of(layer)])
                                    .subspan(layout.offset(layer, half, from[i]), layout.block_bytes);
                            wrong += std::equal(got.begin(), got.end(), want.begin()) ? 0 : 1;
                        }
                    }
                }
                CHECK(wrong == 0);
                intact += wrong == 0 ? 1 : 0;
            }
            CHECK(intact == 20);
            CHECK(leases.statistics().released == 20);
            CHECK(inbox.statistics().received == 20);
            CHECK(inbox.statistics().failed == 0);
            MESSAGE(test::mode_name(mode) << ": 20 of 20 two-rail reads of 3,200 blocks; the owner reused its blocks "
                                          << "on hearing, and every byte read was from before");
        }
    }

    TEST_CASE(
        "a pool on two rails, each rail its own protection domain on both sides: the metadata carries both rails' "
        "keys, a read striped over both moves every block with each rail's own keys (without them rail 1 fails), "
        "and rail 1 alone moves it too") {
        asio::io_context io(1);
        QueuePairOptions o = test::transfer_qp_options();
        test::Pair p(io.get_executor(), test::modes[0], 4096, o, {},
                     Access::local_write | Access::remote_write | Access::remote_read);
        const KvLayout layout = KvLayout::per_layer(8, 512, 256);
        Engine decode(p.a.pd, layout, std::byte{0xEE});
        Engine prefill(p.b.pd, layout, std::byte{0});
        prefill.fill_pattern(9);
        // Rail 1: the same devices, other protection domains (another NIC's, as far as keys go).
        ProtectionDomain pd_a1(p.a.device), pd_b1(p.b.device);
        CHECK(decode.add_rail(pd_a1) == 1);
        CHECK(prefill.add_rail(pd_b1) == 1);
        CHECK(decode.pool.rails() == 2);
        PreparedQueuePair a1(pd_a1, p.a.cq, p.a.cq, test::test_qp_options(o));
        PreparedQueuePair b1(pd_b1, p.b.cq, p.b.cq, test::test_qp_options(o));
        auto [qa1, qb1] = test::connect_advertised(a1, *decode.pool.regions(1)[0], b1, *prefill.pool.regions(1)[0]);

        const std::vector<std::byte> metadata = prefill.pool.describe();
        CHECK(metadata.size() == 88 + 8 * (16 + 2 * 4));
        const RemoteKvPool theirs = RemoteKvPool::load(metadata);
        REQUIRE(theirs.rails() == 2);
        for (std::size_t t = 0; t < 8; ++t) {
            CHECK(theirs.tensors(1)[t].rkey == prefill.pool.regions(1)[t]->rkey());
            CHECK(theirs.tensors(1)[t].rkey != theirs.tensors(0)[t].rkey);
        }
        const std::vector<std::uint32_t> from = scattered(512, 400, 41);
        const std::vector<std::uint32_t> to = scattered(512, 400, 42);
        const TransferPlan plan = decode.pool.plan(TransferDirection::read, to, theirs, from, {},
                                                   TransferLimits{p.a.qp.capabilities().max_send_sge});
        auto run = [&](std::span<const TransferRail> rails) {
            for (auto& t : decode.tensors) std::fill(t.begin(), t.end(), std::byte{0xEE});
            test::Outcome out;
            TransferOptions options;
            options.failover = false; // each rail's own outcome
            async_transfer(rails, plan, options, out.handler());
            io.run_for(60s);
            io.restart();
            REQUIRE(out.calls == 1);
            return out;
        };
        {
            const std::array rails{decode.pool.rail(0, p.a.qp, theirs), decode.pool.rail(1, qa1, theirs)};
            const test::Outcome out = run(rails);
            CHECK_MESSAGE(!out.result, out.result.message() << ": " << out.transfer.failed_blocks);
            REQUIRE(out.transfer.report.rails.size() == 2);
            CHECK(out.transfer.report.rails[0].bytes > 0);
            CHECK(out.transfer.report.rails[1].bytes > 0);
            const auto [wrong, touched] = compare(prefill, from, decode, to, 0, 8, std::byte{0xEE});
            CHECK(wrong == 0);
            CHECK(touched == 0);
        }
        {
            // Rail 1 without its keys: rail 0's lkeys mean nothing in rail 1's domain.
            const std::array rails{decode.pool.rail(0, p.a.qp, theirs), TransferRail{&qa1, {}, {}}};
            const test::Outcome out = run(rails);
            CHECK(out.result);
            CHECK_MESSAGE(out.transfer.failed_blocks.find("rail 1") != std::string::npos, out.transfer.failed_blocks);
        }
        {
            // A fresh rail 1 (the failed one is in error), alone.
            PreparedQueuePair a2(pd_a1, p.a.cq, p.a.cq, test::test_qp_options(o));
            PreparedQueuePair b2(pd_b1, p.b.cq, p.b.cq, test::test_qp_options(o));
            auto [qa2, qb2] = test::connect_advertised(a2, *decode.pool.regions(1)[0], b2, *prefill.pool.regions(1)[0]);
            const std::array rails{decode.pool.rail(1, qa2, theirs)};
            const test::Outcome out = run(rails);
            CHECK_MESSAGE(!out.result, out.result.message() << ": " << out.transfer.failed_blocks);
            const auto [wrong, touched] = compare(prefill, from, decode, to, 0, 8, std::byte{0xEE});
            CHECK(wrong == 0);
            CHECK(touched == 0);
        }
        // Refusals, in words: a rail the peer's pool does not have; regions that are not the same memory.
        const RemoteKvPool one_rail = RemoteKvPool::load(Engine(p.b.pd, layout, std::byte{0}).pool.describe());
        std::error_code ec;
        (void)decode.pool.rail(1, qa1, one_rail, ec);
        CHECK(ec == errc::invalid_argument);
        CHECK_THROWS_WITH(decode.pool.rail(2, qa1, theirs),
                          "KvPool::rail: rail 2: our pool is on 2 rails and the peer's on 2 (KvPool::add_rail on the "
                          "side that lacks it, then describe() again)");
        std::vector<std::byte> elsewhere(layout.tensor_bytes());
        std::vector<MemoryRegion> wrong_memory;
        for (std::uint32_t t = 0; t < layout.tensors(); ++t)
            wrong_memory.emplace_back(pd_a1, elsewhere, Access::local_write);
        Diagnostics d;
        CHECK(decode.pool.add_rail(std::move(wrong_memory), ec, d) == 0);
        CHECK(ec == errc::invalid_argument);
        CHECK(d.detail().find("memory region 0 covers ") == 0);
        CHECK(decode.pool.rails() == 2);
    }

    TEST_CASE("a notification's message: refused in words when too long, without notify, or not inline") {
        asio::io_context io(1);
        test::Pair p = test::transfer_pair(io.get_executor(), 4096); // max_inline_data 0
        std::vector<LocalBuffer> mine = {p.a.mr.slice(0, 64)};
        std::vector<RemoteBlock> theirs = {{p.b.mr.remote(), 0, 64}};
        const TransferPlan plan(TransferDirection::write, mine, theirs, p.a.qp.capabilities());
        const std::array<std::byte, 65> long_message{};
        auto refusal = [&](const TransferOptions& options) {
            test::Outcome out;
            async_transfer(p.a.qp, plan, options, out.handler());
            (void)test::run_until(
                io, [&] { return out.calls == 1; }, 10s);
            CHECK(out.result == errc::invalid_argument);
            return out.transfer.failed_blocks;
        };
        CHECK(refusal({.notify = 1, .notify_message = long_message}) ==
              "notify_message has 65 bytes; a notification carries at most 64");
        CHECK(refusal({.notify_message = std::span(long_message).first(8)}) ==
              "notify_message needs notify (the immediate it goes with)");
        // A queue pair made with max_inline_data 0 may be given more (rxe gives what its send queue's
        // entries hold); a message one byte above what it was given is refused.
        const std::uint32_t room = p.a.qp.capabilities().max_inline_data;
        MESSAGE("a queue pair asked for max_inline_data 0 got " << room);
        if (room < 64) { // rxe gives 64: the refusal is then out of reach here
            const std::size_t size = room + 1;
            CHECK(refusal({.notify = 1, .notify_message = std::span(long_message).first(size)}) ==
                  "the notification's message of " + std::to_string(size) +
                      " bytes goes inline, and rail 0's queue pair has max_inline_data " + std::to_string(room) +
                      ": make it with QueuePairOptions::max_inline_data >= " + std::to_string(size));
        }
        CHECK(p.a.qp.outstanding_sends() == 0);

        // An inbox on a queue pair whose CQ no executor drives, and with no slots.
        test::Pair polled_by_hand;
        std::error_code ec;
        CHECK_FALSE(NotificationInbox::create(polled_by_hand.b.qp, polled_by_hand.b.pd, 8, ec));
        CHECK(ec == errc::no_executor);
        CHECK_FALSE(NotificationInbox::create(p.b.qp, p.b.pd, 0, ec));
        CHECK(ec == errc::invalid_argument);
        std::string words;
        try {
            NotificationInbox too_many(p.b.qp, p.b.pd, 100000);
        } catch (const Error& e) {
            words = e.what();
        }
        CHECK_MESSAGE(words.find("slots must be 1 to the receive queue's") != std::string::npos, words);
    }

    TEST_CASE("an inbox whose queue pair fails ends its wait with the failure; a cancelled wait ends aborted") {
        asio::io_context io(1);
        QueuePairOptions o = test::transfer_qp_options();
        o.max_inline_data = 64;
        test::Pair p(io.get_executor(), test::modes[0], 4096, o, {},
                     Access::local_write | Access::remote_write | Access::remote_read);
        NotificationInbox inbox(p.b.qp, p.b.pd, 4);
        asio::cancellation_signal cancel;
        std::optional<async_error_code> cancelled;
        inbox.async_wait(
            asio::bind_cancellation_slot(cancel.slot(), [&](async_error_code ec, Notification) { cancelled = ec; }));
        cancel.emit(asio::cancellation_type::terminal);
        (void)test::run_until(
            io, [&] { return cancelled.has_value(); }, 10s);
        REQUIRE(cancelled.has_value());
        CHECK(*cancelled == asio::error::operation_aborted);

        std::optional<async_error_code> ended;
        inbox.async_wait([&](async_error_code ec, Notification) { ended = ec; });
        REQUIRE_FALSE(p.b.qp.force_error()); // the owner's queue pair fails under the inbox
        (void)test::run_until(
            io, [&] { return ended.has_value(); }, 10s);
        REQUIRE(ended.has_value());
        CHECK(*ended);
        CHECK(inbox.error());
        CHECK_FALSE(inbox.poll());
        MESSAGE("the inbox's wait ended with: " << ended->message());
    }

    TEST_CASE(
        "an inbox whose queue pair is destroyed under it: its wait ends aborted, poll() finds nothing, and the "
        "inbox goes later without touching what is gone (ASan)") {
        for (const AsyncOptions& mode : {test::modes[0], test::polled_mode}) {
            CAPTURE(test::mode_name(mode));
            asio::io_context io(1);
            QueuePairOptions o = test::transfer_qp_options();
            o.max_inline_data = 64;
            test::Pair p(io.get_executor(), mode, 4096, o, {},
                         Access::local_write | Access::remote_write | Access::remote_read);
            std::optional<NotificationInbox> inbox(std::in_place, p.b.qp, p.b.pd, 8);
            // One notification read before the queue pair goes, one waited for when it goes.
            const std::string request = "before";
            TransferOptions options;
            options.notify = 5u;
            options.notify_message = std::as_bytes(std::span(request));
            const test::Scatter s{8, 256}; // 4096 bytes: the pair's memory
            const TransferPlan plan = s.plan(p.a.mr, p.b.mr.remote());
            test::Outcome out;
            async_transfer(p.a.qp, plan, options, out.handler());
            (void)test::run_until(
                io, [&] { return out.calls == 1 && inbox->unread() == 1; }, 30s);
            REQUIRE(inbox->unread() == 1);
            std::optional<async_error_code> ended;
            inbox->async_wait([&](async_error_code ec, Notification) { ended = ec; });
            std::optional<Notification> first = inbox->poll(); // taken by the wait or here: one of them has it
            (void)test::run_until(
                io, [&] { return ended.has_value(); }, 1s);
            const bool wait_took_it = ended.has_value() && !*ended;
            CHECK(wait_took_it != first.has_value());
            if (wait_took_it) {
                ended.reset();
                inbox->async_wait([&](async_error_code ec, Notification) { ended = ec; });
            }
            p.b.qp = QueuePair(); // destroyed under the inbox
            (void)test::run_until(
                io, [&] { return ended.has_value(); }, 10s);
            REQUIRE(ended.has_value());
            CHECK(*ended == asio::error::operation_aborted);
            CHECK(inbox->error());
            CHECK_FALSE(inbox->poll());
            inbox.reset(); // after its queue pair: nothing of the queue pair is touched
            (void)test::run_until(
                io, [] { return false; }, 50ms);
        }
    }
}
