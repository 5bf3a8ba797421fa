// CmListener: binds, listens, and hands each connection request over as a
// CmConnection with its own event channel and what the peer asked for.
#include "cm_state.hpp"
#include "gpuverbs/detail/deadline.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <arpa/inet.h>

#include <cerrno>

namespace gpuverbs {

CmListener CmListener::create_impl(const std::string& address, std::uint16_t port, detail::Status& status) {
    sockaddr_storage where{};
    if (!detail::cm_address(address, port, true, where, "rdma_bind_addr", status)) return {};
    std::shared_ptr<detail::CmIdCore> id = detail::new_cm_id(status);
    if (!id) return {};
    if (rdma_bind_addr(id->id(), reinterpret_cast<sockaddr*>(&where)) != 0) {
        int err = detail::last_errno(EINVAL);
        status.fail_errno(err, "rdma_bind_addr",
                          "cannot bind to " + address + " port " + std::to_string(port) +
                              (err == EADDRNOTAVAIL ? " (no RDMA device has that address)"
                               : err == EADDRINUSE  ? " (another rdma_cm listener has that port)"
                                                    : ""));
        return {};
    }
    if (rdma_listen(id->id(), 16) != 0) {
        status.fail_errno(detail::last_errno(EINVAL), "rdma_listen", "cannot listen");
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

std::string CmListener::address() const {
    return id_ ? detail::address_text(rdma_get_local_addr(id_->id())) : std::string();
}

CmConnection CmListener::accept_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    if (!id_) {
        status.fail(errc::invalid_argument, "rdma_get_cm_event", "the CmListener is empty");
        return {};
    }
    auto deadline = detail::deadline_after(timeout);
    for (;;) {
        rdma_cm_event* ev = detail::next_event(id_->channel(), deadline, "a connection request", status);
        if (ev == nullptr) return {};
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            rdma_ack_cm_event(ev); // e.g. a disconnect of a connection not yet migrated
            continue;
        }
        rdma_cm_id* incoming = ev->id;
        CmParameters requested;
        std::vector<std::byte> data;
        try {
            detail::copy_conn_param(ev->param.conn, requested, data);
        } catch (...) {
            (void)rdma_reject(incoming, nullptr, 0);
            rdma_ack_cm_event(ev);
            (void)rdma_destroy_id(incoming);
            throw;
        }
        rdma_ack_cm_event(ev);
        // Give the connection its own channel so its events never reach the listener.
        rdma_event_channel* ch = detail::new_channel(status);
        if (ch == nullptr) {
            (void)rdma_reject(incoming, nullptr, 0);
            (void)rdma_destroy_id(incoming);
            return {};
        }
        if (rdma_migrate_id(incoming, ch) != 0) {
            int err = detail::last_errno(EINVAL);
            (void)rdma_reject(incoming, nullptr, 0);
            (void)rdma_destroy_id(incoming);
            rdma_destroy_event_channel(ch);
            status.fail_errno(err, "rdma_migrate_id", "cannot take over the connection request");
            return {};
        }
        CmConnection c;
        c.state_ = std::make_shared<detail::CmState>(std::make_shared<detail::CmIdCore>(ch, incoming), true);
        c.state_->requested = requested;
        c.state_->peer_data = std::move(data);
        return c;
    }
}

CmConnection CmListener::accept(std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return accept_impl(timeout, s); });
}

CmConnection CmListener::accept(std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return accept_impl(timeout, s); });
}

CmConnection CmListener::accept(std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return accept_impl(timeout, s); });
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
