// The values of an rdma_cm connection: what each side asks for (CmOptions),
// what was agreed (CmParameters), a refusal and its data, the private-data
// limits and the events a connection reports. No librdmacm or Asio here.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// How long accept, connect, establish, CmListener::accept and cm_resolve
/// wait when not told (the one source of that default, Python's included).
inline constexpr std::chrono::milliseconds default_cm_timeout{30000};

/// What one side asks for when it connects or accepts. The read depths are
/// upper bounds: the agreed value is the smallest of this, what the device
/// allows and what the peer asked for (CmConnection::parameters()).
struct CmOptions {
    /// RDMA reads and atomics the peer may have outstanding at us (we answer them).
    std::uint8_t responder_resources = 16;
    /// RDMA reads and atomics we may have outstanding at the peer.
    std::uint8_t initiator_depth = 16;
    /// Transport retries before a request fails with IBV_WC_RETRY_EXC_ERR
    /// (0-7). The connection request carries the client's count and both queue
    /// pairs use it; a server's value is not sent (the answer has no field).
    /// Finite by default (6, as ConnectOptions): 7 is "retry forever" on
    /// Soft-RoCE, so a write to a peer that is gone would never complete there.
    std::uint8_t retry_count = 6;
    /// Receiver-not-ready retries the *peer* makes when a send of its finds no
    /// receive of ours posted, before its send fails with
    /// IBV_WC_RNR_RETRY_EXC_ERR (0-6; 7 retries forever). The connection
    /// manager carries it to the peer (InfiniBand CM: the request holds the
    /// server's, the answer the client's); our own queue pair retries as the
    /// peer asked — parameters().rnr_retry_count. 7 by default, as
    /// ConnectOptions: the peer's send waits for our receive for as long as we
    /// take, and gpuverbs bounds that wait itself (AsyncOptions::receiver_wait,
    /// 10 s: the peer's queue pair is then declared stalled). A finite count
    /// fails a send that finds no receive within about (count + 1) x
    /// min_rnr_timer (~18 ms for 6 with the defaults). Post receives before
    /// accept/connect and ahead of the peer's sends; docs/rdma-cm.md.
    std::uint8_t rnr_retry_count = 7;
    /// How long a peer waits before retrying a send we had no receive for, in
    /// the InfiniBand encoding (16 = 2.56 ms, 12 = 0.64 ms, 0 = 655 ms: what
    /// rdma_cm alone leaves). Set on our queue pair once it is connected.
    std::uint8_t min_rnr_timer = 16;
    /// End-to-end flow control (the responder's credits); hardware may ignore it.
    bool flow_control = true;
    /// What the peer may do to our memory through this connection's queue
    /// pair (remote write, read, atomics). Default: what the connection
    /// advertised (CmConnection::advertise), nothing when it advertised none.
    /// rdma_cm itself sets a queue pair's access when it connects it (write,
    /// plus read and atomics when we answer reads), so gpuverbs asks for no
    /// responder resources when the grant has neither read nor atomics, and
    /// narrows the access (RTS → RTS) as soon as the connection is
    /// established: a write the peer sends before that is still bounded by the
    /// region's own access (docs/security.md).
    std::optional<Access> remote_access;
};

/// The parameters of a connection: what the peer asked for
/// (CmConnection::requested()), or what the connection runs with
/// (CmConnection::parameters(), read back from the queue pair).
struct CmParameters {
    std::uint8_t responder_resources = 0; ///< reads/atomics the peer may have outstanding at us
    std::uint8_t initiator_depth = 0;     ///< reads/atomics we may have outstanding at the peer
    std::uint8_t retry_count = 0;         ///< transport retries of our queue pair (the request's count)
    std::uint8_t rnr_retry_count = 0;     ///< RNR retries of our queue pair (what the peer asked of us)
    std::uint8_t min_rnr_timer = 0;       ///< ours (parameters() only)
    bool flow_control = false;            ///< end-to-end flow control (ours in parameters(), the peer's in requested())
    bool srq = false;                     ///< the peer's receives come from a shared receive queue
    std::uint32_t qp_num = 0;             ///< the peer's queue pair number
    std::uint8_t path_mtu = 0;            ///< IBV_MTU_* (parameters() only)
};

/// Why a connection was refused, as the connecting side sees it.
struct CmRejection {
    int reason = 0;                      ///< the transport's reject reason (28: the peer's program refused)
    bool by_peer = false;                ///< the peer's program refused (rdma_reject), not its transport
    std::string reason_text;             ///< rdma_reject_msg(): "consumer defined", "invalid service ID", …
    std::vector<std::byte> private_data; ///< what the refusal carried (padded by the transport)
};

/// The most private data each message carries on this transport.
struct CmPrivateDataLimits {
    std::size_t connect = 0; ///< in a connection request (56 over RoCE/InfiniBand)
    std::size_t accept = 0;  ///< in the answer that accepts it (196)
    std::size_t reject = 0;  ///< in a refusal (148)
};

/// What happened to an established connection.
enum class CmEventType : std::uint8_t {
    disconnected,   ///< the peer disconnected, or we did (RDMA_CM_EVENT_DISCONNECTED)
    device_removal, ///< the device is going away (RDMA_CM_EVENT_DEVICE_REMOVAL)
    address_change, ///< the local address changed (RDMA_CM_EVENT_ADDR_CHANGE)
    timewait_exit,  ///< the queue pair left time-wait: its number may be reused (RDMA_CM_EVENT_TIMEWAIT_EXIT)
    other,          ///< another rdma_cm event (native_type says which)
};
/// "disconnected", "device_removal", … (the enumerator's name).
std::string_view to_string(CmEventType type) noexcept;

/// One event of an established connection.
struct CmEvent {
    CmEventType type = CmEventType::other;
    int native_type = -1; ///< the rdma_cm_event_type
    int status = 0;       ///< the event's status
    /// One line: what happened, what gpuverbs did about it, what to do.
    [[nodiscard]] std::string describe() const;
};

} // namespace gpuverbs
