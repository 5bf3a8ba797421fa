#include "gpuverbs/datagram.hpp"

#include <cerrno>
#include <random>

namespace gpuverbs {

AddressHandle::AddressHandle(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote) {
    if (!pd || !local)
        throw Error(errc::invalid_argument, "ibv_create_ah", "the ProtectionDomain or UdQueuePair is empty");
    ibv_ah_attr attr{};
    attr.port_num = local.port();
    attr.dlid = remote.lid;
    if (local.endpoint().link_layer == LinkLayer::ethernet || remote.lid == 0) {
        if (remote.gid.is_zero()) {
            throw Error(errc::invalid_endpoint, "ibv_create_ah", "the remote endpoint has no GID to address it by");
        }
        attr.is_global = 1;
        attr.grh.dgid = remote.gid.to_native();
        attr.grh.sgid_index = static_cast<std::uint8_t>(local.gid_index());
        attr.grh.hop_limit = 64;
    }
    errno = 0;
    ibv_ah* ah = ibv_create_ah(pd.native_handle(), &attr);
    if (ah == nullptr) {
        int err = errno != 0 ? errno : EINVAL;
        throw Error({err, std::system_category()}, "ibv_create_ah",
                    "cannot create an address handle to " + remote.gid.to_string() + " on " + pd.device_name() + ": " +
                        std::system_category().message(err));
    }
    pd_ = pd.core();
    ah_ = std::shared_ptr<ibv_ah>(ah, [](ibv_ah* a) { (void)ibv_destroy_ah(a); });
}

UdQueuePair::UdQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options, std::uint32_t qkey)
    : qkey_(qkey) {
    if (!pd || !send_cq || !recv_cq) {
        throw Error(errc::invalid_argument, "ibv_create_qp", "the ProtectionDomain or a CompletionQueue is empty");
    }
    // The port, GID and limits are found as for RC queue pairs.
    detail::Status status;
    port_ = detail::resolve_local_port(pd, options, local_.gid, status);
    status.check();
    ibv_qp_init_attr init = detail::qp_init_attr(IBV_QPT_UD, send_cq, recv_cq, options);
    errno = 0;
    ibv_qp* qp = ibv_create_qp(pd.native_handle(), &init);
    if (qp == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        throw Error(
            {err, std::system_category()}, "ibv_create_qp",
            "cannot create a UD queue pair on " + pd.device_name() + ": " + std::system_category().message(err));
    }
    core_ = std::make_shared<detail::QpCore>(pd.core(), send_cq.core(), recv_cq.core(), nullptr, qp,
                                             detail::granted(init.cap));
    // A UD QP goes straight to RTS: it has no peer.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port_.port;
    attr.qkey = qkey;
    if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY); rc != 0) {
        throw Error({rc, std::system_category()}, "ibv_modify_qp(RESET->INIT)", "cannot initialise the UD queue pair");
    }
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE); rc != 0) {
        throw Error({rc, std::system_category()}, "ibv_modify_qp(INIT->RTR)", "cannot ready the UD queue pair");
    }
    thread_local std::minstd_rand engine{std::random_device{}()};
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = static_cast<std::uint32_t>(engine()) & 0xffffff;
    if (int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN); rc != 0) {
        throw Error({rc, std::system_category()}, "ibv_modify_qp(RTR->RTS)", "cannot ready the UD queue pair");
    }
    local_.qp_num = qp->qp_num;
    local_.psn = attr.sq_psn;
    local_.lid = port_.lid;
    local_.mtu = port_.active_mtu;
    local_.link_layer = port_.link_layer;
}

} // namespace gpuverbs
