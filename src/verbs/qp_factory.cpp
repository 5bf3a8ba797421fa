#include "gpuverbs/detail/verbs/qp_factory.hpp"
#include "gpuverbs/detail/access.hpp"
#include "gpuverbs/detail/verbs/device_core.hpp"

#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#include "random.hpp"

#include <cerrno>
#include <cstdio>
#include <stdexcept>

namespace gpuverbs::detail {

namespace {

// The checks every queue pair's parts must pass before verbs sees them.
bool check_parts(const QpParts& parts, const char* verb, Status& status) {
    const SharedReceiveQueue* srq = parts.srq;
    if (parts.pd == nullptr || parts.send_cq == nullptr || parts.recv_cq == nullptr || !*parts.pd || !*parts.send_cq ||
        !*parts.recv_cq || (srq != nullptr && !*srq)) {
        status.fail(errc::invalid_argument, verb,
                    srq != nullptr ? "the ProtectionDomain, a CompletionQueue or the SRQ is empty"
                                   : "the ProtectionDomain or a CompletionQueue is empty");
        return false;
    }
    ibv_context* context = parts.pd->native_handle()->context;
    if (parts.send_cq->native_handle()->context != context || parts.recv_cq->native_handle()->context != context ||
        (srq != nullptr && srq->native_handle()->context != context)) {
        // Verbs would only say EINVAL.
        status.fail(errc::invalid_argument, verb,
                    "the completion queues, shared receive queue and protection domain must come from the same "
                    "opened Device; here they come from different Device objects (a device opened twice?)");
        return false;
    }
    return true;
}

const char* type_name(ibv_qp_type type) {
    return type == IBV_QPT_UD ? "a UD" : "an RC";
}

// The creation attributes of a queue pair of `type` from the user's options
// (no receive queue of its own when it uses a shared receive queue).
ibv_qp_init_attr qp_init_attr(ibv_qp_type type, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                              const QueuePairOptions& options, ibv_srq* srq) noexcept {
    ibv_qp_init_attr init{};
    init.send_cq = send_cq.native_handle();
    init.recv_cq = recv_cq.native_handle();
    init.srq = srq;
    init.qp_type = type;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = options.max_send_wr;
    init.cap.max_recv_wr = srq != nullptr ? 0 : options.max_recv_wr;
    init.cap.max_send_sge = options.max_send_sge;
    init.cap.max_recv_sge = srq != nullptr ? 0 : options.max_recv_sge;
    init.cap.max_inline_data = options.max_inline_data;
    return init;
}

// What the device granted: ibv_create_qp and rdma_create_qp write it back into the attributes.
QueuePairCapabilities granted(const ibv_qp_cap& cap) noexcept {
    // max_rd_atomic: not known before the queue pair connects (connect sets it), and nothing moves before.
    return {cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data};
}

// An RC queue pair with the extended send verbs (every opcode gpuverbs posts),
// or nullptr when the provider has none (the caller then makes a classic one).
ibv_qp* create_extended(ibv_pd* pd, ibv_qp_init_attr& init) noexcept {
    ibv_qp_init_attr_ex ex{};
    ex.qp_context = init.qp_context;
    ex.send_cq = init.send_cq;
    ex.recv_cq = init.recv_cq;
    ex.srq = init.srq;
    ex.cap = init.cap;
    ex.qp_type = init.qp_type;
    ex.sq_sig_all = init.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ex.pd = pd;
    ex.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                        IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    ibv_qp* qp = ibv_create_qp_ex(pd->context, &ex);
    if (qp != nullptr) init.cap = ex.cap; // what the device granted
    return qp;
}

// Creates the ibv_qp (ibv_create_qp, or `make` when given) and wraps it in its QpCore.
std::shared_ptr<QpCore> make_core(ibv_qp_type type, const QpParts& parts, const QueuePairOptions& options,
                                  const char* verb, const QpMaker* make, std::shared_ptr<void> owner, Status& status) {
    ibv_qp_init_attr init = qp_init_attr(type, *parts.send_cq, *parts.recv_cq, options,
                                         parts.srq != nullptr ? parts.srq->native_handle() : nullptr);
    ibv_qp* qp = nullptr;
    bool extended = false;
    if (options.extended_verbs && make == nullptr && type == IBV_QPT_RC) {
        qp = create_extended(parts.pd->native_handle(), init);
        extended = qp != nullptr; // else: the provider has no extended verbs (or refused): classic below
    }
    errno = 0;
    if (qp == nullptr) {
        qp = make != nullptr ? (*make)(parts.pd->native_handle(), init)
                             : ibv_create_qp(parts.pd->native_handle(), &init);
    }
    if (qp == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        status.fail_errno(err, verb,
                          std::string("cannot create ") + type_name(type) + " queue pair on " +
                              parts.pd->device_name() + " with max_send_wr=" + std::to_string(options.max_send_wr) +
                              " max_recv_wr=" + std::to_string(options.max_recv_wr) +
                              " max_send_sge=" + std::to_string(options.max_send_sge) +
                              " max_recv_sge=" + std::to_string(options.max_recv_sge) +
                              " max_inline_data=" + std::to_string(options.max_inline_data) +
                              (err == EINVAL ? " (above the device's limits? see Device::query())" : ""));
        return nullptr;
    }
    const bool owned_here = owner == nullptr;
    try {
        auto core = std::make_shared<QpCore>(
            access::core(*parts.pd), access::core(*parts.send_cq), access::core(*parts.recv_cq),
            parts.srq != nullptr ? access::core(*parts.srq) : nullptr, qp, granted(init.cap), std::move(owner));
        if (extended) core->use_extended(ibv_qp_to_qp_ex(qp));
        return core;
    } catch (const std::length_error&) {
        // The completion queue's registry is full: an error the caller can act on, not an exception.
        if (owned_here) destroyed(ibv_destroy_qp(qp));
        status.fail(errc::invalid_argument, verb,
                    "more than 65,536 queue pairs on one CompletionQueue: spread them over several CQs");
        return nullptr;
    } catch (...) {
        // No QpCore took the QP (out of memory): do not leak it.
        if (owned_here) destroyed(ibv_destroy_qp(qp));
        throw;
    }
}

// The port, GID index and device limits a new queue pair on `pd` will use
// (options.port, options.gid_index or select_gid's choice); `gid_out` receives
// the GID itself. Fails with errc::port_not_found or errc::gid_not_found.
LocalPort resolve_local_port(const ProtectionDomain& pd, const QueuePairOptions& options, Gid& gid_out,
                             Status& status) {
    LocalPort port;
    const DeviceCore& device = *access::core(pd)->device();
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

} // namespace

NewQp create_qp(ibv_qp_type type, const QpParts& parts, const QueuePairOptions& options, Status& status) {
    NewQp made;
    if (!check_parts(parts, "ibv_create_qp", status)) return made;
    // The port and GID are checked before the QP exists, so connect() cannot fail on them.
    made.port = resolve_local_port(*parts.pd, options, made.gid, status);
    if (!status.ok()) return made;
    made.core = make_core(type, parts, options, "ibv_create_qp", nullptr, nullptr, status);
    return made;
}

std::shared_ptr<QpCore> create_owned_qp(const QpParts& parts, const QueuePairOptions& options, const char* verb,
                                        const QpMaker& make, std::shared_ptr<void> owner, Status& status) {
    if (!check_parts(parts, verb, status)) return nullptr;
    return make_core(IBV_QPT_RC, parts, options, verb, &make, std::move(owner), status);
}

bool modify_qp(ibv_qp* qp, const QpTransition& transition, const char* which, Status& status) {
    ibv_qp_attr attr = transition.attr;
    if (int rc = ibv_modify_qp(qp, &attr, transition.mask); rc != 0) {
        status.fail_errno(rc, std::string("ibv_modify_qp(") + which + ")",
                          "cannot move " + qp_name(qp->qp_num) + " " + which + " with " + describe(transition));
        return false;
    }
    return true;
}

std::uint32_t random_psn() {
    return static_cast<std::uint32_t>(system_random()) & 0xffffff; // not an LCG a peer could follow
}

std::string qp_name(std::uint32_t qp_num) {
    char text[24];
    std::snprintf(text, sizeof text, "QP 0x%x", qp_num);
    return text;
}

Access advertised_access(const MemoryRegion& mr, const ibv_pd* qp_pd, std::string_view verb, Status& status) {
    if (!mr) {
        status.fail(errc::invalid_argument, verb, "the MemoryRegion is empty");
    } else if (qp_pd != nullptr && mr.native_handle()->pd != qp_pd) {
        status.fail(errc::invalid_argument, verb,
                    "the region belongs to another protection domain than the queue pair's: the peer could not use "
                    "its key through it");
    }
    return status.ok() ? mr.access() & peer_facing_access : Access::none;
}

} // namespace gpuverbs::detail
