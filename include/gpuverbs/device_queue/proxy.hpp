// The device queue's host proxy (issue 37, the NIC half): it drains a ring
// (ring.hpp) that a kernel — or, in the rig's tests, a CPU thread — pushes
// requests into, and posts them on queue pairs: a batch of descriptors for one
// peer becomes one chain (one doorbell). It returns a request's credit only
// once its RDMA operation completed (the source may be reused then), and owns
// every bound: a request the NIC does not complete within
// `request_timeout` fails the queue (QueueError::peer_failed), which every
// producer's wait reads.
//
//   gpuverbs::DeviceQueueProxy proxy(ring, pd, cq);
//   proxy.add_window(1, source_region);                      // what puts read
//   proxy.add_peer(0, qp, {{1, their_blocks}, {2, their_signals}});
//   while (running) proxy.progress();                        // a thread of its own, or an Asio loop
//
// Lifetimes: the ring's memory, the windows' regions, the peers' queue pairs
// and the CQ must outlive the proxy. Thread safety: one thread at a time calls
// its members (progress() included; the rig's tests run it on a thread of its
// own under TSan); producers push from any thread, through the ring alone.
//
// Not yet (see docs/gpu-initiated.md): several rails per peer with failover,
// the Prometheus text, an Asio-driven form.
#pragma once

#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/device_queue/ring.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpuverbs {

struct DeviceQueueProxyOptions {
    /// Descriptors taken in one progress() call (one chain per peer among them).
    std::uint32_t batch = 32;
    /// A request the NIC has not completed by then fails the queue: the bound
    /// the proxy keeps even where the provider never delivers a completion.
    std::chrono::milliseconds request_timeout{5000};
};

/// What the proxy did (monotonic counts).
struct DeviceQueueProxyCounters {
    std::uint64_t descriptors = 0; ///< taken from the ring
    std::uint64_t chains = 0;      ///< ibv_post_send calls (doorbells)
    std::uint64_t requests = 0;    ///< work requests posted (a put_signal is two)
    std::uint64_t completed = 0;   ///< descriptors completed (their credit returned)
    std::uint64_t queue_full = 0;  ///< passes that left descriptors in the ring: a send queue had no room
    std::uint64_t passes = 0;      ///< progress() calls
    std::uint64_t idle_passes = 0; ///< … that found nothing to take and nothing completed
};

/// A peer's windows: id → the peer's memory as its queue pair reaches it.
using RemoteWindows = std::map<std::uint16_t, RemoteMemory>;

class DeviceQueueProxy {
public:
    /// Reads `queue` (its host pointers: slots and the proxy's words). Signals
    /// that add go as fetch-and-add into a scratch word registered in `pd`;
    /// `cq` is the send CQ of every peer's queue pair (the proxy polls it).
    DeviceQueueProxy(const device_queue::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                     const DeviceQueueProxyOptions& options = {});
    DeviceQueueProxy(const DeviceQueueProxy&) = delete;
    DeviceQueueProxy& operator=(const DeviceQueueProxy&) = delete;
    /// Closes the queue (producers' waits end queue_closed).
    ~DeviceQueueProxy();

    /// A local window that puts read from.
    void add_window(std::uint16_t id, const MemoryRegion& region);
    /// A peer, its queue pair (with max_inline_data >= 8 for signals that set)
    /// and its windows: puts write into them, signals land in them.
    void add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows);

    /// One pass, never blocking: reaps completions and returns credits in
    /// order, fails the queue on a failed completion or a request past its
    /// timeout, then takes up to `batch` descriptors and posts them. The
    /// number of descriptors taken.
    std::size_t progress();

    /// Ends the queue: every producer's wait ends queue_closed.
    void close() noexcept;

    [[nodiscard]] const DeviceQueueProxyCounters& counters() const noexcept { return counters_; }
    /// Why the queue failed, in words (empty while it works).
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    struct Peer {
        QueuePair* qp = nullptr;
        std::vector<std::optional<RemoteMemory>> windows; ///< by id (ids are small)
        bool fence_next = false;
        [[nodiscard]] const RemoteMemory* window(std::uint16_t id) const noexcept;
    };
    [[nodiscard]] Peer* peer(std::uint16_t id) noexcept;
    [[nodiscard]] const MemoryRegion* window(std::uint16_t id) const noexcept;
    void reap();
    void fail(device_queue::QueueError error, std::string words) noexcept;
    /// Takes up to `batch` descriptors and posts them, a chain per run of one
    /// peer's; false when the queue failed.
    bool take_and_post();
    /// The complete descriptor `ahead` after the next (a corrupt next one fails the queue).
    bool peek(device_queue::Request& r, std::uint64_t ahead);
    /// Adds the requests of `r` to `chain` and takes it, its last signaled when
    /// `covers` (the descriptors its completion covers) is not 0; false when
    /// refused (the queue failed).
    bool add(const device_queue::Request& r, Peer& to, SendBatch& chain, std::uint64_t covers);

    device_queue::QueueView queue_;
    device_queue::RingReader reader_;
    DeviceQueueProxyOptions options_;
    CompletionQueue* cq_;
    std::vector<std::uint64_t> scratch_;
    MemoryRegion scratch_region_;
    std::vector<const MemoryRegion*> windows_; ///< by id
    std::vector<Peer> peers_;                  ///< by id; qp null: none
    /// Per slot: completed (1) or not, when posted, and to which peer.
    std::vector<std::uint8_t> done_;
    std::vector<std::chrono::steady_clock::time_point> posted_;
    std::vector<std::uint16_t> peer_of_;
    std::uint64_t credit_ = 0;
    /// The last look-ahead's descriptor (complete, at looked_at_): a complete
    /// descriptor never changes until its slot's credit returns.
    device_queue::Request look_{};
    std::uint64_t looked_at_ = 0;
    bool looked_ahead_ = false;
    std::chrono::steady_clock::time_point now_{}; ///< read once per pass
    bool failed_ = false;
    std::string failure_;
    DeviceQueueProxyCounters counters_;
};

} // namespace gpuverbs
