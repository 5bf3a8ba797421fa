// Two queue pairs connected over the rig's wire: side a on DEV0, side b on
// DEV1, each with its own device, PD, CQ and a registered buffer.
#pragma once

#include "gpuverbs/gpuverbs.hpp"
#include "rig.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace gpuverbs::test {

struct Side {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::vector<std::byte> memory;
    MemoryRegion mr;
    PreparedQueuePair prepared;
    QueuePair qp;

    Side(const std::string& name, std::size_t bytes, const QueuePairOptions& options)
        : device(Device::open(name)),
          pd(device),
          cq(device, 4096),
          memory(bytes),
          mr(pd, memory, access_all),
          prepared(pd, cq, cq, test_qp_options(options)) {}
};

struct ConnectedPair {
    Side a;
    Side b;

    explicit ConnectedPair(std::size_t bytes = 1 << 20, const QueuePairOptions& options = {},
                           const ConnectOptions& connect = {})
        : a(rig_devices()->dev0, bytes, options), b(rig_devices()->dev1, bytes, options) {
        Endpoint ea = a.prepared.endpoint();
        Endpoint eb = b.prepared.endpoint();
        (void)a.prepared.advertise(a.mr); // each side's buffer is the other's to read and write
        (void)b.prepared.advertise(b.mr);
        a.qp = std::move(a.prepared).connect(eb, connect);
        b.qp = std::move(b.prepared).connect(ea, connect);
    }
};

/// The code of the gpuverbs::Error that `f` throws (none if it throws nothing).
template <class F>
std::error_code thrown_code(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.code();
    }
    return {};
}

/// Polls until `count` completions arrived or `timeout` passed; returns what came.
inline std::vector<Completion> poll_for(CompletionQueue& cq, std::size_t count,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::vector<Completion> out;
    std::array<Completion, 64> batch;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
        std::size_t n = cq.poll(batch);
        out.insert(out.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
    }
    return out;
}

/// A recognisable byte pattern: position and seed mixed.
inline void fill_pattern(std::span<std::byte> bytes, std::uint32_t seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = std::byte((i * 131 + std::size_t{seed} * 7 + (i >> 8)) & 0xff);
}
inline bool has_pattern(std::span<const std::byte> bytes, std::uint32_t seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        if (bytes[i] != std::byte((i * 131 + std::size_t{seed} * 7 + (i >> 8)) & 0xff)) return false;
    }
    return true;
}

} // namespace gpuverbs::test
