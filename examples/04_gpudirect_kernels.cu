// The GPU half of example 04: fill GPU memory with a pattern, and count the
// bytes that differ from it, both without copying the data to the host.
#include "04_gpudirect_kernels.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace {

__host__ __device__ unsigned char pattern(std::size_t i, unsigned seed) {
    return static_cast<unsigned char>((i % 251) ^ seed); // 251 is prime: no period lines up with a page
}

__global__ void fill(unsigned char* p, std::size_t n, unsigned seed) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
        p[i] = pattern(i, seed);
}

__global__ void count(const unsigned char* p, std::size_t n, unsigned seed, unsigned long long* bad) {
    unsigned long long mine = 0;
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
        mine += p[i] != pattern(i, seed);
    if (mine != 0) atomicAdd(bad, mine);
}

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

} // namespace

namespace example {

void fill_on_gpu(int gpu, void* gpu_memory, std::size_t size, unsigned seed) {
    check(cudaSetDevice(gpu), "cudaSetDevice");
    fill<<<1024, 256>>>(static_cast<unsigned char*>(gpu_memory), size, seed);
    check(cudaGetLastError(), "launching fill");
    check(cudaDeviceSynchronize(), "fill");
}

std::uint64_t count_mismatches_on_gpu(int gpu, const void* gpu_memory, std::size_t size, unsigned seed) {
    check(cudaSetDevice(gpu), "cudaSetDevice");
    unsigned long long* bad = nullptr;
    check(cudaMalloc(&bad, sizeof *bad), "cudaMalloc");
    check(cudaMemset(bad, 0, sizeof *bad), "cudaMemset");
    count<<<1024, 256>>>(static_cast<const unsigned char*>(gpu_memory), size, seed, bad);
    unsigned long long result = 0;
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&result, bad, sizeof result, cudaMemcpyDeviceToHost);
    cudaFree(bad);
    check(e, "count");
    return result;
}

} // namespace example
