// A device queue's ring in plain host memory, as a CPU producer uses it (the
// unit tests of the ring, and the proxy's tests in the rig, where a CPU
// thread plays the kernel through the same header): host_bytes() laid out by
// layout(), zeroed, and the producers' words apart.
#pragma once

#include "gpuverbs/device_queue/ring.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

namespace gpuverbs::test {

struct HostRing {
    explicit HostRing(std::uint32_t log2_capacity)
        : memory(static_cast<unsigned char*>(::operator new (device_queue::host_bytes(log2_capacity),
                                                             std::align_val_t{device_queue::host_alignment})),
                 Free{}),
          producer(std::make_unique<device_queue::ProducerWords>()) {
        std::memset(memory.get(), 0, device_queue::host_bytes(log2_capacity));
        view = device_queue::layout(memory.get(), producer.get(), log2_capacity);
    }
    struct Free {
        void operator()(unsigned char* p) const noexcept {
            ::operator delete (p, std::align_val_t{device_queue::host_alignment});
        }
    };
    std::unique_ptr<unsigned char, Free> memory;
    std::unique_ptr<device_queue::ProducerWords> producer;
    device_queue::QueueView view;
};

/// A deadline `d` from now on the ring's host clock.
inline std::uint64_t ring_deadline(std::chrono::nanoseconds d) {
    return device_queue::detail::now_ns() + static_cast<std::uint64_t>(d.count());
}

} // namespace gpuverbs::test
