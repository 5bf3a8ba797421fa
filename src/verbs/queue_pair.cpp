#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/detail/access.hpp"

#include "gpuverbs/detail/async/async_driver.hpp"
#include "gpuverbs/detail/verbs/qp_factory.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#include <cerrno>

namespace gpuverbs {

DataPath::executor_type DataPath::get_executor() const noexcept {
    detail::AsyncDriver* d = core_ ? core_->send_cq()->driver() : nullptr;
    return d != nullptr ? d->executor() : executor_type();
}

void QueuePair::release_async() noexcept {
    core_->send_cq()->driver()->release_qp(std::move(core_));
}

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

// A prepared QP grants no remote access; connect grants what was advertised or asked for.
constexpr Access prepared_access = Access::none;

bool to_init(ibv_qp* qp, const detail::LocalPort& port, detail::Status& status) {
    return detail::modify_qp(qp, detail::init_transition(port, prepared_access), "RESET->INIT", status);
}

bool to_reset_and_init(ibv_qp* qp, const detail::LocalPort& port, detail::Status& status) {
    return detail::modify_qp(qp, detail::reset_transition(), "->RESET", status) && to_init(qp, port, status);
}

} // namespace

PreparedQueuePair PreparedQueuePair::create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                                 const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                                                 const QueuePairOptions& options, detail::Status& status) {
    detail::NewQp made = detail::create_qp(IBV_QPT_RC, {&pd, &send_cq, &recv_cq, srq}, options, status);
    if (!made.core) return {};
    ibv_qp* qp = made.core->qp();
    if (!to_init(qp, made.port, status)) return {};
    PreparedQueuePair p;
    p.core_ = std::move(made.core);
    p.port_ = made.port;
    p.local_.qp_num = qp->qp_num;
    p.local_.psn = detail::random_psn();
    p.local_.lid = p.port_.lid;
    p.local_.gid = made.gid;
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

PreparedQueuePair PreparedQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                            const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                            std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, nullptr, options, s); });
}

PreparedQueuePair PreparedQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                            const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                            const QueuePairOptions& options, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, &srq, options, s); });
}

PreparedQueuePair PreparedQueuePair::create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                            const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                            const QueuePairOptions& options, std::error_code& ec,
                                            Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return create_impl(pd, send_cq, recv_cq, &srq, options, s); });
}

QueuePair PreparedQueuePair::connect_impl(const Endpoint& remote, const ConnectOptions& options,
                                          detail::Status& status) {
    if (!core_) {
        status.fail(errc::invalid_argument, "ibv_modify_qp", "the PreparedQueuePair is empty");
        return {};
    }
    ibv_qp* qp = core_->qp();
    // Checked before anything changes, so a refused endpoint leaves the QP as it was.
    detail::QpTransition rtr = detail::rtr_transition(port_, remote, options, status);
    if (!status.ok()) return {};
    // Least access: what was advertised (or asked for), nothing by default.
    const Access grant = options.remote_access.value_or(advertised_) & detail::peer_facing_access;
    if (grant != prepared_access &&
        !detail::modify_qp(qp, detail::access_transition(grant), "INIT access flags", status)) {
        return {};
    }
    const detail::QpTransition rts = detail::rts_transition(local_.psn, port_, options);
    if (!detail::modify_qp(qp, rtr, "INIT->RTR", status) || !detail::modify_qp(qp, rts, "RTR->RTS", status)) {
        // Leave it usable: back to INIT so connect can be tried again.
        detail::Status ignored;
        (void)to_reset_and_init(qp, port_, ignored);
        return {};
    }
    core_->set_max_rd_atomic(rts.attr.max_rd_atomic);
    QueuePair q;
    q.core_ = std::move(core_);
    q.port_ = port_;
    q.local_ = local_;
    q.remote_ = remote;
    q.granted_ = grant;
    return q;
}

RemoteMemory PreparedQueuePair::advertise(const MemoryRegion& mr) {
    constexpr std::string_view verb = "PreparedQueuePair::advertise";
    detail::Status status;
    if (!core_) status.fail(errc::invalid_argument, verb, "the PreparedQueuePair is empty");
    const Access adds = status.ok() ? detail::advertised_access(mr, core_->qp()->pd, verb, status) : Access::none;
    status.check();
    advertised_ = advertised_ | adds;
    return mr.remote();
}

QueuePair PreparedQueuePair::connect(const Endpoint& remote, const ConnectOptions& options) && {
    return detail::or_throw([&](detail::Status& s) { return connect_impl(remote, options, s); });
}

QueuePair PreparedQueuePair::connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec) && {
    return detail::or_code(ec, [&](detail::Status& s) { return connect_impl(remote, options, s); });
}

QueuePair PreparedQueuePair::connect(const Endpoint& remote, const ConnectOptions& options, std::error_code& ec,
                                     Diagnostics& diagnostics) && {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return connect_impl(remote, options, s); });
}

QpState QueuePair::state_impl(detail::Status& status) const {
    if (!core_) return QpState::unknown;
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (int rc = ibv_query_qp(core_->qp(), &attr, IBV_QP_STATE, &init); rc != 0) {
        status.fail_errno(rc, "ibv_query_qp", "cannot query the state of " + detail::qp_name(qp_num()));
        return QpState::unknown;
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

QpState QueuePair::state() const {
    return detail::or_throw([&](detail::Status& s) { return state_impl(s); });
}

QpState QueuePair::state(std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& s) { return state_impl(s); });
}

QpState QueuePair::state(std::error_code& ec, Diagnostics& diagnostics) const {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return state_impl(s); });
}

std::error_code QueuePair::force_error() noexcept {
    const int rc = core_->move_to_error();
    if (rc == 0) (void)core_->health.fail(QueuePairFailure::Cause::moved_to_error, 0);
    return rc == 0 ? std::error_code() : std::error_code(rc, std::system_category());
}

std::optional<QueuePairFailure> QueuePair::failure() const noexcept {
    if (!core_ || !core_->health.failed()) return std::nullopt;
    const detail::QpHealth& h = core_->health;
    QueuePairFailure f;
    f.cause = h.cause();
    f.since = h.since();
    switch (f.cause) {
        case QueuePairFailure::Cause::completion_failed:
            f.status = make_wc_error(static_cast<ibv_wc_status>(h.detail()));
            break;
        case QueuePairFailure::Cause::port_down:
            f.status = errc::port_down;
            f.port = static_cast<std::uint8_t>(h.detail());
            break;
        case QueuePairFailure::Cause::stalled: f.status = errc::queue_pair_stalled; break;
        default: f.status = errc::queue_pair_in_error; break;
    }
    return f;
}

std::string QueuePairFailure::describe() const {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
    std::string why;
    switch (cause) {
        case Cause::completion_failed: why = "a work completion failed (" + status.message() + ")"; break;
        case Cause::moved_to_error: why = "force_error() moved it there"; break;
        case Cause::provider_reports_error:
            why = "the provider reports it in the error state (e.g. the peer answered a request with an error)";
            break;
        case Cause::port_down:
            why = "its port " + std::to_string(port) +
                  " went down with requests outstanding, and gpuverbs moved it "
                  "to the error state";
            break;
        case Cause::stalled:
            why =
                "its requests made no progress for longer than the transport's retry bound (or, for a send "
                "waiting for the peer to post a receive, AsyncOptions::receiver_wait), and gpuverbs moved it to "
                "the error state";
            break;
        case Cause::notification_not_taken:
            why =
                "a transfer's notification waited for the peer's receive past the transfer's deadline, its "
                "cancellation or its notification_timeout (the peer posted no receive), and gpuverbs moved it to "
                "the error state (its send queue could not move past the notification)";
            break;
    }
    return "in the error state since " + std::to_string(ms.count()) + " ms ago: " + why +
           "; connect a new queue pair (or reset this one and connect it again)";
}

PreparedQueuePair QueuePair::reset_impl(detail::Status& status) {
    if (!core_) {
        status.fail(errc::invalid_argument, "ibv_modify_qp", "the QueuePair is empty");
        return {};
    }
    // Asynchronous operations point at this QP's queues and slots; RESET would
    // discard their requests and leave them waiting forever.
    if (detail::AsyncDriver* driver = core_->send_cq()->driver(); driver != nullptr && driver->has_operations(*core_)) {
        status.fail(errc::invalid_argument, "QueuePair::reset",
                    detail::qp_name(local_.qp_num) +
                        " has asynchronous operations outstanding: wait for their handlers first, or destroy the "
                        "QueuePair (which completes them with operation_aborted)");
        return {};
    }
    if (!to_reset_and_init(core_->qp(), port_, status)) return {};
    core_->send.reset();
    core_->receive.reset();
    core_->health.clear();
    core_->watch = detail::QpWatch{};
    PreparedQueuePair p;
    p.core_ = std::move(core_);
    p.port_ = port_;
    p.local_ = local_;
    p.local_.psn = detail::random_psn();
    p.advertised_ = granted_; // connected again, it grants what it granted
    return p;
}

PreparedQueuePair QueuePair::reset() && {
    return detail::or_throw([&](detail::Status& s) { return reset_impl(s); });
}

PreparedQueuePair QueuePair::reset(std::error_code& ec) && {
    return detail::or_code(ec, [&](detail::Status& s) { return reset_impl(s); });
}

PreparedQueuePair QueuePair::reset(std::error_code& ec, Diagnostics& diagnostics) && {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return reset_impl(s); });
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
    q.core_ = std::make_shared<detail::SrqCore>(detail::access::core(pd), srq, init.attr.max_wr, init.attr.max_sge);
    return q;
}

SharedReceiveQueue::SharedReceiveQueue(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge)
    : SharedReceiveQueue(detail::or_throw([&](detail::Status& s) { return create_impl(pd, max_wr, max_sge, s); })) {}

SharedReceiveQueue SharedReceiveQueue::create(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                              std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, max_wr, max_sge, s); });
}

void SharedReceiveQueue::arm_limit_impl(std::uint32_t limit, detail::Status& status) const {
    if (!core_) {
        status.fail(errc::invalid_argument, "ibv_modify_srq", "the SharedReceiveQueue is empty");
        return;
    }
    if (limit >= capacity()) {
        status.fail(errc::invalid_argument, "ibv_modify_srq",
                    "an SRQ limit of " + std::to_string(limit) + " is not below the queue's capacity of " +
                        std::to_string(capacity()) + " receives: the event could never be armed usefully");
        return;
    }
    ibv_srq_attr attr{};
    attr.srq_limit = limit;
    if (int rc = ibv_modify_srq(core_->srq(), &attr, IBV_SRQ_LIMIT); rc != 0) {
        status.fail_errno(rc, "ibv_modify_srq", "cannot arm the SRQ limit at " + std::to_string(limit) + " receives");
    }
}

void SharedReceiveQueue::arm_limit(std::uint32_t limit) {
    detail::Status status;
    arm_limit_impl(limit, status);
    status.check();
}

void SharedReceiveQueue::arm_limit(std::uint32_t limit, std::error_code& ec) {
    detail::Status status;
    arm_limit_impl(limit, status);
    ec = status.code;
}

QueuePairCounters QueuePair::counters() const noexcept {
    QueuePairCounters c;
    if (!core_) return c;
    // Completed first: a request completes only after it was posted, so the
    // snapshot never shows more completed than posted.
    c.sends_completed = core_->send.retired();
    c.receives_completed = core_->receive.retired();
    c.sends_posted = core_->send.posted();
    c.receives_posted = core_->receive.posted();
    for (std::size_t s = 0; s < c.errors.size(); ++s) c.errors[s] = core_->send.errors(s) + core_->receive.errors(s);
    return c;
}

} // namespace gpuverbs
