// Two queue pairs connected over the rig's wire: side a on DEV0, side b on
// DEV1, each with its own device, PD, CQ and a registered buffer that it
// advertises to the other. The CQs are polled by the test, or bound to an
// executor (the asynchronous suites); the modes those suites run in.
#pragma once

#include "gpuverbs/gpuverbs.hpp"
#include "rig.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

namespace gpuverbs::test {

/// Connects `a` and `b` to each other, each having advertised its region: a
/// queue pair grants its peer what its region allows (ConnectOptions::remote_access aside).
inline std::pair<QueuePair, QueuePair> connect_advertised(PreparedQueuePair& a, const MemoryRegion& a_region,
                                                          PreparedQueuePair& b, const MemoryRegion& b_region,
                                                          const ConnectOptions& options = {}) {
    const Endpoint ea = a.endpoint(), eb = b.endpoint();
    (void)a.advertise(a_region);
    (void)b.advertise(b_region);
    QueuePair qa = std::move(a).connect(eb, options);
    return {std::move(qa), std::move(b).connect(ea, options)};
}

/// One end: `bytes` of memory registered with `access`, and a queue pair
/// prepared (test_qp_options) and not yet connected.
struct Side {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::vector<std::byte> memory;
    MemoryRegion mr;
    PreparedQueuePair prepared;
    QueuePair qp;

    /// A CQ the test polls.
    Side(const std::string& name, std::size_t bytes, const QueuePairOptions& options = {}, Access access = access_all)
        : Side(name, std::nullopt, bytes, options, access) {}
    /// A CQ bound to `executor`, waited for as `mode` says.
    Side(const std::string& name, const boost::asio::any_io_executor& executor, const AsyncOptions& mode,
         std::size_t bytes, const QueuePairOptions& options = {}, Access access = access_all)
        : Side(name, std::pair{executor, mode}, bytes, options, access) {}

private:
    using Binding = std::optional<std::pair<boost::asio::any_io_executor, AsyncOptions>>;
    Side(const std::string& name, const Binding& bound, std::size_t bytes, const QueuePairOptions& options,
         Access access)
        : device(Device::open(name)),
          pd(device),
          cq(bound ? CompletionQueue(device, 4096, bound->first, bound->second) : CompletionQueue(device, 4096)),
          memory(bytes),
          mr(pd, memory, access),
          prepared(pd, cq, cq, test_qp_options(options)) {}
};

/// Both ends, connected: each side's buffer is the other's to use as its
/// registration allows (access_all unless said: read, write and atomics).
struct Pair {
    Side a, b;

    /// CQs the test polls.
    explicit Pair(std::size_t bytes = 1 << 20, const QueuePairOptions& options = {}, const ConnectOptions& connect = {})
        : a(rig_devices()->dev0, bytes, options), b(rig_devices()->dev1, bytes, options) {
        connect_sides(connect);
    }
    /// CQs bound to `executor`, waited for as `mode` says.
    Pair(const boost::asio::any_io_executor& executor, const AsyncOptions& mode, std::size_t bytes = 1 << 20,
         const QueuePairOptions& options = {}, const ConnectOptions& connect = {}, Access access = access_all)
        : a(rig_devices()->dev0, executor, mode, bytes, options, access),
          b(rig_devices()->dev1, executor, mode, bytes, options, access) {
        connect_sides(connect);
    }

private:
    void connect_sides(const ConnectOptions& connect) {
        std::tie(a.qp, b.qp) = connect_advertised(a.prepared, a.mr, b.prepared, b.mr, connect);
    }
};

// Every test whose operations start, complete and end on one thread runs in
// the single-threaded mode too (no lock, no poll guard: a race would show
// under TSan); the tests with a second thread use only the shared modes.
inline constexpr AsyncOptions shared_modes[] = {{CompletionMode::event_driven, {}},
                                                {CompletionMode::adaptive, std::chrono::microseconds(50)}};
inline constexpr AsyncOptions modes[] = {{CompletionMode::event_driven, {}},
                                         {CompletionMode::adaptive, std::chrono::microseconds(50)},
                                         {CompletionMode::event_driven, {}, true},
                                         {CompletionMode::adaptive, std::chrono::microseconds(50), true}};
/// CompletionMode::polled: nothing moves but inside gpuverbs::progress, which
/// run_until calls (the tests that run the io_context themselves use the modes above).
inline constexpr AsyncOptions polled_mode{CompletionMode::polled, {}, true};
inline constexpr AsyncOptions modes_and_polled[] = {modes[0], modes[1], modes[2], modes[3], polled_mode};
inline std::string mode_name(const AsyncOptions& m) {
    const char* name = m.mode == CompletionMode::adaptive ? "adaptive"
                       : m.mode == CompletionMode::polled ? "polled"
                                                          : "event";
    return std::string(name) + (m.single_threaded ? ", single-threaded" : "");
}

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

/// Runs `io` until `done()` or `limit`; how long it took.
template <class Done>
std::chrono::milliseconds run_until(boost::asio::io_context& io, Done&& done, std::chrono::milliseconds limit) {
    const auto t0 = std::chrono::steady_clock::now();
    io.restart();
    while (!done() && std::chrono::steady_clock::now() - t0 < limit) {
        (void)gpuverbs::progress(io); // CQs in CompletionMode::polled move only here
        if (!done()) io.run_for(std::chrono::milliseconds(10));
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
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
