// Counts calls to global operator new in this test binary, to check that a
// code path allocates nothing in steady state.
#pragma once

#include <atomic>
#include <cstddef>

namespace gpuverbs::test {
/// Global operator new calls so far (all threads).
std::size_t allocations() noexcept;
} // namespace gpuverbs::test
