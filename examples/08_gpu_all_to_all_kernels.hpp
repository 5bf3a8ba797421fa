// The GPU half of 08_gpu_all_to_all (08_gpu_all_to_all_kernels.cu, compiled
// by nvcc): N ranks' kernels on one GPU, one thread block per rank, each
// pushing its dispatch and combine through its own device queue, while the
// host plays the NIC (it takes each request and does the copy a NIC would).
// What the host compiler reads too: the windows, the bytes, the launch.
#pragma once

#include <gpuverbs/device_queue/ring.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace example {

/// The windows, as the kernels name them (the NIC half's too).
enum Window : std::uint16_t {
    tokens_window = 1,
    inbox_window = 2,
    results_window = 3,
    outbox_window = 4,
    signals_window = 5
};

/// Byte i of token t of rank r in a round.
GPUVERBS_HOST_DEVICE constexpr std::uint8_t pattern(std::uint32_t r, std::uint32_t t, std::size_t i,
                                                    std::uint32_t round) {
    return static_cast<std::uint8_t>((std::size_t{r} * 131 + std::size_t{t} * 31 + i + std::size_t{round} * 7) % 251);
}

/// One rank's queue (its kernel's view) and memory, all in GPU memory: the
/// tokens, the inbox (every source's rows), the results (rows back from the
/// experts), the experts' outbox, and 2 × ranks signal words.
struct RankMemory {
    gpuverbs::device_queue::QueueView queue;
    std::uint8_t* tokens = nullptr;
    std::uint8_t* inbox = nullptr;
    std::uint8_t* results = nullptr;
    std::uint8_t* outbox = nullptr;
    std::uint64_t* signals = nullptr;
};

struct Shape {
    std::uint32_t ranks = 4;
    std::uint32_t tokens = 512;
    std::size_t row = 1024;
    std::uint32_t rounds = 1;
    std::uint64_t timeout_ns = 0; ///< every push and wait
};

/// Starts every rank's kernel (one block each) on a stream of its own. The
/// routes: owner and index of each (rank, token), count of each (from, to).
bool start_ranks(const std::vector<RankMemory>& ranks, const Shape& shape, const std::vector<std::uint32_t>& owner,
                 const std::vector<std::uint32_t>& index, const std::vector<std::uint32_t>& count, std::string& why);
/// Whether the kernels are done (without waiting).
bool ranks_running(bool& running, std::string& why);
/// Waits for them: per rank, the worst wait's WaitResult and the bytes not as expected.
bool finish_ranks(std::vector<std::uint32_t>& worst, std::vector<unsigned long long>& wrong, std::string& why);

/// The NIC's part, by the host: a copy in GPU memory, or a signal's 8 bytes
/// stored (a stream of their own, beside the kernels).
bool copy_on_gpu(void* destination, const void* source, std::size_t bytes, std::string& why);
bool store_on_gpu(std::uint64_t* word, std::uint64_t value, std::string& why);

} // namespace example
