// The slot ring behind every work queue: contexts survive, selective
// signaling retires the unsignaled requests before a signaled one.
#include "gpuverbs/detail/work_queue_state.hpp"

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
            CHECK(s == round % 3);
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

    TEST_CASE("wr_id encodes the queue kind and slot and decodes them back") {
        using namespace gpuverbs::detail;
        for (auto kind : {QueueKind::send, QueueKind::receive, QueueKind::shared_receive}) {
            std::uint64_t id = encode_wr_id(kind, 12345);
            CHECK(wr_id_kind(id) == kind);
            CHECK(wr_id_slot(id) == 12345);
        }
    }
}
