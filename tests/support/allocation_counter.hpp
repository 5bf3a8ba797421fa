// Counts calls to global operator new in this test binary, to check that a
// code path allocates nothing in steady state, and keeps the largest one (a
// peer's number must never size an allocation).
#pragma once

#include <atomic>
#include <cstddef>

namespace gpuverbs::test {
/// Global operator new calls so far (all threads).
std::size_t allocations() noexcept;
/// The largest single allocation since reset_largest_allocation() (all threads).
std::size_t largest_allocation() noexcept;
void reset_largest_allocation() noexcept;
} // namespace gpuverbs::test
