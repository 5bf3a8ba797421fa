// The GPU half of the device queue's tests and benchmark (issue 37): kernels
// that push through the real ring (ring_kernels.cu, compiled by nvcc), and the
// CUDA memory they push into, behind plain host functions so that host-compiled
// tests (tests/gpu/device_queue_gpu_test.cpp) and the benchmark
// (benchmarks/device_queue_bench.cpp) drive them.
#pragma once

#include "gpuverbs/device_queue/ring.hpp"
#include "ring_requests.hpp" // request_of, same: what the producers push and the reader checks

#include <cstdint>
#include <string>

namespace gpuverbs::test::ring {

using device_queue::QueueView;
using device_queue::Request;

/// A ring in CUDA memory: slots and the proxy's words in mapped pinned host
/// memory, the producers' words in GPU memory. `device` is what kernels get,
/// `host` what the reader uses (its producer pointer is null).
class DeviceRing {
public:
    DeviceRing() = default;
    DeviceRing(const DeviceRing&) = delete;
    DeviceRing& operator=(const DeviceRing&) = delete;
    ~DeviceRing();
    /// Allocates 2^log2_capacity slots; false with the CUDA error in `why`.
    bool create(std::uint32_t log2_capacity, std::string& why);
    /// Zeroes every word (between runs).
    bool reset(std::string& why);
    /// The producers' words, read back from GPU memory.
    bool producer_words(device_queue::ProducerWords& out, std::string& why) const;
    QueueView device{};
    QueueView host{};

private:
    /// fail()'s copy of the error into the producers' words, as DeviceQueue's: a non-blocking stream.
    struct ErrorCopy : device_queue::ProducerErrorSink {
        DeviceRing* ring = nullptr;
    };
    static void copy_error(const device_queue::ProducerErrorSink& sink, std::uint32_t error) noexcept;
    void* host_memory_ = nullptr;
    void* producer_memory_ = nullptr;
    void* errors_ = nullptr; ///< cudaStream_t
    ErrorCopy error_copy_;
    std::size_t host_bytes_ = 0;
};

/// The producers' words of any queue's kernel view (GPU memory), read back.
bool producer_words_of(const QueueView& device_view, device_queue::ProducerWords& out, std::string& why);

/// Starts `blocks` x `threads` producers, each pushing `per_thread` requests
/// (request_of) with a timeout of `timeout_ns`; counts pushes that did not end
/// done into a device word. Asynchronous: wait with finish().
bool start_producers(const QueueView& q, int blocks, int threads, std::uint64_t per_thread, std::uint64_t timeout_ns,
                     std::string& why);
/// Waits for the last kernel; `failed_pushes` from start_producers' word.
bool finish(std::uint64_t& failed_pushes, std::string& why);
/// … and the longest single push of any producer thread (GPU clock, ns).
bool finish(std::uint64_t& failed_pushes, std::uint64_t& longest_push_ns, std::string& why);

/// One GPU thread: `iterations` times, push one request and spin until its
/// credit comes back. Per iteration, nanoseconds on the GPU's clock: the
/// push alone, and push to credit. Asynchronous: collect with finish_round_trips().
/// `wait_mode` 0 waits with the library's quiet_until; 1-3 are the variants the benchmark compares it with.
bool start_round_trips(const QueueView& q, std::uint32_t iterations, std::string& why, int wait_mode = 0);
bool finish_round_trips(std::uint64_t* push_ns, std::uint64_t* round_trip_ns, std::uint32_t iterations,
                        std::string& why);

/// One GPU thread pushes `count` puts back to back (with the data fence when
/// `fenced`, as gpuverbs::device::put does by default): its own nanoseconds
/// for all of them. Asynchronous: finish_pushes().
bool start_pushes(const QueueView& q, std::uint64_t count, bool fenced, std::string& why);
bool finish_pushes(std::uint64_t& ns, std::string& why);

/// What the waits return when nobody reads: codes and nanoseconds each took.
struct WaitProbe {
    std::uint32_t push_into_free = 0; ///< a push while slots are free
    std::uint32_t push_into_full = 0; ///< a push once every slot is taken (reader stopped)
    std::uint32_t quiet = 0;          ///< quiet with the reader stopped
    std::uint32_t wait_signal = 0;    ///< a signal nobody sends
    std::uint64_t push_into_full_ns = 0;
    std::uint64_t quiet_ns = 0;
    std::uint64_t wait_signal_ns = 0;
};
/// Runs the waits on one GPU thread, each with `timeout_ns`; fills the ring first.
bool probe_waits(const QueueView& q, std::uint64_t timeout_ns, WaitProbe& out, std::string& why);

// --- the plainest ring, as the baseline (issue 37's starting point) ----------------
//
// 64-byte slots in mapped pinned host memory: a 56-byte payload, then a
// sequence word (position + 1) stored after __threadfence_system(); the
// reservation counter in GPU memory (atomicAdd per thread); before each push
// the GPU reads the host's credit word across PCIe. The benchmark runs it
// beside ours, in the same process, on the same memory.
struct PlainSlot {
    std::uint64_t payload[7];
    std::uint64_t sequence;
};
/// Starts `blocks` x `threads` plain producers (request_of's words as payload).
bool start_plain_producers(const QueueView& q, int blocks, int threads, std::uint64_t per_thread, std::string& why);
/// One GPU thread, plain protocol: push, then spin on the host credit; GPU nanoseconds per iteration.
bool start_plain_round_trips(const QueueView& q, std::uint32_t iterations, std::string& why);

/// The floor a push-to-credit round trip is judged against (issue 50): one GPU
/// thread stores a number into host memory (slot 0's first word) and spins
/// until the host stores it back into slot 1's; the host's side is the
/// caller's (answer_pings in the benchmark). Asynchronous: finish_ping_pong().
bool start_ping_pong(const QueueView& q, std::uint32_t iterations, std::string& why);
bool finish_ping_pong(std::uint64_t* round_trip_ns, std::uint32_t iterations, std::string& why);

/// One GPU thread reads the proxy's credit word `count` times, each read's
/// address depending on the last one's value (so they cannot overlap): the
/// nanoseconds of all of them. What a wait for a credit costs at the least.
bool time_host_reads(const QueueView& q, std::uint32_t count, std::uint64_t& ns, std::string& why);

/// The GPU's encoding of request_of(thread, n) at `position`: the eight words nvcc's code writes.
bool encode_on_gpu(std::uint32_t thread, std::uint64_t n, std::uint64_t position, std::uint32_t log2_capacity,
                   std::uint64_t (&words)[device_queue::descriptor_words], std::string& why);

} // namespace gpuverbs::test::ring
