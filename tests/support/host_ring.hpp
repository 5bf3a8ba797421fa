// A device queue's ring in plain host memory, as a CPU producer uses it (the
// unit tests of the ring, and the proxy's tests in the rig, where a CPU
// thread plays the kernel through the same header).
#pragma once

#include "gpuverbs/device_queue/ring.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpuverbs::test {

struct HostRing {
    explicit HostRing(std::uint32_t log2_capacity)
        : slots(std::size_t{1} << log2_capacity),
          producer(std::make_unique<device_queue::ProducerWords>()),
          proxy(std::make_unique<device_queue::ProxyWords>()) {
        view.slots = slots.data();
        view.producer = producer.get();
        view.proxy = proxy.get();
        view.log2_capacity = log2_capacity;
    }
    std::vector<device_queue::Descriptor> slots;
    std::unique_ptr<device_queue::ProducerWords> producer;
    std::unique_ptr<device_queue::ProxyWords> proxy;
    device_queue::QueueView view;
};

/// A deadline `d` from now on the ring's host clock.
inline std::uint64_t ring_deadline(std::chrono::nanoseconds d) {
    return device_queue::detail::now_ns() + static_cast<std::uint64_t>(d.count());
}

} // namespace gpuverbs::test
