#include "gpuverbs/rdma_cm.hpp"

#if GPUVERBS_HAVE_RDMACM

#include "gpuverbs/detail/qp_factory.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpuverbs {
namespace detail {

/// An rdma_cm id with its own event channel. Destroys, in order: the
/// connection (disconnect), the QP made on it, the id, the channel.
class CmIdCore {
public:
    CmIdCore(rdma_event_channel* channel, rdma_cm_id* id) noexcept : channel_(channel), id_(id) {}
    CmIdCore(const CmIdCore&) = delete;
    CmIdCore& operator=(const CmIdCore&) = delete;
    ~CmIdCore() {
        if (connected) (void)rdma_disconnect(id_);
        if (id_->qp != nullptr) rdma_destroy_qp(id_);
        (void)rdma_destroy_id(id_);
        rdma_destroy_event_channel(channel_);
    }
    [[nodiscard]] rdma_cm_id* id() const noexcept { return id_; }
    [[nodiscard]] rdma_event_channel* channel() const noexcept { return channel_; }
    bool connected = false;

private:
    rdma_event_channel* channel_;
    rdma_cm_id* id_;
};

} // namespace detail

boost::asio::thread_pool& detail::cm_thread() {
    // The steps are waits for the connection manager, and a server's accept
    // must not hold up a client's resolve in the same process: enough threads
    // for that many steps to wait at once (more queue behind them).
    static boost::asio::thread_pool pool(16);
    return pool;
}

namespace {

using Clock = std::chrono::steady_clock;

// errno after a failed librdmacm call, never 0 (which would read as success).
int last_errno(int fallback) {
    return errno != 0 ? errno : fallback;
}

rdma_event_channel* new_channel(detail::Status& status) {
    errno = 0;
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) {
        status.fail_errno(errno != 0 ? errno : ENODEV, "rdma_create_event_channel",
                          "cannot open the RDMA connection manager (is rdma_ucm loaded? /dev/infiniband/rdma_cm)");
        return nullptr;
    }
    (void)::fcntl(ch->fd, F_SETFL, ::fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
    return ch;
}

std::shared_ptr<detail::CmIdCore> new_id(detail::Status& status) {
    rdma_event_channel* ch = new_channel(status);
    if (ch == nullptr) return nullptr;
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
        status.fail_errno(last_errno(ENOMEM), "rdma_create_id", "cannot create an rdma_cm id");
        rdma_destroy_event_channel(ch);
        return nullptr;
    }
    return std::make_shared<detail::CmIdCore>(ch, id);
}

bool parse_ipv4(const std::string& text, std::uint16_t port, sockaddr_in& out) {
    out = sockaddr_in{};
    out.sin_family = AF_INET;
    out.sin_port = htons(port);
    if (inet_pton(AF_INET, text.c_str(), &out.sin_addr) == 1) return true;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* found = nullptr;
    if (getaddrinfo(text.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
    out.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
    freeaddrinfo(found);
    return true;
}

// Waits for the next event on `core`'s channel. On success returns the event
// (which the caller acks); on timeout or failure fails `status`.
rdma_cm_event* next_event(rdma_event_channel* ch, Clock::time_point deadline, const std::string& waiting_for,
                          detail::Status& status) {
    for (;;) {
        rdma_cm_event* ev = nullptr;
        if (rdma_get_cm_event(ch, &ev) == 0) return ev;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            status.fail_errno(last_errno(EIO), "rdma_get_cm_event", "waiting for " + waiting_for);
            return nullptr;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            status.fail(std::make_error_code(std::errc::timed_out), "rdma_get_cm_event",
                        "timed out waiting for " + waiting_for);
            return nullptr;
        }
        pollfd p{ch->fd, POLLIN, 0};
        (void)::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    }
}

// Waits for `wanted`; any other event ends the wait with an error naming it.
bool expect_event(detail::CmIdCore& core, rdma_cm_event_type wanted, Clock::time_point deadline,
                  const std::string& doing, detail::Status& status) {
    rdma_cm_event* ev = next_event(core.channel(), deadline, std::string(rdma_event_str(wanted)) + " " + doing, status);
    if (ev == nullptr) return false;
    rdma_cm_event_type got = ev->event;
    int event_status = ev->status;
    rdma_ack_cm_event(ev);
    if (got == wanted) return true;
    std::string hint;
    if (got == RDMA_CM_EVENT_REJECTED) hint = " (nobody listens on that port, or the server refused)";
    if (got == RDMA_CM_EVENT_ADDR_ERROR) hint = " (no RDMA device has a route to that address)";
    if (got == RDMA_CM_EVENT_UNREACHABLE) hint = " (the peer did not answer)";
    status.fail(errc::unsupported, "rdma_cm",
                doing + ": got " + rdma_event_str(got) + " (status " + std::to_string(event_status) + ") instead of " +
                    rdma_event_str(wanted) + hint);
    return false;
}

} // namespace

std::string CmConnection::peer_address() const {
    if (!id_) return {};
    sockaddr* a = rdma_get_peer_addr(id_->id());
    char text[INET6_ADDRSTRLEN] = {};
    if (a->sa_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a)->sin_addr, text, sizeof text);
    if (a->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a)->sin6_addr, text, sizeof text);
    return text;
}

QueuePair CmConnection::establish_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                       const CompletionQueue& recv_cq, const QueuePairOptions& options,
                                       std::chrono::milliseconds timeout, detail::Status& status) {
    auto deadline = Clock::now() + timeout;
    if (!id_ || !pd || !send_cq || !recv_cq) {
        status.fail(errc::invalid_argument, "rdma_create_qp", "the connection, PD or a CQ is empty");
        return {};
    }
    rdma_cm_id* id = id_->id();
    if (pd.native_handle()->context != id->verbs) {
        status.fail(errc::invalid_argument, "rdma_create_qp",
                    "the protection domain is on " + pd.device_name() + " but the connection manager chose " +
                        device_.name() + ": make the PD and CQs on conn.device()");
        return {};
    }
    // If establishing fails (wrapping the QP included), destroy the QP now, while
    // its CQs are certainly alive: left to the cm id, it would outlive them and
    // block their destruction.
    struct DestroyQpOnFailure {
        rdma_cm_id* id;
        bool done = false;
        ~DestroyQpOnFailure() {
            if (!done && id->qp != nullptr) rdma_destroy_qp(id);
        }
    } guard{id};
    // librdmacm makes the QP and keeps it on the cm id: the QpCore keeps the id
    // alive and lets it destroy the QP.
    auto core = detail::create_owned_qp(
        {&pd, &send_cq, &recv_cq, nullptr}, options, "rdma_create_qp",
        [id](ibv_pd* p, ibv_qp_init_attr& init) { return rdma_create_qp(id, p, &init) == 0 ? id->qp : nullptr; }, id_,
        status);
    if (!core) return {};
    // librdmacm moves the QP through RTR and RTS itself, with the values the
    // transition table would use for default ConnectOptions.
    detail::LocalPort port;
    if (ibv_device_attr dev{}; ibv_query_device(id->verbs, &dev) == 0) {
        port.device_max_rd_atomic = dev.max_qp_init_rd_atom;
        port.device_max_dest_rd_atomic = dev.max_qp_rd_atom;
    }
    const detail::CmConnectParameters chosen = detail::cm_connect_parameters(port, ConnectOptions{});
    rdma_conn_param param{};
    param.responder_resources = chosen.responder_resources;
    param.initiator_depth = chosen.initiator_depth;
    param.retry_count = chosen.retry_count;
    param.rnr_retry_count = chosen.rnr_retry_count;
    const char* verb = incoming_ ? "rdma_accept" : "rdma_connect";
    if ((incoming_ ? rdma_accept(id, &param) : rdma_connect(id, &param)) != 0) {
        status.fail_errno(last_errno(EINVAL), verb, incoming_ ? "cannot accept" : "cannot connect");
        return {};
    }
    if (!expect_event(*id_, RDMA_CM_EVENT_ESTABLISHED, deadline,
                      incoming_ ? "accepting the connection" : "connecting to " + peer_address(), status)) {
        return {};
    }
    id_->connected = true;
    guard.done = true;

    QueuePair q;
    q.core_ = std::move(core);
    ibv_qp_attr attr{};
    ibv_qp_init_attr got{};
    (void)ibv_query_qp(id->qp, &attr, IBV_QP_DEST_QPN | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN,
                       &got);
    q.local_.qp_num = id->qp->qp_num;
    q.local_.psn = attr.sq_psn;
    q.local_.mtu = static_cast<Mtu>(attr.path_mtu);
    q.remote_.qp_num = attr.dest_qp_num;
    q.remote_.psn = attr.rq_psn;
    q.remote_.mtu = static_cast<Mtu>(attr.path_mtu);
    q.remote_.gid = Gid::from_native(attr.ah_attr.grh.dgid);
    q.port_.port = id->port_num;
    q.port_.gid_index = attr.ah_attr.grh.sgid_index;
    id_.reset();
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

void CmConnection::reject() && {
    if (id_ && incoming_) (void)rdma_reject(id_->id(), nullptr, 0);
    id_.reset();
}

CmListener CmListener::create_impl(const std::string& address, std::uint16_t port, detail::Status& status) {
    std::shared_ptr<detail::CmIdCore> id = new_id(status);
    if (!id) return {};
    sockaddr_in where{};
    if (!parse_ipv4(address, port, where)) {
        status.fail(errc::invalid_argument, "rdma_bind_addr", "'" + address + "' is not an IPv4 address or host name");
        return {};
    }
    if (rdma_bind_addr(id->id(), reinterpret_cast<sockaddr*>(&where)) != 0) {
        int err = last_errno(EINVAL);
        status.fail_errno(err, "rdma_bind_addr",
                          "cannot bind to " + address + ":" + std::to_string(port) +
                              (err == EADDRNOTAVAIL ? " (no RDMA device has that address)" : ""));
        return {};
    }
    if (rdma_listen(id->id(), 16) != 0) {
        status.fail_errno(last_errno(EINVAL), "rdma_listen", "cannot listen");
        return {};
    }
    CmListener l;
    l.id_ = std::move(id);
    return l;
}

CmListener::CmListener(const std::string& address, std::uint16_t port)
    : CmListener(detail::or_throw([&](detail::Status& s) { return create_impl(address, port, s); })) {}

CmListener CmListener::create(const std::string& address, std::uint16_t port, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(address, port, s); });
}

std::uint16_t CmListener::port() const {
    return id_ ? ntohs(rdma_get_src_port(id_->id())) : 0;
}

CmConnection CmListener::accept_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    if (!id_) {
        status.fail(errc::invalid_argument, "rdma_get_cm_event", "the CmListener is empty");
        return {};
    }
    auto deadline = Clock::now() + timeout;
    for (;;) {
        rdma_cm_event* ev = next_event(id_->channel(), deadline, "a connection request", status);
        if (ev == nullptr) return {};
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            rdma_ack_cm_event(ev); // e.g. a disconnect of a connection not yet migrated
            continue;
        }
        rdma_cm_id* incoming = ev->id;
        rdma_ack_cm_event(ev);
        // Give the connection its own channel so its events never reach the listener.
        rdma_event_channel* ch = new_channel(status);
        if (ch == nullptr) {
            (void)rdma_reject(incoming, nullptr, 0);
            (void)rdma_destroy_id(incoming);
            return {};
        }
        if (rdma_migrate_id(incoming, ch) != 0) {
            int err = last_errno(EINVAL);
            (void)rdma_reject(incoming, nullptr, 0);
            (void)rdma_destroy_id(incoming);
            rdma_destroy_event_channel(ch);
            status.fail_errno(err, "rdma_migrate_id", "cannot take over the connection request");
            return {};
        }
        CmConnection c;
        c.id_ = std::make_shared<detail::CmIdCore>(ch, incoming);
        c.device_ = Device::from_native(incoming->verbs, false);
        c.incoming_ = true;
        return c;
    }
}

CmConnection CmListener::accept(std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return accept_impl(timeout, s); });
}

CmConnection CmListener::accept(std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return accept_impl(timeout, s); });
}

CmConnection detail::cm_resolve_impl(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                                     const std::string& source, Status& status) {
    auto deadline = Clock::now() + timeout;
    CmConnection c;
    c.id_ = new_id(status);
    if (!c.id_) return {};
    sockaddr_in to{}, from{};
    if (!parse_ipv4(host, port, to)) {
        status.fail(errc::invalid_argument, "rdma_resolve_addr", "'" + host + "' is not an IPv4 address or host name");
        return {};
    }
    if (!source.empty() && !parse_ipv4(source, 0, from)) {
        status.fail(errc::invalid_argument, "rdma_resolve_addr", "'" + source + "' is not an IPv4 address");
        return {};
    }
    // Address resolution waits for the neighbour (ARP) entry. When that entry
    // becomes valid before the kernel queues the request, no event wakes it
    // until its own timeout; short attempts, retried until our deadline, keep
    // that from costing the caller the whole timeout.
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        int attempt_ms = static_cast<int>(std::clamp<long long>(left, 1, 1000));
        if (rdma_resolve_addr(c.id_->id(), source.empty() ? nullptr : reinterpret_cast<sockaddr*>(&from),
                              reinterpret_cast<sockaddr*>(&to), attempt_ms) != 0) {
            status.fail_errno(last_errno(EINVAL), "rdma_resolve_addr", "cannot resolve " + host);
            return {};
        }
        rdma_cm_event* ev = next_event(c.id_->channel(), deadline, "the address of " + host, status);
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
    auto ms = static_cast<int>(std::max<long long>(1, timeout.count()));
    if (rdma_resolve_route(c.id_->id(), ms) != 0) {
        status.fail_errno(last_errno(EINVAL), "rdma_resolve_route", "cannot resolve a route to " + host);
        return {};
    }
    if (!expect_event(*c.id_, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, "resolving the route to " + host, status)) {
        return {};
    }
    c.device_ = Device::from_native(c.id_->id()->verbs, false);
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
