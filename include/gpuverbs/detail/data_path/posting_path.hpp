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
#include <type_traits>

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
/// for r.local().size() entries, written only when at most
/// max_sge_per_request) — everything but wr_id; `bytes`, when given,
/// receives the bytes the request moves. Pure.
GPUVERBS_HOT std::error_code lower(const WorkRequest& r, const QueuePairCapabilities& caps, ibv_send_wr& wr,
                                   ibv_sge* sges, std::uint64_t* bytes = nullptr) noexcept {
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
    if (t.into_local && caps.max_rd_atomic == 0) return errc::reads_not_granted; // the device would hold it for ever
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
    if (bytes != nullptr) *bytes = total;
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
    ibv_qp* qp;             ///< when posting to the QP
    ibv_srq* srq;           ///< when posting to the SRQ
    const QpHealth* health; ///< the QP's (nullptr for an SRQ)
};
/// The QP's receive queue; errc::receives_through_srq when the QP takes its
/// receives from a SharedReceiveQueue (post them there).
inline std::error_code receive_target(QpCore& qp, ReceiveTarget& out) noexcept {
    if (qp.srq() != nullptr) return errc::receives_through_srq;
    out = {&qp.receive, QueueKind::receive, qp.recv_tag(), qp.caps().max_recv_sge, qp.qp(), nullptr, &qp.health};
    return no_error();
}
inline ReceiveTarget receive_target(SrqCore& srq) noexcept {
    return {&srq.receive, QueueKind::shared_receive, srq.tag(), srq.max_sge, nullptr, srq.srq(), nullptr};
}

/// Posts a chain of lowered send requests, each with at most one
/// scatter/gather entry, through the extended verbs: one ibv_wr_start …
/// ibv_wr_complete (one doorbell), all or nothing. An opcode outside what
/// gpuverbs lowers aborts the whole chain with EINVAL.
inline int post_extended(ibv_qp_ex* qpx, const ibv_send_wr* first) noexcept {
    ibv_wr_start(qpx);
    for (const ibv_send_wr* w = first; w != nullptr; w = w->next) {
        qpx->wr_id = w->wr_id;
        qpx->wr_flags = w->send_flags;
        switch (w->opcode) {
            case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(qpx, w->wr.rdma.rkey, w->wr.rdma.remote_addr); break;
            case IBV_WR_RDMA_WRITE_WITH_IMM:
                ibv_wr_rdma_write_imm(qpx, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
                break;
            case IBV_WR_SEND: ibv_wr_send(qpx); break;
            case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(qpx, w->imm_data); break;
            case IBV_WR_RDMA_READ: ibv_wr_rdma_read(qpx, w->wr.rdma.rkey, w->wr.rdma.remote_addr); break;
            case IBV_WR_ATOMIC_CMP_AND_SWP:
                ibv_wr_atomic_cmp_swp(qpx, w->wr.atomic.rkey, w->wr.atomic.remote_addr, w->wr.atomic.compare_add,
                                      w->wr.atomic.swap);
                break;
            case IBV_WR_ATOMIC_FETCH_AND_ADD:
                ibv_wr_atomic_fetch_add(qpx, w->wr.atomic.rkey, w->wr.atomic.remote_addr, w->wr.atomic.compare_add);
                break;
            default: ibv_wr_abort(qpx); return EINVAL;
        }
        if (w->num_sge == 1) {
            const ibv_sge& s = w->sg_list[0];
            if ((w->send_flags & IBV_SEND_INLINE) != 0) {
                ibv_wr_set_inline_data(qpx, reinterpret_cast<void*>(s.addr), // NOLINT(performance-no-int-to-ptr)
                                       s.length);
            } else {
                ibv_wr_set_sge(qpx, s.lkey, s.addr, s.length);
            }
        }
    }
    return ibv_wr_complete(qpx);
}

/// The one way gpuverbs hands lowered requests to a work queue — post,
/// SendBatch, the asynchronous driver and the transfer engine all use it:
///
///   SubmitChain chain(...);
///   if (!chain.reserve(n)) → queue full (nothing recorded);
///   chain.push(wr, context, opcode) …   // slot recorded, wr_id set, linked
///   chain.submit()                        // one doorbell
///
/// submit() accounts for a chain the provider took only in part: the
/// requests before the one it refused are committed (their completions will
/// come), the rest are not. `Wr` is ibv_send_wr or ibv_recv_wr.
template <class Wr>
class SubmitChain {
public:
    /// A send queue's chain.
    explicit SubmitChain(QpCore& qp) noexcept requires std::is_same_v<Wr, ibv_send_wr>
        : queue_(&qp.send),
          health_(&qp.health),
          qp_(qp.qp()),
          qpx_(qp.extended()),
          id_(WrId::encode(QueueKind::send, qp.send_tag(), 0)) {}
    /// A receive queue's chain (the QP's own or an SRQ).
    explicit SubmitChain(const ReceiveTarget& target) noexcept requires std::is_same_v<Wr, ibv_recv_wr>
        : queue_(target.queue),
          health_(target.health),
          qp_(target.qp),
          srq_(target.srq),
          id_(WrId::encode(target.kind, target.tag, 0)) {}

    /// Whether the queue has room for `n` more requests of this chain.
    [[nodiscard]] bool reserve(std::uint32_t n) const noexcept { return queue_->has_room_for(count_ + n); }

    /// Appends one lowered request (room reserved): its slot records
    /// `context` and `opcode`, its wr_id names the slot.
    GPUVERBS_HOT void push(Wr& wr, std::uint64_t context, Opcode opcode) noexcept {
        queue_->record(count_, context, opcode);
        wr.wr_id = id_ | queue_->slot(count_);
        attach(&wr, 1);
    }
    /// Appends `n` lowered requests laid out one after another, all for one
    /// owner (a transfer's chain): one record per slot, wr_ids and links set.
    GPUVERBS_HOT void push_run(Wr* wrs, std::uint32_t n, std::uint64_t context, Opcode opcode) noexcept {
        queue_->record_run(count_, n, context, opcode);
        const std::uint64_t first = queue_->posted() + count_;
        const std::uint32_t mask = queue_->mask();
        for (std::uint32_t k = 0; k < n; ++k) {
            wrs[k].wr_id = id_ | (static_cast<std::uint32_t>(first + k) & mask);
            wrs[k].next = wrs + k + 1;
        }
        attach(wrs, n);
    }

    /// Appends `n` lowered requests laid out one after another, request k
    /// with contexts[k] and opcodes[k] (a SendBatch): one pass, no per-request link branch.
    GPUVERBS_HOT void push_array(Wr* wrs, std::uint32_t n, const std::uint64_t* contexts,
                                 const Opcode* opcodes) noexcept {
        for (std::uint32_t k = 0; k < n; ++k) {
            queue_->record(count_ + k, contexts[k], opcodes[k]);
            wrs[k].wr_id = id_ | queue_->slot(count_ + k);
            wrs[k].next = wrs + k + 1;
        }
        attach(wrs, n);
    }

    /// The sequence number the next pushed request will have (1 for a queue's first).
    [[nodiscard]] std::uint64_t next_sequence() const noexcept { return queue_->posted() + count_ + 1; }
    [[nodiscard]] std::uint32_t size() const noexcept { return count_; }

    /// Rings the doorbell once for the whole chain and commits what the
    /// provider took (taken()); the chain is empty afterwards.
    GPUVERBS_HOT std::error_code submit() noexcept {
        taken_ = 0;
        if (count_ == 0) return no_error();
        // A queue pair known to be in error takes nothing: the provider may
        // never complete what it is given (a receive on Soft-RoCE).
        if (health_ != nullptr && health_->failed()) [[unlikely]] {
            count_ = 0;
            first_ = last_ = nullptr;
            return errc::queue_pair_in_error;
        }
        Wr* bad = nullptr;
        int rc = 0;
        if constexpr (std::is_same_v<Wr, ibv_send_wr>) {
            if (qpx_ != nullptr && one_entry_each()) {
                rc = post_extended(qpx_, first_);
                bad = rc == 0 ? nullptr : first_; // all or nothing
            } else {
                rc = ibv_post_send(qp_, first_, &bad);
            }
        } else {
            rc = srq_ != nullptr ? ibv_post_srq_recv(srq_, first_, &bad) : ibv_post_recv(qp_, first_, &bad);
        }
        if (rc == 0) {
            taken_ = count_;
        } else {
            // The requests before the refused one were posted: count them.
            for (const Wr* w = first_; w != nullptr && w != bad; w = w->next) ++taken_;
        }
        queue_->commit(taken_);
        count_ = 0;
        first_ = last_ = nullptr;
        return rc == 0 ? no_error() : std::error_code(rc, std::system_category());
    }
    /// How many requests the last submit() handed to the device.
    [[nodiscard]] std::uint32_t taken() const noexcept { return taken_; }

private:
    /// Whether every request has at most one scatter/gather entry (the
    /// extended path then needs no ibv_wr_set_sge_list, which rxe before
    /// rdma-core 64 gets wrong).
    [[nodiscard]] bool one_entry_each() const noexcept {
        for (const Wr* w = first_; w != nullptr; w = w->next) {
            if (w->num_sge > 1) return false;
        }
        return true;
    }

    /// Links wrs[0 .. n) (each already linked to the next) after the chain.
    void attach(Wr* wrs, std::uint32_t n) noexcept {
        wrs[n - 1].next = nullptr;
        if (last_ != nullptr) {
            last_->next = wrs;
        } else {
            first_ = wrs;
        }
        last_ = wrs + n - 1;
        count_ += n;
    }

    WorkQueueState* queue_;
    const QpHealth* health_ = nullptr; ///< the queue pair's (none for an SRQ)
    ibv_qp* qp_ = nullptr;
    ibv_qp_ex* qpx_ = nullptr; ///< set when the QP posts through the extended verbs
    ibv_srq* srq_ = nullptr;
    std::uint64_t id_; ///< the wr_id without its slot
    Wr* first_ = nullptr;
    Wr* last_ = nullptr;
    std::uint32_t count_ = 0;
    std::uint32_t taken_ = 0;
};

/// Posts one lowered send request: takes a slot (or errc::send_queue_full),
/// records `context` and `opcode` in it, rings the doorbell, commits.
GPUVERBS_HOT std::error_code submit_send(QpCore& qp, ibv_send_wr& wr, std::uint64_t context, Opcode opcode) noexcept {
    SubmitChain<ibv_send_wr> chain(qp);
    if (!chain.reserve(1)) return errc::send_queue_full;
    chain.push(wr, context, opcode);
    return chain.submit();
}

/// Posts one lowered receive to `target` (errc::receive_queue_full when it has no room).
inline std::error_code submit_receive(const ReceiveTarget& target, ibv_recv_wr& wr, std::uint64_t context) noexcept {
    SubmitChain<ibv_recv_wr> chain(target);
    if (!chain.reserve(1)) return errc::receive_queue_full;
    chain.push(wr, context, Opcode::receive);
    return chain.submit();
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
    SubmitChain<ibv_recv_wr> chain(target);
    if (!chain.reserve(static_cast<std::uint32_t>(n))) return errc::receive_queue_full;
    std::array<ibv_recv_wr, max_receives_per_post> wrs;
    std::array<ibv_sge, max_receives_per_post> sges;
    for (std::size_t i = 0; i < n; ++i) {
        if (std::error_code ec = lower_receive(buffers.subspan(i, 1), target.max_sge, wrs[i], &sges[i])) return ec;
    }
    for (std::size_t i = 0; i < n; ++i) chain.push(wrs[i], first_context + i, Opcode::receive);
    return chain.submit();
}

} // namespace gpuverbs::detail
