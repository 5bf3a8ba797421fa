// The set-up sequence is enforced by types: what cannot be done does not compile.
#include "gpuverbs/verbs/queue_pair.hpp"

#include <doctest/doctest.h>

#include <type_traits>

using namespace gpuverbs;

namespace {

template <class T>
concept can_post = requires(T& t, const LocalBuffer& b, const RemoteMemory& r) {
    t.post_write(b, r);
    t.post_send(b);
    t.post_receive(b);
};

template <class T>
concept can_connect_lvalue = requires(T& t, const Endpoint& e) {
    t.connect(e);
};

template <class T>
concept can_connect_rvalue = requires(T&& t, const Endpoint& e) {
    std::move(t).connect(e);
};

} // namespace

TEST_SUITE("queue pair typing") {
    TEST_CASE("a queue pair that is not connected has no data path") {
        static_assert(!can_post<PreparedQueuePair>);
        static_assert(can_post<QueuePair>);
        CHECK_FALSE(can_post<PreparedQueuePair>);
    }

    TEST_CASE("connect consumes the prepared queue pair: it cannot be called on an lvalue") {
        static_assert(!can_connect_lvalue<PreparedQueuePair>);
        static_assert(can_connect_rvalue<PreparedQueuePair>);
        CHECK_FALSE(can_connect_lvalue<PreparedQueuePair>);
    }

    TEST_CASE("handles are move-only") {
        static_assert(!std::is_copy_constructible_v<QueuePair>);
        static_assert(!std::is_copy_constructible_v<PreparedQueuePair>);
        static_assert(!std::is_copy_constructible_v<MemoryRegion>);
        static_assert(!std::is_copy_constructible_v<CompletionQueue>);
        static_assert(!std::is_copy_constructible_v<ProtectionDomain>);
        static_assert(std::is_nothrow_move_constructible_v<QueuePair>);
        static_assert(std::is_nothrow_move_constructible_v<MemoryRegion>);
        CHECK(std::is_nothrow_move_assignable_v<CompletionQueue>);
    }

    TEST_CASE("a send batch lives on the stack: neither copyable nor movable") {
        static_assert(!std::is_copy_constructible_v<QueuePair::SendBatch>);
        static_assert(!std::is_move_constructible_v<QueuePair::SendBatch>);
        CHECK(QueuePair::SendBatch::max_requests == 32);
    }
}
