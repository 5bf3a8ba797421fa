#include "gpuverbs/queue_pair.hpp"

#include "gpuverbs/shared_receive_queue.hpp"

#include <cerrno>
#include <cstdio>
#include <random>

namespace gpuverbs {

std::string_view to_string(QpState state) noexcept {
    switch (state) {
        case QpState::reset: return "RESET";
        case QpState::init: return "INIT";
        case QpState::ready_to_receive: return "RTR";
        case QpState::ready_to_send: return "RTS";
        case QpState::send_drained: return "SQD";
        case QpState::send_error: return "SQE";
        case QpState::error: return "ERROR";
        case QpState::unknown: return "unknown";
    }
    return "unknown";
}

namespace {

std::string qp_name(std::uint32_t qp_num) {
    char text[24];
    std::snprintf(text, sizeof text, "QP 0x%x", qp_num);
    return text;
}

std::uint32_t random_psn() {
    thread_local std::minstd_rand engine{std::random_device{}()};
    return static_cast<std::uint32_t>(engine()) & 0xffffff;
}

// Applies one transition; on failure says which, on which QP, with which attributes.
bool modify(ibv_qp* qp, const detail::QpTransition& t, const char* which, detail::Status& status) {
    ibv_qp_attr attr = t.attr;
    if (int rc = ibv_modify_qp(qp, &attr, t.mask); rc != 0) {
        status.fail_errno(rc, std::string("ibv_modify_qp(") + which + ")",
                          "cannot move " + qp_name(qp->qp_num) + " " + which + " with " + detail::describe(t));
        return false;
    }
    return true;
}

bool to_reset_and_init(ibv_qp* qp, const detail::LocalPort& port, detail::Status& status) {
    detail::QpTransition reset;
    reset.attr.qp_state = IBV_QPS_RESET;
    reset.mask = IBV_QP_STATE;
    return modify(qp, reset, "->RESET", status) &&
           modify(qp, detail::init_transition(port, Access::remote_write | Access::remote_read | Access::remote_atomic),
                  "RESET->INIT", status);
}

} // namespace

namespace detail {

LocalPort resolve_local_port(const ProtectionDomain& pd, const QueuePairOptions& options, Gid& gid_out,
                             Status& status) {
    LocalPort port;
    const detail::DeviceCore& device = *pd.core()->device();
    // The port and GID this QP will use, checked now so connect() cannot fail on them.
    ibv_device_attr dev_attr{};
    if (int rc = ibv_query_device(device.context(), &dev_attr); rc != 0) {
        status.fail_errno(rc, "ibv_query_device", "cannot query " + device.name());
        return port;
    }
    if (options.port == 0 || options.port > dev_attr.phys_port_cnt) {
        status.fail(errc::port_not_found, "ibv_create_qp",
                    device.name() + " has no port " + std::to_string(options.port) + " (ports are 1.." +
                        std::to_string(dev_attr.phys_port_cnt) + ")");
        return port;
    }
    ibv_port_attr port_attr{};
    if (int rc = ibv_query_port(device.context(), options.port, &port_attr); rc != 0) {
        status.fail_errno(rc, "ibv_query_port", "cannot query " + device.name());
        return port;
    }
    port.port = options.port;
    port.link_layer = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET     ? LinkLayer::ethernet
                      : port_attr.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::infiniband
                                                                          : LinkLayer::unspecified;
    port.active_mtu = static_cast<Mtu>(port_attr.active_mtu);
    port.lid = port_attr.lid;
    port.device_max_rd_atomic = dev_attr.max_qp_init_rd_atom;
    port.device_max_dest_rd_atomic = dev_attr.max_qp_rd_atom;

    ibv_gid gid{};
    if (options.gid_index) {
        port.gid_index = *options.gid_index;
        if (int rc = ibv_query_gid(device.context(), options.port, static_cast<int>(*options.gid_index), &gid);
            rc != 0) {
            status.fail_errno(rc, "ibv_query_gid",
                              device.name() + " port " + std::to_string(options.port) + " has no GID index " +
                                  std::to_string(*options.gid_index));
            return port;
        }
    } else if (port.link_layer == LinkLayer::ethernet) {
        // The same table and rule as Device::select_gid, without reopening the device.
        std::vector<GidEntry> table = read_gid_table(device.context(), device.name(), options.port,
                                                     port_attr.gid_tbl_len, dev_attr.phys_port_cnt, status);
        if (!status.ok()) return port;
        auto chosen = select_gid(table, LinkLayer::ethernet, options.gid_preference);
        if (!chosen) {
            status.fail(errc::gid_not_found, "ibv_create_qp",
                        device.name() + " port " + std::to_string(options.port) +
                            " has no RoCE GID to connect with (does its interface have an IP address?)");
            return port;
        }
        port.gid_index = chosen->index;
        gid = chosen->gid.to_native();
    } else {
        (void)ibv_query_gid(device.context(), options.port, 0, &gid); // IB: GID 0 for cross-subnet use
    }

    gid_out = Gid::from_native(gid);
    return port;
}

} // namespace detail

PreparedQueuePair PreparedQueuePair::create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                                 const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                                                 const QueuePairOptions& options, detail::Status& status) {
    const char* verb = "ibv_create_qp";
    if (!pd || !send_cq || !recv_cq || (srq != nullptr && !*srq)) {
        status.fail(errc::invalid_argument, verb, "the ProtectionDomain, a CompletionQueue or the SRQ is empty");
        return {};
    }
    ibv_context* context = pd.native_handle()->context;
    if (send_cq.native_handle()->context != context || recv_cq.native_handle()->context != context ||
        (srq != nullptr && srq->native_handle()->context != context)) {
        // Verbs would only say EINVAL.
        status.fail(errc::invalid_argument, verb,
                    "the completion queues, shared receive queue and protection domain must come from the same "
                    "opened Device; here they come from different Device objects (a device opened twice?)");
        return {};
    }
    PreparedQueuePair p;
    Gid local_gid;
    p.port_ = detail::resolve_local_port(pd, options, local_gid, status);
    if (!status.ok()) return {};
    const detail::DeviceCore& device = *pd.core()->device();
    ibv_qp_init_attr init =
        detail::qp_init_attr(IBV_QPT_RC, send_cq, recv_cq, options, srq != nullptr ? srq->native_handle() : nullptr);
    errno = 0;
    ibv_qp* qp = ibv_create_qp(pd.native_handle(), &init);
    if (qp == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        status.fail_errno(err, verb,
                          "cannot create an RC queue pair on " + device.name() +
                              " with max_send_wr=" + std::to_string(options.max_send_wr) +
                              " max_recv_wr=" + std::to_string(options.max_recv_wr) +
                              " max_send_sge=" + std::to_string(options.max_send_sge) +
                              " max_recv_sge=" + std::to_string(options.max_recv_sge) +
                              " max_inline_data=" + std::to_string(options.max_inline_data) +
                              (err == EINVAL ? " (above the device's limits? see Device::query())" : ""));
        return {};
    }
    p.core_ = std::make_shared<detail::QpCore>(pd.core(), send_cq.core(), recv_cq.core(),
                                               srq != nullptr ? srq->core() : nullptr, qp, detail::granted(init.cap));
    if (!modify(qp,
                detail::init_transition(p.port_, Access::remote_write | Access::remote_read | Access::remote_atomic),
                "RESET->INIT", status)) {
        return {};
    }
    p.local_.qp_num = qp->qp_num;
    p.local_.psn = random_psn();
    p.local_.lid = p.port_.lid;
    p.local_.gid = local_gid;
    p.local_.mtu = p.port_.active_mtu;
    p.local_.link_layer = p.port_.link_layer;
    return p;
}

PreparedQueuePair::PreparedQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                     const CompletionQueue& recv_cq, const QueuePairOptions& options)
    : PreparedQueuePair(
          detail::or_throw([&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, nullptr, options, s); })) {
}

PreparedQueuePair::PreparedQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                     const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                     const QueuePairOptions& options)
    : PreparedQueuePair(
          detail::or_throw([&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, &srq, options, s); })) {}

PreparedQueuePair PreparedQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                            const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                            std::error_code& ec) {
    return detail::or_code(ec,
                           [&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, nullptr, options, s); });
}

QueuePair PreparedQueuePair::connect_impl(const Endpoint& remote, const ConnectOptions& options,
                                          detail::Status& status) {
    if (!core_) {
        status.fail(errc::invalid_argument, "ibv_modify_qp", "the PreparedQueuePair is empty");
        return {};
    }
    ibv_qp* qp = core_->qp();
    // The QP may have been connected for access flags other than the defaults.
    if (options.remote_access != (Access::remote_write | Access::remote_read | Access::remote_atomic)) {
        detail::QpTransition access;
        access.attr.qp_access_flags = detail::init_transition(port_, options.remote_access).attr.qp_access_flags;
        access.mask = IBV_QP_ACCESS_FLAGS;
        if (!modify(qp, access, "INIT access flags", status)) return {};
    }
    detail::QpTransition rtr = detail::rtr_transition(port_, remote, options, status);
    if (!status.ok()) return {};
    if (!modify(qp, rtr, "INIT->RTR", status) ||
        !modify(qp, detail::rts_transition(local_.psn, port_, options), "RTR->RTS", status)) {
        // Leave it usable: back to INIT so connect can be tried again.
        detail::Status ignored;
        (void)to_reset_and_init(qp, port_, ignored);
        return {};
    }
    QueuePair q;
    q.core_ = std::move(core_);
    q.port_ = port_;
    q.local_ = local_;
    q.remote_ = remote;
    return q;
}

QueuePair PreparedQueuePair::connect(const Endpoint& remote, const ConnectOptions& options) && {
    return detail::or_throw([&](detail::Status& s) { return connect_impl(remote, options, s); });
}

QueuePair PreparedQueuePair::connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec) && {
    return detail::or_code(ec, [&](detail::Status& s) { return connect_impl(remote, options, s); });
}

QpState QueuePair::state() const {
    if (!core_) return QpState::unknown;
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (int rc = ibv_query_qp(core_->qp(), &attr, IBV_QP_STATE, &init); rc != 0) {
        throw Error({rc, std::system_category()}, "ibv_query_qp", "cannot query the state of " + qp_name(qp_num()));
    }
    switch (attr.qp_state) {
        case IBV_QPS_RESET: return QpState::reset;
        case IBV_QPS_INIT: return QpState::init;
        case IBV_QPS_RTR: return QpState::ready_to_receive;
        case IBV_QPS_RTS: return QpState::ready_to_send;
        case IBV_QPS_SQD: return QpState::send_drained;
        case IBV_QPS_SQE: return QpState::send_error;
        case IBV_QPS_ERR: return QpState::error;
        default: return QpState::unknown;
    }
}

std::error_code QueuePair::force_error() noexcept {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    int rc = ibv_modify_qp(core_->qp(), &attr, IBV_QP_STATE);
    return rc == 0 ? std::error_code() : std::error_code(rc, std::system_category());
}

PreparedQueuePair QueuePair::reset() && {
    detail::Status status;
    if (!core_) {
        status.fail(errc::invalid_argument, "ibv_modify_qp", "the QueuePair is empty");
        status.raise();
    }
    if (!to_reset_and_init(core_->qp(), port_, status)) status.raise();
    core_->send.reset();
    core_->receive.reset();
    PreparedQueuePair p;
    p.core_ = std::move(core_);
    p.port_ = port_;
    p.local_ = local_;
    p.local_.psn = random_psn();
    return p;
}

SharedReceiveQueue SharedReceiveQueue::create_impl(const ProtectionDomain& pd, std::uint32_t max_wr,
                                                   std::uint32_t max_sge, detail::Status& status) {
    if (!pd) {
        status.fail(errc::invalid_argument, "ibv_create_srq", "the ProtectionDomain is empty");
        return {};
    }
    ibv_srq_init_attr init{};
    init.attr.max_wr = max_wr;
    init.attr.max_sge = max_sge;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(pd.native_handle(), &init);
    if (srq == nullptr) {
        status.fail_errno(errno != 0 ? errno : ENOMEM, "ibv_create_srq",
                          "cannot create a shared receive queue of " + std::to_string(max_wr) + " receives with " +
                              std::to_string(max_sge) + " SGEs on " + pd.device_name());
        return {};
    }
    SharedReceiveQueue q;
    q.core_ = std::make_shared<detail::SrqCore>(pd.core(), srq, init.attr.max_wr, init.attr.max_sge);
    return q;
}

SharedReceiveQueue::SharedReceiveQueue(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge)
    : SharedReceiveQueue(detail::or_throw([&](detail::Status& s) { return create_impl(pd, max_wr, max_sge, s); })) {}

SharedReceiveQueue SharedReceiveQueue::create(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                              std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, max_wr, max_sge, s); });
}

} // namespace gpuverbs
