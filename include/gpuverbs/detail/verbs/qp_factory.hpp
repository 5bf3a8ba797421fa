// Where queue pairs are made. Every kind — a reliable-connected QP, an
// unreliable-datagram QP, the QP rdma_cm makes for a connection — is checked,
// created and wrapped in the QpCore the data path uses here, and moved between
// states here, with the attributes of the one table in qp_transitions.hpp.
#pragma once

#include "gpuverbs/detail/verbs/qp_transitions.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/gid.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace gpuverbs {
class SharedReceiveQueue;
}

namespace gpuverbs::detail {

/// What a queue pair is made from; `srq` may be null (the QP then has a receive queue of its own).
struct QpParts {
    const ProtectionDomain* pd = nullptr;
    const CompletionQueue* send_cq = nullptr;
    const CompletionQueue* recv_cq = nullptr;
    const SharedReceiveQueue* srq = nullptr;
};

/// A queue pair just made (in RESET) and the port and GID it talks from.
struct NewQp {
    std::shared_ptr<QpCore> core; ///< empty when creation failed
    LocalPort port;
    Gid gid;
};

/// Creates a queue pair of `type` (IBV_QPT_RC or IBV_QPT_UD) with
/// ibv_create_qp on the port and GID `options` choose (resolve_local_port);
/// its QpCore owns it. Fails `status` naming what is wrong: an empty part,
/// parts from different opened Devices, the port, the GID, or the depths the
/// device refused.
NewQp create_qp(ibv_qp_type type, const QpParts& parts, const QueuePairOptions& options, Status& status);

/// Makes an RC queue pair on someone else's behalf and returns it, or nullptr
/// with errno set: rdma_create_qp on a cm id, which keeps the QP.
using QpMaker = std::function<ibv_qp*(ibv_pd* pd, ibv_qp_init_attr& init)>;

/// The same checks and wrapping for an RC QP that `make` creates (`verb` names
/// it in errors) and `owner` destroys: the QpCore keeps `owner` alive and
/// leaves the QP to it. rdma_cm chooses the port itself, so none is resolved.
std::shared_ptr<QpCore> create_owned_qp(const QpParts& parts, const QueuePairOptions& options, const char* verb,
                                        const QpMaker& make, std::shared_ptr<void> owner, Status& status);

/// Applies one row of the transition table to `qp`; on failure `status` says
/// which change (`which`, e.g. "RESET->INIT"), on which QP, with which attributes.
bool modify_qp(ibv_qp* qp, const QpTransition& transition, const char* which, Status& status);

/// A random first packet sequence number (24 bits), so that a reused QP number
/// does not accept a stale peer's packets.
std::uint32_t random_psn();

/// "QP 0x1a2b", for messages.
std::string qp_name(std::uint32_t qp_num);
/// What advertising `mr` through a queue pair of domain `qp_pd` adds to the
/// queue pair's grant: mr's remote flags. Fails `status` (as `verb`) for an
/// empty region or one of another protection domain (`qp_pd` nullptr: no
/// queue pair yet, not checked).
Access advertised_access(const MemoryRegion& mr, const ibv_pd* qp_pd, std::string_view verb, Status& status);

} // namespace gpuverbs::detail
