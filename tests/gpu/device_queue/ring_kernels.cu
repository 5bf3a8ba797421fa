// Kernels and CUDA memory of the device queue's GPU half (ring_kernels.hpp says what each does).
#include "ring_kernels.hpp"

#include "gpuverbs/device_queue/device.cuh"

#include <cuda_runtime.h>

#include <cstring>

namespace gpuverbs::test::ring {

namespace {

namespace dq = gpuverbs::device_queue;
using dq::WaitResult;

bool ok(cudaError_t e, const char* what, std::string& why) {
    if (e == cudaSuccess) return true;
    why = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return false;
}

// Device words the kernels report through, allocated once.
unsigned long long* counters = nullptr; ///< [0] failed pushes, [1] single-thread ns
std::uint64_t* trip_push = nullptr;
std::uint64_t* trip_total = nullptr;
std::uint32_t trip_capacity = 0;

bool ensure_counters(std::string& why) {
    if (counters != nullptr) return true;
    return ok(cudaMalloc(&counters, 4 * sizeof(unsigned long long)), "cudaMalloc(counters)", why);
}

constexpr std::uint64_t never = ~std::uint64_t{0} >> 1;

__global__ void produce(QueueView q, std::uint64_t per_thread, std::uint64_t timeout_ns, unsigned long long* failed) {
    const std::uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long longest = 0;
    for (std::uint64_t n = 0; n < per_thread; ++n) {
        const std::uint64_t t0 = dq::detail::now_ns();
        if (gpuverbs::device::push(q, request_of(thread, n), timeout_ns) != WaitResult::done) atomicAdd(failed, 1ULL);
        const unsigned long long took = dq::detail::now_ns() - t0;
        longest = took > longest ? took : longest;
    }
    atomicMax(failed + 2, longest); // the longest push of any thread
}

/// Ways to wait for a credit, compared by the benchmark (0 is the library's quiet_until).
__device__ bool wait_credit(const QueueView& q, std::uint64_t position, std::uint64_t deadline, int mode) {
    if (mode == 0) return dq::quiet_until(q, position, deadline) == WaitResult::done;
    for (;;) {
        std::uint64_t credit = 0;
        std::uint32_t error = 0;
        if (mode == 1) {
            credit = dq::detail::load_acquire(&q.proxy->credit);
            error = dq::detail::load_acquire(&q.proxy->error);
        } else {
            dq::detail::load_credit_and_error(q.proxy, credit, error);
        }
        if (credit > position) {
            if (mode == 5) cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
            return true;
        }
        if (error != 0 || dq::detail::now_ns() >= deadline) return false;
        if (mode == 1 || mode == 2) __nanosleep(64);
        if (mode == 3) __nanosleep(256);
    }
}

__global__ void round_trips(QueueView q, std::uint32_t iterations, int mode, std::uint64_t* push_ns,
                            std::uint64_t* total_ns) {
    for (std::uint32_t i = 0; i < iterations; ++i) {
        std::uint64_t position = 0;
        const std::uint64_t t0 = dq::detail::now_ns();
        const WaitResult got = gpuverbs::device::push(q, request_of(0, i), 1'000'000'000ULL, &position);
        const std::uint64_t t1 = dq::detail::now_ns();
        // A second at most: reported as never, not a hang.
        const bool back = got == WaitResult::done && wait_credit(q, position, t0 + 1'000'000'000ULL, mode);
        const std::uint64_t t2 = dq::detail::now_ns();
        push_ns[i] = t1 - t0;
        total_ns[i] = back ? t2 - t0 : never;
    }
}

__global__ void pushes(QueueView q, std::uint64_t count, bool fenced, unsigned long long* ns,
                       unsigned long long* failed) {
    const std::uint64_t t0 = dq::detail::now_ns();
    for (std::uint64_t n = 0; n < count; ++n) {
        const Request r = request_of(0, n);
        const WaitResult got = fenced ? gpuverbs::device::put(q, r.peer, r.dst_window, r.dst_offset, r.src_window,
                                                              r.src_offset, r.bytes, 1'000'000'000ULL)
                                      : gpuverbs::device::push(q, r, 1'000'000'000ULL);
        if (got != WaitResult::done) atomicAdd(failed, 1ULL);
    }
    *ns = dq::detail::now_ns() - t0;
}

__global__ void waits(QueueView q, std::uint64_t timeout_ns, std::uint64_t* signal, WaitProbe* out) {
    std::uint64_t position = 0;
    out->push_into_free =
        static_cast<std::uint32_t>(gpuverbs::device::push(q, request_of(0, 0), timeout_ns, &position));
    // Fill every other slot: the reader is stopped, so the next push finds none.
    for (std::uint64_t n = 1; n < q.capacity(); ++n) (void)gpuverbs::device::push(q, request_of(0, n), timeout_ns);
    std::uint64_t t0 = dq::detail::now_ns();
    out->push_into_full = static_cast<std::uint32_t>(gpuverbs::device::push(q, request_of(0, 0), timeout_ns));
    out->push_into_full_ns = dq::detail::now_ns() - t0;
    t0 = dq::detail::now_ns();
    out->quiet = static_cast<std::uint32_t>(gpuverbs::device::quiet(q, timeout_ns));
    out->quiet_ns = dq::detail::now_ns() - t0;
    t0 = dq::detail::now_ns();
    out->wait_signal = static_cast<std::uint32_t>(gpuverbs::device::wait_signal(q, signal, 1, timeout_ns));
    out->wait_signal_ns = dq::detail::now_ns() - t0;
}

// The plain ring: slots reinterpret the same memory as PlainSlot.
__device__ inline std::uint64_t plain_push(const QueueView& q, std::uint32_t thread, std::uint64_t n) {
    auto* reserved = reinterpret_cast<unsigned long long*>(&q.producer->reserved);
    const std::uint64_t position = atomicAdd(reserved, 1ULL);
    while (position >= dq::detail::load_acquire(&q.proxy->credit) + q.capacity()) {
    }
    std::uint64_t w[dq::descriptor_words];
    dq::encode(request_of(thread, n), position, q.log2_capacity, w);
    auto* slot = reinterpret_cast<PlainSlot*>(q.slots) + (position & (q.capacity() - 1));
    auto* payload = reinterpret_cast<volatile std::uint64_t*>(slot->payload);
    for (int i = 0; i < 7; ++i) payload[i] = w[i];
    __threadfence_system();
    *reinterpret_cast<volatile std::uint64_t*>(&slot->sequence) = position + 1;
    return position;
}

__global__ void plain_produce(QueueView q, std::uint64_t per_thread) {
    const std::uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
    for (std::uint64_t n = 0; n < per_thread; ++n) (void)plain_push(q, thread, n);
}

__global__ void plain_round_trips(QueueView q, std::uint32_t iterations, std::uint64_t* push_ns,
                                  std::uint64_t* total_ns) {
    for (std::uint32_t i = 0; i < iterations; ++i) {
        const std::uint64_t t0 = dq::detail::now_ns();
        const std::uint64_t position = plain_push(q, 0, i);
        const std::uint64_t t1 = dq::detail::now_ns();
        std::uint64_t t2 = t1;
        while (dq::detail::load_acquire(&q.proxy->credit) <= position) {
            t2 = dq::detail::now_ns();
            if (t2 - t0 > 1'000'000'000ULL) break;
        }
        t2 = dq::detail::now_ns();
        push_ns[i] = t1 - t0;
        total_ns[i] = t2 - t0;
    }
}

/// The floor of a round trip: one GPU thread stores `i` into a host word (slot 0's first word) and spins
/// on another (slot 1's) until the host wrote `i` back. No ring, no fence: a store's flight and a read's.
__global__ void ping_pong(QueueView q, std::uint32_t iterations, std::uint64_t* total_ns) {
    auto* ping = reinterpret_cast<volatile std::uint64_t*>(q.slots[0].word);
    auto* pong = reinterpret_cast<volatile std::uint64_t*>(q.slots[1].word);
    for (std::uint32_t i = 1; i <= iterations; ++i) {
        const std::uint64_t t0 = dq::detail::now_ns();
        *ping = i;
        while (*pong != i) {
        }
        total_ns[i - 1] = dq::detail::now_ns() - t0;
    }
}

__global__ void host_reads(QueueView q, std::uint32_t count, unsigned long long* ns, unsigned long long* sink) {
    auto* words = reinterpret_cast<std::uint64_t*>(&q.proxy->credit); // credit, then the error word: both 0 here
    std::uint64_t v = 0;
    const std::uint64_t t0 = dq::detail::now_ns();
    for (std::uint32_t i = 0; i < count; ++i) v = dq::detail::load_acquire(words + (v & 1));
    *ns = dq::detail::now_ns() - t0;
    *sink = v;
}

__global__ void encode_kernel(std::uint32_t thread, std::uint64_t n, std::uint64_t position,
                              std::uint32_t log2_capacity, std::uint64_t* words) {
    std::uint64_t w[dq::descriptor_words];
    dq::encode(request_of(thread, n), position, log2_capacity, w);
    for (std::size_t i = 0; i < dq::descriptor_words; ++i) words[i] = w[i];
}

} // namespace

DeviceRing::~DeviceRing() {
    if (errors_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(errors_));
    if (host_memory_ != nullptr) (void)cudaFreeHost(host_memory_);
    if (producer_memory_ != nullptr) (void)cudaFree(producer_memory_);
}

bool DeviceRing::create(std::uint32_t log2_capacity, std::string& why) {
    host_bytes_ = dq::host_bytes(log2_capacity);
    if (!ok(cudaHostAlloc(&host_memory_, host_bytes_, cudaHostAllocMapped), "cudaHostAlloc(ring, mapped)", why))
        return false;
    if (!ok(cudaMalloc(&producer_memory_, sizeof(dq::ProducerWords)), "cudaMalloc(producer words)", why)) return false;
    void* mapped = nullptr;
    if (!ok(cudaHostGetDevicePointer(&mapped, host_memory_, 0), "cudaHostGetDevicePointer", why)) return false;
    cudaStream_t errors = nullptr;
    if (!ok(cudaStreamCreateWithFlags(&errors, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", why)) return false;
    errors_ = errors;
    error_copy_.write = &DeviceRing::copy_error;
    error_copy_.ring = this;
    host = dq::layout(host_memory_, nullptr, log2_capacity);
    host.producer_error = &error_copy_;
    device = dq::layout(mapped, static_cast<dq::ProducerWords*>(producer_memory_), log2_capacity);
    return reset(why);
}

void DeviceRing::copy_error(const dq::ProducerErrorSink& sink, std::uint32_t /*error*/) noexcept {
    const DeviceRing& r = *static_cast<const ErrorCopy&>(sink).ring;
    auto* words = static_cast<dq::ProducerWords*>(r.producer_memory_);
    auto stream = static_cast<cudaStream_t>(r.errors_);
    if (cudaMemcpyAsync(&words->error, &r.host.proxy->error, sizeof(std::uint32_t), cudaMemcpyHostToDevice, stream) ==
        cudaSuccess)
        (void)cudaStreamSynchronize(stream);
}

bool DeviceRing::reset(std::string& why) {
    std::memset(host_memory_, 0, host_bytes_);
    return ok(cudaMemset(producer_memory_, 0, sizeof(dq::ProducerWords)), "cudaMemset(producer words)", why) &&
           ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why);
}

bool DeviceRing::producer_words(dq::ProducerWords& out, std::string& why) const {
    return ok(cudaMemcpy(&out, producer_memory_, sizeof out, cudaMemcpyDeviceToHost), "cudaMemcpy(producer words)",
              why);
}

bool producer_words_of(const QueueView& device_view, dq::ProducerWords& out, std::string& why) {
    return ok(cudaMemcpy(&out, device_view.producer, sizeof out, cudaMemcpyDeviceToHost),
              "cudaMemcpy(producer words)", why);
}

bool start_producers(const QueueView& q, int blocks, int threads, std::uint64_t per_thread, std::uint64_t timeout_ns,
                     std::string& why) {
    if (!ensure_counters(why)) return false;
    if (!ok(cudaMemset(counters, 0, 4 * sizeof(unsigned long long)), "cudaMemset(counters)", why)) return false;
    produce<<<blocks, threads>>>(q, per_thread, timeout_ns, counters);
    return ok(cudaGetLastError(), "launch(produce)", why);
}

bool finish(std::uint64_t& failed_pushes, std::string& why) {
    std::uint64_t longest = 0;
    return finish(failed_pushes, longest, why);
}

bool finish(std::uint64_t& failed_pushes, std::uint64_t& longest_push_ns, std::string& why) {
    unsigned long long c[4] = {};
    if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why)) return false;
    if (!ok(cudaMemcpy(c, counters, sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy(counters)", why)) return false;
    failed_pushes = c[0];
    longest_push_ns = c[2];
    return true;
}

static bool size_trips(std::uint32_t iterations, std::string& why) {
    if (trip_capacity >= iterations) return true;
    if (trip_push != nullptr) (void)cudaFree(trip_push);
    if (trip_total != nullptr) (void)cudaFree(trip_total);
    trip_capacity = 0;
    if (!ok(cudaMalloc(&trip_push, iterations * sizeof(std::uint64_t)), "cudaMalloc(push times)", why) ||
        !ok(cudaMalloc(&trip_total, iterations * sizeof(std::uint64_t)), "cudaMalloc(round trips)", why))
        return false;
    trip_capacity = iterations;
    return true;
}

bool start_round_trips(const QueueView& q, std::uint32_t iterations, std::string& why, int wait_mode) {
    if (!size_trips(iterations, why)) return false;
    round_trips<<<1, 1>>>(q, iterations, wait_mode, trip_push, trip_total);
    return ok(cudaGetLastError(), "launch(round_trips)", why);
}

bool finish_round_trips(std::uint64_t* push_ns, std::uint64_t* round_trip_ns, std::uint32_t iterations,
                        std::string& why) {
    return ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why) &&
           ok(cudaMemcpy(push_ns, trip_push, iterations * sizeof(std::uint64_t), cudaMemcpyDeviceToHost),
              "cudaMemcpy(push times)", why) &&
           ok(cudaMemcpy(round_trip_ns, trip_total, iterations * sizeof(std::uint64_t), cudaMemcpyDeviceToHost),
              "cudaMemcpy(round trips)", why);
}

bool start_pushes(const QueueView& q, std::uint64_t count, bool fenced, std::string& why) {
    if (!ensure_counters(why)) return false;
    if (!ok(cudaMemset(counters, 0, 4 * sizeof(unsigned long long)), "cudaMemset(counters)", why)) return false;
    pushes<<<1, 1>>>(q, count, fenced, counters + 1, counters);
    return ok(cudaGetLastError(), "launch(pushes)", why);
}

bool finish_pushes(std::uint64_t& ns, std::string& why) {
    unsigned long long c[4] = {};
    if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why)) return false;
    if (!ok(cudaMemcpy(c, counters, sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy(counters)", why)) return false;
    if (c[0] != 0) {
        why = std::to_string(c[0]) + " pushes did not end done";
        return false;
    }
    ns = c[1];
    return true;
}

bool probe_waits(const QueueView& q, std::uint64_t timeout_ns, WaitProbe& out, std::string& why) {
    std::uint64_t* signal = nullptr;
    WaitProbe* probe = nullptr;
    if (!ok(cudaMalloc(&signal, sizeof *signal), "cudaMalloc(signal)", why)) return false;
    if (!ok(cudaMalloc(&probe, sizeof *probe), "cudaMalloc(probe)", why)) return false;
    bool good = ok(cudaMemset(signal, 0, sizeof *signal), "cudaMemset(signal)", why);
    if (good) {
        waits<<<1, 1>>>(q, timeout_ns, signal, probe);
        good = ok(cudaGetLastError(), "launch(waits)", why) &&
               ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why) &&
               ok(cudaMemcpy(&out, probe, sizeof out, cudaMemcpyDeviceToHost), "cudaMemcpy(probe)", why);
    }
    (void)cudaFree(signal);
    (void)cudaFree(probe);
    return good;
}

bool start_plain_producers(const QueueView& q, int blocks, int threads, std::uint64_t per_thread, std::string& why) {
    plain_produce<<<blocks, threads>>>(q, per_thread);
    return ok(cudaGetLastError(), "launch(plain_produce)", why);
}

bool start_plain_round_trips(const QueueView& q, std::uint32_t iterations, std::string& why) {
    if (!size_trips(iterations, why)) return false;
    plain_round_trips<<<1, 1>>>(q, iterations, trip_push, trip_total);
    return ok(cudaGetLastError(), "launch(plain_round_trips)", why);
}

bool start_ping_pong(const QueueView& q, std::uint32_t iterations, std::string& why) {
    if (!size_trips(iterations, why)) return false;
    ping_pong<<<1, 1>>>(q, iterations, trip_total);
    return ok(cudaGetLastError(), "launch(ping_pong)", why);
}

bool finish_ping_pong(std::uint64_t* round_trip_ns, std::uint32_t iterations, std::string& why) {
    return ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why) &&
           ok(cudaMemcpy(round_trip_ns, trip_total, iterations * sizeof(std::uint64_t), cudaMemcpyDeviceToHost),
              "cudaMemcpy(ping pong)", why);
}

bool time_host_reads(const QueueView& q, std::uint32_t count, std::uint64_t& ns, std::string& why) {
    if (!ensure_counters(why)) return false;
    host_reads<<<1, 1>>>(q, count, counters + 1, counters + 2);
    unsigned long long c[4] = {};
    if (!ok(cudaGetLastError(), "launch(host_reads)", why) ||
        !ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", why) ||
        !ok(cudaMemcpy(c, counters, sizeof c, cudaMemcpyDeviceToHost), "cudaMemcpy(counters)", why))
        return false;
    ns = c[1];
    return true;
}

bool encode_on_gpu(std::uint32_t thread, std::uint64_t n, std::uint64_t position, std::uint32_t log2_capacity,
                   std::uint64_t (&words)[dq::descriptor_words], std::string& why) {
    std::uint64_t* d = nullptr;
    if (!ok(cudaMalloc(&d, sizeof words), "cudaMalloc(words)", why)) return false;
    encode_kernel<<<1, 1>>>(thread, n, position, log2_capacity, d);
    const bool good = ok(cudaGetLastError(), "launch(encode)", why) &&
                      ok(cudaMemcpy(words, d, sizeof words, cudaMemcpyDeviceToHost), "cudaMemcpy(words)", why);
    (void)cudaFree(d);
    return good;
}

} // namespace gpuverbs::test::ring
