// The attributes of a reliable-connected QP's state changes (RESET → INIT →
// RTR → RTS), computed from the local port, the remote Endpoint and the
// user's options. Pure functions: no verbs call, unit-tested on their own;
// QueuePair applies the result with ibv_modify_qp.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/gid.hpp"
#include "gpuverbs/queue_pair_types.hpp"

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

QpTransition init_transition(const LocalPort& local, Access remote_access);
/// Fails `status` with errc::invalid_endpoint or errc::invalid_argument,
/// naming the attribute, when the remote endpoint or options cannot work.
QpTransition rtr_transition(const LocalPort& local, const Endpoint& remote, const ConnectOptions& options,
                            Status& status);
QpTransition rts_transition(std::uint32_t local_psn, const LocalPort& local, const ConnectOptions& options);

/// The attributes as text for error messages ("path_mtu=4096 dest_qp_num=0x11 …").
std::string describe(const QpTransition& t);

} // namespace gpuverbs::detail
