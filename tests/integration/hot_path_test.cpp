// The completion and posting paths on real RDMA, for every change that could
// lose a completion or its context: a QP destroyed with completions still
// queued, error completions carrying the right context, SRQ receives through
// the registry's QP-number lookup, mixed signaled and unsignaled requests,
// and the one posting path used by post(), SendBatch and async_post alike.
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <set>
#include <thread>

using namespace gpuverbs;
using gpuverbs::test::Pair;
using gpuverbs::test::poll_for;

TEST_SUITE("the hot path on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("completions of a destroyed QP are reported without a context, and the CQ's other QPs are unaffected") {
        Device dev0 = Device::open(gpuverbs::test::rig_devices()->dev0);
        Device dev1 = Device::open(gpuverbs::test::rig_devices()->dev1);
        ProtectionDomain pd0(dev0), pd1(dev1);
        CompletionQueue cq0(dev0, 256), cq1(dev1, 256);
        std::vector<std::byte> m0(8192), m1(8192);
        MemoryRegion mr0(pd0, m0, access_all), mr1(pd1, m1, access_all);
        auto connect = [&] {
            PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
            (void)a.advertise(mr0);
            (void)b.advertise(mr1);
            Endpoint ea = a.endpoint(), eb = b.endpoint();
            return std::pair{std::move(a).connect(eb), std::move(b).connect(ea)};
        };
        auto [doomed, doomed_peer] = connect();
        auto [kept, kept_peer] = connect();
        // Completions of the doomed QP sit in cq0 when it is destroyed.
        for (std::uint64_t i = 0; i < 8; ++i)
            REQUIRE_FALSE(doomed.post_write(mr0.slice(0, 64), mr1.remote(), 0, {.context = 100 + i}));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const std::uint32_t doomed_num = doomed.qp_num();
        doomed = QueuePair();
        // A new QP takes the freed registry index; the stale completions must not reach it.
        auto [fresh, fresh_peer] = connect();
        REQUIRE_FALSE(fresh.post_write(mr0.slice(0, 64), mr1.remote(), 0, {.context = 7}));
        REQUIRE_FALSE(kept.post_write(mr0.slice(0, 64), mr1.remote(), 64, {.context = 9}));
        auto done = poll_for(cq0, 10, std::chrono::seconds(5));
        int stale = 0, fresh_seen = 0, kept_seen = 0;
        for (const Completion& c : done) {
            if (c.qp_num == doomed_num) {
                ++stale;
                CHECK(c.context == 0);
                CHECK(c.opcode == Opcode::unknown);
            } else if (c.qp_num == fresh.qp_num()) {
                ++fresh_seen;
                CHECK(c.context == 7);
                CHECK(c.opcode == Opcode::write);
            } else if (c.qp_num == kept.qp_num()) {
                ++kept_seen;
                CHECK(c.context == 9);
            }
        }
        CHECK(fresh_seen == 1);
        CHECK(kept_seen == 1);
        MESSAGE("stale completions of the destroyed QP still in the CQ: " << stale);
        CHECK(fresh.outstanding_sends() == 0);
    }

    TEST_CASE("error completions carry the context of the request that failed, and the flushed ones theirs") {
        Pair p;
        RemoteMemory wrong = p.b.mr.remote();
        wrong.rkey ^= 0x5a5a5a;
        REQUIRE_FALSE(p.a.qp.post(WorkRequest::write(p.a.mr.slice(0, 64), wrong).context(41)));
        REQUIRE_FALSE(p.a.qp.post(WorkRequest::write(p.a.mr.slice(0, 64), p.b.mr.remote()).context(42)));
        REQUIRE_FALSE(p.a.qp.post(WorkRequest::read(p.a.mr.slice(0, 64), p.b.mr.remote()).context(43)));
        auto done = poll_for(p.a.cq, 3);
        REQUIRE(done.size() == 3);
        CHECK(done[0].context == 41);
        CHECK(done[0].opcode == Opcode::write);
        CHECK(done[0].status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK(done[1].context == 42);
        CHECK(done[1].status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        CHECK(done[2].context == 43);
        CHECK(done[2].opcode == Opcode::read);
        CHECK(done[2].status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
    }

    TEST_CASE("unsignaled requests are retired by the next signaled one, across many wraps of the ring") {
        QueuePairOptions options;
        options.max_send_wr = 16;
        Pair p(1 << 16, options);
        const std::uint64_t depth = p.a.qp.capabilities().max_send_wr;
        std::uint64_t signaled = 0;
        for (std::uint64_t i = 0; i < depth * 20; ++i) {
            const bool signal = i % 5 == 4;
            std::error_code ec =
                p.a.qp.post(WorkRequest::write(p.a.mr.slice(i % 64 * 64, 64), p.b.mr.remote(), i % 64 * 64)
                                .options({.context = i, .signaled = signal}));
            while (ec == errc::send_queue_full) {
                auto got = poll_for(p.a.cq, 1, std::chrono::seconds(5));
                REQUIRE_FALSE(got.empty());
                for (const Completion& c : got) CHECK(c.context % 5 == 4);
                signaled += got.size();
                ec = p.a.qp.post(WorkRequest::write(p.a.mr.slice(i % 64 * 64, 64), p.b.mr.remote(), i % 64 * 64)
                                     .options({.context = i, .signaled = signal}));
            }
            REQUIRE_FALSE(ec);
        }
        const std::uint64_t expected = depth * 20 / 5;
        auto rest = poll_for(p.a.cq, expected - signaled);
        for (const Completion& c : rest) CHECK(c.context % 5 == 4);
        CHECK(signaled + rest.size() == expected);
        CHECK(p.a.qp.outstanding_sends() == depth * 20 % 5); // the unsignaled tail is not known to be finished
    }

    TEST_CASE("receives from a shared receive queue come back with their contexts to two QPs on one CQ") {
        Device dev0 = Device::open(gpuverbs::test::rig_devices()->dev0);
        Device dev1 = Device::open(gpuverbs::test::rig_devices()->dev1);
        ProtectionDomain pd0(dev0), pd1(dev1);
        CompletionQueue cq0(dev0, 64), cq1(dev1, 64);
        SharedReceiveQueue srq(pd1, 32);
        std::vector<std::byte> m0(4096), m1(std::size_t{32} * 128);
        MemoryRegion mr0(pd0, m0, access_all), mr1(pd1, m1, access_all);
        auto connect = [&] {
            PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1, srq);
            Endpoint ea = a.endpoint(), eb = b.endpoint();
            return std::pair{std::move(a).connect(eb), std::move(b).connect(ea)};
        };
        auto [s1, r1] = connect();
        auto [s2, r2] = connect();
        for (std::size_t i = 0; i < 32; ++i) REQUIRE_FALSE(srq.post_receive(mr1.slice(i * 128, 128), 1000 + i));
        for (int i = 0; i < 16; ++i) {
            m0[static_cast<std::size_t>(i)] = std::byte(i);
            REQUIRE_FALSE((i % 2 == 0 ? s1 : s2).post_send(mr0.slice(static_cast<std::size_t>(i), 1)));
        }
        auto got = poll_for(cq1, 16);
        REQUIRE(got.size() == 16);
        std::set<std::uint64_t> contexts;
        for (const Completion& c : got) {
            CHECK(c.ok());
            CHECK(c.opcode == Opcode::receive);
            CHECK((c.qp_num == r1.qp_num() || c.qp_num == r2.qp_num()));
            contexts.insert(c.context);
        }
        CHECK(contexts.size() == 16); // sixteen different receives, each reported once
        CHECK(*contexts.begin() == 1000);
    }

    TEST_CASE("one shared receive queue serving QPs on two CQs: each CQ routes its completions to the SRQ's contexts") {
        // The SRQ's receives carry its number; each CQ knows the SRQ through
        // its own QPs. Dropping one CQ's QP leaves the other CQ's routing intact.
        Device dev0 = Device::open(gpuverbs::test::rig_devices()->dev0);
        Device dev1 = Device::open(gpuverbs::test::rig_devices()->dev1);
        ProtectionDomain pd0(dev0), pd1(dev1);
        CompletionQueue cq0(dev0, 64), cq1(dev1, 64), cq2(dev1, 64);
        SharedReceiveQueue srq(pd1, 32);
        std::vector<std::byte> m0(64), m1(std::size_t{32} * 64);
        MemoryRegion mr0(pd0, m0, access_all), mr1(pd1, m1, access_all);
        auto connect = [&](CompletionQueue& receiving_cq) {
            PreparedQueuePair a(pd0, cq0, cq0), b(pd1, receiving_cq, receiving_cq, srq);
            Endpoint ea = a.endpoint(), eb = b.endpoint();
            return std::pair{std::move(a).connect(eb), std::move(b).connect(ea)};
        };
        auto [s1, r1] = connect(cq1);
        auto [s2, r2] = connect(cq2);
        for (std::size_t i = 0; i < 32; ++i) REQUIRE_FALSE(srq.post_receive(mr1.slice(i * 64, 64), 2000 + i));
        auto send_from = [&](QueuePair& s, int n) {
            for (int i = 0; i < n; ++i) REQUIRE_FALSE(s.post_send(mr0.slice(0, 8)));
        };
        send_from(s1, 4);
        send_from(s2, 4);
        std::set<std::uint64_t> contexts;
        for (CompletionQueue* cq : {&cq1, &cq2}) {
            auto got = poll_for(*cq, 4);
            REQUIRE(got.size() == 4);
            for (const Completion& c : got) {
                CHECK(c.ok());
                CHECK(c.opcode == Opcode::receive);
                CHECK(c.qp_num == (cq == &cq1 ? r1.qp_num() : r2.qp_num()));
                contexts.insert(c.context);
            }
        }
        CHECK(contexts.size() == 8);
        CHECK(*contexts.begin() >= 2000);
        CHECK(*contexts.rbegin() < 2032);
        // The QP on cq1 goes; cq2 still finds the SRQ.
        { QueuePair gone = std::move(r1); }
        send_from(s2, 4);
        auto later = poll_for(cq2, 4);
        REQUIRE(later.size() == 4);
        for (const Completion& c : later) {
            CHECK(c.ok());
            CHECK(c.context >= 2000);
            CHECK(c.context < 2032);
            CHECK(contexts.insert(c.context).second); // never a receive reported twice
        }
    }

    TEST_CASE("post, SendBatch and the shorthands refuse the same bad request with the same error") {
        QueuePairOptions options;
        options.max_inline_data = 32;
        Pair p(1 << 16, options);
        const WorkRequest too_long = WorkRequest::send(p.a.mr.slice(0, 256)).inline_data();
        CHECK(p.a.qp.post(too_long) == errc::inline_too_large);
        auto batch = p.a.qp.batch();
        CHECK(batch.add(too_long) == errc::inline_too_large);
        CHECK(batch.empty());
        CHECK(p.a.qp.post_send(p.a.mr.slice(0, 256), {.inline_data = true}) == errc::inline_too_large);
        const RemoteMemory small{p.b.mr.remote().address, 16, p.b.mr.remote().rkey};
        CHECK(p.a.qp.post(WorkRequest::write(p.a.mr.slice(0, 64), small)) == errc::remote_range_outside_region);
        CHECK(batch.add(WorkRequest::write(p.a.mr.slice(0, 64), small)) == errc::remote_range_outside_region);
    }
}
