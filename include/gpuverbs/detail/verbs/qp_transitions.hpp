// The one table of queue-pair state changes: the attributes of a
// reliable-connected QP's RESET → INIT → RTR → RTS, computed from the local
// port, the remote Endpoint and the user's options; an unreliable-datagram
// QP's (no peer: a Q_Key instead); and the parameters rdma_cm's accept and
// connect take, which make the same changes inside librdmacm. Pure functions:
// no verbs call, unit-tested on their own; detail/verbs/qp_factory.hpp applies the
// result with ibv_modify_qp.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/gid.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <infiniband/verbs.h>

#include <string>

namespace gpuverbs::detail {

/// What the local side brings to a connection.
struct LocalPort {
    std::uint8_t port = 1;
    std::uint32_t gid_index = 0;
    LinkLayer link_layer = LinkLayer::unspecified;
    Mtu active_mtu = Mtu::mtu_1024;
    std::uint16_t lid = 0;
    int device_max_rd_atomic = 1;      ///< ibv_device_attr::max_qp_init_rd_atom
    int device_max_dest_rd_atomic = 1; ///< ibv_device_attr::max_qp_rd_atom
};

struct QpTransition {
    ibv_qp_attr attr{};
    int mask = 0;
};

/// The access flags a queue pair grants its peer (a region's others are local).
inline constexpr Access peer_facing_access = Access::remote_write | Access::remote_read | Access::remote_atomic;

QpTransition init_transition(const LocalPort& local, Access remote_access);
/// Fails `status` with errc::invalid_endpoint or errc::invalid_argument,
/// naming the attribute, when the remote endpoint or options cannot work.
QpTransition rtr_transition(const LocalPort& local, const Endpoint& remote, const ConnectOptions& options,
                            Status& status);
QpTransition rts_transition(std::uint32_t local_psn, const LocalPort& local, const ConnectOptions& options);
/// Any state → RESET: the first step of reusing a QP (e.g. after an error).
QpTransition reset_transition();
/// INIT → INIT with other remote access flags (connect() granting remote access).
QpTransition access_transition(Access remote_access);

/// Unreliable datagram: RESET → INIT on the local port, with the Q_Key that incoming datagrams must carry.
QpTransition ud_init_transition(const LocalPort& local, std::uint32_t qkey);
/// Unreliable datagram: INIT → RTR (no peer, so nothing else to set).
QpTransition ud_rtr_transition();
/// Unreliable datagram: RTR → RTS with our first PSN.
QpTransition ud_rts_transition(std::uint32_t local_psn);

/// What rdma_accept and rdma_connect take (rdma_conn_param's fields): librdmacm
/// moves the QP through RTR and RTS itself, with these values where
/// rtr_transition and rts_transition would put them, clamped the same way.
struct CmConnectParameters {
    std::uint8_t responder_resources = 1; ///< as RTR's max_dest_rd_atomic
    std::uint8_t initiator_depth = 1;     ///< as RTS's max_rd_atomic
    std::uint8_t retry_count = 6;         ///< as RTS's retry_cnt
    std::uint8_t rnr_retry_count = 7;     ///< as RTS's rnr_retry
};
CmConnectParameters cm_connect_parameters(const LocalPort& local, const ConnectOptions& options);

/// The attributes as text for error messages ("path_mtu=4096 dest_qp_num=0x11 …").
std::string describe(const QpTransition& t);

} // namespace gpuverbs::detail
