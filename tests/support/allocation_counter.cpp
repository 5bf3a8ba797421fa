#include "allocation_counter.hpp"

#include <cstdlib>
#include <new>

namespace {
std::atomic<std::size_t> count{0};
std::atomic<std::size_t> largest{0};

void note(std::size_t size) noexcept {
    count.fetch_add(1, std::memory_order_relaxed);
    std::size_t seen = largest.load(std::memory_order_relaxed);
    while (size > seen && !largest.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
    }
}
} // namespace

std::size_t gpuverbs::test::allocations() noexcept {
    return count.load(std::memory_order_relaxed);
}

std::size_t gpuverbs::test::largest_allocation() noexcept {
    return largest.load(std::memory_order_relaxed);
}

void gpuverbs::test::reset_largest_allocation() noexcept {
    largest.store(0, std::memory_order_relaxed);
}

void* operator new(std::size_t size) {
    note(size);
    if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every
// allocation this program makes must pair with the deletes above.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    note(size);
    return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}
