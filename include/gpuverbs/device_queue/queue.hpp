// The memory of a device queue (ring.hpp), owned: its slots and the proxy's
// words in pinned host memory mapped into a GPU, the producers' words in that
// GPU's memory — or all of it in plain host memory, for CPU producers.
//
//   gpuverbs::DeviceQueue queue = gpuverbs::DeviceQueue::on_gpu(0, 12);   // 4,096 slots
//   my_kernel<<<...>>>(queue.view(), ...);                                // device.cuh's put, signal, quiet…
//   gpuverbs::DeviceQueueProxy proxy(queue.proxy_view(), pd, cq);
//
// Destroy the proxy and let every kernel using the queue end before the
// queue: its memory goes with it.
#pragma once

#include "gpuverbs/device_queue/ring.hpp"
#include "gpuverbs/error.hpp"

#include <cstdint>
#include <memory>
#include <system_error>

namespace gpuverbs {

class DeviceQueue {
public:
    /// Empty (no memory): view() is all null.
    DeviceQueue() noexcept;
    DeviceQueue(DeviceQueue&&) noexcept;
    DeviceQueue& operator=(DeviceQueue&&) noexcept;
    DeviceQueue(const DeviceQueue&) = delete;
    DeviceQueue& operator=(const DeviceQueue&) = delete;
    ~DeviceQueue();

    /// 2^log2_capacity slots (2^0 to 2^20: device_queue::max_log2_capacity;
    /// any size serves any number of producers, in ticket order) for kernels
    /// on CUDA device `gpu`. The queue's memory starts zeroed: no descriptor,
    /// no credit, no error, nothing cancelled.
    /// Throws gpuverbs::Error: errc::invalid_argument for a capacity out of
    /// range; built_without_cuda, no_gpu_driver, no_gpu or cuda_error (the
    /// driver's words) from CUDA; errc::unsupported for a GPU that cannot map
    /// pinned host memory, where the slots live.
    static DeviceQueue on_gpu(int gpu, std::uint32_t log2_capacity);
    static DeviceQueue on_gpu(int gpu, std::uint32_t log2_capacity, std::error_code& ec);
    static DeviceQueue on_gpu(int gpu, std::uint32_t log2_capacity, std::error_code& ec, Diagnostics& diagnostics);
    /// The same in ordinary host memory, for producers on CPU threads (and
    /// the rig, where no GPU is). Throws errc::invalid_argument for a
    /// capacity out of range.
    static DeviceQueue on_host(std::uint32_t log2_capacity);

    explicit operator bool() const noexcept { return state_ != nullptr; }
    /// What producers take, by value: GPU addresses for a GPU queue.
    [[nodiscard]] const device_queue::QueueView& view() const noexcept { return view_; }
    /// What the proxy reads: host addresses (the producers' words are the
    /// producers' own: null here for a GPU queue).
    [[nodiscard]] const device_queue::QueueView& proxy_view() const noexcept { return proxy_view_; }
    /// The GPU the queue is mapped into; -1 for a host queue.
    [[nodiscard]] int gpu() const noexcept { return gpu_; }

private:
    struct State;
    static DeviceQueue on_gpu_impl(int gpu, std::uint32_t log2_capacity, detail::Status& status);
    std::unique_ptr<State> state_;
    device_queue::QueueView view_{};
    device_queue::QueueView proxy_view_{};
    int gpu_ = -1;
};

} // namespace gpuverbs
