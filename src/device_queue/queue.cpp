// DeviceQueue (include/gpuverbs/device_queue/queue.hpp): the ring's memory,
// from the CUDA driver (loaded at run time, as everywhere in gpuverbs) or
// from the heap.
#include "gpuverbs/device_queue/queue.hpp"

#include "gpu/cuda/driver_api.hpp"

#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace gpuverbs {

namespace dq = device_queue;
using detail::Status;

namespace {

bool capacity_ok(std::uint32_t log2_capacity, const char* verb, Status& status) {
    if (log2_capacity <= dq::max_log2_capacity) return true;
    status.fail(make_error_code(errc::invalid_argument), verb,
                "a device queue holds 2^0 to 2^" + std::to_string(dq::max_log2_capacity) + " slots; 2^" +
                    std::to_string(log2_capacity) + " asked");
    return false;
}

} // namespace

struct DeviceQueue::State {
    // A host queue: the heap, 64-byte aligned.
    std::byte* heap = nullptr;
    std::size_t heap_bytes = 0;
    dq::ProducerWords* heap_producer = nullptr;
#if GPUVERBS_HAVE_CUDA
    const detail::cuda::DriverApi* cu = nullptr;
    detail::cuda::PrimaryContext context;
    void* pinned = nullptr;
    CUdeviceptr producer = 0;
    /// Where fail() copies the error word into the producers' (GPU memory):
    /// a stream that does not wait for the kernels on the legacy stream, so
    /// the copy lands while they run (and wait on it).
    CUstream errors = nullptr;
    struct ErrorCopy : dq::ProducerErrorSink {
        State* state = nullptr;
    } error_copy;
    static void copy_error(const dq::ProducerErrorSink& sink, std::uint32_t /*error*/) noexcept {
        const State& s = *static_cast<const ErrorCopy&>(sink).state;
        detail::cuda::PrimaryContext::Scope scope(*s.cu, s.context.get());
        // From the proxy's error word (pinned: the copy engine reads it), which fail() wrote first.
        auto* const words = static_cast<dq::ProxyWords*>(
            static_cast<void*>(static_cast<std::byte*>(s.pinned) + dq::proxy_offset(s.log2_capacity)));
        if (s.cu->cuMemcpyHtoDAsync(s.producer + offsetof(dq::ProducerWords, error), &words->error, sizeof words->error,
                                    s.errors) != CUDA_SUCCESS) {
            return;
        }
        // Waited for up to a millisecond: it lands in microseconds, so a kernel started after fail() sees it;
        // one queued behind other streams' work (streams sharing a hardware queue) does not hold the proxy's
        // thread longer (waiting tickets read the host word themselves).
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
        while (s.cu->cuStreamQuery(s.errors) == CUDA_ERROR_NOT_READY && std::chrono::steady_clock::now() < give_up) {
        }
    }
    std::uint32_t log2_capacity = 0;
#endif
    State() = default;
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
        if (heap != nullptr) ::operator delete (heap, std::align_val_t{dq::host_alignment});
        delete heap_producer;
#if GPUVERBS_HAVE_CUDA
        if (cu != nullptr && context) {
            detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
            if (errors != nullptr) {
                (void)cu->cuStreamSynchronize(errors); // a copy in flight reads and writes what is freed below
                (void)cu->cuStreamDestroy(errors);
            }
            if (pinned != nullptr) (void)cu->cuMemFreeHost(pinned);
            if (producer != 0) (void)cu->cuMemFree(producer);
        }
#endif
    }
};

DeviceQueue::DeviceQueue() noexcept = default;
DeviceQueue::DeviceQueue(DeviceQueue&&) noexcept = default;
DeviceQueue& DeviceQueue::operator=(DeviceQueue&&) noexcept = default;
DeviceQueue::~DeviceQueue() = default;

DeviceQueue DeviceQueue::on_host(std::uint32_t log2_capacity) {
    Status status;
    if (!capacity_ok(log2_capacity, "DeviceQueue::on_host", status)) status.raise();
    DeviceQueue q;
    q.state_ = std::make_unique<State>();
    State& s = *q.state_;
    s.heap_bytes = dq::host_bytes(log2_capacity);
    s.heap = static_cast<std::byte*>(::operator new (s.heap_bytes, std::align_val_t{dq::host_alignment}));
    std::memset(s.heap, 0, s.heap_bytes);
    s.heap_producer = new dq::ProducerWords{};
    q.view_ = dq::layout(s.heap, s.heap_producer, log2_capacity);
    q.proxy_view_ = q.view_;
    return q;
}

DeviceQueue DeviceQueue::on_gpu_impl(int gpu, std::uint32_t log2_capacity, Status& status) {
    DeviceQueue q;
    if (!capacity_ok(log2_capacity, "DeviceQueue::on_gpu", status)) return q;
#if GPUVERBS_HAVE_CUDA
    const detail::cuda::DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr) return q;
    int count = 0;
    (void)cu->cuDeviceGetCount(&count);
    CUdevice device = 0;
    if (gpu < 0 || gpu >= count || cu->cuDeviceGet(&device, gpu) != CUDA_SUCCESS) {
        status.fail(make_error_code(errc::invalid_argument), "DeviceQueue::on_gpu",
                    "there is no CUDA device " + std::to_string(gpu) + " (" + std::to_string(count) + " visible)");
        return q;
    }
    int can_map = 0;
    int unified = 0;
    (void)cu->cuDeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, device);
    (void)cu->cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, device);
    if (can_map == 0 || unified == 0) {
        status.fail(make_error_code(errc::unsupported), "DeviceQueue::on_gpu",
                    "CUDA device " + std::to_string(gpu) +
                        " cannot map pinned host memory, where a device queue's slots live (CAN_MAP_HOST_MEMORY " +
                        std::to_string(can_map) + ", UNIFIED_ADDRESSING " + std::to_string(unified) + ")");
        return q;
    }
    q.state_ = std::make_unique<State>();
    State& s = *q.state_;
    s.cu = cu;
    s.context = detail::cuda::PrimaryContext(*cu, gpu, status);
    if (!s.context) return DeviceQueue();
    detail::cuda::PrimaryContext::Scope scope(*cu, s.context.get());
    const std::size_t bytes = dq::host_bytes(log2_capacity);
    // Mapped into every context's address space (portable), and into this GPU's.
    if (detail::cuda::failed(cu->cuMemHostAlloc(&s.pinned, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
                             "cuMemHostAlloc", "cannot pin " + std::to_string(bytes) + " bytes for a device queue",
                             status)) {
        s.pinned = nullptr;
        return DeviceQueue();
    }
    std::memset(s.pinned, 0, bytes);
    CUdeviceptr mapped = 0;
    if (detail::cuda::failed(cu->cuMemHostGetDevicePointer(&mapped, s.pinned, 0), "cuMemHostGetDevicePointer",
                             "the device queue's slots have no GPU address", status) ||
        detail::cuda::failed(cu->cuMemAlloc(&s.producer, sizeof(dq::ProducerWords)), "cuMemAlloc",
                             "cannot allocate the device queue's producer words in GPU memory", status) ||
        detail::cuda::failed(cu->cuMemsetD8(s.producer, 0, sizeof(dq::ProducerWords)), "cuMemsetD8",
                             "cannot clear the device queue's producer words", status) ||
        detail::cuda::failed(cu->cuStreamCreate(&s.errors, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                             "cannot create the stream that carries the device queue's error to its producers",
                             status)) {
        return DeviceQueue();
    }
    s.log2_capacity = log2_capacity;
    s.error_copy.write = &State::copy_error;
    s.error_copy.state = &s;
    q.proxy_view_ = dq::layout(s.pinned, nullptr, log2_capacity); // the producers' words are GPU memory
    q.proxy_view_.producer_error = &s.error_copy;
    // GPU addresses, as the driver API gives them: integers.
    void* const slots = reinterpret_cast<void*>(mapped);                     // NOLINT(performance-no-int-to-ptr)
    auto* const producer = reinterpret_cast<dq::ProducerWords*>(s.producer); // NOLINT(performance-no-int-to-ptr)
    q.view_ = dq::layout(slots, producer, log2_capacity);
    q.gpu_ = gpu;
    return q;
#else
    (void)gpu;
    (void)detail::cuda::driver_api(status); // says "built without CUDA"
    return q;
#endif
}

DeviceQueue DeviceQueue::on_gpu(int gpu, std::uint32_t log2_capacity) {
    return detail::or_throw([&](Status& s) { return on_gpu_impl(gpu, log2_capacity, s); });
}

DeviceQueue DeviceQueue::on_gpu(int gpu, std::uint32_t log2_capacity, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return on_gpu_impl(gpu, log2_capacity, s); });
}

DeviceQueue DeviceQueue::on_gpu(int gpu, std::uint32_t log2_capacity, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](Status& s) { return on_gpu_impl(gpu, log2_capacity, s); });
}

} // namespace gpuverbs
