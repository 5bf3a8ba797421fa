// The plain values around queue pairs: creation options, the Endpoint a peer
// needs to connect, connection options and per-request send options.
#pragma once

#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/gid.hpp"
#include "gpuverbs/verbs/memory_region.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace gpuverbs {

/// What a queue pair is created with. The device may round the depths and
/// inline size up; QueuePair::capabilities() reports the real values.
struct QueuePairOptions {
    std::uint32_t max_send_wr = 256;   ///< send queue depth
    std::uint32_t max_recv_wr = 256;   ///< receive queue depth (unused with a SharedReceiveQueue)
    std::uint32_t max_send_sge = 1;    ///< scatter/gather entries per send-side request
    std::uint32_t max_recv_sge = 1;    ///< … per receive
    std::uint32_t max_inline_data = 0; ///< bytes a send or write may carry inline
    std::uint8_t port = 1;
    /// GID table index to use on RoCE; default: Device::select_gid's choice.
    std::optional<std::uint32_t> gid_index;
    /// When gid_index is not given: restricts select_gid (e.g. to one IPv4 address).
    GidPreference gid_preference;
    /// Post send-side requests through the extended verbs (ibv_qp_ex and
    /// ibv_wr_*) where the provider has them, the classic ibv_post_send
    /// elsewhere; QueuePair::uses_extended_verbs() says which it got. RC
    /// queue pairs made with ibv_create_qp (PreparedQueuePair, the TCP
    /// bootstrap) only; rdma_cm's and UD queue pairs stay classic. Off by
    /// default: on Soft-RoCE it costs more instructions than the classic
    /// path (docs/performance.md, "Extended verbs"). Requests with several
    /// scatter/gather entries always take the classic path (rxe before
    /// rdma-core 64 mis-sums ibv_wr_set_sge_list's lengths).
    bool extended_verbs = false;
};

/// What the device granted a queue pair: depths, scatter/gather entries and
/// inline size (may exceed what QueuePairOptions asked for).
struct QueuePairCapabilities {
    std::uint32_t max_send_wr = 0;     ///< send requests outstanding at once
    std::uint32_t max_recv_wr = 0;     ///< receives outstanding at once (0 with a SharedReceiveQueue)
    std::uint32_t max_send_sge = 0;    ///< scatter/gather entries per send-side request
    std::uint32_t max_recv_sge = 0;    ///< … per receive
    std::uint32_t max_inline_data = 0; ///< bytes a send or write may carry inline
    /// Reads and atomics it may have outstanding at once (its initiator depth,
    /// as agreed when it connected; 255 before). 0: reads and atomics are
    /// refused at once with errc::reads_not_granted (the device would hold
    /// them for ever).
    std::uint32_t max_rd_atomic = 255;
};

/// What the peer needs to connect to a queue pair; exchange it out of band
/// (wire.hpp serializes it). gid is used on RoCE, lid on InfiniBand.
struct Endpoint {
    std::uint32_t qp_num = 0;
    std::uint32_t psn = 0; ///< first packet sequence number (24 bits)
    std::uint16_t lid = 0;
    Gid gid;
    Mtu mtu = Mtu::mtu_1024; ///< the port's active MTU
    LinkLayer link_layer = LinkLayer::unspecified;

    friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

namespace detail {

/// ConnectOptions::rnr_retry, 0.1's name of rnr_retry_count, kept for one
/// release: setting it (`{.rnr_retry = 7}`, `options.rnr_retry = 7`) still
/// works, with a deprecation warning, and then wins over rnr_retry_count.
class RenamedRnrRetry {
public:
    RenamedRnrRetry() = default;
    [[deprecated("use ConnectOptions::rnr_retry_count")]] RenamedRnrRetry(std::uint8_t count) : count_(count) {}
    [[deprecated("use ConnectOptions::rnr_retry_count")]] RenamedRnrRetry& operator=(std::uint8_t count) {
        count_ = count;
        return *this;
    }
    /// What a program set through the old name, else `count`.
    [[nodiscard]] std::uint8_t value_or(std::uint8_t count) const noexcept { return count_.value_or(count); }

private:
    std::optional<std::uint8_t> count_;
};

} // namespace detail

/// How connect() sets up the path. The defaults suit almost everyone.
struct ConnectOptions {
    /// Default: the smaller of both ports' active MTUs.
    std::optional<Mtu> path_mtu;
    /// Local ACK timeout, 4.096 µs × 2^timeout (14 ≈ 67 ms).
    std::uint8_t timeout = 14;
    /// Transport retries before a request fails with IBV_WC_RETRY_EXC_ERR
    /// (0-7). Finite by default on every provider: 6 retries of the 67 ms
    /// timeout fail a request to a peer that is gone in about half a second.
    /// 7 means seven retries on hardware but "retry forever" on Soft-RoCE
    /// (rxe never counts 7 down), so a dead peer would hang there.
    std::uint8_t retry_count = 6;
    /// Receiver-not-ready retries our sends make when the peer has no receive
    /// posted, before failing with IBV_WC_RNR_RETRY_EXC_ERR (0-6; 7 retries
    /// for as long as the peer takes). 7 by default, as CmOptions and Python:
    /// a PreparedQueuePair cannot post receives before it is connected, so a
    /// peer's first send can always arrive before our first receive (with a
    /// finite count, the lazy mesh and the echo service failed that way in the
    /// rig). The wait is bounded by gpuverbs, not the provider: an
    /// asynchronous send that waits for a receive longer than
    /// AsyncOptions::receiver_wait (10 s) fails its queue pair as stalled, a
    /// transfer's notification at TransferOptions::notification_timeout. A
    /// dead peer fails a request sooner: transport retries (above) are finite.
    std::uint8_t rnr_retry_count = 7;
    /// Deprecated: 0.1's name of rnr_retry_count (set it instead).
    detail::RenamedRnrRetry rnr_retry{};
    /// How long the peer waits before retrying a send we had no receive for,
    /// in the InfiniBand encoding (12 ≈ 0.64 ms).
    std::uint8_t min_rnr_timer = 12;
    /// RDMA reads/atomics outstanding as initiator; default: the device's limit (at most 16).
    std::optional<std::uint8_t> max_rd_atomic;
    /// … as target; default: the device's limit (at most 16).
    std::optional<std::uint8_t> max_dest_rd_atomic;
    std::uint8_t service_level = 0;
    std::uint8_t traffic_class = 0;
    std::uint8_t hop_limit = 64;
    std::uint32_t flow_label = 0;
    /// What the peer may do to our memory through this QP (remote write, read,
    /// atomics; the region must allow it too). Default: what the queue pair
    /// advertised — the union of the remote access of every region passed to
    /// PreparedQueuePair::advertise — and nothing when it advertised none, so
    /// a peer told no key can neither read nor write through it (least access;
    /// docs/security.md). Set it to grant more or less than that.
    std::optional<Access> remote_access;
};

/// Per-request options of the send-side data path.
struct SendOptions {
    /// Handed back in the Completion.
    std::uint64_t context = 0;
    /// Generate a completion. Unsignaled requests are finished when a later
    /// signaled one completes: signal at least once per send-queue depth.
    bool signaled = true;
    /// Copy the payload into the request (up to max_inline_data): the buffer is
    /// reusable when post returns and needs no memory region.
    bool inline_data = false;
    /// Wait for earlier reads and atomics to finish before starting this one.
    bool fence = false;
    /// Ask the peer's CQ to wake solicited-only waiters (sends, writes with immediate).
    bool solicited = false;
};

/// A queue pair's state (ibv_qp_state).
enum class QpState : std::uint8_t {
    reset,
    init,
    ready_to_receive,
    ready_to_send,
    send_drained,
    send_error,
    error,
    unknown
};
std::string_view to_string(QpState state) noexcept;

/// A queue pair's counts (QueuePair::counters; prometheus_text exports them).
/// Requests count every posted work request, signaled or not; a request is
/// completed once a completion of its queue at or after it arrived. Receives
/// taken from a SharedReceiveQueue are the SRQ's, not counted here.
struct QueuePairCounters {
    std::uint64_t sends_posted = 0;
    std::uint64_t sends_completed = 0;
    std::uint64_t receives_posted = 0;
    std::uint64_t receives_completed = 0;
    /// Failed work completions by status (index: ibv_wc_status; both queues).
    std::array<std::uint64_t, 32> errors{};
};

/// Why gpuverbs knows a queue pair is in the error state (QueuePair::failure()).
/// Posting on it is refused with errc::queue_pair_in_error until it is reset
/// and connected again; its asynchronous operations end within the bounds of
/// docs/transfers.md ("Bounds"), whether or not the provider completes them.
struct QueuePairFailure {
    enum class Cause : std::uint8_t {
        completion_failed,      ///< a work completion failed (status: its ibv_wc_status)
        moved_to_error,         ///< QueuePair::force_error() moved it there
        provider_reports_error, ///< ibv_query_qp reported ERROR (e.g. the peer's NAK) with operations outstanding
        port_down,              ///< its port left ACTIVE with requests outstanding: gpuverbs moved it to error
        stalled,                ///< outstanding requests made no progress for longer than the transport's retry
                                ///< bound: gpuverbs moved it to error
        notification_not_taken, ///< a transfer's notification waited for the peer's receive past the transfer's
                                ///< deadline, its cancellation or TransferOptions::notification_timeout: gpuverbs
                                ///< moved it to error (its send queue waited behind the notification)
    };
    Cause cause = Cause::completion_failed;
    /// When gpuverbs learned of it.
    std::chrono::steady_clock::time_point since{};
    /// The failed completion's status (wc category), else errc::queue_pair_in_error, port_down or
    /// queue_pair_stalled: what operations that gpuverbs itself completes end with.
    std::error_code status;
    /// The port, for Cause::port_down.
    std::uint8_t port = 0;

    /// "in the error state for 1.2 s: a work completion failed (transport retry counter exceeded); connect a
    /// new queue pair (or reset this one)".
    [[nodiscard]] std::string describe() const;
};

} // namespace gpuverbs
