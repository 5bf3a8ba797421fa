// The posting path: what runs for every work request gpuverbs posts.
//
// lower() turns a WorkRequest into an ibv_send_wr in place and makes every
// local check — opcode, scatter/gather count, each local range inside its
// region, inline size, remote range, atomic size and alignment — with a
// handful of compares; nothing is posted when one fails. submit_send() and
// submit_receive() take a slot in the queue's ring (or refuse with
// "queue full"), record the caller's context there, put the slot in the
// wr_id and ring the doorbell. The synchronous post_*, SendBatch and the
// asynchronous operations all come through here, so they check the same
// things and cannot drift apart. No allocation, no lock, no exception.
#pragma once

#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/data_path/completion_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <span>
#include <system_error>

namespace gpuverbs::detail {

/// Scatter/gather entries one request may have in gpuverbs (devices allow fewer).
inline constexpr std::size_t max_sge_per_request = 32;

/// What each gpuverbs opcode is on the send queue: one table, no switch.
struct OpcodeTraits {
    ibv_wr_opcode verbs = IBV_WR_SEND;
    bool send_side = false;  ///< a request of the send queue at all
    bool remote = false;     ///< names remote memory
    bool atomic = false;     ///< 8 bytes, 8-byte aligned, result into the local buffer
    bool into_local = false; ///< the NIC writes the local buffer (reads, atomics): never inline
};
inline constexpr std::array<OpcodeTraits, 10> opcode_traits = [] {
    std::array<OpcodeTraits, 10> t{};
    auto at = [&t](Opcode op) -> OpcodeTraits& { return t[static_cast<std::size_t>(op)]; };
    at(Opcode::send) = {IBV_WR_SEND, true, false, false, false};
    at(Opcode::send_with_imm) = {IBV_WR_SEND_WITH_IMM, true, false, false, false};
    at(Opcode::write) = {IBV_WR_RDMA_WRITE, true, true, false, false};
    at(Opcode::write_with_imm) = {IBV_WR_RDMA_WRITE_WITH_IMM, true, true, false, false};
    at(Opcode::read) = {IBV_WR_RDMA_READ, true, true, false, true};
    at(Opcode::compare_swap) = {IBV_WR_ATOMIC_CMP_AND_SWP, true, true, true, true};
    at(Opcode::fetch_add) = {IBV_WR_ATOMIC_FETCH_AND_ADD, true, true, true, true};
    return t;
}();

/// Checks `r` against the QP's capabilities and fills `wr` and `sges` (room
/// for max_sge_per_request entries) — everything but wr_id. Pure.
GPUVERBS_HOT std::error_code lower(const WorkRequest& r, const QueuePairCapabilities& caps, ibv_send_wr& wr,
                                   ibv_sge* sges) noexcept {
    const auto op = static_cast<std::size_t>(r.opcode());
    if (op >= opcode_traits.size() || !opcode_traits[op].send_side) return errc::invalid_argument;
    const OpcodeTraits& t = opcode_traits[op];
    const std::span<const LocalBuffer> local = r.local();
    const std::size_t n = local.size();
    if (n > caps.max_send_sge || n > max_sge_per_request) return errc::too_many_sges;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const LocalBuffer& b = local[i];
        if (!b.in_region()) return errc::local_range_outside_region;
        sges[i].addr = b.address;
        sges[i].length = b.length;
        sges[i].lkey = b.lkey;
        total += b.length;
    }
    const SendOptions& o = r.send_options();
    if (o.inline_data) {
        if (t.into_local) return errc::invalid_argument; // the NIC writes into reads' and atomics' buffers
        if (total > caps.max_inline_data) return errc::inline_too_large;
    }
    if (t.remote) {
        const RemoteMemory& remote = r.remote();
        if (!remote.contains(r.remote_offset(), t.atomic ? 8 : total)) return errc::remote_range_outside_region;
        const std::uint64_t remote_address = remote.address + r.remote_offset();
        if (t.atomic) {
            if (n != 1 || total != 8 || ((sges[0].addr | remote_address) & 7U) != 0) return errc::misaligned_atomic;
            wr.wr.atomic.remote_addr = remote_address;
            wr.wr.atomic.compare_add = r.compare_add();
            wr.wr.atomic.swap = r.swap_value();
            wr.wr.atomic.rkey = remote.rkey;
        } else {
            wr.wr.rdma.remote_addr = remote_address;
            wr.wr.rdma.rkey = remote.rkey;
        }
    }
    wr.next = nullptr;
    wr.sg_list = sges;
    wr.num_sge = static_cast<int>(n);
    wr.opcode = t.verbs;
    wr.send_flags = (o.signaled ? unsigned{IBV_SEND_SIGNALED} : 0U) | (o.inline_data ? unsigned{IBV_SEND_INLINE} : 0U) |
                    (o.fence ? unsigned{IBV_SEND_FENCE} : 0U) | (o.solicited ? unsigned{IBV_SEND_SOLICITED} : 0U);
    wr.imm_data = htonl(r.immediate());
    return no_error();
}

/// Checks a receive and fills `wr` and `sges` — everything but wr_id. Pure.
inline std::error_code lower_receive(std::span<const LocalBuffer> local, std::uint32_t max_sge, ibv_recv_wr& wr,
                                     ibv_sge* sges) noexcept {
    if (local.size() > max_sge || local.size() > max_sge_per_request) return errc::too_many_sges;
    for (std::size_t i = 0; i < local.size(); ++i) {
        if (!local[i].in_region()) return errc::local_range_outside_region;
        sges[i].addr = local[i].address;
        sges[i].length = local[i].length;
        sges[i].lkey = local[i].lkey;
    }
    wr.next = nullptr;
    wr.sg_list = sges;
    wr.num_sge = static_cast<int>(local.size());
    return no_error();
}

/// Where a receive goes: the QP's own receive queue, or an SRQ.
struct ReceiveTarget {
    WorkQueueState* queue;
    QueueKind kind;
    std::uint32_t tag;
    std::uint32_t max_sge;
    ibv_qp* qp;   ///< when posting to the QP
    ibv_srq* srq; ///< when posting to the SRQ
};
/// The QP's receive queue; errc::receives_through_srq when the QP takes its
/// receives from a SharedReceiveQueue (post them there).
inline std::error_code receive_target(QpCore& qp, ReceiveTarget& out) noexcept {
    if (qp.srq() != nullptr) return errc::receives_through_srq;
    out = {&qp.receive, QueueKind::receive, qp.recv_tag(), qp.caps().max_recv_sge, qp.qp(), nullptr};
    return no_error();
}
inline ReceiveTarget receive_target(SrqCore& srq) noexcept {
    return {&srq.receive, QueueKind::shared_receive, 0, srq.max_sge, nullptr, srq.srq()};
}

/// Posts one lowered send request: takes a slot (or errc::send_queue_full),
/// records `context` and `opcode` in it, rings the doorbell, commits.
GPUVERBS_HOT std::error_code submit_send(QpCore& qp, ibv_send_wr& wr, std::uint64_t context, Opcode opcode) noexcept {
    if (!qp.send.has_room_for(1)) return errc::send_queue_full;
    qp.send.record(0, context, opcode);
    wr.wr_id = WrId::encode(QueueKind::send, qp.send_tag(), qp.send.slot(0));
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp.qp(), &wr, &bad); rc != 0) return {rc, std::system_category()};
    qp.send.commit(1);
    return no_error();
}

/// Posts one lowered receive to `target` (errc::receive_queue_full when it has no room).
inline std::error_code submit_receive(const ReceiveTarget& target, ibv_recv_wr& wr, std::uint64_t context) noexcept {
    WorkQueueState& queue = *target.queue;
    if (!queue.has_room_for(1)) return errc::receive_queue_full;
    queue.record(0, context, Opcode::receive);
    wr.wr_id = WrId::encode(target.kind, target.tag, queue.slot(0));
    ibv_recv_wr* bad = nullptr;
    const int rc =
        target.srq != nullptr ? ibv_post_srq_recv(target.srq, &wr, &bad) : ibv_post_recv(target.qp, &wr, &bad);
    if (rc != 0) return {rc, std::system_category()};
    queue.commit(1);
    return no_error();
}

/// The synchronous form: lower, then submit.
GPUVERBS_HOT std::error_code post(QpCore& qp, const WorkRequest& r) noexcept {
    ibv_send_wr wr;
    std::array<ibv_sge, max_sge_per_request> sges;
    if (std::error_code ec = lower(r, qp.caps(), wr, sges.data())) return ec;
    return submit_send(qp, wr, r.send_options().context, r.opcode());
}

inline std::error_code post_receive(const ReceiveTarget& target, std::span<const LocalBuffer> local,
                                    std::uint64_t context) noexcept {
    ibv_recv_wr wr;
    std::array<ibv_sge, max_sge_per_request> sges;
    if (std::error_code ec = lower_receive(local, target.max_sge, wr, sges.data())) return ec;
    return submit_receive(target, wr, context);
}

/// At most this many receives go to the NIC with one post_receives call.
inline constexpr std::size_t max_receives_per_post = 32;

/// One receive per buffer (contexts first_context, first_context + 1, …), all
/// checked, then posted with one ibv_post_recv: all of them, or none when a
/// check fails (errc::batch_full for more than max_receives_per_post,
/// receive_queue_full without room for all). Should the provider refuse one,
/// those before it are posted and accounted for.
inline std::error_code post_receives(const ReceiveTarget& target, std::span<const LocalBuffer> buffers,
                                     std::uint64_t first_context) noexcept {
    const std::size_t n = buffers.size();
    if (n == 0) return no_error();
    if (n > max_receives_per_post) return errc::batch_full;
    WorkQueueState& queue = *target.queue;
    if (!queue.has_room_for(static_cast<std::uint32_t>(n))) return errc::receive_queue_full;
    std::array<ibv_recv_wr, max_receives_per_post> wrs;
    std::array<ibv_sge, max_receives_per_post> sges;
    for (std::size_t i = 0; i < n; ++i) {
        if (std::error_code ec = lower_receive(buffers.subspan(i, 1), target.max_sge, wrs[i], &sges[i])) return ec;
    }
    for (std::size_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::uint32_t>(i);
        queue.record(k, first_context + i, Opcode::receive);
        wrs[i].wr_id = WrId::encode(target.kind, target.tag, queue.slot(k));
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    const int rc = target.srq != nullptr ? ibv_post_srq_recv(target.srq, wrs.data(), &bad)
                                         : ibv_post_recv(target.qp, wrs.data(), &bad);
    queue.commit(static_cast<std::uint32_t>(rc == 0 ? n : static_cast<std::size_t>(bad - wrs.data())));
    return rc == 0 ? no_error() : std::error_code(rc, std::system_category());
}

} // namespace gpuverbs::detail
