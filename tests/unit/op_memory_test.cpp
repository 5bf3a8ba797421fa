// The memory of asynchronous operations (detail::OpMemory): blocks recycled
// per thread, and between threads through the lock-free shared stack.
#include "allocation_counter.hpp"
#include "gpuverbs/detail/async/async_op.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

using gpuverbs::detail::OpMemory;

TEST_SUITE("operation memory") {
    TEST_CASE("a block freed on the same thread is the next one handed out") {
        void* a = OpMemory::get();
        OpMemory::put(a);
        void* b = OpMemory::get();
        CHECK(b == a);
        OpMemory::put(b);
    }

    TEST_CASE("blocks freed on another thread come back to the thread that needs them") {
        // More than one thread keeps for itself: the rest goes to the shared stack.
        constexpr std::size_t n = 4 * OpMemory::thread_capacity;
        std::vector<void*> made;
        made.reserve(n);
        for (std::size_t i = 0; i < n; ++i) made.push_back(OpMemory::get());
        std::thread([&made] {
            for (void* b : made) OpMemory::put(b);
        }).join(); // the thread's own list is shared when it ends, too
        const std::set<void*> ours(made.begin(), made.end());
        std::vector<void*> again;
        std::size_t reused = 0;
        for (std::size_t i = 0; i < n; ++i) {
            again.push_back(OpMemory::get());
            reused += ours.count(again.back());
        }
        CHECK(reused == n); // every block came back; none was allocated anew
        for (void* b : again) OpMemory::put(b);
    }

    TEST_CASE("a producer and a consumer thread trade blocks without loss or double use") {
        // One thread takes blocks and hands them over, another frees them: the
        // shared stack is pushed by one and taken by the other at once (TSan
        // and ASan check the races and the double frees).
        constexpr int rounds = 20000;
        constexpr int ring = 64;
        std::vector<std::atomic<void*>> slots(ring);
        for (auto& s : slots) s.store(nullptr);
        std::atomic<bool> stop{false};
        std::thread consumer([&] {
            int freed = 0;
            while (freed < rounds) {
                for (auto& s : slots) {
                    if (void* b = s.exchange(nullptr, std::memory_order_acquire)) {
                        *static_cast<volatile unsigned char*>(b) = 0xaa; // still ours to write
                        OpMemory::put(b);
                        ++freed;
                    }
                }
            }
            stop = true;
        });
        const std::size_t allocated_before = gpuverbs::test::allocations();
        for (int i = 0; i < rounds; ++i) {
            void* b = OpMemory::get();
            *static_cast<volatile unsigned char*>(b) = 0x55;
            auto& s = slots[static_cast<std::size_t>(i % ring)];
            void* expected = nullptr;
            while (!s.compare_exchange_weak(expected, b, std::memory_order_release)) expected = nullptr;
        }
        consumer.join();
        CHECK(stop.load());
        // Recycled, not allocated per operation: the blocks in flight and in
        // the two threads' lists, not one per round.
        CHECK(gpuverbs::test::allocations() - allocated_before < rounds / 10);
    }
}
