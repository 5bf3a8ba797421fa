// The GPU half's kernels of 08_gpu_all_to_all (the header says what they do).
#include "08_gpu_all_to_all_kernels.hpp"

#include <gpuverbs/device_queue/device.cuh>

#include <cuda_runtime.h>

namespace example {

namespace {

namespace dq = gpuverbs::device_queue;
namespace dev = gpuverbs::device;

/// Rank blockIdx.x: dispatch its tokens, wait for its inputs, the experts' work, combine, check, each round.
__global__ void rank_kernel(const RankMemory* ranks, Shape s, const std::uint32_t* owner, const std::uint32_t* index,
                            const std::uint32_t* count, std::uint32_t* worst, unsigned long long* wrong) {
    const std::uint32_t me = blockIdx.x;
    const RankMemory m = ranks[me];
    const std::uint32_t n = s.ranks;
    const std::uint32_t tokens = s.tokens;
    const std::size_t row = s.row;
    const std::uint32_t peer = threadIdx.x; // threads below n speak for one peer each (signals, waits)
    auto note = [&](dq::WaitResult r) {
        if (r != dq::WaitResult::done) atomicMax(&worst[me], static_cast<std::uint32_t>(r));
    };
    unsigned long long bad = 0;
    for (std::uint32_t round = 0; round < s.rounds; ++round) {
        for (std::size_t at = threadIdx.x; at < tokens * row; at += blockDim.x) {
            m.tokens[at] = pattern(me, static_cast<std::uint32_t>(at / row), at % row, round);
        }
        __threadfence_system(); // every thread's bytes before any put of them (the puts skip their own fence)
        __syncthreads();
        // Dispatch: each token's row to its expert's rank (a copy when that is this rank).
        for (std::uint32_t t = threadIdx.x; t < tokens; t += blockDim.x) {
            const std::uint32_t to = owner[me * tokens + t];
            const std::size_t at = (std::size_t{me} * tokens + index[me * tokens + t]) * row;
            if (to == me) {
                for (std::size_t i = 0; i < row; ++i) m.inbox[at + i] = m.tokens[t * row + i];
            } else {
                note(dev::put(m.queue, static_cast<std::uint16_t>(to), inbox_window, at, tokens_window, t * row, row,
                              s.timeout_ns, true));
            }
        }
        __syncthreads(); // every put in the ring before the signals: the NIC performs them in order
        if (peer < n && peer != me) {
            note(dev::signal(m.queue, static_cast<std::uint16_t>(peer), signals_window, std::uint64_t{me} * 8,
                             (round + 1) * std::uint64_t{count[me * n + peer]}, dq::SignalOp::set, s.timeout_ns));
            note(dev::wait_signal(m.queue, &m.signals[peer], (round + 1) * std::uint64_t{count[peer * n + me]},
                                  s.timeout_ns));
        }
        __syncthreads();
        // The experts: every row that came here, checked, + 1 into the outbox.
        for (std::uint32_t from = 0; from < n; ++from) {
            for (std::uint32_t t = threadIdx.x; t < tokens; t += blockDim.x) {
                if (owner[from * tokens + t] != me) continue;
                const std::size_t at = (std::size_t{from} * tokens + index[from * tokens + t]) * row;
                for (std::size_t i = 0; i < row; ++i) {
                    bad += m.inbox[at + i] != pattern(from, t, i, round) ? 1 : 0;
                    m.outbox[at + i] = static_cast<std::uint8_t>(m.inbox[at + i] + 1);
                }
            }
        }
        __threadfence_system();
        __syncthreads();
        // Combine: every processed row back to the rank its token came from, at the token's place.
        for (std::uint32_t from = 0; from < n; ++from) {
            for (std::uint32_t k = threadIdx.x; k < tokens; k += blockDim.x) {
                if (owner[from * tokens + k] != me) continue;
                const std::size_t at = (std::size_t{from} * tokens + index[from * tokens + k]) * row;
                if (from == me) {
                    for (std::size_t i = 0; i < row; ++i) m.results[k * row + i] = m.outbox[at + i];
                } else {
                    note(dev::put(m.queue, static_cast<std::uint16_t>(from), results_window, k * row, outbox_window,
                                  at, row, s.timeout_ns, true));
                }
            }
        }
        __syncthreads();
        if (peer < n && peer != me) {
            note(dev::signal(m.queue, static_cast<std::uint16_t>(peer), signals_window, std::uint64_t{n + me} * 8,
                             (round + 1) * std::uint64_t{count[peer * n + me]}, dq::SignalOp::set, s.timeout_ns));
            note(dev::wait_signal(m.queue, &m.signals[n + peer], (round + 1) * std::uint64_t{count[me * n + peer]},
                                  s.timeout_ns));
        }
        __syncthreads();
        for (std::size_t at = threadIdx.x; at < tokens * row; at += blockDim.x) {
            const auto t = static_cast<std::uint32_t>(at / row);
            bad += m.results[at] != static_cast<std::uint8_t>(pattern(me, t, at % row, round) + 1) ? 1 : 0;
        }
        // The next round rewrites the tokens and the outbox: what was posted from them must be done.
        if (threadIdx.x == 0) note(dev::quiet(m.queue, s.timeout_ns));
        __syncthreads();
    }
    atomicAdd(&wrong[me], bad);
}

bool ok(cudaError_t e, const char* what, std::string& why) {
    if (e == cudaSuccess) return true;
    why = std::string(what) + ": " + cudaGetErrorString(e);
    return false;
}

/// What the launch keeps: its stream, the tables and results in GPU memory, a stream for the host's copies.
struct Launch {
    cudaStream_t ranks = nullptr, copies = nullptr;
    RankMemory* memory = nullptr;
    std::uint32_t *owner = nullptr, *index = nullptr, *count = nullptr, *worst = nullptr;
    unsigned long long* wrong = nullptr;
    std::uint64_t* word = nullptr; // a signal's value, pinned for its copy
    std::uint32_t n = 0;
};
Launch launch;

template <class T>
bool to_gpu(T*& out, const std::vector<T>& values, std::string& why) {
    return ok(cudaMalloc(&out, values.size() * sizeof(T)), "cudaMalloc", why) &&
           ok(cudaMemcpy(out, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", why);
}

} // namespace

bool start_ranks(const std::vector<RankMemory>& ranks, const Shape& shape, const std::vector<std::uint32_t>& owner,
                 const std::vector<std::uint32_t>& index, const std::vector<std::uint32_t>& count, std::string& why) {
    launch.n = shape.ranks;
    const std::vector<std::uint32_t> zeros(shape.ranks, 0);
    const std::vector<unsigned long long> none(shape.ranks, 0);
    cudaFuncAttributes attributes{}; // loaded now (CUDA loads modules lazily: a launch could wait for a copy)
    if (!ok(cudaFuncGetAttributes(&attributes, rank_kernel), "cudaFuncGetAttributes", why) ||
        !ok(cudaStreamCreateWithFlags(&launch.ranks, cudaStreamNonBlocking), "cudaStreamCreate", why) ||
        !ok(cudaStreamCreateWithFlags(&launch.copies, cudaStreamNonBlocking), "cudaStreamCreate", why) ||
        !ok(cudaMallocHost(&launch.word, sizeof(std::uint64_t)), "cudaMallocHost", why) ||
        !to_gpu(launch.memory, ranks, why) || !to_gpu(launch.owner, owner, why) || !to_gpu(launch.index, index, why) ||
        !to_gpu(launch.count, count, why) || !to_gpu(launch.worst, zeros, why) || !to_gpu(launch.wrong, none, why)) {
        return false;
    }
    rank_kernel<<<shape.ranks, 256, 0, launch.ranks>>>(launch.memory, shape, launch.owner, launch.index, launch.count,
                                                       launch.worst, launch.wrong);
    return ok(cudaGetLastError(), "launch(rank_kernel)", why);
}

bool ranks_running(bool& running, std::string& why) {
    const cudaError_t e = cudaStreamQuery(launch.ranks);
    running = e == cudaErrorNotReady;
    return running || ok(e, "cudaStreamQuery(ranks)", why);
}

bool finish_ranks(std::vector<std::uint32_t>& worst, std::vector<unsigned long long>& wrong, std::string& why) {
    worst.assign(launch.n, 0);
    wrong.assign(launch.n, 0);
    return ok(cudaStreamSynchronize(launch.ranks), "cudaStreamSynchronize(ranks)", why) &&
           ok(cudaMemcpy(worst.data(), launch.worst, launch.n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
              "cudaMemcpy", why) &&
           ok(cudaMemcpy(wrong.data(), launch.wrong, launch.n * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
              "cudaMemcpy", why);
}

bool copy_on_gpu(void* destination, const void* source, std::size_t bytes, std::string& why) {
    return ok(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, launch.copies), "cudaMemcpyAsync",
              why) &&
           ok(cudaStreamSynchronize(launch.copies), "cudaStreamSynchronize(copies)", why);
}

bool store_on_gpu(std::uint64_t* word, std::uint64_t value, std::string& why) {
    *launch.word = value;
    return ok(cudaMemcpyAsync(word, launch.word, sizeof value, cudaMemcpyHostToDevice, launch.copies),
              "cudaMemcpyAsync", why) &&
           ok(cudaStreamSynchronize(launch.copies), "cudaStreamSynchronize(copies)", why);
}

} // namespace example
