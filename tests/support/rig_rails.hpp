// The rig's two-rail topology for multi-rail transfers: rail 0 rxe0 -> rxe1,
// rail 1 rxe2 -> rxe3 (setup-rxe rails-up), a pool on each side registered
// on both of its devices, every CQ bound to one executor.
#pragma once

#include "gpuverbs/gpuverbs.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <boost/asio/any_io_executor.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

namespace gpuverbs::test {

/// One wire: a queue pair on each side, connected, and each side's pool registered on its device.
struct RailWire {
    Device d0, d1;
    ProtectionDomain pd0, pd1;
    CompletionQueue cq0, cq1;
    MemoryRegion mr0, mr1;
    QueuePair qp0, qp1;
    RailWire(const char* a, const char* b, const boost::asio::any_io_executor& ex, std::span<std::byte> m0,
             std::span<std::byte> m1, std::uint32_t max_send_wr = 128)
        : d0(Device::open(a)),
          d1(Device::open(b)),
          pd0(d0),
          pd1(d1),
          cq0(d0, 1024, ex),
          cq1(d1, 1024, ex),
          mr0(pd0, m0, Access::local_write | Access::remote_write),
          mr1(pd1, m1, Access::local_write | Access::remote_write) {
        QueuePairOptions o;
        o.max_send_wr = max_send_wr;
        // The default transport timeout (14: ~67 ms per try) and retries
        // (6): a dead rail is noticed in about half a second. Shorter
        // ones (12 and 3: 64 ms in all) failed the healthy rail too when
        // the rig's CPUs were loaded (a CI run: acknowledgements late).
        const ConnectOptions c;
        PreparedQueuePair a0(pd0, cq0, cq0, o), b1(pd1, cq1, cq1, o);
        std::tie(qp0, qp1) = connect_advertised(a0, mr0, b1, mr1, c);
    }
};

/// `second` as a transfer over `first`'s regions takes it: its writing queue
/// pair, with the same memory's keys on its own devices.
inline TransferRail second_rail(const RailWire& first, RailWire& second) {
    TransferRail rail{&second.qp0, {}, {}};
    rail.local(first.mr0, second.mr0).remote(first.mr1.remote(), second.mr1.remote());
    return rail;
}

/// Both wires over one pair of pools (m0 on the writing side, m1 on the other).
struct Rails {
    using Wire = RailWire;
    std::vector<std::byte> m0, m1;
    Wire rail0, rail1;
    Rails(const boost::asio::any_io_executor& ex, std::size_t bytes)
        : m0(bytes), m1(bytes), rail0("rxe0", "rxe1", ex, m0, m1), rail1("rxe2", "rxe3", ex, m0, m1) {}
    /// The two rails as a transfer takes them: the plan in rail 0's keys.
    std::vector<TransferRail> spec() { return {TransferRail{&rail0.qp0, {}, {}}, second_rail(rail0, rail1)}; }
};

/// Brings the second wire up (setup-rxe rails-up) until the returned guard
/// goes; nothing, with a message, without the rig's fault injector: the test
/// then has nothing to run.
inline std::optional<Heal> second_wire() {
    if (!faults_available()) {
        MESSAGE("no fault injector (run in the rig): the second wire cannot be made");
        return std::nullopt;
    }
    REQUIRE(fault("rails-up") == 0);
    return std::optional<Heal>(std::in_place, "rails-down");
}

} // namespace gpuverbs::test
