// Bad input and broken peers on real RDMA: every failure is a clear error or
// an error completion, nothing hangs, and every object stays destroyable.
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>

using namespace gpuverbs;
using gpuverbs::test::Pair;
using gpuverbs::test::poll_for;

TEST_SUITE("failures on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("a wrong rkey gives a remote access error completion that says why") {
        Pair p;
        RemoteMemory wrong = p.b.mr.remote();
        wrong.rkey ^= 0x5a5a;
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 64), wrong, 0, {.context = 3}));
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK(done[0].context == 3);
        CHECK(done[0].opcode == Opcode::write); // known even though ibv_wc.opcode is not valid on errors
        CHECK(done[0].status.message().find("wrong rkey") != std::string::npos);
        // The QP is now in the error state, and gpuverbs knows it from the
        // completion: a later request is refused at once, saying so, and
        // nothing reaches the provider (which may never complete it).
        const std::optional<QueuePairFailure> failure = p.a.qp.failure();
        REQUIRE(failure);
        CHECK(failure->cause == QueuePairFailure::Cause::completion_failed);
        CHECK(failure->status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK_MESSAGE(failure->describe().find("a work completion failed") != std::string::npos, failure->describe());
        CHECK(p.a.qp.post_write(p.a.mr.slice(0, 64), p.b.mr.remote(), 0, {.context = 4}) == errc::queue_pair_in_error);
        CHECK(p.a.qp.outstanding_sends() == 0);
        CHECK(poll_for(p.a.cq, 1, std::chrono::milliseconds(200)).empty());
        CHECK(p.a.qp.state() == QpState::error);
    }

    TEST_CASE("an address past the peer's region is refused locally, and by the peer if forced") {
        Pair p;
        CHECK(p.a.qp.post_write(p.a.mr.slice(0, 64), p.b.mr.remote(), p.b.mr.length() - 32) ==
              errc::remote_range_outside_region);
        CHECK(p.a.qp.outstanding_sends() == 0);
        // A RemoteMemory that lies about its length gets past the local check; the NIC refuses.
        RemoteMemory lying = p.b.mr.remote();
        lying.length *= 2;
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 64), lying, p.b.mr.length() + 4096));
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
    }

    TEST_CASE("local bad input is refused before anything is posted") {
        Pair p;
        CHECK(p.a.qp.post_write(p.a.mr.slice(p.a.mr.length() - 10, 20), p.b.mr.remote()) ==
              errc::local_range_outside_region);
        std::array<std::byte, 512> big{};
        CHECK(p.a.qp.post_send(unregistered(big), {.inline_data = true}) == errc::inline_too_large);
        std::array<LocalBuffer, 2> two{p.a.mr.slice(0, 8), p.a.mr.slice(8, 8)};
        CHECK(p.a.qp.post_send(two) == errc::too_many_sges); // max_send_sge is 1 by default
        CHECK(p.a.qp.post_fetch_add(p.a.mr.slice(4, 8), p.b.mr.remote(), 0, 1) == errc::misaligned_atomic);
        // A length past a request's 32-bit field: refused, never cut to its low bits (4 GiB + 16 was 16 bytes).
        CHECK(p.a.qp.post_write(p.a.mr.slice(0, (std::size_t{1} << 32) + 16), p.b.mr.remote()) ==
              errc::local_range_outside_region);
        CHECK(p.a.qp.outstanding_sends() == 0);
        // Nothing was posted, so nothing completes, and the QP is still fine.
        CHECK(poll_for(p.a.cq, 1, std::chrono::milliseconds(200)).empty());
        CHECK(p.a.qp.state() == QpState::ready_to_send);
    }

    TEST_CASE("a full send queue is reported locally and drains as completions are polled") {
        QueuePairOptions options;
        options.max_send_wr = 16;
        Pair p(1 << 20, options);
        std::uint32_t depth = p.a.qp.capabilities().max_send_wr;
        for (std::uint32_t i = 0; i < depth; ++i) {
            REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 8), p.b.mr.remote(), 0, {.context = i}));
        }
        CHECK(p.a.qp.post_write(p.a.mr.slice(0, 8), p.b.mr.remote()) == errc::send_queue_full);
        auto done = poll_for(p.a.cq, depth);
        CHECK(done.size() == depth);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 8), p.b.mr.remote()));
        CHECK(poll_for(p.a.cq, 1).size() == 1);
    }

    TEST_CASE("a full receive queue is reported locally") {
        QueuePairOptions options;
        options.max_recv_wr = 4;
        Pair p(1 << 20, options);
        std::uint32_t depth = p.b.qp.capabilities().max_recv_wr;
        for (std::uint32_t i = 0; i < depth; ++i) REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 8)));
        CHECK(p.b.qp.post_receive(p.b.mr.slice(0, 8)) == errc::receive_queue_full);
    }

    TEST_CASE("a send longer than the posted receive fails on both sides with length errors") {
        Pair p;
        REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 16), 1));
        REQUIRE_FALSE(p.a.qp.post_send(p.a.mr.slice(0, 64), {.context = 2}));
        auto r = poll_for(p.b.cq, 1);
        auto s = poll_for(p.a.cq, 1);
        REQUIRE(r.size() == 1);
        REQUIRE(s.size() == 1);
        // The spec (and mlx5) say LOC_LEN_ERR; rxe reports LOC_QP_OP_ERR for the same overrun.
        bool length_error =
            r[0].status == make_wc_error(IBV_WC_LOC_LEN_ERR) || r[0].status == make_wc_error(IBV_WC_LOC_QP_OP_ERR);
        CHECK_MESSAGE(length_error, r[0].status.message());
        CHECK(r[0].context == 1);
        CHECK_FALSE(s[0].ok()); // the sender learns the peer refused it
    }

    TEST_CASE("forcing a QP to error flushes every outstanding receive with its context") {
        Pair p;
        for (std::uint64_t i = 0; i < 5; ++i) REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 64), 10 + i));
        REQUIRE_FALSE(p.b.qp.force_error());
        auto flushed = poll_for(p.b.cq, 5);
        REQUIRE(flushed.size() == 5);
        for (std::uint64_t i = 0; i < 5; ++i) {
            CHECK(flushed[i].status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
            CHECK(flushed[i].context == 10 + i);
            CHECK(flushed[i].opcode == Opcode::receive);
        }
        CHECK(p.b.qp.state() == QpState::error);
    }

    TEST_CASE("a peer whose QP is destroyed mid-stream: later work fails, earlier work stays, nothing hangs") {
        Pair p(8 << 20);
        ConnectOptions fast_fail;
        fast_fail.timeout = 8; // ~1 ms per try, so the test does not wait long for the dead peer
        fast_fail.retry_count = 1;
        PreparedQueuePair again = std::move(p.a.qp).reset();
        p.a.qp = std::move(again).connect(p.b.qp.local_endpoint(), fast_fail);
        // Large writes in flight when the peer goes away: each either landed or fails; none is lost.
        for (std::uint64_t i = 0; i < 8; ++i) {
            REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 1 << 20), p.b.mr.remote(), 0, {.context = i}));
        }
        p.b.qp = QueuePair(); // the peer's QP is destroyed
        for (std::uint64_t i = 8; i < 32; ++i) {
            REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 4096), p.b.mr.remote(), 0, {.context = i}));
        }
        auto done = poll_for(p.a.cq, 32, std::chrono::seconds(60));
        REQUIRE(done.size() == 32); // every request completes: none lost, none hangs
        for (std::size_t i = 0; i < done.size(); ++i) CHECK(done[i].context == i);
        // Work posted after the peer vanished cannot have succeeded.
        for (std::size_t i = 8; i < done.size(); ++i) {
            CHECK_FALSE(done[i].ok());
        }
        auto first_failure = std::find_if(done.begin(), done.end(), [](const Completion& c) { return !c.ok(); });
        REQUIRE(first_failure != done.end());
        CHECK(first_failure->status == make_wc_error(IBV_WC_RETRY_EXC_ERR)); // the peer stopped answering
        for (auto it = first_failure + 1; it != done.end(); ++it) {
            CHECK(it->status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        }
        CHECK(p.a.qp.state() == QpState::error);
    }

    TEST_CASE("a QP in error can be reset and connected again, and then works") {
        Pair p;
        REQUIRE_FALSE(p.a.qp.force_error());
        REQUIRE_FALSE(p.b.qp.force_error());
        CHECK(p.a.qp.state() == QpState::error);
        PreparedQueuePair ra = std::move(p.a.qp).reset();
        PreparedQueuePair rb = std::move(p.b.qp).reset();
        Endpoint ea = ra.endpoint(), eb = rb.endpoint();
        p.a.qp = std::move(ra).connect(eb);
        p.b.qp = std::move(rb).connect(ea);
        std::memset(p.a.memory.data(), 0x3c, 100);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 100), p.b.mr.remote()));
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].ok());
        CHECK(p.b.memory[99] == std::byte{0x3c});
    }

    TEST_CASE("connect refuses an impossible endpoint, says why, and the QP can still connect") {
        Pair p;
        PreparedQueuePair prepared(p.a.pd, p.a.cq, p.a.cq);
        Endpoint bad = p.b.qp.local_endpoint();
        bad.qp_num = 0;
        try {
            (void)std::move(prepared).connect(bad);
            FAIL("connect accepted QP number 0");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_endpoint);
            CHECK(std::string(e.what()).find("ibv_modify_qp(INIT->RTR): the remote endpoint's QP number 0x0") == 0);
        }
        REQUIRE(prepared); // still usable
        std::error_code ec;
        ConnectOptions huge;
        huge.path_mtu = Mtu::mtu_4096;
        Endpoint small_mtu = p.b.qp.local_endpoint();
        small_mtu.mtu = Mtu::mtu_1024;
        (void)std::move(prepared).connect(small_mtu, huge, ec);
        CHECK(ec == errc::invalid_argument);
        CHECK(prepared);
        // The error_code form with Diagnostics keeps the words the exception had.
        Diagnostics diag;
        ec.clear();
        (void)std::move(prepared).connect(bad, {}, ec, diag);
        CHECK(ec == errc::invalid_endpoint);
        CHECK(diag.message().find("ibv_modify_qp(INIT->RTR): the remote endpoint's QP number 0x0") == 0);
        REQUIRE(prepared);
        QueuePair connected = std::move(prepared).connect(p.b.qp.local_endpoint(), {}, ec, diag);
        CHECK_FALSE(ec);
        CHECK(connected);
        CHECK(diag.message().empty()); // a success clears what an earlier failure left
    }

    TEST_CASE("Diagnostics carry the words of open and register failures, as the exceptions do") {
        Diagnostics diag;
        std::error_code ec;
        Device missing = Device::open("mlx5_99", ec, diag);
        CHECK_FALSE(missing);
        CHECK(ec == errc::device_not_found);
        CHECK(diag.verb() == "ibv_open_device");
        CHECK(diag.detail().find("no RDMA device named 'mlx5_99'; devices present: ") == 0);
        CHECK(diag.message() == "ibv_open_device: " + diag.detail());
        CHECK(diag.message().find(gpuverbs::test::rig_devices()->dev0) != std::string::npos);

        Device dev = Device::open(gpuverbs::test::rig_devices()->dev0, ec, diag);
        REQUIRE(dev);
        CHECK(diag.message().empty());
        ProtectionDomain pd(dev);
        std::string thrown;
        try {
            MemoryRegion mr(pd, reinterpret_cast<void*>(0x10), 4096, Access::local_write);
        } catch (const Error& e) {
            thrown = e.what();
        }
        REQUIRE_FALSE(thrown.empty());
        MemoryRegion bad = MemoryRegion::create(pd, reinterpret_cast<void*>(0x10), 4096, Access::local_write, ec, diag);
        CHECK_FALSE(bad);
        CHECK(ec == std::error_code(EFAULT, std::system_category()));
        CHECK(diag.message() == thrown);
        CHECK(diag.message().find("not mapped memory") != std::string::npos);
    }

    TEST_CASE("a completion queue from another opened Device is refused with the reason, not a bare EINVAL") {
        Device first = Device::open(gpuverbs::test::rig_devices()->dev0);
        Device second = Device::open(gpuverbs::test::rig_devices()->dev0); // the same NIC, opened twice
        ProtectionDomain pd(first);
        CompletionQueue cq(second, 16);
        try {
            PreparedQueuePair qp(pd, cq, cq);
            FAIL("a QP mixing two opened devices was created");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(std::string(e.what()).find("from the same opened Device") != std::string::npos);
        }
    }

    TEST_CASE("registering unmapped memory fails with EFAULT and says so") {
        Device dev = Device::open(gpuverbs::test::rig_devices()->dev0);
        ProtectionDomain pd(dev);
        try {
            MemoryRegion mr(pd, reinterpret_cast<void*>(0x10), 4096, Access::local_write);
            FAIL("registered address 0x10");
        } catch (const Error& e) {
            CHECK(e.code() == std::error_code(EFAULT, std::system_category()));
            CHECK(std::string(e.what()).find("not mapped memory") != std::string::npos);
        }
        std::vector<std::byte> m(64);
        std::error_code ec;
        MemoryRegion bad = MemoryRegion::create(pd, m.data(), m.size(), Access::remote_write, ec);
        CHECK(ec == errc::invalid_argument); // remote_write without local_write
        CHECK_FALSE(bad);
    }

    TEST_CASE("objects can be destroyed in any order, parents before children") {
        auto dev = std::make_unique<Device>(Device::open(gpuverbs::test::rig_devices()->dev0));
        auto pd = std::make_unique<ProtectionDomain>(*dev);
        auto cq = std::make_unique<CompletionQueue>(*dev, 16);
        std::vector<std::byte> m(4096);
        auto mr = std::make_unique<MemoryRegion>(*pd, std::span(m), access_all);
        auto qp = std::make_unique<PreparedQueuePair>(*pd, *cq, *cq);
        dev.reset();
        pd.reset();
        cq.reset();
        CHECK(mr->lkey() != 0); // still registered: the MR keeps the PD and device alive
        CHECK(qp->native_handle() != nullptr);
        mr.reset();
        qp.reset();
    }
}
