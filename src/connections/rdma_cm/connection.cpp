// CmConnection in steps: the queue pair first (receives can be posted), then
// accept or connect with negotiated parameters and private data; and the
// client's side of it, cm_resolve.
#include "cm_state.hpp"

#include "gpuverbs/detail/deadline.hpp"
#include "gpuverbs/detail/verbs/qp_factory.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <limits>

namespace gpuverbs {

namespace detail {

CmState::CmState(std::shared_ptr<CmIdCore> core, bool is_incoming)
    : id(std::move(core)),
      device(Device::from_native(id->id()->verbs, false)),
      incoming(is_incoming),
      events(std::make_shared<CmEventReader>(id)) {}

CmState::~CmState() {
    if (events) {
        events->close();
        events->cancel();
    }
}

} // namespace detail

namespace {

using detail::Clock;

detail::CmState& require(const std::shared_ptr<detail::CmState>& state, const char* what) {
    if (!state) throw Error(make_error_code(errc::invalid_argument), what, "the CmConnection is empty");
    return *state;
}

std::string describe_rejection(const CmRejection& r) {
    std::string out = "status " + std::to_string(r.reason) + ": " + r.reason_text;
    if (r.by_peer) {
        out += "; the peer's program refused";
        out += r.private_data.empty() ? " without private data"
                                      : " with " + std::to_string(r.private_data.size()) + " bytes of private data";
    } else {
        out += " (nobody listens on that port, or the server refused)";
    }
    return out;
}

/// What the connection runs with, as the established queue pair says (what
/// was asked where it cannot say); the attributes for the QueuePair's endpoints.
ibv_qp_attr read_back(ibv_qp* qp, const CmParameters& asked, const CmParameters& peer, CmParameters& agreed) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    const int mask = IBV_QP_DEST_QPN | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN |
                     IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                     IBV_QP_MIN_RNR_TIMER;
    agreed = asked;
    if (ibv_query_qp(qp, &attr, mask, &init) == 0) {
        agreed.initiator_depth = attr.max_rd_atomic;
        agreed.responder_resources = attr.max_dest_rd_atomic;
        agreed.retry_count = attr.retry_cnt;
        agreed.rnr_retry_count = attr.rnr_retry;
        agreed.min_rnr_timer = attr.min_rnr_timer;
        agreed.path_mtu = static_cast<std::uint8_t>(attr.path_mtu);
        agreed.qp_num = attr.dest_qp_num;
    }
    agreed.srq = peer.srq;
    return attr;
}

} // namespace

CmConnection::~CmConnection() = default;

const Device& CmConnection::device() const noexcept {
    static const Device none;
    return state_ ? state_->device : none;
}

std::string CmConnection::peer_address() const {
    return state_ ? detail::address_text(rdma_get_peer_addr(state_->id->id())) : std::string();
}
std::uint16_t CmConnection::peer_port() const {
    return state_ ? ntohs(rdma_get_dst_port(state_->id->id())) : 0;
}
std::string CmConnection::local_address() const {
    return state_ ? detail::address_text(rdma_get_local_addr(state_->id->id())) : std::string();
}
std::uint16_t CmConnection::local_port() const {
    return state_ ? ntohs(rdma_get_src_port(state_->id->id())) : 0;
}
bool CmConnection::incoming() const noexcept {
    return state_ && state_->incoming;
}
CmPrivateDataLimits CmConnection::private_data_limits() const {
    if (!state_) return {};
    const ibv_context* verbs = state_->id->id()->verbs;
    return detail::cm_private_data_limits(verbs != nullptr && verbs->device->transport_type == IBV_TRANSPORT_IWARP);
}
const CmParameters& CmConnection::requested() const {
    return require(state_, "CmConnection::requested").requested;
}
std::span<const std::byte> CmConnection::peer_private_data() const {
    if (!state_) return {};
    return state_->peer_data;
}
const std::optional<CmRejection>& CmConnection::rejection() const {
    return require(state_, "CmConnection::rejection").rejection;
}
bool CmConnection::connected() const noexcept {
    return state_ && state_->established && state_->id->connected();
}
const CmParameters& CmConnection::parameters() const {
    return require(state_, "CmConnection::parameters").agreed;
}
QueuePair& CmConnection::qp() {
    auto& s = require(state_, "CmConnection::qp");
    if (!s.qp) {
        throw Error(make_error_code(errc::invalid_argument), "CmConnection::qp",
                    "the connection has no queue pair yet: call create_qp first");
    }
    return s.qp;
}

RemoteMemory CmConnection::advertise(const MemoryRegion& mr) {
    constexpr std::string_view verb = "CmConnection::advertise";
    auto& s = require(state_, "CmConnection::advertise");
    detail::Status status;
    if (s.established) {
        status.fail(errc::invalid_argument, verb,
                    "the connection is already established: advertise regions before accept() or connect() (or "
                    "set CmOptions::remote_access)");
    }
    const Access adds = status.ok()
                            ? detail::advertised_access(mr, s.qp ? s.qp.native_handle()->pd : nullptr, verb, status)
                            : Access::none;
    status.check();
    s.advertised = s.advertised | adds;
    return mr.remote();
}

QueuePair* CmConnection::create_qp_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                        const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                                        const QueuePairOptions& options, detail::Status& status) {
    if (!state_ || !pd || !send_cq || !recv_cq) {
        status.fail(errc::invalid_argument, "rdma_create_qp", "the connection, PD or a CQ is empty");
        return nullptr;
    }
    detail::CmState& s = *state_;
    if (s.qp || s.id->id()->qp != nullptr) {
        status.fail(errc::invalid_argument, "rdma_create_qp", "the connection already has its queue pair");
        return nullptr;
    }
    rdma_cm_id* id = s.id->id();
    if (pd.native_handle()->context != id->verbs) {
        status.fail(errc::invalid_argument, "rdma_create_qp",
                    "the protection domain is on " + pd.device_name() + " but the connection manager chose " +
                        s.device.name() + ": make the PD and CQs on conn.device()");
        return nullptr;
    }
    // If wrapping the QP fails, destroy it now, while its CQs are certainly
    // alive: left to the cm id, it would outlive them and block their destruction.
    struct DestroyQpOnFailure {
        rdma_cm_id* id;
        bool done = false;
        ~DestroyQpOnFailure() {
            if (!done && id->qp != nullptr) rdma_destroy_qp(id);
        }
    } guard{id, false};
    // librdmacm makes the QP (and moves it to INIT, so receives can be posted)
    // and keeps it on the cm id: the QpCore keeps the id alive and, when it
    // goes, destroys the QP before it lets go of the CQs.
    auto core = detail::create_owned_qp(
        {&pd, &send_cq, &recv_cq, srq}, options, "rdma_create_qp",
        [id](ibv_pd* p, ibv_qp_init_attr& init) { return rdma_create_qp(id, p, &init) == 0 ? id->qp : nullptr; },
        std::make_shared<detail::CmQpOwner>(s.id), status);
    if (!core) return nullptr;
    QueuePair q;
    q.core_ = std::move(core);
    q.local_.qp_num = id->qp->qp_num;
    q.port_.port = id->port_num;
    s.qp = std::move(q);
    s.qp_has_srq = srq != nullptr;
    guard.done = true;
    return &s.qp;
}

QueuePair& CmConnection::create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                   const CompletionQueue& recv_cq, const QueuePairOptions& options) {
    return *detail::or_throw(
        [&](detail::Status& s) { return create_qp_impl(pd, send_cq, recv_cq, nullptr, options, s); });
}

QueuePair& CmConnection::create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                   const CompletionQueue& recv_cq, const SharedReceiveQueue& srq,
                                   const QueuePairOptions& options) {
    return *detail::or_throw([&](detail::Status& s) { return create_qp_impl(pd, send_cq, recv_cq, &srq, options, s); });
}

QueuePair* CmConnection::create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                   const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                   std::error_code& ec) {
    return detail::or_code(
        ec, [&](detail::Status& s) { return create_qp_impl(pd, send_cq, recv_cq, nullptr, options, s); });
}

bool CmConnection::step_impl(bool server, const CmOptions& options, std::span<const std::byte> private_data,
                             std::chrono::milliseconds timeout, detail::Status& status) {
    const char* verb = server ? "rdma_accept" : "rdma_connect";
    if (!state_) {
        status.fail(errc::invalid_argument, verb, "the CmConnection is empty");
        return false;
    }
    detail::CmState& s = *state_;
    if (server != s.incoming) {
        status.fail(errc::invalid_argument, verb,
                    server ? "this connection was resolved by cm_resolve: the client's step is connect()"
                           : "this connection is a request a listener received: the server's step is accept()");
        return false;
    }
    if (s.established || s.rejection) {
        status.fail(errc::invalid_argument, verb, "the connection was already established or refused");
        return false;
    }
    if (!s.qp) {
        status.fail(errc::invalid_argument, verb,
                    "the connection has no queue pair: call create_qp (and post receives) first");
        return false;
    }
    if (!detail::cm_check_request(server ? "accept" : "connect", options, private_data.size(), private_data_limits(),
                                  status)) {
        return false;
    }
    const auto deadline = detail::deadline_after(timeout);
    rdma_cm_id* id = s.id->id();
    detail::CmDeviceLimits device;
    if (ibv_device_attr attr{}; ibv_query_device(id->verbs, &attr) == 0) {
        device.max_responder_resources = static_cast<std::uint8_t>(std::clamp(attr.max_qp_rd_atom, 0, 255));
        device.max_initiator_depth = static_cast<std::uint8_t>(std::clamp(attr.max_qp_init_rd_atom, 0, 255));
    }
    // Least access: the advertised regions' (or what was asked for). Without
    // read and atomics, no responder resources: rdma_cm then connects the
    // queue pair with remote write only, and read and atomics are refused
    // from the first packet on.
    const Access grant = options.remote_access.value_or(s.advertised) & detail::peer_facing_access;
    CmParameters ask = detail::cm_negotiate(options, device, server ? &s.requested : nullptr);
    if ((grant & (Access::remote_read | Access::remote_atomic)) == Access::none) ask.responder_resources = 0;
    rdma_conn_param param{};
    param.responder_resources = ask.responder_resources;
    param.initiator_depth = ask.initiator_depth;
    param.retry_count = ask.retry_count;
    param.rnr_retry_count = ask.rnr_retry_count;
    param.flow_control = ask.flow_control ? 1 : 0;
    param.srq = s.qp_has_srq ? 1 : 0;
    param.private_data = private_data.empty() ? nullptr : private_data.data();
    param.private_data_len = static_cast<std::uint8_t>(private_data.size());
    if ((server ? rdma_accept(id, &param) : rdma_connect(id, &param)) != 0) {
        status.fail_errno(detail::last_errno(EINVAL), verb, server ? "cannot accept" : "cannot connect");
        return false;
    }
    const std::string doing = server ? "accepting the connection from " + peer_address()
                                     : "connecting to " + peer_address() + " port " + std::to_string(peer_port());
    rdma_cm_event* ev = detail::next_event(s.id->channel(), deadline, "ESTABLISHED " + doing, status);
    if (ev == nullptr) return false;
    const rdma_cm_event_type got = ev->event;
    const int event_status = ev->status;
    if (got == RDMA_CM_EVENT_ESTABLISHED && !server) {
        try {
            detail::copy_conn_param(ev->param.conn, s.requested, s.peer_data);
        } catch (...) {
            rdma_ack_cm_event(ev);
            throw;
        }
    }
    if (got == RDMA_CM_EVENT_REJECTED) {
        CmRejection r;
        r.reason = event_status;
        r.by_peer = event_status == detail::cm_consumer_reject;
        r.reason_text = detail::cm_reject_reason(event_status);
        const auto* data = static_cast<const std::byte*>(ev->param.conn.private_data);
        if (r.by_peer && data != nullptr) r.private_data.assign(data, data + ev->param.conn.private_data_len);
        rdma_ack_cm_event(ev);
        const std::string why = describe_rejection(r);
        s.rejection = std::move(r);
        status.fail(errc::connection_rejected, "rdma_cm",
                    doing + ": got REJECTED (" + why + ") instead of ESTABLISHED");
        return false;
    }
    rdma_ack_cm_event(ev);
    if (got != RDMA_CM_EVENT_ESTABLISHED) {
        std::string hint;
        if (got == RDMA_CM_EVENT_UNREACHABLE) hint = " (the peer did not answer)";
        if (got == RDMA_CM_EVENT_CONNECT_ERROR) hint = " (the connection could not be set up)";
        if (got == RDMA_CM_EVENT_DISCONNECTED) hint = " (the peer disconnected at once)";
        status.fail(errc::unsupported, "rdma_cm",
                    doing + ": got " + rdma_event_str(got) + " (status " + std::to_string(event_status) +
                        ") instead of ESTABLISHED" + hint);
        return false;
    }
    // rdma_cm set the queue pair's access itself (write, plus read and
    // atomics with responder resources): narrowed to the grant now.
    ibv_qp_attr narrow{};
    narrow.qp_access_flags = static_cast<unsigned>(grant);
    if (const int rc = ibv_modify_qp(id->qp, &narrow, IBV_QP_ACCESS_FLAGS); rc != 0) {
        status.fail_errno(rc, "ibv_modify_qp",
                          doing +
                              ": cannot narrow the queue pair's remote access to what it grants (RTS->RTS); "
                              "the connection is closed rather than left granting more");
        (void)rdma_disconnect(id);
        (void)s.qp.force_error();
        return false;
    }
    s.established = true;
    s.id->mark_connected();
    s.qp.granted_ = grant;

    // rdma_cm leaves the RNR timer at the transport's (0 = 655 ms on RoCE): ours from now on.
    ibv_qp_attr change{};
    change.min_rnr_timer = options.min_rnr_timer;
    (void)ibv_modify_qp(id->qp, &change, IBV_QP_MIN_RNR_TIMER);

    const ibv_qp_attr attr = read_back(id->qp, ask, s.requested, s.agreed);
    QueuePair& q = s.qp;
    q.core_->set_max_rd_atomic(s.agreed.initiator_depth);
    q.local_.qp_num = id->qp->qp_num;
    q.local_.psn = attr.sq_psn;
    q.local_.mtu = static_cast<Mtu>(attr.path_mtu);
    q.remote_.qp_num = attr.dest_qp_num;
    q.remote_.psn = attr.rq_psn;
    q.remote_.mtu = static_cast<Mtu>(attr.path_mtu);
    q.remote_.gid = Gid::from_native(attr.ah_attr.grh.dgid);
    q.port_.port = id->port_num;
    q.port_.gid_index = attr.ah_attr.grh.sgid_index;
    return true;
}

void CmConnection::accept(const CmOptions& options, std::span<const std::byte> private_data,
                          std::chrono::milliseconds timeout) {
    (void)detail::or_throw([&](detail::Status& s) { return step_impl(true, options, private_data, timeout, s); });
}
void CmConnection::accept(const CmOptions& options, std::span<const std::byte> private_data,
                          std::chrono::milliseconds timeout, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return step_impl(true, options, private_data, timeout, s); });
}
void CmConnection::connect(const CmOptions& options, std::span<const std::byte> private_data,
                           std::chrono::milliseconds timeout) {
    (void)detail::or_throw([&](detail::Status& s) { return step_impl(false, options, private_data, timeout, s); });
}
void CmConnection::connect(const CmOptions& options, std::span<const std::byte> private_data,
                           std::chrono::milliseconds timeout, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return step_impl(false, options, private_data, timeout, s); });
}
void CmConnection::accept(const CmOptions& options, std::span<const std::byte> private_data,
                          std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics,
                          [&](detail::Status& s) { return step_impl(true, options, private_data, timeout, s); });
}
void CmConnection::connect(const CmOptions& options, std::span<const std::byte> private_data,
                           std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics,
                          [&](detail::Status& s) { return step_impl(false, options, private_data, timeout, s); });
}

bool CmConnection::reject_impl(std::span<const std::byte> private_data, detail::Status& status) {
    if (!state_ || !state_->incoming || state_->established) {
        status.fail(errc::invalid_argument, "rdma_reject",
                    "only a connection request a listener received, not yet accepted, can be refused");
        return false;
    }
    if (!detail::cm_check_request("reject", CmOptions{}, private_data.size(), private_data_limits(), status)) {
        return false; // the request stays: accept or refuse it again
    }
    const int rc = rdma_reject(state_->id->id(), private_data.empty() ? nullptr : private_data.data(),
                               static_cast<std::uint8_t>(private_data.size()));
    const int err = detail::last_errno(EINVAL);
    state_.reset();
    if (rc != 0) {
        status.fail_errno(err, "rdma_reject", "cannot refuse the connection request");
        return false;
    }
    return true;
}

void CmConnection::reject(std::span<const std::byte> private_data) && {
    (void)detail::or_throw([&](detail::Status& s) { return reject_impl(private_data, s); });
}
void CmConnection::reject(std::span<const std::byte> private_data, std::error_code& ec) && {
    (void)detail::or_code(ec, [&](detail::Status& s) { return reject_impl(private_data, s); });
}

QueuePair CmConnection::establish_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                       const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                       std::chrono::milliseconds timeout, detail::Status& status) {
    if (!state_) {
        status.fail(errc::invalid_argument, "rdma_create_qp", "the connection, PD or a CQ is empty");
        return {};
    }
    if (create_qp_impl(pd, send_cq, recv_cq, nullptr, options, status) == nullptr) return {};
    // No receive can be posted before this short form connects, so a peer's
    // first send may find none: ask the peer to retry it forever (quickly: our
    // RNR timer is set once connected).
    CmOptions cm;
    cm.rnr_retry_count = 7;
    if (!step_impl(state_->incoming, cm, {}, timeout, status)) {
        state_->qp = QueuePair(); // its QP destroyed now, while its CQs are certainly alive
        return {};
    }
    QueuePair q = std::move(state_->qp);
    state_.reset();
    return q;
}

QueuePair CmConnection::establish(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                  const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                  std::chrono::milliseconds timeout) && {
    return detail::or_throw(
        [&](detail::Status& s) { return establish_impl(pd, send_cq, recv_cq, options, timeout, s); });
}

QueuePair CmConnection::establish(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                  const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                  std::chrono::milliseconds timeout, std::error_code& ec) && {
    return detail::or_code(
        ec, [&](detail::Status& s) { return establish_impl(pd, send_cq, recv_cq, options, timeout, s); });
}

QueuePair CmConnection::establish(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                  const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                  std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) && {
    return detail::or_code(
        ec, diagnostics, [&](detail::Status& s) { return establish_impl(pd, send_cq, recv_cq, options, timeout, s); });
}

CmConnection detail::cm_resolve_impl(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                                     const std::string& source, Status& status) {
    auto deadline = detail::deadline_after(timeout);
    sockaddr_storage to{}, from{};
    if (!cm_address(host, port, false, to, "rdma_resolve_addr", status)) return {};
    if (!source.empty() && !cm_address(source, 0, true, from, "rdma_resolve_addr", status)) return {};
    std::shared_ptr<CmIdCore> id = new_cm_id(status);
    if (!id) return {};
    // Address resolution waits for the neighbour (ARP/ND) entry. When that entry
    // becomes valid before the kernel queues the request, no event wakes it
    // until its own timeout; short attempts, retried until our deadline, keep
    // that from costing the caller the whole timeout.
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        int attempt_ms = static_cast<int>(std::clamp<long long>(left, 1, 1000));
        if (rdma_resolve_addr(id->id(), source.empty() ? nullptr : reinterpret_cast<sockaddr*>(&from),
                              reinterpret_cast<sockaddr*>(&to), attempt_ms) != 0) {
            status.fail_errno(last_errno(EINVAL), "rdma_resolve_addr", "cannot resolve " + host);
            return {};
        }
        rdma_cm_event* ev = next_event(id->channel(), deadline, "the address of " + host, status);
        if (ev == nullptr) return {};
        rdma_cm_event_type got = ev->event;
        int event_status = ev->status;
        rdma_ack_cm_event(ev);
        if (got == RDMA_CM_EVENT_ADDR_RESOLVED) break;
        if (got == RDMA_CM_EVENT_ADDR_ERROR && Clock::now() < deadline) continue;
        status.fail(errc::unsupported, "rdma_resolve_addr",
                    "resolving the address " + host + ": got " + rdma_event_str(got) + " (status " +
                        std::to_string(event_status) + ") (no RDMA device has a route to that address)");
        return {};
    }
    // What is left of the deadline, as an int of milliseconds (never wrapped).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int ms = static_cast<int>(std::clamp<long long>(left, 1, std::numeric_limits<int>::max()));
    if (rdma_resolve_route(id->id(), ms) != 0) {
        status.fail_errno(last_errno(EINVAL), "rdma_resolve_route", "cannot resolve a route to " + host);
        return {};
    }
    rdma_cm_event* ev = next_event(id->channel(), deadline, "ROUTE_RESOLVED for " + host, status);
    if (ev == nullptr) return {};
    rdma_cm_event_type got = ev->event;
    int event_status = ev->status;
    rdma_ack_cm_event(ev);
    if (got != RDMA_CM_EVENT_ROUTE_RESOLVED) {
        status.fail(errc::unsupported, "rdma_cm",
                    "resolving the route to " + host + ": got " + rdma_event_str(got) + " (status " +
                        std::to_string(event_status) + ") instead of ROUTE_RESOLVED");
        return {};
    }
    CmConnection c;
    c.state_ = std::make_shared<CmState>(std::move(id), false);
    return c;
}

CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source) {
    return detail::or_throw([&](detail::Status& s) { return detail::cm_resolve_impl(host, port, timeout, source, s); });
}

CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec) {
    return detail::or_code(ec,
                           [&](detail::Status& s) { return detail::cm_resolve_impl(host, port, timeout, source, s); });
}

CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return detail::cm_resolve_impl(host, port, timeout, source, s); });
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
