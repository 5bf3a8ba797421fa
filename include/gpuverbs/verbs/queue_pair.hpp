// Reliable-connected queue pairs, set up as a typed sequence that cannot be
// misused:
//
//   gpuverbs::PreparedQueuePair prepared(pd, cq, cq);        // created, in INIT
//   send_to_peer(prepared.endpoint());                       // QPN, PSN, LID, GID, MTU
//   gpuverbs::QueuePair qp = std::move(prepared).connect(peer_endpoint);   // RTR, RTS
//   qp.post_write(mr.slice(0, n), peer_memory, 0, {.context = 1});
//
// Only a connected QueuePair has a data path (it is a DataPath: data_path.hpp),
// so posting on a QP that is not connected does not compile. This file is the
// set-up; what runs per operation lives in detail/data_path/posting_path.hpp and
// detail/data_path/completion_path.hpp.
#pragma once

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/detail/verbs/qp_transitions.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <infiniband/verbs.h>

#include <memory>
#include <system_error>

namespace gpuverbs {

class QueuePair;
class SharedReceiveQueue;

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
    static PreparedQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                    const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                    std::error_code& ec, Diagnostics& diagnostics);
    /// … on a shared receive queue, without throwing.
    static PreparedQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                    const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                    const QueuePairOptions& options, std::error_code& ec);
    static PreparedQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                    const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                    const QueuePairOptions& options, std::error_code& ec, Diagnostics& diagnostics);

    PreparedQueuePair(PreparedQueuePair&&) noexcept = default;
    PreparedQueuePair& operator=(PreparedQueuePair&&) noexcept = default;
    PreparedQueuePair(const PreparedQueuePair&) = delete;
    PreparedQueuePair& operator=(const PreparedQueuePair&) = delete;
    ~PreparedQueuePair() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    /// What the peer needs to connect to this QP.
    [[nodiscard]] const Endpoint& endpoint() const noexcept { return local_; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return local_.qp_num; }

    /// Tells this queue pair that its peer will be given `mr`: returns what
    /// the peer needs (mr.remote()), and connect() grants the peer the remote
    /// access `mr` allows (write, read, atomics; with other advertised regions,
    /// the union), unless ConnectOptions::remote_access says otherwise. A queue
    /// pair that advertised nothing grants nothing. Throws invalid_argument for
    /// an empty region or one of another protection domain.
    RemoteMemory advertise(const MemoryRegion& mr);
    /// What connect() grants by default: the remote access advertised so far.
    [[nodiscard]] Access advertised_access() const noexcept { return advertised_; }

    /// INIT → RTR → RTS against `remote`. On success this object is empty; on
    /// failure (gpuverbs::Error naming the transition and its attributes) it is
    /// left in INIT and can be connected again.
    QueuePair connect(const Endpoint& remote, const ConnectOptions& options = {}) &&;
    QueuePair connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec) &&;
    /// … with the explanation the exception would carry kept in `diagnostics`.
    QueuePair connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec,
                      Diagnostics& diagnostics) &&;

    /// Names this object in DeviceEvent (unique for the process's life; 0 when empty).
    [[nodiscard]] std::uint64_t id() const noexcept { return core_ ? core_->id() : 0; }
    [[nodiscard]] ibv_qp* native_handle() const noexcept { return core_ ? core_->qp() : nullptr; }
    /// Whether send-side requests go through the extended verbs (QueuePairOptions::extended_verbs
    /// asked for them and the provider has them).
    [[nodiscard]] bool uses_extended_verbs() const noexcept { return core_ && core_->extended() != nullptr; }

private:
    friend class QueuePair;
    static PreparedQueuePair create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                         const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                                         const QueuePairOptions& options, detail::Status& status);
    QueuePair connect_impl(const Endpoint& remote, const ConnectOptions& options, detail::Status& status);

    std::shared_ptr<detail::QpCore> core_;
    detail::LocalPort port_;
    Endpoint local_;
    Access advertised_ = Access::none;
};

/// A connected reliable queue pair (RTS): set-up and state here, the data
/// path — synchronous, batched and asynchronous — from DataPath (data_path.hpp).
class QueuePair : public DataPath {
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
            granted_ = other.granted_;
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
    /// The remote access the peer was granted through this queue pair
    /// (ConnectOptions::remote_access, or what the queue pair advertised).
    [[nodiscard]] Access remote_access() const noexcept { return granted_; }
    /// The depths, SGE counts and inline size the device granted.
    [[nodiscard]] const QueuePairCapabilities& capabilities() const noexcept { return core_->caps(); }
    /// Send requests posted and not yet known to be finished.
    [[nodiscard]] std::uint64_t outstanding_sends() const noexcept { return core_->send.outstanding(); }
    /// Receives posted to this QP's own receive queue and not yet completed.
    [[nodiscard]] std::uint64_t outstanding_receives() const noexcept { return core_->receive.outstanding(); }
    /// What it has done since it was last connected (read from the
    /// bookkeeping the data path keeps anyway: reading costs nothing there).
    [[nodiscard]] QueuePairCounters counters() const noexcept;

    /// The QP's state as the device reports it (ibv_query_qp).
    [[nodiscard]] QpState state() const;
    /// The same without throwing: QpState::unknown, with `ec` (and the words) set, when the query fails.
    [[nodiscard]] QpState state(std::error_code& ec) const;
    [[nodiscard]] QpState state(std::error_code& ec, Diagnostics& diagnostics) const;
    /// Moves the QP to the error state: outstanding requests complete with
    /// IBV_WC_WR_FLUSH_ERR; new posts are refused (errc::queue_pair_in_error).
    /// For shutdown and tests.
    std::error_code force_error() noexcept;
    /// Whether gpuverbs knows the QP is in the error state, since when and
    /// why (a failed completion, force_error(), the provider's state, its port
    /// down, a stall); empty while it is not known to be. Posts are refused
    /// then: reset it and connect again, or connect a new queue pair.
    [[nodiscard]] std::optional<QueuePairFailure> failure() const noexcept;
    /// Back to RESET and INIT with a new PSN, ready to connect again (e.g.
    /// after an error). Poll the CQ empty of this QP's completions first; with
    /// asynchronous operations still outstanding it throws
    /// errc::invalid_argument and leaves the QueuePair as it was.
    PreparedQueuePair reset() &&;
    /// The same without throwing: on failure `ec` (and the words) are set and
    /// the PreparedQueuePair returned is empty. The QueuePair is kept: as it
    /// was when refused before any change, else in whatever state the failing
    /// transition left it (destroy it, or reset it again).
    PreparedQueuePair reset(std::error_code& ec) &&;
    PreparedQueuePair reset(std::error_code& ec, Diagnostics& diagnostics) &&;

    /// Names this object in DeviceEvent (unique for the process's life; 0 when empty).
    [[nodiscard]] std::uint64_t id() const noexcept { return core_ ? core_->id() : 0; }
    [[nodiscard]] ibv_qp* native_handle() const noexcept { return core_ ? core_->qp() : nullptr; }
    /// Whether send-side requests go through the extended verbs (QueuePairOptions::extended_verbs
    /// asked for them and the provider has them).
    [[nodiscard]] bool uses_extended_verbs() const noexcept { return core_ && core_->extended() != nullptr; }

private:
    friend class PreparedQueuePair;
    friend class CmConnection;

    /// With a driver, the QP is torn down under its lock, after its operations are aborted.
    void release() noexcept {
        if (core_ && core_->send_cq()->driver() != nullptr) release_async();
        core_.reset();
    }
    void release_async() noexcept;
    [[nodiscard]] QpState state_impl(detail::Status& status) const;
    PreparedQueuePair reset_impl(detail::Status& status);

    detail::LocalPort port_;
    Endpoint local_;
    Endpoint remote_;
    Access granted_ = Access::none;
};

} // namespace gpuverbs
