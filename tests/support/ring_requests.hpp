// The requests the device queue's tests push: every field derived from the
// producer and its count, so a reader checks each descriptor's contents and
// each producer's order. One header for the host tests and the GPU kernels
// (nvcc compiles it into tests/gpu/device_queue/ring_kernels.cu).
#pragma once

#include "gpuverbs/device_queue/ring.hpp"

#include <cstdint>

namespace gpuverbs::test {

/// What producer `thread` pushes as its `n`th request (signal_value is `n`).
GPUVERBS_HOST_DEVICE inline device_queue::Request request_of(std::uint32_t thread, std::uint64_t n) {
    device_queue::Request r;
    r.op = static_cast<device_queue::Op>(1 + n % 4);
    r.signal_op = static_cast<device_queue::SignalOp>(n % 2);
    r.peer = static_cast<std::uint16_t>(thread);
    r.src_window = static_cast<std::uint16_t>(n * 3);
    r.dst_window = static_cast<std::uint16_t>(n * 5 + thread);
    r.signal_window = static_cast<std::uint16_t>(n ^ thread);
    r.src_offset = n * 64;
    r.dst_offset = (n << 20) + thread;
    r.bytes = n % 65537;
    r.signal_offset = n * 8;
    r.signal_value = n; // the producer's own count: the reader checks each producer's order by it
    return r;
}

GPUVERBS_HOST_DEVICE inline bool same(const device_queue::Request& a, const device_queue::Request& b) {
    return a.op == b.op && a.signal_op == b.signal_op && a.peer == b.peer && a.src_window == b.src_window &&
           a.dst_window == b.dst_window && a.signal_window == b.signal_window && a.src_offset == b.src_offset &&
           a.dst_offset == b.dst_offset && a.bytes == b.bytes && a.signal_offset == b.signal_offset &&
           a.signal_value == b.signal_value;
}

} // namespace gpuverbs::test
