// The completion path: what runs for every work completion gpuverbs reports.
//
// Per completion: one registry lookup by the index the wr_id carries (no lock,
// no search), one slot read that gives back the caller's context and opcode,
// and a Completion filled with plain stores. Per poll: one ibv_poll_cq of up to
// 32 and two atomic increments (QpRegistry::PollGuard). Nothing allocates;
// a successful status costs no call into the C++ runtime.
#pragma once

#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <system_error>

namespace gpuverbs::detail {

/// std::system_category(), looked up once: a default-constructed
/// std::error_code calls that out-of-line function each time, which is most
/// of what a successful completion would otherwise cost.
inline const std::error_category* const system_category_ptr = &std::system_category();

/// The empty (success) std::error_code, without a call into the runtime.
GPUVERBS_HOT std::error_code no_error() noexcept {
    // Before static initialisation has run (another static's constructor), fall back.
    return system_category_ptr != nullptr ? std::error_code(0, *system_category_ptr) : std::error_code();
}

/// The queue a completion belongs to, or nullptr when its QP was destroyed
/// before the completion was polled. Call inside a QpRegistry::PollGuard.
GPUVERBS_HOT WorkQueueState* queue_of(const ibv_wc& wc, QpRegistry& registry) noexcept {
    const QueueKind kind = WrId::kind(wc.wr_id);
    if (kind == QueueKind::shared_receive) {
        SrqCore* srq = registry.find_srq(WrId::index(wc.wr_id), WrId::generation(wc.wr_id));
        return srq != nullptr ? &srq->receive : nullptr;
    }
    QpCore* qp = registry.find(WrId::index(wc.wr_id), WrId::generation(wc.wr_id));
    if (qp == nullptr) return nullptr;
    return kind == QueueKind::send ? &qp->send : &qp->receive;
}

/// A failed completion of an RC queue pair: the queue pair is in the error
/// state from now on (QpHealth). Off the success path. Inside a PollGuard.
inline void note_failed_completion(const ibv_wc& wc, QpRegistry& registry) noexcept {
    if (WrId::kind(wc.wr_id) == QueueKind::shared_receive) return; // an SRQ completion names no queue pair cheaply
    QpCore* qp = registry.find(WrId::index(wc.wr_id), WrId::generation(wc.wr_id));
    if (qp != nullptr && qp->qp()->qp_type == IBV_QPT_RC)
        (void)qp->health.fail(QueuePairFailure::Cause::completion_failed, static_cast<int>(wc.status));
}

/// Turns one work completion into a Completion: the caller's context and the
/// operation come from the slot the wr_id names (ibv_wc.opcode is undefined
/// on errors). Pure apart from the slot's retirement.
GPUVERBS_HOT void translate(const ibv_wc& wc, WorkQueueState* queue, Completion& c) noexcept {
    c.status = CompletionStatus(wc.status);
    c.byte_length = wc.byte_len;
    c.qp_num = wc.qp_num;
    c.source_qp = wc.src_qp;
    c.vendor_error = wc.vendor_err;
    c.immediate.reset();
    if (queue == nullptr) { // the QP was destroyed before its completions were polled
        c.context = 0;
        c.opcode = Opcode::unknown;
        return;
    }
    const WorkQueueState::Finished f = queue->complete(WrId::slot(wc.wr_id));
    c.context = f.context;
    c.opcode = f.opcode == Opcode::receive && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM
                   ? Opcode::receive_with_imm
                   : f.opcode;
    // Immediate data is the peer's, on receives only: some providers (rxe)
    // also flag the sender's own write-with-immediate completion, with imm 0.
    if (f.opcode == Opcode::receive && (wc.wc_flags & IBV_WC_WITH_IMM) != 0) c.immediate = ntohl(wc.imm_data);
}

/// The one poll, behind CompletionQueue::poll and the asynchronous driver:
/// up to `max` work completions of `cq`, each handed to `on(wc, queue, i)`
/// with its queue's state (nullptr: its QP or SRQ is gone), inside the
/// registry's guard (`Guarded` false: the caller knows no QP or SRQ of this
/// CQ can be destroyed meanwhile — one thread does both). Returns how many,
/// or a negative errno when the first ibv_poll_cq failed.
template <bool Guarded = true, class OnCompletion>
GPUVERBS_HOT int poll_completions(ibv_cq* cq, QpRegistry& registry, int max, OnCompletion&& on) noexcept {
    constexpr int batch = 32;
    ibv_wc wc[batch];
    int total = 0;
    do {
        const int want = max - total < batch ? max - total : batch;
        const int got = ibv_poll_cq(cq, want, wc);
        if (got <= 0) return got < 0 && total == 0 ? got : total;
        // Each completion goes to its queue's state; a failed one is counted there too.
        auto each = [&](int i) {
            WorkQueueState* queue = queue_of(wc[i], registry);
            if (wc[i].status != IBV_WC_SUCCESS && queue != nullptr) [[unlikely]] {
                queue->count_error(static_cast<unsigned>(wc[i].status));
                note_failed_completion(wc[i], registry);
            }
            on(wc[i], queue, total + i);
        };
        if constexpr (Guarded) {
            QpRegistry::PollGuard guard(registry);
            for (int i = 0; i < got; ++i) each(i);
        } else {
            for (int i = 0; i < got; ++i) each(i);
        }
        total += got;
        if (got < want) break;
    } while (total < max);
    return total;
}

/// Polls up to `max` of `cq`'s completions into `out`, translated; negative
/// errno on failure. What CompletionQueue::poll runs.
GPUVERBS_HOT int poll_into(CqCore& cq, Completion* out, int max) noexcept {
    return poll_completions(cq.cq(), cq.registry(), max,
                            [out](const ibv_wc& wc, WorkQueueState* queue, int i) { translate(wc, queue, out[i]); });
}

} // namespace gpuverbs::detail
