// OpMemory's shared stack (detail/async/async_op.hpp): blocks freed on one
// thread that another thread's operations reuse, bounded by max_pooled.
#include "gpuverbs/detail/async/async_op.hpp"

#include <atomic>
#include <cstddef>
#include <new>

namespace gpuverbs::detail {

namespace {
struct SharedBlocks {
    std::atomic<void*> head{nullptr};
    std::atomic<std::size_t> count{0}; ///< approximate: only bounds the stack
};
// Constant-initialized and trivially destructible: usable from any static
// constructor or destructor (operations may be freed during static destruction).
constinit SharedBlocks shared_blocks_state;
SharedBlocks& shared_blocks() noexcept {
    return shared_blocks_state;
}
} // namespace

void OpMemory::refill(Cache& c) noexcept {
    SharedBlocks& s = shared_blocks();
    if (s.head.load(std::memory_order_relaxed) == nullptr) return;
    void* list = s.head.exchange(nullptr, std::memory_order_acquire);
    std::size_t n = 0;
    for (void* b = list; b != nullptr; b = next_of(b)) ++n;
    s.count.fetch_sub(n, std::memory_order_relaxed);
    c.head = list; // called only when the thread's list is empty
    c.count = static_cast<unsigned>(n);
}

void OpMemory::share(void* block) noexcept {
    SharedBlocks& s = shared_blocks();
    if (s.count.load(std::memory_order_relaxed) >= max_pooled) {
        ::operator delete(block);
        return;
    }
    s.count.fetch_add(1, std::memory_order_relaxed);
    void* head = s.head.load(std::memory_order_relaxed);
    do {
        next_of(block) = head;
    } while (!s.head.compare_exchange_weak(head, block, std::memory_order_release, std::memory_order_relaxed));
}

} // namespace gpuverbs::detail
