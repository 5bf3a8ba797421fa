// The device queue's host proxy (issue 37, the NIC half): it drains a ring
// (ring.hpp) that a kernel — or, in the rig's tests, a CPU thread — pushes
// requests into, and posts them on queue pairs: a batch of descriptors for one
// peer becomes one chain (one doorbell). It returns a request's credit only
// once its RDMA operation completed (the source may be reused then), and owns
// every bound: a request the NIC does not complete within `request_timeout`
// fails its rail, which every producer's wait reads once no rail is left.
//
//   gpuverbs::DeviceQueueProxy proxy(ring, pd, cq);
//   proxy.add_window(1, source_region);                      // what puts read
//   proxy.add_peer(0, qp, {{1, their_blocks}, {2, their_signals}});
//   proxy.add_device(pd_b, cq_b);                            // a second NIC…
//   proxy.add_window(1, source_region_on_b);                 // … the same memory registered on it
//   proxy.add_rail(0, qp_b, {{1, their_blocks_b}, {2, their_signals_b}}); // takes over if qp fails
//   while (running) proxy.progress();                        // a thread of its own, or async_drive() (drive.hpp)
//
// Failover: a rail whose request fails on the path (retries exhausted, a
// flush, the link down, a refused post) or does not complete in time is put
// in error, and the peer's requests not known to have completed are posted
// again, in order, on its next rail: the producer does not notice. A put
// posted again writes its bytes again, and a signal that sets sets its value
// again; a signal that *adds* cannot be posted twice without risking counting
// it twice, so one in flight on a failed rail ends the queue peer_failed,
// saying so (use set signals where failover must be invisible).
//
// Lifetimes: the ring's memory, the windows' regions, the peers' queue pairs
// and the CQs must outlive the proxy. Thread safety: one thread at a time calls
// its members (progress() included; the rig's tests run it on a thread of its
// own under TSan); producers push from any thread, through the ring alone.
#pragma once

#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/device_queue/ring.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
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
    std::uint64_t descriptors = 0;   ///< taken from the ring
    std::uint64_t chains = 0;        ///< ibv_post_send calls (doorbells)
    std::uint64_t requests = 0;      ///< work requests posted (a put_signal is two)
    std::uint64_t completed = 0;     ///< descriptors completed (their credit returned)
    std::uint64_t queue_full = 0;    ///< passes that left descriptors in the ring: a send queue had no room
    std::uint64_t passes = 0;        ///< progress() calls
    std::uint64_t idle_passes = 0;   ///< … that found nothing to take and nothing completed
    std::uint64_t ring_full = 0;     ///< … that found every slot taken and not completed: producers wait for credit
    std::uint64_t rail_failures = 0; ///< rails found failed (a path error, a refused post, the request timeout)
    std::uint64_t reposted = 0;      ///< descriptors posted again on another rail after theirs failed
    std::uint64_t skipped = 0;       ///< positions whose producer gave up (timed out, or the queue failed)
    /// Chains by descriptors: 1, 2, 3–4, 5–8, 9–16, 17–32, 33–64, more.
    std::array<std::uint64_t, 8> chain_lengths{};
    std::uint64_t chained = 0; ///< descriptors posted in chains (the histogram's sum)
    /// Chains by time from post to completion, seen once per pass: ≤ 10 µs,
    /// 100 µs, 1 ms, 10 ms, 100 ms, 1 s, more.
    std::array<std::uint64_t, 7> completion_times{};
    double completion_seconds = 0; ///< their sum
};

/// A rail of a peer as the proxy sees it (DeviceQueueProxy::rails()).
struct DeviceQueueRailState {
    std::uint16_t peer = 0;
    std::uint32_t rail = 0; ///< in the order added: 0 is add_peer's
    std::uint32_t qp_num = 0;
    bool active = false; ///< it carries the peer's new requests
    bool failed = false;
    std::string failure; ///< why, in words (empty while it works)
};

/// A peer's windows: id → the peer's memory as its queue pair reaches it.
using RemoteWindows = std::map<std::uint16_t, RemoteMemory>;

class DeviceQueueProxy {
public:
    /// Reads `queue` (its host pointers: slots and the proxy's words). Signals
    /// that add go as fetch-and-add into a scratch word registered in `pd`;
    /// `cq` is the send CQ of every peer's queue pair (the proxy polls it, and
    /// takes every completion in it as its own: no other queue pair may use it).
    DeviceQueueProxy(const device_queue::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                     const DeviceQueueProxyOptions& options = {});
    /// The error_code form (nothing thrown, nothing caught): a proxy that
    /// could not register its scratch words in `pd` is empty (false), leaves
    /// the queue as it was and refuses every add_*.
    static DeviceQueueProxy create(const device_queue::QueueView& queue, const ProtectionDomain& pd,
                                   CompletionQueue& cq, const DeviceQueueProxyOptions& options, std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    static DeviceQueueProxy create(const device_queue::QueueView& queue, const ProtectionDomain& pd,
                                   CompletionQueue& cq, const DeviceQueueProxyOptions& options, std::error_code& ec,
                                   Diagnostics& diagnostics);
    DeviceQueueProxy(const DeviceQueueProxy&) = delete;
    DeviceQueueProxy& operator=(const DeviceQueueProxy&) = delete;
    /// Moved, the proxy keeps the queue (the one moved from is empty); move it
    /// before a thread or async_drive holds it, never after.
    DeviceQueueProxy(DeviceQueueProxy&&) noexcept = default;
    DeviceQueueProxy& operator=(DeviceQueueProxy&&) = delete;
    /// Closes the queue (producers' waits end queue_closed), unless the proxy is empty.
    ~DeviceQueueProxy();
    /// False when create() failed.
    explicit operator bool() const noexcept { return !locals_.empty(); }

    /// Another NIC the proxy posts from (a rail on another device): its
    /// protection domain (the proxy registers its scratch words there) and the
    /// send CQ of its queue pairs, which progress() polls too.
    void add_device(const ProtectionDomain& pd, CompletionQueue& cq);
    void add_device(const ProtectionDomain& pd, CompletionQueue& cq, std::error_code& ec);
    void add_device(const ProtectionDomain& pd, CompletionQueue& cq, std::error_code& ec, Diagnostics& diagnostics);
    /// A local window that puts read from, as registered in one of the
    /// proxy's protection domains; add it once per device that has a rail
    /// (the same memory registered on each). Throws gpuverbs::Error
    /// (errc::invalid_argument) for a region of a protection domain the proxy
    /// has not.
    void add_window(std::uint16_t id, const MemoryRegion& region);
    void add_window(std::uint16_t id, const MemoryRegion& region, std::error_code& ec);
    void add_window(std::uint16_t id, const MemoryRegion& region, std::error_code& ec, Diagnostics& diagnostics);
    /// A peer and its first rail: a queue pair (with max_inline_data >= 8 for
    /// signals that set, its PD one of the proxy's) and the peer's windows as
    /// it reaches them: puts write into them, signals land in them. Throws
    /// gpuverbs::Error (errc::invalid_argument) for a peer added before (add
    /// another rail with add_rail), a queue pair of a protection domain the
    /// proxy has not, or one whose send queue holds fewer than 2 requests (a
    /// put_signal is two).
    void add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows);
    void add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec);
    void add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec,
                  Diagnostics& diagnostics);
    /// Another rail to `peer` (added before): it takes the peer's requests
    /// over when the rails before it failed. Throws gpuverbs::Error
    /// (errc::invalid_argument) for an unknown peer or a queue pair of a
    /// protection domain the proxy has not.
    void add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows);
    void add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec);
    void add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec,
                  Diagnostics& diagnostics);

    /// One pass, never blocking: reaps completions and returns credits in
    /// order, fails the queue on a failed completion or a request past its
    /// timeout, then takes up to `batch` descriptors and posts them. The
    /// number of descriptors taken. What goes wrong here fails the queue
    /// (error(), failure(): producers see it), it is not thrown.
    std::size_t progress();

    /// Ends the queue: every producer's wait ends queue_closed.
    void close() noexcept;

    [[nodiscard]] const DeviceQueueProxyCounters& counters() const noexcept { return counters_; }
    /// Every rail of every peer, and what the proxy knows of it.
    [[nodiscard]] std::vector<DeviceQueueRailState> rails() const;
    /// How the queue ended (QueueError::none while it works).
    [[nodiscard]] device_queue::QueueError error() const noexcept { return error_; }
    /// Why the queue failed, in words (empty while it works).
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    /// A protection domain the proxy posts from: its scratch words (a signal
    /// that adds lands its old value in its slot's word; one that sets is
    /// sent inline from it), its CQ and the local windows registered in it.
    struct Local {
        ibv_pd* pd = nullptr;
        CompletionQueue* cq = nullptr;
        std::vector<std::uint64_t> scratch;
        MemoryRegion scratch_region;
        /// A window as a put's request needs it (read once, at add_window).
        struct Window {
            std::uint64_t iova = 0;
            std::uint64_t length = 0;
            std::uint32_t lkey = 0;
            bool present = false;
        };
        std::vector<Window> windows; ///< by id
    };
    struct Rail {
        QueuePair* qp = nullptr;
        /// Its queue pair's core, where the proxy posts (kept alive with the rail).
        std::shared_ptr<detail::QpCore> core;
        Local* local = nullptr;
        struct Window {
            RemoteMemory memory;
            bool present = false;
        };
        std::vector<Window> windows; ///< by id (ids are small)
        std::uint64_t id_bits = 0;   ///< its id among all rails, where its requests' contexts carry it
        bool failed = false;
        /// Failed, and its queue pair's requests not all flushed yet: no credit
        /// returns meanwhile (what it posted may still be read or in flight),
        /// for at most request_timeout.
        bool draining = false;
        std::chrono::steady_clock::time_point failed_at{};
        std::string failure;
        [[nodiscard]] const RemoteMemory* window(std::uint16_t id) const noexcept {
            return id < windows.size() && windows[id].present ? &windows[id].memory : nullptr;
        }
    };
    struct Peer {
        std::vector<Rail> rails; ///< none: not added
        std::size_t active = 0;  ///< the rail new requests go on
        /// Positions to post again on the active rail, in order, before any
        /// new request to the peer (their rail failed).
        std::deque<std::uint64_t> retry;
        bool fence_next = false;
    };
    /// The slot's rail while it waits in a peer's retry list.
    static constexpr std::uint8_t unposted = 0xff;
    /// One doorbell's requests, lowered in place (a put straight from its
    /// descriptor, with no WorkRequest between), posted through the data
    /// path's SubmitChain as SendBatch posts.
    struct Chain {
        std::array<ibv_send_wr, SendBatch::max_requests> wrs;
        std::array<ibv_sge, SendBatch::max_requests> sges;
        std::array<std::uint64_t, SendBatch::max_requests> contexts;
        std::array<Opcode, SendBatch::max_requests> opcodes;
        std::uint32_t count = 0;
    };

    DeviceQueueProxy(const device_queue::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                     const DeviceQueueProxyOptions& options, detail::Status* status);
    [[nodiscard]] Peer* peer(std::uint16_t id) noexcept;
    [[nodiscard]] Local* local_of(const QueuePair& qp, const char* verb, detail::Status& status);
    bool make_rail(QueuePair& qp, std::uint16_t peer, const RemoteWindows& windows, const char* verb, Rail& rail,
                   detail::Status& status);
    bool add_device_impl(const ProtectionDomain& pd, CompletionQueue& cq, detail::Status& status);
    bool add_window_impl(std::uint16_t id, const MemoryRegion& region, detail::Status& status);
    bool add_peer_impl(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, detail::Status& status);
    bool add_rail_impl(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, detail::Status& status);
    /// Whether a failed rail still has requests with its NIC (their flushes not polled yet).
    bool draining() noexcept;
    void reap();
    void on_completion(const Completion& c);
    /// The rail `rail` of `peer` failed (words: why): it goes to error and the
    /// peer's unfinished requests move to its next rail, or the queue fails.
    void fail_rail(std::uint16_t peer, std::size_t rail, std::string words);
    void check_timeout();
    void fail(device_queue::QueueError error, std::string words) noexcept;
    /// Takes up to `batch` descriptors and posts them, a chain per run of one
    /// peer's; false when the queue failed.
    bool take_and_post();
    /// Posts what peers' retry lists hold, as room allows.
    void post_retries();
    /// The next descriptor, if complete: positions whose producers gave up
    /// are taken on the way, a corrupt one fails the queue.
    bool next(device_queue::Request& r);
    /// Adds the requests of `r` (at `position`) to the chain on the peer's
    /// active rail, its last signaled when `covers` (the descriptors its
    /// completion covers) is not 0; false when refused (the queue failed).
    bool add(const device_queue::Request& r, std::uint64_t position, Peer& to, std::uint64_t covers);
    /// Takes the puts to `peer` that follow, as long as they are complete,
    /// fit in the chain (`limit` requests) and in `most`, and name windows
    /// and ranges that hold: lowered straight from their words (decode_put)
    /// after the chain's last request. How many it took; what stops it is
    /// left for peek() and add() (and their words, if it is wrong).
    std::uint32_t take_puts(Rail& rail, std::uint16_t peer, std::uint64_t limit, std::uint32_t most);
    /// add()'s signal: its request after the put's, if any.
    bool add_signal(const device_queue::Request& r, std::size_t slot, Rail& rail, std::uint64_t context, bool signaled,
                    bool fence);
    /// Posts the chain on `rail` (one doorbell) and empties it.
    std::error_code post_chain(Rail& rail) noexcept;
    void count_chain(std::size_t descriptors) noexcept;

    device_queue::QueueView queue_;
    device_queue::RingReader reader_;
    DeviceQueueProxyOptions options_;
    std::vector<std::unique_ptr<Local>> locals_; ///< [0]: the constructor's
    std::vector<CompletionQueue*> cqs_;          ///< each once
    std::vector<Peer> peers_;                    ///< by id
    /// Every rail by its id (what a request's context carries): its peer and its index among the peer's.
    std::vector<std::pair<std::uint16_t, std::uint8_t>> rail_ids_;
    /// What the proxy knows of a slot's request.
    struct Slot {
        std::chrono::steady_clock::time_point posted{}; ///< when posted (its bound starts)
        std::uint16_t peer = 0;
        std::uint8_t rail = 0; ///< which of the peer's rails (unposted: waiting to be posted again)
        std::uint8_t done = 0; ///< completed, its credit not returned yet (only once a rail failed, or a
                               ///< fence or skipped position: in order, the credit moves at once)
    };
    std::vector<Slot> slots_; ///< by slot
    std::uint64_t credit_ = 0;
    /// Once a rail failed, completions are checked against the slot's rail
    /// (a failed rail's late completions are not the retry's).
    bool any_rail_failed_ = false;
    bool any_retry_ = false;
    bool any_draining_ = false;
    Chain chain_;
    std::array<Completion, 64> reaped_;           ///< a poll's completions (not zeroed per pass)
    std::chrono::steady_clock::time_point now_{}; ///< read once per pass
    bool failed_ = false;
    device_queue::QueueError error_ = device_queue::QueueError::none;
    std::string failure_;
    DeviceQueueProxyCounters counters_;
};

} // namespace gpuverbs
