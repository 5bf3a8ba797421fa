// The GPU half of example 04: two small kernels (04_gpudirect_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>

namespace example {

/// Writes byte i = pattern(i, seed) into `size` bytes of GPU `gpu`'s memory.
void fill_on_gpu(int gpu, void* gpu_memory, std::size_t size, unsigned seed);

/// How many of `size` bytes of GPU memory differ from pattern(i, seed),
/// counted on the GPU; only the count comes back to the host.
std::uint64_t count_mismatches_on_gpu(int gpu, const void* gpu_memory, std::size_t size, unsigned seed);

} // namespace example
