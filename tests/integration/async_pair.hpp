// Two queue pairs connected over the rig's wire with their CQs bound to an
// executor (the asynchronous suites' fixture; connected_pair.hpp is the
// synchronous one), and the completion modes those suites run in.
#pragma once

#include "gpuverbs/gpuverbs.hpp"
#include "rig.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace gpuverbs::test {

struct AsyncSide {
    Device device;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::vector<std::byte> memory;
    MemoryRegion mr;
    PreparedQueuePair prepared;
    QueuePair qp;
    AsyncSide(const std::string& name, const boost::asio::any_io_executor& ex, const AsyncOptions& mode,
              std::size_t bytes, const QueuePairOptions& options)
        : device(Device::open(name)),
          pd(device),
          cq(device, 4096, ex, mode),
          memory(bytes),
          mr(pd, memory, access_all),
          prepared(pd, cq, cq, test_qp_options(options)) {}
};

struct AsyncPair {
    AsyncSide a, b;
    AsyncPair(const boost::asio::any_io_executor& ex, const AsyncOptions& mode, std::size_t bytes = 1 << 20,
              const QueuePairOptions& options = {}, const ConnectOptions& connect = {})
        : a(rig_devices()->dev0, ex, mode, bytes, options), b(rig_devices()->dev1, ex, mode, bytes, options) {
        Endpoint ea = a.prepared.endpoint(), eb = b.prepared.endpoint();
        (void)a.prepared.advertise(a.mr); // each side's buffer is the other's to read and write
        (void)b.prepared.advertise(b.mr);
        a.qp = std::move(a.prepared).connect(eb, connect);
        b.qp = std::move(b.prepared).connect(ea, connect);
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
inline std::string mode_name(const AsyncOptions& m) {
    return std::string(m.mode == CompletionMode::adaptive ? "adaptive" : "event") +
           (m.single_threaded ? ", single-threaded" : "");
}

} // namespace gpuverbs::test
