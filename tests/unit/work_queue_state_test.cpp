// The slot ring behind every work queue: contexts survive, selective
// signaling retires the unsignaled requests before a signaled one.
#include "gpuverbs/detail/verbs/work_queue_state.hpp"

#include <doctest/doctest.h>

using gpuverbs::Opcode;
using gpuverbs::detail::WorkQueueState;

TEST_SUITE("work queue state") {
    TEST_CASE("a completion hands back the context and opcode recorded for its slot") {
        WorkQueueState q(4);
        q.record(0, 111, Opcode::write);
        q.record(1, 222, Opcode::read);
        auto s0 = q.slot(0), s1 = q.slot(1);
        q.commit(2);
        CHECK(q.outstanding() == 2);
        auto f0 = q.complete(s0);
        CHECK(f0.context == 111);
        CHECK(f0.opcode == Opcode::write);
        CHECK(q.outstanding() == 1);
        auto f1 = q.complete(s1);
        CHECK(f1.context == 222);
        CHECK(f1.opcode == Opcode::read);
        CHECK(q.outstanding() == 0);
    }

    TEST_CASE("a signaled completion retires every unsignaled request before it") {
        WorkQueueState q(8);
        for (std::uint32_t i = 0; i < 5; ++i) q.record(i, i, Opcode::write);
        auto last = q.slot(4);
        q.commit(5);
        CHECK(q.outstanding() == 5);
        CHECK_FALSE(q.has_room_for(4));
        CHECK(q.has_room_for(3));
        CHECK(q.complete(last).context == 4);
        CHECK(q.outstanding() == 0);
        CHECK(q.has_room_for(8));
    }

    TEST_CASE("slots wrap around the ring without losing contexts") {
        WorkQueueState q(3);
        for (std::uint64_t round = 0; round < 10; ++round) {
            q.record(0, round * 10, Opcode::send);
            auto s = q.slot(0);
            q.commit(1);
            CHECK(s == round % 4); // a ring of 4 (the next power of two) holds 3 outstanding
            CHECK(q.complete(s).context == round * 10);
        }
        CHECK(q.outstanding() == 0);
    }

    TEST_CASE("reset empties the bookkeeping") {
        WorkQueueState q(2);
        q.record(0, 1, Opcode::send);
        q.commit(1);
        q.reset();
        CHECK(q.outstanding() == 0);
        CHECK(q.slot(0) == 0);
    }

    TEST_CASE("wr_id encodes the queue kind, the QP's registry index and generation, and the slot") {
        using namespace gpuverbs::detail;
        for (auto kind : {QueueKind::send, QueueKind::receive, QueueKind::shared_receive}) {
            const std::uint32_t tag = WrId::tag(65535, 0x3fff);
            std::uint64_t id = WrId::encode(kind, tag, 0xfffffffe);
            CHECK(WrId::kind(id) == kind);
            CHECK(WrId::index(id) == 65535);
            CHECK(WrId::generation(id) == 0x3fff);
            CHECK(WrId::slot(id) == 0xfffffffe);
        }
        CHECK(WrId::generation(WrId::encode(QueueKind::send, WrId::tag(1, 0x4001), 0)) == 1); // wraps at 14 bits
    }

    TEST_CASE("the slot ring is a power of two but the room is the capacity asked for") {
        WorkQueueState q(5);
        CHECK(q.capacity() == 5);
        for (std::uint32_t i = 0; i < 5; ++i) {
            REQUIRE(q.has_room_for(1));
            q.record(0, i, Opcode::send);
            q.commit(1);
        }
        CHECK_FALSE(q.has_room_for(1));
        CHECK(q.complete(4).context == 4); // slot numbers run 0..7 before wrapping
        CHECK(q.has_room_for(5));
        q.record(0, 99, Opcode::write);
        CHECK(q.slot(0) == 5);
    }
}
