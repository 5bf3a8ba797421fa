// The kernels of 07_gpu_initiated_put: a producer that puts blocks and
// signals through the device queue (gpuverbs/device_queue/device.cuh), and a
// checker that waits for the signal and checks every byte. Each runs on a
// stream of its own, beside the other and beside the host.
#include "07_gpu_initiated_kernels.hpp"

#include <gpuverbs/device_queue/device.cuh>

#include <cuda_runtime.h>

namespace example {

namespace {

namespace dq = gpuverbs::device_queue;
namespace dev = gpuverbs::device;

__global__ void produce(dq::QueueView q, std::uint8_t* source, std::size_t blocks, std::size_t block_bytes,
                        std::uint64_t timeout_ns, std::uint32_t* results) {
    const std::size_t k = threadIdx.x;
    if (k < blocks) {
        // The block this thread produced…
        for (std::size_t i = 0; i < block_bytes; ++i) source[k * block_bytes + i] = pattern(k, i);
        // … goes to the peer: put fences the data first, so the NIC reads what was written.
        const dev::WaitResult r =
            dev::put(q, 0, blocks_window, k * block_bytes, blocks_window, k * block_bytes, block_bytes, timeout_ns);
        atomicMax(&results[0], static_cast<std::uint32_t>(r));
    }
    __syncthreads(); // every put is in the ring before the signal: the proxy posts it after them
    if (k == 0) {
        results[1] =
            static_cast<std::uint32_t>(dev::signal(q, 0, signal_window, 0, blocks, dq::SignalOp::set, timeout_ns));
        results[2] = static_cast<std::uint32_t>(dev::quiet(q, timeout_ns)); // the sources may be reused after
    }
}

__global__ void check(dq::QueueView q, const std::uint8_t* destination, std::uint64_t* signal, std::size_t blocks,
                      std::size_t block_bytes, std::uint64_t timeout_ns, std::uint32_t* result,
                      unsigned long long* wrong) {
    __shared__ std::uint32_t waited;
    if (threadIdx.x == 0) waited = static_cast<std::uint32_t>(dev::wait_signal(q, signal, blocks, timeout_ns));
    __syncthreads(); // the signal was read with acquire order: the blocks' bytes are visible after it
    if (threadIdx.x == 0) *result = waited;
    if (waited != static_cast<std::uint32_t>(dq::WaitResult::done)) return;
    unsigned long long bad = 0;
    for (std::size_t at = threadIdx.x; at < blocks * block_bytes; at += blockDim.x) {
        bad += destination[at] != pattern(at / block_bytes, at % block_bytes) ? 1 : 0;
    }
    atomicAdd(wrong, bad);
}

bool ok(cudaError_t e, const char* what, std::string& why) {
    if (e == cudaSuccess) return true;
    why = std::string(what) + ": " + cudaGetErrorString(e);
    return false;
}

/// Streams that neither wait for the legacy default stream nor make it wait.
struct Streams {
    cudaStream_t producer = nullptr, checker = nullptr, copies = nullptr;
    std::uint32_t* producer_results = nullptr; // pinned host memory the kernels write
    std::uint32_t* checker_result = nullptr;
    unsigned long long* checker_wrong = nullptr;
    std::uint64_t* word = nullptr; // a signal's value, pinned for the copy
};

bool streams(Streams*& out, std::string& why) {
    static Streams s;
    static bool made = false;
    if (!made) {
        // Both kernels loaded now: with CUDA's lazy module loading (the default since 12.2) a kernel's first
        // launch waits for the kernels running, so the producer's would wait for the checker, which spins
        // until the producer's signal comes.
        cudaFuncAttributes attributes{};
        made = ok(cudaFuncGetAttributes(&attributes, produce), "cudaFuncGetAttributes(produce)", why) &&
               ok(cudaFuncGetAttributes(&attributes, check), "cudaFuncGetAttributes(check)", why) &&
               ok(cudaStreamCreateWithFlags(&s.producer, cudaStreamNonBlocking), "cudaStreamCreate", why) &&
               ok(cudaStreamCreateWithFlags(&s.checker, cudaStreamNonBlocking), "cudaStreamCreate", why) &&
               ok(cudaStreamCreateWithFlags(&s.copies, cudaStreamNonBlocking), "cudaStreamCreate", why) &&
               ok(cudaMallocHost(&s.producer_results, 3 * sizeof(std::uint32_t)), "cudaMallocHost", why) &&
               ok(cudaMallocHost(&s.checker_result, sizeof(std::uint32_t)), "cudaMallocHost", why) &&
               ok(cudaMallocHost(&s.checker_wrong, sizeof(unsigned long long)), "cudaMallocHost", why) &&
               ok(cudaMallocHost(&s.word, sizeof(std::uint64_t)), "cudaMallocHost", why);
        if (!made) return false;
    }
    out = &s;
    return true;
}

} // namespace

bool start_producer(const dq::QueueView& q, void* source, std::size_t blocks, std::size_t block_bytes,
                    std::uint64_t timeout_ns, std::string& why) {
    Streams* s = nullptr;
    if (!streams(s, why)) return false;
    s->producer_results[0] = s->producer_results[1] = s->producer_results[2] = 0;
    produce<<<1, static_cast<unsigned>(blocks), 0, s->producer>>>(q, static_cast<std::uint8_t*>(source), blocks,
                                                                  block_bytes, timeout_ns, s->producer_results);
    return ok(cudaGetLastError(), "launch(produce)", why);
}

bool finish_producer(std::uint32_t results[3], std::string& why) {
    Streams* s = nullptr;
    if (!streams(s, why) || !ok(cudaStreamSynchronize(s->producer), "cudaStreamSynchronize(produce)", why)) {
        return false;
    }
    for (int i = 0; i < 3; ++i) results[i] = s->producer_results[i];
    return true;
}

bool start_checker(const dq::QueueView& q, const void* destination, std::uint64_t* signal, std::size_t blocks,
                   std::size_t block_bytes, std::uint64_t timeout_ns, std::string& why) {
    Streams* s = nullptr;
    if (!streams(s, why)) return false;
    *s->checker_result = 0;
    *s->checker_wrong = 0;
    check<<<1, 256, 0, s->checker>>>(q, static_cast<const std::uint8_t*>(destination), signal, blocks, block_bytes,
                                     timeout_ns, s->checker_result, s->checker_wrong);
    return ok(cudaGetLastError(), "launch(check)", why);
}

bool finish_checker(std::uint32_t& wait_result, std::uint64_t& wrong, std::string& why) {
    Streams* s = nullptr;
    if (!streams(s, why) || !ok(cudaStreamSynchronize(s->checker), "cudaStreamSynchronize(check)", why)) return false;
    wait_result = *s->checker_result;
    wrong = *s->checker_wrong;
    return true;
}

bool copy_on_gpu(void* destination, const void* source, std::size_t bytes, std::string& why) {
    Streams* s = nullptr;
    return streams(s, why) &&
           ok(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, s->copies), "cudaMemcpyAsync",
              why) &&
           ok(cudaStreamSynchronize(s->copies), "cudaStreamSynchronize(copies)", why);
}

bool store_on_gpu(std::uint64_t* word, std::uint64_t value, std::string& why) {
    Streams* s = nullptr;
    if (!streams(s, why)) return false;
    *s->word = value;
    return ok(cudaMemcpyAsync(word, s->word, sizeof value, cudaMemcpyHostToDevice, s->copies), "cudaMemcpyAsync",
              why) &&
           ok(cudaStreamSynchronize(s->copies), "cudaStreamSynchronize(copies)", why);
}

} // namespace example
