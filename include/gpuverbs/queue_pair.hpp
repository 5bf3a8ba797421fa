// Reliable-connected queue pairs, set up as a typed sequence that cannot be
// misused, and their data path.
//
//   gpuverbs::PreparedQueuePair prepared(pd, cq, cq);        // created, in INIT
//   send_to_peer(prepared.endpoint());                       // QPN, PSN, LID, GID, MTU
//   gpuverbs::QueuePair qp = std::move(prepared).connect(peer_endpoint);   // RTR, RTS
//   qp.post_write(mr.slice(0, n), peer_memory, 0, {.context = 1});
//
// Only a connected QueuePair has post functions, so posting on a QP that is
// not connected does not compile. Every post_* checks locally what it can —
// local ranges against their memory region, remote ranges against the
// RemoteMemory, inline size, SGE count, queue depth — and returns an error
// with nothing posted. The data path never allocates and never throws.
//
// Thread safety: one thread may post while another polls the CQ; posting from
// two threads on one QueuePair needs the caller's lock.
#pragma once

#include "gpuverbs/completion.hpp"
#include "gpuverbs/completion_queue.hpp"
#include "gpuverbs/detail/async_op.hpp"
#include "gpuverbs/detail/qp_transitions.hpp"
#include "gpuverbs/detail/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/memory_region.hpp"
#include "gpuverbs/protection_domain.hpp"
#include "gpuverbs/queue_pair_types.hpp"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <boost/asio/async_result.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <system_error>

namespace gpuverbs {

class QueuePair;
class SharedReceiveQueue;

/// A buffer that is not in any memory region, for inline sends and writes
/// only (SendOptions::inline_data): the payload is copied when posted.
inline LocalBuffer unregistered(std::span<const std::byte> bytes) noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(bytes.data());
    return LocalBuffer{a, static_cast<std::uint32_t>(bytes.size()), 0, a, a + bytes.size()};
}

namespace detail {

/// Scatter/gather entries one request may have in gpuverbs (devices allow fewer).
inline constexpr std::size_t max_sge_per_request = 32;

/// One send-queue request before it becomes an ibv_send_wr.
struct SendDescription {
    Opcode opcode = Opcode::send;
    std::span<const LocalBuffer> local;
    const RemoteMemory* remote = nullptr;
    std::uint64_t remote_offset = 0;
    std::uint32_t immediate = 0;
    std::uint64_t compare_add = 0;
    std::uint64_t swap = 0;
    SendOptions options;
};

inline bool uses_remote(Opcode op) noexcept {
    return op == Opcode::write || op == Opcode::write_with_imm || op == Opcode::read || op == Opcode::compare_swap ||
           op == Opcode::fetch_add;
}

/// Checks a request against the QP's capabilities and fills `wr` and `sges`
/// (which must hold max_sge_per_request entries). Pure: touches no device.
inline std::error_code fill_send_request(const SendDescription& d, const QpCore::Caps& caps, ibv_send_wr& wr,
                                         ibv_sge* sges) noexcept {
    if (d.local.size() > caps.max_send_sge || d.local.size() > max_sge_per_request) return errc::too_many_sges;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < d.local.size(); ++i) {
        const LocalBuffer& b = d.local[i];
        if (!b.in_region()) return errc::local_range_outside_region;
        sges[i] = ibv_sge{b.address, b.length, b.lkey};
        total += b.length;
    }
    const bool atomic = d.opcode == Opcode::compare_swap || d.opcode == Opcode::fetch_add;
    if (d.options.inline_data) {
        if (d.opcode == Opcode::read || atomic) return errc::invalid_argument;
        if (total > caps.max_inline_data) return errc::inline_too_large;
    }
    wr = ibv_send_wr{};
    wr.sg_list = sges;
    wr.num_sge = static_cast<int>(d.local.size());
    unsigned flags = 0;
    if (d.options.signaled) flags |= IBV_SEND_SIGNALED;
    if (d.options.inline_data) flags |= IBV_SEND_INLINE;
    if (d.options.fence) flags |= IBV_SEND_FENCE;
    if (d.options.solicited) flags |= IBV_SEND_SOLICITED;
    wr.send_flags = flags;
    if (uses_remote(d.opcode)) {
        if (d.remote == nullptr) return errc::invalid_argument;
        const std::uint64_t length = atomic ? 8 : total;
        if (!d.remote->contains(d.remote_offset, length)) return errc::remote_range_outside_region;
        const std::uint64_t remote_address = d.remote->address + d.remote_offset;
        if (atomic) {
            if (d.local.size() != 1 || total != 8 || sges[0].addr % 8 != 0 || remote_address % 8 != 0) {
                return errc::misaligned_atomic;
            }
            wr.wr.atomic.remote_addr = remote_address;
            wr.wr.atomic.rkey = d.remote->rkey;
            wr.wr.atomic.compare_add = d.compare_add;
            wr.wr.atomic.swap = d.swap;
        } else {
            wr.wr.rdma.remote_addr = remote_address;
            wr.wr.rdma.rkey = d.remote->rkey;
        }
    }
    switch (d.opcode) {
        case Opcode::send: wr.opcode = IBV_WR_SEND; break;
        case Opcode::send_with_imm: wr.opcode = IBV_WR_SEND_WITH_IMM; break;
        case Opcode::write: wr.opcode = IBV_WR_RDMA_WRITE; break;
        case Opcode::write_with_imm: wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
        case Opcode::read: wr.opcode = IBV_WR_RDMA_READ; break;
        case Opcode::compare_swap: wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP; break;
        case Opcode::fetch_add: wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; break;
        default: return errc::invalid_argument;
    }
    if (d.opcode == Opcode::send_with_imm || d.opcode == Opcode::write_with_imm) wr.imm_data = htonl(d.immediate);
    return {};
}

/// Checks a receive and fills `wr` and `sges`. Pure.
inline std::error_code fill_receive_request(std::span<const LocalBuffer> local, std::uint32_t max_sge, ibv_recv_wr& wr,
                                            ibv_sge* sges) noexcept {
    if (local.size() > max_sge || local.size() > max_sge_per_request) return errc::too_many_sges;
    for (std::size_t i = 0; i < local.size(); ++i) {
        if (!local[i].in_region()) return errc::local_range_outside_region;
        sges[i] = ibv_sge{local[i].address, local[i].length, local[i].lkey};
    }
    wr = ibv_recv_wr{};
    wr.sg_list = sges;
    wr.num_sge = static_cast<int>(local.size());
    return {};
}

/// The port, GID index and device limits a new queue pair on `pd` will use
/// (options.port, options.gid_index or select_gid's choice); `gid` receives
/// the GID itself. Fails with errc::port_not_found or errc::gid_not_found.
LocalPort resolve_local_port(const ProtectionDomain& pd, const QueuePairOptions& options, Gid& gid, Status& status);

/// The creation attributes of a queue pair of `type` from the user's options
/// (no receive queue of its own when it uses a shared receive queue).
inline ibv_qp_init_attr qp_init_attr(ibv_qp_type type, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                                     const QueuePairOptions& options, ibv_srq* srq = nullptr) noexcept {
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

/// What the device granted: ibv_create_qp and rdma_create_qp write it back into the attributes.
inline QpCore::Caps granted(const ibv_qp_cap& cap) noexcept {
    return {cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data};
}

/// Posts one checked send-queue request: takes a slot (or refuses with
/// errc::send_queue_full), records the caller's context and opcode in it,
/// rings the doorbell, and commits the slot once the device accepted it.
inline std::error_code post_send_request(QpCore& qp, ibv_send_wr& wr, std::uint64_t context, Opcode opcode) noexcept {
    if (!qp.send.has_room_for(1)) return errc::send_queue_full;
    qp.send.record(0, context, opcode);
    wr.wr_id = encode_wr_id(QueueKind::send, qp.send.slot(0));
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp.qp(), &wr, &bad); rc != 0) return {rc, std::system_category()};
    qp.send.commit(1);
    return {};
}

/// Posts receives to a work queue (a QP's or an SRQ's) after the local checks.
template <class PostFn>
std::error_code post_receive_to(WorkQueueState& queue, QueueKind kind, std::uint32_t max_sge,
                                std::span<const LocalBuffer> local, std::uint64_t context, PostFn post) noexcept {
    ibv_recv_wr wr;
    std::array<ibv_sge, max_sge_per_request> sges;
    if (auto ec = fill_receive_request(local, max_sge, wr, sges.data())) return ec;
    if (!queue.has_room_for(1)) return errc::receive_queue_full;
    queue.record(0, context, Opcode::receive);
    wr.wr_id = encode_wr_id(kind, queue.slot(0));
    ibv_recv_wr* bad = nullptr;
    if (int rc = post(&wr, &bad); rc != 0) return {rc, std::system_category()};
    queue.commit(1);
    return {};
}

} // namespace detail

/// A reliable-connected queue pair that exists (in INIT) but is not connected.
/// It has no data path: connect() it to a peer's Endpoint to get a QueuePair.
class PreparedQueuePair {
public:
    PreparedQueuePair() noexcept = default;
    /// Creates an RC queue pair using `send_cq` and `recv_cq` (may be the same CQ).
    PreparedQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                      const QueuePairOptions& options = {});
    /// … whose receives come from a shared receive queue.
    PreparedQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                      const SharedReceiveQueue& srq, const QueuePairOptions& options = {});
    static PreparedQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                    const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                    std::error_code& ec);

    PreparedQueuePair(PreparedQueuePair&&) noexcept = default;
    PreparedQueuePair& operator=(PreparedQueuePair&&) noexcept = default;
    PreparedQueuePair(const PreparedQueuePair&) = delete;
    PreparedQueuePair& operator=(const PreparedQueuePair&) = delete;
    ~PreparedQueuePair() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    /// What the peer needs to connect to this QP.
    [[nodiscard]] const Endpoint& endpoint() const noexcept { return local_; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return local_.qp_num; }

    /// INIT → RTR → RTS against `remote`. On success this object is empty; on
    /// failure (gpuverbs::Error naming the transition and its attributes) it is
    /// left in INIT and can be connected again.
    QueuePair connect(const Endpoint& remote, const ConnectOptions& options = {}) &&;
    QueuePair connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec) &&;

    [[nodiscard]] ibv_qp* native_handle() const noexcept { return core_ ? core_->qp() : nullptr; }

private:
    friend class QueuePair;
    static PreparedQueuePair create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                         const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                                         const QueuePairOptions& options, detail::Status& status);
    QueuePair connect_impl(const Endpoint& remote, const ConnectOptions& options, detail::Status& status);

    std::shared_ptr<detail::QpCore> core_;
    detail::LocalPort port_;
    Endpoint local_;
};

/// A connected reliable queue pair (RTS): the data path, synchronous (post_*)
/// and, when its CQ is bound to an executor, asynchronous (async_*).
class QueuePair {
public:
    QueuePair() noexcept = default;
    QueuePair(QueuePair&&) noexcept = default;
    QueuePair& operator=(QueuePair&& other) noexcept {
        if (this != &other) {
            release();
            core_ = std::move(other.core_);
            port_ = other.port_;
            local_ = other.local_;
            remote_ = other.remote_;
        }
        return *this;
    }
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;
    /// Outstanding asynchronous operations complete with operation_aborted.
    ~QueuePair() { release(); }

    explicit operator bool() const noexcept { return core_ != nullptr; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return local_.qp_num; }
    [[nodiscard]] const Endpoint& local_endpoint() const noexcept { return local_; }
    [[nodiscard]] const Endpoint& remote_endpoint() const noexcept { return remote_; }
    /// The depths, SGE counts and inline size the device granted.
    [[nodiscard]] const detail::QpCore::Caps& capabilities() const noexcept { return core_->caps(); }
    /// Send requests posted and not yet known to be finished.
    [[nodiscard]] std::uint64_t outstanding_sends() const noexcept { return core_->send.outstanding(); }

    // --- data path: noexcept; an error means nothing was posted -------------

    /// RDMA write of `src` to `dst` at `dst_offset`.
    std::error_code post_write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                               const SendOptions& options = {}) noexcept {
        return post_one({Opcode::write, {&src, 1}, &dst, dst_offset, 0, 0, 0, options});
    }
    /// … gathering from several local buffers.
    std::error_code post_write(std::span<const LocalBuffer> src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                               const SendOptions& options = {}) noexcept {
        return post_one({Opcode::write, src, &dst, dst_offset, 0, 0, 0, options});
    }
    /// RDMA write that also consumes a receive at the peer, handing it `immediate`.
    std::error_code post_write_with_imm(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset,
                                        std::uint32_t immediate, const SendOptions& options = {}) noexcept {
        return post_one({Opcode::write_with_imm, {&src, 1}, &dst, dst_offset, immediate, 0, 0, options});
    }
    /// RDMA read of `src` at `src_offset` into `dst`.
    std::error_code post_read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                              const SendOptions& options = {}) noexcept {
        return post_one({Opcode::read, {&dst, 1}, &src, src_offset, 0, 0, 0, options});
    }
    /// … scattering into several local buffers.
    std::error_code post_read(std::span<const LocalBuffer> dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                              const SendOptions& options = {}) noexcept {
        return post_one({Opcode::read, dst, &src, src_offset, 0, 0, 0, options});
    }
    /// Send: consumes a receive posted by the peer.
    std::error_code post_send(const LocalBuffer& src, const SendOptions& options = {}) noexcept {
        return post_one({Opcode::send, {&src, 1}, nullptr, 0, 0, 0, 0, options});
    }
    std::error_code post_send(std::span<const LocalBuffer> src, const SendOptions& options = {}) noexcept {
        return post_one({Opcode::send, src, nullptr, 0, 0, 0, 0, options});
    }
    std::error_code post_send_with_imm(const LocalBuffer& src, std::uint32_t immediate,
                                       const SendOptions& options = {}) noexcept {
        return post_one({Opcode::send_with_imm, {&src, 1}, nullptr, 0, immediate, 0, 0, options});
    }
    /// Atomically adds `add` to the 8-byte word at `target`+`offset`; the old
    /// value lands in `result` (8 bytes, 8-byte aligned; byte order is the
    /// peer's host order on all common NICs).
    std::error_code post_fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                   std::uint64_t add, const SendOptions& options = {}) noexcept {
        return post_one({Opcode::fetch_add, {&result, 1}, &target, offset, 0, add, 0, options});
    }
    /// Atomically replaces the word with `swap` if it equals `compare`; the old value lands in `result`.
    std::error_code post_compare_swap(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                      std::uint64_t compare, std::uint64_t swap,
                                      const SendOptions& options = {}) noexcept {
        return post_one({Opcode::compare_swap, {&result, 1}, &target, offset, 0, compare, swap, options});
    }
    /// A receive for the peer's next send or write-with-immediate.
    std::error_code post_receive(const LocalBuffer& dst, std::uint64_t context = 0) noexcept {
        return post_receive(std::span<const LocalBuffer>(&dst, 1), context);
    }
    std::error_code post_receive(std::span<const LocalBuffer> dst, std::uint64_t context = 0) noexcept {
        if (core_->srq() != nullptr) return errc::invalid_argument; // receives go to the SharedReceiveQueue
        return detail::post_receive_to(
            core_->receive, detail::QueueKind::receive, core_->caps().max_recv_sge, dst, context,
            [this](ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(core_->qp(), wr, bad); });
    }

    class SendBatch;
    /// A batch of send-side requests posted with one doorbell; see SendBatch.
    SendBatch batch() noexcept;

    // --- asynchronous data path (the CQ must be bound to an executor) --------
    //
    // Each async_* takes an Asio completion token (callback, use_awaitable,
    // use_future, deferred — the default) and calls the handler exactly once,
    // on its associated executor, never from inside the initiating function:
    // with the operation's result; with the work completion's error
    // (wc_category); with IBV_WC_WR_FLUSH_ERR when the QP failed; or with
    // operation_aborted when the QueuePair or CompletionQueue is destroyed first.
    // When the send or receive queue is full, operations wait in order and are
    // posted as slots free. Per-operation cancellation: not supported; the slot
    // is ignored, because posted RDMA work cannot be recalled — destroy the
    // QueuePair to end all of its operations (they complete with
    // operation_aborted and the QP is destroyed, so the NIC stops using the buffers).

    using executor_type = boost::asio::any_io_executor;
    /// The executor of the QP's completion queue (empty if it is not bound).
    [[nodiscard]] executor_type get_executor() const noexcept {
        detail::AsyncDriver* d = core_ ? core_->send_cq()->driver() : nullptr;
        return d != nullptr ? d->executor() : executor_type();
    }

    /// RDMA write. Completion signature: void(std::error_code, std::size_t bytes).
    template <class Token = default_token_t<executor_type>>
    auto async_write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                     Token&& token = Token()) {
        return start<detail::ResultKind::bytes, void(boost::system::error_code, std::size_t)>(
            std::forward<Token>(token), request(Opcode::write, src, &dst, dst_offset));
    }
    /// RDMA write with immediate. void(std::error_code, std::size_t bytes).
    template <class Token = default_token_t<executor_type>>
    auto async_write_with_imm(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset,
                              std::uint32_t immediate, Token&& token = Token()) {
        auto r = request(Opcode::write_with_imm, src, &dst, dst_offset);
        r.immediate = immediate;
        return start<detail::ResultKind::bytes, void(boost::system::error_code, std::size_t)>(
            std::forward<Token>(token), r);
    }
    /// RDMA read. void(std::error_code, std::size_t bytes).
    template <class Token = default_token_t<executor_type>>
    auto async_read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                    Token&& token = Token()) {
        return start<detail::ResultKind::bytes, void(boost::system::error_code, std::size_t)>(
            std::forward<Token>(token), request(Opcode::read, dst, &src, src_offset));
    }
    /// Send. void(std::error_code, std::size_t bytes).
    template <class Token = default_token_t<executor_type>>
    auto async_send(const LocalBuffer& src, Token&& token = Token()) {
        return start<detail::ResultKind::bytes, void(boost::system::error_code, std::size_t)>(
            std::forward<Token>(token), request(Opcode::send, src, nullptr, 0));
    }
    /// Send with immediate. void(std::error_code, std::size_t bytes).
    template <class Token = default_token_t<executor_type>>
    auto async_send_with_imm(const LocalBuffer& src, std::uint32_t immediate, Token&& token = Token()) {
        auto r = request(Opcode::send_with_imm, src, nullptr, 0);
        r.immediate = immediate;
        return start<detail::ResultKind::bytes, void(boost::system::error_code, std::size_t)>(
            std::forward<Token>(token), r);
    }
    /// Receive (a send or a write with immediate from the peer).
    /// void(std::error_code, gpuverbs::Received).
    template <class Token = default_token_t<executor_type>>
    auto async_receive(const LocalBuffer& dst, Token&& token = Token()) {
        return start<detail::ResultKind::received, void(boost::system::error_code, Received)>(
            std::forward<Token>(token), request(Opcode::receive, dst, nullptr, 0));
    }
    /// Fetch-and-add; hands back the old value. void(boost::system::error_code, std::uint64_t).
    template <class Token = default_token_t<executor_type>>
    auto async_fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset, std::uint64_t add,
                         Token&& token = Token()) {
        auto r = request(Opcode::fetch_add, result, &target, offset);
        r.compare_add = add;
        return start<detail::ResultKind::old_value, void(boost::system::error_code, std::uint64_t)>(
            std::forward<Token>(token), r);
    }
    /// Compare-and-swap; hands back the old value. void(boost::system::error_code, std::uint64_t).
    template <class Token = default_token_t<executor_type>>
    auto async_compare_swap(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                            std::uint64_t compare, std::uint64_t swap, Token&& token = Token()) {
        auto r = request(Opcode::compare_swap, result, &target, offset);
        r.compare_add = compare;
        r.swap = swap;
        return start<detail::ResultKind::old_value, void(boost::system::error_code, std::uint64_t)>(
            std::forward<Token>(token), r);
    }

    // --- state ---------------------------------------------------------------

    /// The QP's state as the device reports it (ibv_query_qp).
    [[nodiscard]] QpState state() const;
    /// Moves the QP to the error state: outstanding requests complete with
    /// IBV_WC_WR_FLUSH_ERR, new ones too. For shutdown and tests.
    std::error_code force_error() noexcept;
    /// Back to RESET and INIT with a new PSN, ready to connect again (e.g.
    /// after an error). Poll the CQ empty of this QP's completions first.
    PreparedQueuePair reset() &&;

    [[nodiscard]] ibv_qp* native_handle() const noexcept { return core_ ? core_->qp() : nullptr; }

private:
    friend class PreparedQueuePair;
    friend class CmConnection;

    void release() noexcept {
        detail::AsyncDriver* d = core_ ? core_->send_cq()->driver() : nullptr;
        // With a driver, the QP is torn down on its strand, after its operations are aborted.
        if (d != nullptr) d->release_qp(std::move(core_));
        core_.reset();
    }

    static detail::AsyncOpBase request(Opcode op, const LocalBuffer& local, const RemoteMemory* remote,
                                       std::uint64_t offset) noexcept {
        detail::AsyncOpBase r;
        r.opcode = op;
        r.local = local;
        if (remote != nullptr) r.remote = *remote;
        r.remote_offset = offset;
        return r;
    }

    template <detail::ResultKind K, class Signature, class Token>
    auto start(Token&& token, const detail::AsyncOpBase& r) {
        return boost::asio::async_initiate<Token, Signature>(
            [](auto&& handler, std::shared_ptr<detail::QpCore> qp, detail::AsyncOpBase req) {
                detail::start_async<K>(std::forward<decltype(handler)>(handler), qp, req);
            },
            token, core_, r);
    }

    std::error_code post_one(const detail::SendDescription& d) noexcept {
        ibv_send_wr wr;
        std::array<ibv_sge, detail::max_sge_per_request> sges;
        if (auto ec = detail::fill_send_request(d, core_->caps(), wr, sges.data())) return ec;
        return detail::post_send_request(*core_, wr, d.options.context, d.opcode);
    }

    std::shared_ptr<detail::QpCore> core_;
    detail::LocalPort port_;
    Endpoint local_;
    Endpoint remote_;
};

/// Send-side requests gathered and posted with one doorbell (one
/// ibv_post_send over a chain). A guard: requests not posted when it is
/// destroyed are discarded, never half-posted. Each add checks the request as
/// post_* would and leaves the batch unchanged on error; post() checks the
/// queue has room for all of them, else posts none. Lives on the stack: it is
/// neither copyable nor movable (its requests point into it).
class QueuePair::SendBatch {
public:
    static constexpr std::size_t max_requests = 32;
    static constexpr std::size_t max_sges = 64;

    explicit SendBatch(QueuePair& qp) noexcept : qp_(&qp) {}
    SendBatch(const SendBatch&) = delete;
    SendBatch& operator=(const SendBatch&) = delete;
    ~SendBatch() = default;

    std::error_code write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                          const SendOptions& options = {}) noexcept {
        return add({Opcode::write, {&src, 1}, &dst, dst_offset, 0, 0, 0, options});
    }
    std::error_code write(std::span<const LocalBuffer> src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                          const SendOptions& options = {}) noexcept {
        return add({Opcode::write, src, &dst, dst_offset, 0, 0, 0, options});
    }
    std::error_code write_with_imm(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset,
                                   std::uint32_t immediate, const SendOptions& options = {}) noexcept {
        return add({Opcode::write_with_imm, {&src, 1}, &dst, dst_offset, immediate, 0, 0, options});
    }
    std::error_code read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                         const SendOptions& options = {}) noexcept {
        return add({Opcode::read, {&dst, 1}, &src, src_offset, 0, 0, 0, options});
    }
    std::error_code send(const LocalBuffer& src, const SendOptions& options = {}) noexcept {
        return add({Opcode::send, {&src, 1}, nullptr, 0, 0, 0, 0, options});
    }
    std::error_code send_with_imm(const LocalBuffer& src, std::uint32_t immediate,
                                  const SendOptions& options = {}) noexcept {
        return add({Opcode::send_with_imm, {&src, 1}, nullptr, 0, immediate, 0, 0, options});
    }
    std::error_code fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                              std::uint64_t add_value, const SendOptions& options = {}) noexcept {
        return add({Opcode::fetch_add, {&result, 1}, &target, offset, 0, add_value, 0, options});
    }
    std::error_code compare_swap(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                 std::uint64_t compare, std::uint64_t swap, const SendOptions& options = {}) noexcept {
        return add({Opcode::compare_swap, {&result, 1}, &target, offset, 0, compare, swap, options});
    }

    [[nodiscard]] std::size_t size() const noexcept { return count_; }
    [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
    /// Drops the requests gathered so far.
    void clear() noexcept {
        count_ = 0;
        sges_used_ = 0;
    }

    /// Posts every gathered request with one doorbell and empties the batch.
    /// On errc::send_queue_full nothing is posted and the batch is kept.
    std::error_code post() noexcept {
        if (count_ == 0) return {};
        detail::QpCore& core = *qp_->core_;
        if (!core.send.has_room_for(count_)) return errc::send_queue_full;
        for (std::size_t i = 0; i < count_; ++i) {
            const auto n = static_cast<std::uint32_t>(i);
            core.send.record(n, contexts_[i], opcodes_[i]);
            wrs_[i].wr_id = detail::encode_wr_id(detail::QueueKind::send, core.send.slot(n));
            wrs_[i].next = i + 1 < count_ ? &wrs_[i + 1] : nullptr;
        }
        ibv_send_wr* bad = nullptr;
        int rc = ibv_post_send(core.qp(), wrs_.data(), &bad);
        // The requests before the one that failed were posted: account for them.
        const auto posted = static_cast<std::uint32_t>(rc == 0 ? count_ : bad - wrs_.data());
        core.send.commit(posted);
        clear();
        return rc == 0 ? std::error_code() : std::error_code(rc, std::system_category());
    }

private:
    std::error_code add(const detail::SendDescription& d) noexcept {
        if (count_ == max_requests || sges_used_ + d.local.size() > max_sges) return errc::batch_full;
        if (auto ec = detail::fill_send_request(d, qp_->core_->caps(), wrs_[count_], &sges_[sges_used_])) return ec;
        contexts_[count_] = d.options.context;
        opcodes_[count_] = d.opcode;
        sges_used_ += d.local.size();
        ++count_;
        return {};
    }

    QueuePair* qp_;
    std::size_t count_ = 0;
    std::size_t sges_used_ = 0;
    std::array<ibv_send_wr, max_requests> wrs_;
    std::array<ibv_sge, max_sges + detail::max_sge_per_request> sges_;
    std::array<std::uint64_t, max_requests> contexts_;
    std::array<Opcode, max_requests> opcodes_;
};

inline QueuePair::SendBatch QueuePair::batch() noexcept {
    return SendBatch(*this);
}

} // namespace gpuverbs
