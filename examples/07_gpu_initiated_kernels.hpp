// The two kernels of 07_gpu_initiated_put (07_gpu_initiated_kernels.cu,
// compiled by nvcc), behind plain host functions; and what both halves of the
// example agree on (the windows, the bytes), which the host compiler reads too.
#pragma once

#include <gpuverbs/device_queue/ring.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace example {

/// The windows both sides agree on: blocks in window 1, the signal word in window 2.
constexpr std::uint16_t blocks_window = 1;
constexpr std::uint16_t signal_window = 2;

/// Byte i of block k: what the producer writes and the peer expects.
GPUVERBS_HOST_DEVICE constexpr std::uint8_t pattern(std::size_t k, std::size_t i) {
    return static_cast<std::uint8_t>((k * 131 + i * 7 + 5) % 251);
}

/// Starts the producer: one kernel of `blocks` threads (at most 1024). Thread
/// k writes block k of `source` (GPU memory; window 1 at the host) and puts it
/// to peer 0's window 1 at the same offset; then thread 0 signals `blocks`
/// (set, into peer 0's window 2) and waits for quiet. Collect with
/// finish_producer. False with the CUDA error in `why`.
bool start_producer(const gpuverbs::device_queue::QueueView& q, void* source, std::size_t blocks,
                    std::size_t block_bytes, std::uint64_t timeout_ns, std::string& why);
/// Waits for it: the WaitResults of its worst put, the signal and quiet.
bool finish_producer(std::uint32_t results[3], std::string& why);

/// Starts the peer's checker: one kernel waits until the signal word reaches
/// `blocks` (bounded by `timeout_ns`), then checks every byte of `destination`.
bool start_checker(const gpuverbs::device_queue::QueueView& q, const void* destination, std::uint64_t* signal,
                   std::size_t blocks, std::size_t block_bytes, std::uint64_t timeout_ns, std::string& why);
/// Its WaitResult and how many bytes were not as written.
bool finish_checker(std::uint32_t& wait_result, std::uint64_t& wrong, std::string& why);

/// Where no NIC is, the host does what the NIC would: copies `bytes` from GPU
/// memory to GPU memory, or stores a signal's 8 bytes (a stream of its own,
/// so that it runs beside the kernels).
bool copy_on_gpu(void* destination, const void* source, std::size_t bytes, std::string& why);
bool store_on_gpu(std::uint64_t* word, std::uint64_t value, std::string& why);

} // namespace example
