#include "gpuverbs/detail/verbs/qp_transitions.hpp"

#include <algorithm>
#include <cstdio>

namespace gpuverbs::detail {

namespace {

std::string hex(std::uint32_t v) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", v);
    return text;
}

std::uint8_t clamp_rd_atomic(std::optional<std::uint8_t> wanted, int device_limit) {
    int limit = std::clamp(device_limit, 1, 16);
    return static_cast<std::uint8_t>(wanted ? std::clamp<int>(*wanted, 1, limit) : limit);
}

} // namespace

QpTransition init_transition(const LocalPort& local, Access remote_access) {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_INIT;
    t.attr.pkey_index = 0;
    t.attr.port_num = local.port;
    t.attr.qp_access_flags =
        static_cast<unsigned>(remote_access & (Access::remote_write | Access::remote_read | Access::remote_atomic));
    t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return t;
}

QpTransition rtr_transition(const LocalPort& local, const Endpoint& remote, const ConnectOptions& options,
                            Status& status) {
    QpTransition t;
    const char* verb = "ibv_modify_qp(INIT->RTR)";
    if (remote.qp_num == 0 || remote.qp_num > 0xffffff) {
        status.fail(
            errc::invalid_endpoint, verb,
            "the remote endpoint's QP number " + hex(remote.qp_num) + " is not a valid QP number (1..0xffffff)");
        return t;
    }
    if (remote.link_layer != LinkLayer::unspecified && local.link_layer != LinkLayer::unspecified &&
        remote.link_layer != local.link_layer) {
        status.fail(errc::invalid_endpoint, verb,
                    "the remote endpoint is on an " + std::string(to_string(remote.link_layer)) +
                        " port but this port is " + std::string(to_string(local.link_layer)) +
                        "; both ends must use the same link layer");
        return t;
    }
    if (local.link_layer == LinkLayer::ethernet && remote.gid.is_zero()) {
        status.fail(errc::invalid_endpoint, verb,
                    "the remote endpoint has no GID (all zero), which RoCE needs to address it; the peer's port "
                    "probably has no IP address");
        return t;
    }
    if (local.link_layer == LinkLayer::infiniband && remote.lid == 0 && remote.gid.is_zero()) {
        status.fail(errc::invalid_endpoint, verb,
                    "the remote endpoint has LID 0 and no GID: the peer's InfiniBand port has no LID (is a subnet "
                    "manager running?)");
        return t;
    }
    Mtu path = std::min(local.active_mtu, remote.mtu);
    if (options.path_mtu) {
        if (*options.path_mtu > path) {
            status.fail(errc::invalid_argument, verb,
                        "path MTU " + std::to_string(mtu_bytes(*options.path_mtu)) +
                            " is larger than the ports allow (local active MTU " +
                            std::to_string(mtu_bytes(local.active_mtu)) + ", remote " +
                            std::to_string(mtu_bytes(remote.mtu)) + ")");
            return t;
        }
        path = *options.path_mtu;
    }
    t.attr.qp_state = IBV_QPS_RTR;
    t.attr.path_mtu = static_cast<ibv_mtu>(path);
    t.attr.dest_qp_num = remote.qp_num;
    t.attr.rq_psn = remote.psn & 0xffffff;
    t.attr.max_dest_rd_atomic = clamp_rd_atomic(options.max_dest_rd_atomic, local.device_max_dest_rd_atomic);
    t.attr.min_rnr_timer = std::min<std::uint8_t>(options.min_rnr_timer, 31);
    ibv_ah_attr& ah = t.attr.ah_attr;
    ah.port_num = local.port;
    ah.sl = options.service_level;
    ah.dlid = remote.lid;
    // RoCE always needs the global route header; InfiniBand only across subnets (a GID without a LID).
    if (local.link_layer == LinkLayer::ethernet || remote.lid == 0) {
        ah.is_global = 1;
        ah.grh.dgid = remote.gid.to_native();
        ah.grh.sgid_index = static_cast<std::uint8_t>(local.gid_index);
        ah.grh.hop_limit = options.hop_limit;
        ah.grh.traffic_class = options.traffic_class;
        ah.grh.flow_label = options.flow_label;
    }
    t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER;
    return t;
}

QpTransition rts_transition(std::uint32_t local_psn, const LocalPort& local, const ConnectOptions& options) {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_RTS;
    t.attr.sq_psn = local_psn & 0xffffff;
    t.attr.timeout = std::min<std::uint8_t>(options.timeout, 31);
    t.attr.retry_cnt = std::min<std::uint8_t>(options.retry_count, 7);
    t.attr.rnr_retry = std::min<std::uint8_t>(options.rnr_retry.value_or(options.rnr_retry_count), 7);
    t.attr.max_rd_atomic = clamp_rd_atomic(options.max_rd_atomic, local.device_max_rd_atomic);
    t.mask =
        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    return t;
}

QpTransition reset_transition() {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_RESET;
    t.mask = IBV_QP_STATE;
    return t;
}

QpTransition access_transition(Access remote_access) {
    QpTransition t;
    t.attr.qp_access_flags = init_transition(LocalPort{}, remote_access).attr.qp_access_flags;
    t.mask = IBV_QP_ACCESS_FLAGS;
    return t;
}

QpTransition ud_init_transition(const LocalPort& local, std::uint32_t qkey) {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_INIT;
    t.attr.pkey_index = 0;
    t.attr.port_num = local.port;
    t.attr.qkey = qkey;
    t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    return t;
}

QpTransition ud_rtr_transition() {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_RTR;
    t.mask = IBV_QP_STATE;
    return t;
}

QpTransition ud_rts_transition(std::uint32_t local_psn) {
    QpTransition t;
    t.attr.qp_state = IBV_QPS_RTS;
    t.attr.sq_psn = local_psn & 0xffffff;
    t.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    return t;
}

CmConnectParameters cm_connect_parameters(const LocalPort& local, const ConnectOptions& options) {
    // The same clamps as the RTR and RTS rows, so both ways of connecting agree.
    CmConnectParameters p;
    p.responder_resources = clamp_rd_atomic(options.max_dest_rd_atomic, local.device_max_dest_rd_atomic);
    p.initiator_depth = clamp_rd_atomic(options.max_rd_atomic, local.device_max_rd_atomic);
    p.retry_count = std::min<std::uint8_t>(options.retry_count, 7);
    p.rnr_retry_count = std::min<std::uint8_t>(options.rnr_retry.value_or(options.rnr_retry_count), 7);
    return p;
}

std::string describe(const QpTransition& t) {
    const ibv_qp_attr& a = t.attr;
    std::string s;
    auto add = [&](const std::string& part) {
        if (!s.empty()) s += ' ';
        s += part;
    };
    if (t.mask & IBV_QP_PORT) add("port=" + std::to_string(a.port_num));
    if (t.mask & IBV_QP_QKEY) add("qkey=" + hex(a.qkey));
    if (t.mask & IBV_QP_ACCESS_FLAGS) add("access_flags=" + hex(a.qp_access_flags));
    if (t.mask & IBV_QP_PATH_MTU) add("path_mtu=" + std::to_string(mtu_bytes(static_cast<Mtu>(a.path_mtu))));
    if (t.mask & IBV_QP_DEST_QPN) add("dest_qp_num=" + hex(a.dest_qp_num));
    if (t.mask & IBV_QP_RQ_PSN) add("rq_psn=" + hex(a.rq_psn));
    if (t.mask & IBV_QP_MAX_DEST_RD_ATOMIC) add("max_dest_rd_atomic=" + std::to_string(a.max_dest_rd_atomic));
    if (t.mask & IBV_QP_MIN_RNR_TIMER) add("min_rnr_timer=" + std::to_string(a.min_rnr_timer));
    if (t.mask & IBV_QP_AV) {
        add("dlid=" + std::to_string(a.ah_attr.dlid));
        if (a.ah_attr.is_global) {
            add("dgid=" + Gid::from_native(a.ah_attr.grh.dgid).to_string());
            add("sgid_index=" + std::to_string(a.ah_attr.grh.sgid_index));
            add("hop_limit=" + std::to_string(a.ah_attr.grh.hop_limit));
        }
    }
    if (t.mask & IBV_QP_SQ_PSN) add("sq_psn=" + hex(a.sq_psn));
    if (t.mask & IBV_QP_TIMEOUT) add("timeout=" + std::to_string(a.timeout));
    if (t.mask & IBV_QP_RETRY_CNT) add("retry_cnt=" + std::to_string(a.retry_cnt));
    if (t.mask & IBV_QP_RNR_RETRY) add("rnr_retry=" + std::to_string(a.rnr_retry));
    if (t.mask & IBV_QP_MAX_QP_RD_ATOMIC) add("max_rd_atomic=" + std::to_string(a.max_rd_atomic));
    return s;
}

} // namespace gpuverbs::detail
