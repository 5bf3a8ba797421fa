#include "gpuverbs/verbs/datagram.hpp"
#include "gpuverbs/detail/access.hpp"

#include "gpuverbs/detail/verbs/qp_factory.hpp"

#include "random.hpp"

#include <cerrno>

namespace gpuverbs {

AddressHandle AddressHandle::create_impl(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote,
                                         detail::Status& status) {
    const char* verb = "ibv_create_ah";
    if (!pd || !local) {
        status.fail(errc::invalid_argument, verb, "the ProtectionDomain or UdQueuePair is empty");
        return {};
    }
    ibv_ah_attr attr{};
    attr.port_num = local.port();
    attr.dlid = remote.lid;
    if (local.endpoint().link_layer == LinkLayer::ethernet || remote.lid == 0) {
        if (remote.gid.is_zero()) {
            status.fail(errc::invalid_endpoint, verb,
                        "the remote endpoint has no GID to address it by: on RoCE the peer's port needs an IP address "
                        "(its GID table has no RoCE entry)");
            return {};
        }
        attr.is_global = 1;
        attr.grh.dgid = remote.gid.to_native();
        attr.grh.sgid_index = static_cast<std::uint8_t>(local.gid_index());
        attr.grh.hop_limit = 64;
    }
    errno = 0;
    ibv_ah* ah = ibv_create_ah(pd.native_handle(), &attr);
    if (ah == nullptr) {
        status.fail_errno(errno != 0 ? errno : EINVAL, verb,
                          "cannot create an address handle to " + remote.gid.to_string() + " on " + pd.device_name());
        return {};
    }
    AddressHandle h;
    h.pd_ = detail::access::core(pd);
    h.ah_ = std::shared_ptr<ibv_ah>(ah, [](ibv_ah* a) { (void)ibv_destroy_ah(a); });
    return h;
}

AddressHandle::AddressHandle(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote)
    : AddressHandle(detail::or_throw([&](detail::Status& s) { return create_impl(pd, local, remote, s); })) {}

AddressHandle AddressHandle::create(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote,
                                    std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, local, remote, s); });
}

UdQueuePair UdQueuePair::create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                     const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                     std::uint32_t qkey, detail::Status& status) {
    // The same factory as RC queue pairs: the same checks, port, GID and wrapping.
    detail::NewQp made = detail::create_qp(IBV_QPT_UD, {&pd, &send_cq, &recv_cq, nullptr}, options, status);
    if (!made.core) return {};
    ibv_qp* qp = made.core->qp();
    // A UD QP goes straight to RTS: it has no peer.
    const std::uint32_t psn = detail::random_psn();
    if (!detail::modify_qp(qp, detail::ud_init_transition(made.port, qkey), "RESET->INIT", status) ||
        !detail::modify_qp(qp, detail::ud_rtr_transition(), "INIT->RTR", status) ||
        !detail::modify_qp(qp, detail::ud_rts_transition(psn), "RTR->RTS", status)) {
        return {};
    }
    UdQueuePair q;
    q.core_ = std::move(made.core);
    q.port_ = made.port;
    q.qkey_ = qkey;
    q.local_.qp_num = qp->qp_num;
    q.local_.psn = psn;
    q.local_.lid = made.port.lid;
    q.local_.gid = made.gid;
    q.local_.mtu = made.port.active_mtu;
    q.local_.link_layer = made.port.link_layer;
    return q;
}

namespace {

/// 31 random bits (a qkey with the top bit set is a controlled qkey, which
/// only privileged processes may set), never 0 nor the well-known default.
std::uint32_t random_qkey() {
    for (;;) {
        const auto qkey = static_cast<std::uint32_t>(detail::system_random()) & 0x7fffffffU;
        if (qkey != 0 && qkey != UdQueuePair::default_qkey) return qkey;
    }
}

} // namespace

UdQueuePair::UdQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options, std::optional<std::uint32_t> qkey)
    : UdQueuePair(detail::or_throw([&](detail::Status& s) {
          return create_impl(pd, send_cq, recv_cq, options, qkey.value_or(random_qkey()), s);
      })) {}

UdQueuePair UdQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                const CompletionQueue& recv_cq, const QueuePairOptions& options, std::error_code& ec) {
    return create(pd, send_cq, recv_cq, options, random_qkey(), ec);
}

UdQueuePair UdQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                const CompletionQueue& recv_cq, const QueuePairOptions& options, std::uint32_t qkey,
                                std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, options, qkey, s); });
}

} // namespace gpuverbs
