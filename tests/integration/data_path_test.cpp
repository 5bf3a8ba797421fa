// Every RC operation, byte-exact, between rxe0 and rxe1 over the wire.
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace gpuverbs;
using gpuverbs::test::fill_pattern;
using gpuverbs::test::has_pattern;
using gpuverbs::test::Pair;
using gpuverbs::test::poll_for;

namespace {
constexpr std::size_t MiB = 1 << 20;
} // namespace

TEST_SUITE("RC data path on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("connect brings both queue pairs to RTS with each other's endpoint") {
        Pair p;
        CHECK(p.a.qp.state() == QpState::ready_to_send);
        CHECK(p.b.qp.state() == QpState::ready_to_send);
        CHECK(p.a.qp.remote_endpoint() == p.b.qp.local_endpoint());
        CHECK(p.b.qp.remote_endpoint() == p.a.qp.local_endpoint());
        CHECK_FALSE(p.a.prepared); // consumed by connect
        CHECK(p.a.qp.local_endpoint().gid.is_ipv4_mapped());
        CHECK(p.a.qp.local_endpoint().mtu == p.a.device.query_port(1).active_mtu);
    }

    TEST_CASE("a queue pair posts through the extended verbs when asked and the provider has them (rxe has)") {
        // In the second run (GPUVERBS_TEST_EXTENDED_VERBS=1) every test's queue
        // pairs are extended: this says the run really took that path.
        Pair classic_or_env;
        CHECK(classic_or_env.a.qp.uses_extended_verbs() ==
              (gpuverbs::test::env_or("GPUVERBS_TEST_EXTENDED_VERBS") == "1"));
        QueuePairOptions options;
        options.extended_verbs = true;
        options.max_send_sge = 2;
        Pair p(MiB, options);
        REQUIRE(p.a.qp.uses_extended_verbs());
        REQUIRE(p.b.qp.uses_extended_verbs());
        QueuePairOptions plain;
        Pair q(MiB, plain);
        if (gpuverbs::test::env_or("GPUVERBS_TEST_EXTENDED_VERBS") != "1") CHECK_FALSE(q.a.qp.uses_extended_verbs());
        // One entry: ibv_wr_set_sge. Two entries: the classic path on the
        // same queue pair (ibv_wr_set_sge_list is wrong on older rxe). Both land.
        fill_pattern(std::span(p.a.memory).first(4096), 3);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 1000), p.b.mr.remote(), 0));
        const LocalBuffer two[] = {p.a.mr.slice(1000, 1000), p.a.mr.slice(2000, 2096)};
        REQUIRE_FALSE(p.a.qp.post_write(two, p.b.mr.remote(), 1000));
        auto done = poll_for(p.a.cq, 2);
        REQUIRE(done.size() == 2);
        CHECK(done[0].ok());
        CHECK(done[1].ok());
        CHECK(has_pattern(std::span(p.b.memory).first(4096), 3));
        CHECK(p.b.memory[4096] == std::byte{0});
    }

    TEST_CASE("RDMA write moves every byte, from 1 byte to 8 MiB") {
        Pair p(8 * MiB);
        std::uint32_t seed = 1;
        for (std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{65537}, MiB, 8 * MiB}) {
            CAPTURE(size);
            fill_pattern(std::span(p.a.memory).first(size), seed);
            std::memset(p.b.memory.data(), 0, size + (size < p.b.memory.size() ? 1 : 0));
            REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, size), p.b.mr.remote(), 0, {.context = seed}));
            auto done = poll_for(p.a.cq, 1);
            REQUIRE(done.size() == 1);
            CHECK(done[0].ok());
            CHECK(done[0].opcode == Opcode::write);
            CHECK(done[0].context == seed);
            CHECK(has_pattern(std::span(p.b.memory).first(size), seed));
            if (size < p.b.memory.size()) CHECK(p.b.memory[size] == std::byte{0}); // nothing past the end
            ++seed;
        }
    }

    TEST_CASE("RDMA write lands at the remote offset asked for") {
        Pair p;
        fill_pattern(std::span(p.a.memory).first(100), 9);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.slice(0, 100), p.b.mr.remote(), 5000));
        REQUIRE(poll_for(p.a.cq, 1).at(0).ok());
        CHECK(has_pattern(std::span(p.b.memory).subspan(5000, 100), 9));
        CHECK(p.b.memory[4999] == std::byte{0});
        CHECK(p.b.memory[5100] == std::byte{0});
    }

    TEST_CASE("write with immediate delivers data and the immediate to a posted receive") {
        Pair p;
        fill_pattern(std::span(p.a.memory).first(3000), 3);
        REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 0), 77));
        REQUIRE_FALSE(p.a.qp.post_write_with_imm(p.a.mr.slice(0, 3000), p.b.mr.remote(), 1000, 0xdeadbeef));
        auto sent = poll_for(p.a.cq, 1);
        auto received = poll_for(p.b.cq, 1);
        REQUIRE(sent.size() == 1);
        REQUIRE(received.size() == 1);
        CHECK(sent[0].opcode == Opcode::write_with_imm);
        CHECK(received[0].ok());
        CHECK(received[0].opcode == Opcode::receive_with_imm);
        CHECK(received[0].context == 77);
        CHECK(received[0].immediate == 0xdeadbeefu);
        CHECK(received[0].byte_length == 3000);
        CHECK(has_pattern(std::span(p.b.memory).subspan(1000, 3000), 3));
    }

    TEST_CASE("RDMA read fetches every byte, from 1 byte to 8 MiB") {
        Pair p(8 * MiB);
        std::uint32_t seed = 20;
        for (std::size_t size : {std::size_t{1}, std::size_t{4096}, MiB + 3, 8 * MiB}) {
            CAPTURE(size);
            fill_pattern(std::span(p.b.memory).first(size), seed);
            std::memset(p.a.memory.data(), 0, size);
            REQUIRE_FALSE(p.a.qp.post_read(p.a.mr.slice(0, size), p.b.mr.remote(), 0, {.context = 5}));
            auto done = poll_for(p.a.cq, 1);
            REQUIRE(done.size() == 1);
            CHECK(done[0].ok());
            CHECK(done[0].opcode == Opcode::read);
            CHECK(has_pattern(std::span(p.a.memory).first(size), seed));
            ++seed;
        }
    }

    TEST_CASE("send and receive deliver the payload, its length and the immediate") {
        Pair p;
        for (std::size_t size : {std::size_t{1}, std::size_t{4095}, std::size_t{4096 * 3 + 1}, 256 * 1024ul}) {
            CAPTURE(size);
            std::memset(p.b.memory.data(), 0, size);
            fill_pattern(std::span(p.a.memory).first(size), static_cast<std::uint32_t>(size));
            REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, size), size));
            REQUIRE_FALSE(p.a.qp.post_send(p.a.mr.slice(0, size)));
            REQUIRE(poll_for(p.a.cq, 1).at(0).opcode == Opcode::send);
            auto r = poll_for(p.b.cq, 1);
            REQUIRE(r.size() == 1);
            CHECK(r[0].ok());
            CHECK(r[0].opcode == Opcode::receive);
            CHECK(r[0].context == size);
            CHECK(r[0].byte_length == size);
            CHECK_FALSE(r[0].immediate.has_value());
            CHECK(has_pattern(std::span(p.b.memory).first(size), static_cast<std::uint32_t>(size)));
        }
        REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 64)));
        REQUIRE_FALSE(p.a.qp.post_send_with_imm(p.a.mr.slice(0, 10), 42));
        auto r = poll_for(p.b.cq, 1);
        REQUIRE(r.size() == 1);
        CHECK(r[0].immediate == 42u);
        CHECK(r[0].byte_length == 10);
        CHECK(poll_for(p.a.cq, 1).at(0).opcode == Opcode::send_with_imm);
    }

    TEST_CASE("post_receives posts many receives with one doorbell, all or none, each with its context") {
        QueuePairOptions options;
        options.max_recv_wr = 8;
        Pair p(1 << 16, options);
        const std::uint32_t depth = p.b.qp.capabilities().max_recv_wr;
        REQUIRE(depth >= 8);
        std::vector<LocalBuffer> buffers;
        for (std::uint32_t i = 0; i < 33; ++i) buffers.push_back(p.b.mr.slice(std::size_t{i} * 64, 64));
        // Refused as a whole, nothing posted: too many, more than the queue holds, a bad range.
        CHECK(p.b.qp.post_receives(buffers) == errc::batch_full);
        CHECK(p.b.qp.post_receives(std::span(buffers).first(depth + 1)) == errc::receive_queue_full);
        std::vector<LocalBuffer> bad(buffers.begin(), buffers.begin() + 4);
        bad[3].length = 1 << 20; // past its region
        CHECK(p.b.qp.post_receives(bad) == errc::local_range_outside_region);
        CHECK(p.b.qp.outstanding_receives() == 0);
        // Four receives, one doorbell; four sends fill them in order, contexts 100..103.
        REQUIRE_FALSE(p.b.qp.post_receives(std::span(buffers).first(4), 100));
        CHECK(p.b.qp.outstanding_receives() == 4);
        for (std::uint32_t i = 0; i < 4; ++i) {
            std::memset(p.a.memory.data() + std::size_t{i} * 64, static_cast<int>(i + 1), 64);
            REQUIRE_FALSE(p.a.qp.post_send(p.a.mr.slice(std::size_t{i} * 64, 64)));
        }
        CHECK(poll_for(p.a.cq, 4).size() == 4);
        auto r = poll_for(p.b.cq, 4);
        REQUIRE(r.size() == 4);
        for (std::uint32_t i = 0; i < 4; ++i) {
            CHECK(r[i].ok());
            CHECK(r[i].context == 100 + i);
            CHECK(p.b.memory[std::size_t{i} * 64 + 63] == std::byte(i + 1));
        }
        CHECK(p.b.qp.outstanding_receives() == 0);
    }

    TEST_CASE("fetch-and-add returns the old value and adds remotely") {
        Pair p;
        std::uint64_t start = 1000;
        std::memcpy(p.b.memory.data() + 64, &start, 8);
        for (std::size_t i = 0; i < 10; ++i) {
            REQUIRE_FALSE(p.a.qp.post_fetch_add(p.a.mr.slice(8 * i, 8), p.b.mr.remote(), 64, 5));
        }
        auto done = poll_for(p.a.cq, 10);
        REQUIRE(done.size() == 10);
        for (std::size_t i = 0; i < 10; ++i) {
            CHECK(done[i].opcode == Opcode::fetch_add);
            std::uint64_t old = 0;
            std::memcpy(&old, p.a.memory.data() + 8 * i, 8);
            CHECK(old == 1000 + 5u * i);
        }
        std::uint64_t now = 0;
        std::memcpy(&now, p.b.memory.data() + 64, 8);
        CHECK(now == 1050);
    }

    TEST_CASE("compare-and-swap swaps only when the value matches") {
        Pair p;
        std::uint64_t v = 7;
        std::memcpy(p.b.memory.data() + 8, &v, 8);
        REQUIRE_FALSE(p.a.qp.post_compare_swap(p.a.mr.slice(0, 8), p.b.mr.remote(), 8, 7, 99));
        REQUIRE_FALSE(p.a.qp.post_compare_swap(p.a.mr.slice(8, 8), p.b.mr.remote(), 8, 7, 1234));
        auto done = poll_for(p.a.cq, 2);
        REQUIRE(done.size() == 2);
        CHECK(done[0].opcode == Opcode::compare_swap);
        std::uint64_t first = 0, second = 0, now = 0;
        std::memcpy(&first, p.a.memory.data(), 8);
        std::memcpy(&second, p.a.memory.data() + 8, 8);
        std::memcpy(&now, p.b.memory.data() + 8, 8);
        CHECK(first == 7);   // matched: swapped in 99
        CHECK(second == 99); // did not match 7: left alone
        CHECK(now == 99);
    }

    TEST_CASE("inline sends carry unregistered memory, reusable as soon as post returns") {
        QueuePairOptions options;
        options.max_inline_data = 64;
        Pair p(MiB, options);
        REQUIRE(p.a.qp.capabilities().max_inline_data >= 64);
        std::array<std::byte, 48> message;
        fill_pattern(message, 4);
        REQUIRE_FALSE(p.b.qp.post_receive(p.b.mr.slice(0, 64)));
        REQUIRE_FALSE(p.a.qp.post_send(unregistered(message), {.inline_data = true}));
        message.fill(std::byte{0}); // the payload was copied at post time
        REQUIRE(poll_for(p.a.cq, 1).at(0).ok());
        auto r = poll_for(p.b.cq, 1);
        REQUIRE(r.size() == 1);
        CHECK(r[0].byte_length == 48);
        CHECK(has_pattern(std::span(p.b.memory).first(48), 4));
    }

    TEST_CASE("scatter/gather: a write gathers several buffers, a read scatters into several") {
        QueuePairOptions options;
        options.max_send_sge = 4;
        Pair p(MiB, options);
        fill_pattern(std::span(p.a.memory).first(3000), 6);
        std::array<LocalBuffer, 3> pieces{p.a.mr.slice(0, 1000), p.a.mr.slice(1000, 1000), p.a.mr.slice(2000, 1000)};
        REQUIRE_FALSE(p.a.qp.post_write(pieces, p.b.mr.remote(), 0));
        REQUIRE(poll_for(p.a.cq, 1).at(0).ok());
        CHECK(has_pattern(std::span(p.b.memory).first(3000), 6));
        // Scatter the remote bytes back into two places of our buffer.
        std::array<LocalBuffer, 2> halves{p.a.mr.slice(10000, 1500), p.a.mr.slice(20000, 1500)};
        REQUIRE_FALSE(p.a.qp.post_read(halves, p.b.mr.remote(), 0));
        REQUIRE(poll_for(p.a.cq, 1).at(0).ok());
        CHECK(std::memcmp(p.a.memory.data() + 10000, p.b.memory.data(), 1500) == 0);
        CHECK(std::memcmp(p.a.memory.data() + 20000, p.b.memory.data() + 1500, 1500) == 0);
    }

    TEST_CASE("a batch posts many requests with one doorbell and only the signaled one completes") {
        Pair p;
        auto batch = p.a.qp.batch();
        for (std::uint32_t i = 0; i < 32; ++i) {
            fill_pattern(std::span(p.a.memory).subspan(i * 1024ul, 1024), i);
            bool last = i == 31;
            REQUIRE_FALSE(batch.write(p.a.mr.slice(i * 1024ul, 1024), p.b.mr.remote(), i * 1024ul,
                                      {.context = i, .signaled = last}));
        }
        CHECK(batch.size() == 32);
        CHECK(batch.write(p.a.mr.slice(0, 8), p.b.mr.remote()) == errc::batch_full);
        REQUIRE_FALSE(batch.post());
        CHECK(batch.empty());
        CHECK(p.a.qp.outstanding_sends() == 32);
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].context == 31);
        CHECK(p.a.qp.outstanding_sends() == 0); // the signaled one finishes the 31 before it
        for (std::uint32_t i = 0; i < 32; ++i) CHECK(has_pattern(std::span(p.b.memory).subspan(i * 1024ul, 1024), i));
    }

    TEST_CASE("thousands of operations in flight, selectively signaled, all land") {
        QueuePairOptions options;
        options.max_send_wr = 128;
        Pair p(4 * MiB, options);
        constexpr int total = 5000; // > 4 MiB / 1 KiB: wraps around and rewrites the start
        constexpr std::size_t size = 1024;
        fill_pattern(std::span(p.a.memory).first(4 * MiB), 11);
        int posted = 0, completions = 0, signaled = 0;
        std::array<Completion, 64> batch;
        while (posted < total) {
            bool signal = posted % 16 == 15 || posted == total - 1;
            std::size_t offset = (static_cast<std::size_t>(posted) * size) % (4 * MiB);
            std::error_code ec =
                p.a.qp.post_write(p.a.mr.slice(offset, size), p.b.mr.remote(), offset, {.signaled = signal});
            if (ec == errc::send_queue_full) {
                std::size_t n = p.a.cq.poll(batch);
                for (std::size_t i = 0; i < n; ++i) REQUIRE(batch[i].ok());
                completions += static_cast<int>(n);
                continue;
            }
            REQUIRE_FALSE(ec);
            ++posted;
            signaled += signal ? 1 : 0;
        }
        auto rest = poll_for(p.a.cq, static_cast<std::size_t>(signaled - completions));
        completions += static_cast<int>(rest.size());
        CHECK(completions == signaled);
        CHECK(p.a.qp.outstanding_sends() == 0);
        CHECK(std::memcmp(p.a.memory.data(), p.b.memory.data(), 4 * MiB) == 0);
    }

    TEST_CASE("a shared receive queue feeds receives to a queue pair") {
        Device dev0 = Device::open(gpuverbs::test::rig_devices()->dev0);
        Device dev1 = Device::open(gpuverbs::test::rig_devices()->dev1);
        ProtectionDomain pd0(dev0), pd1(dev1);
        CompletionQueue cq0(dev0, 64), cq1(dev1, 64);
        SharedReceiveQueue srq(pd1, 16);
        std::vector<std::byte> m0(4096), m1(4096);
        MemoryRegion mr0(pd0, m0, access_all), mr1(pd1, m1, access_all);
        PreparedQueuePair a(pd0, cq0, cq0);
        PreparedQueuePair b(pd1, cq1, cq1, srq);
        Endpoint ea = a.endpoint(), eb = b.endpoint();
        QueuePair qa = std::move(a).connect(eb);
        QueuePair qb = std::move(b).connect(ea);
        CHECK(qb.post_receive(mr1.slice(0, 100)) == errc::receives_through_srq); // receives go to the SRQ
        CHECK(std::error_code(errc::receives_through_srq).message().find("post receives to the SharedReceiveQueue") !=
              std::string::npos);
        for (std::size_t i = 0; i < 4; ++i) REQUIRE_FALSE(srq.post_receive(mr1.slice(i * 1024, 1024), 100 + i));
        for (int i = 0; i < 4; ++i) {
            m0[i] = std::byte(i + 1);
            REQUIRE_FALSE(qa.post_send(mr0.slice(i, 1)));
        }
        auto r = poll_for(cq1, 4);
        REQUIRE(r.size() == 4);
        for (std::size_t i = 0; i < 4; ++i) {
            CHECK(r[i].context == 100u + i);
            CHECK(r[i].qp_num == qb.qp_num());
            CHECK(m1[i * 1024] == std::byte(i + 1));
        }
    }
}
