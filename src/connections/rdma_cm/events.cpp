// An established connection's events (disconnect, device removal, address
// change, time-wait exit), read through the shared event reader; and
// disconnect(), which completes every outstanding operation once.
#include "cm_state.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <cerrno>
#include <cstring>

namespace gpuverbs {

std::string_view to_string(CmEventType type) noexcept {
    switch (type) {
        case CmEventType::disconnected: return "disconnected";
        case CmEventType::device_removal: return "device_removal";
        case CmEventType::address_change: return "address_change";
        case CmEventType::timewait_exit: return "timewait_exit";
        case CmEventType::other: return "other";
    }
    return "other";
}

std::string CmEvent::describe() const {
    std::string out(to_string(type));
    out += " (";
    out += rdma_event_str(static_cast<rdma_cm_event_type>(native_type));
    out += ", status " + std::to_string(status) + ")";
    switch (type) {
        case CmEventType::disconnected:
            out +=
                ": the connection is closed; its queue pair is in the error state and every outstanding "
                "operation completed (IBV_WC_WR_FLUSH_ERR): destroy it, or connect anew";
            break;
        case CmEventType::device_removal:
            out +=
                ": the device is going away; the queue pair is in the error state: destroy the connection, "
                "its queue pair, CQs, MRs and PD";
            break;
        case CmEventType::address_change:
            out += ": the local address moved: the connection may still work; new connections resolve anew";
            break;
        case CmEventType::timewait_exit: out += ": the queue pair's number may be reused"; break;
        case CmEventType::other: break;
    }
    return out;
}

namespace detail {

CmEvent translate_cm_event(int native_type, int status) noexcept {
    CmEvent e;
    e.native_type = native_type;
    e.status = status;
    switch (native_type) {
        case RDMA_CM_EVENT_DISCONNECTED: e.type = CmEventType::disconnected; break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL: e.type = CmEventType::device_removal; break;
        case RDMA_CM_EVENT_ADDR_CHANGE: e.type = CmEventType::address_change; break;
        case RDMA_CM_EVENT_TIMEWAIT_EXIT: e.type = CmEventType::timewait_exit; break;
        default: e.type = CmEventType::other; break;
    }
    return e;
}

std::optional<CmEvent> CmEventReader::read(Status& status) {
    if (closed()) return std::nullopt;
    std::shared_ptr<CmIdCore> id = id_.lock();
    if (!id) return std::nullopt;
    rdma_cm_event* ev = nullptr;
    errno = 0;
    if (rdma_get_cm_event(id->channel(), &ev) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != 0) {
            status.fail_errno(errno, "rdma_get_cm_event", "cannot read the connection's events");
        }
        return std::nullopt;
    }
    int type = 0;
    static_assert(sizeof type == sizeof ev->event);
    std::memcpy(&type, &ev->event, sizeof type);
    CmEvent out = translate_cm_event(type, ev->status);
    rdma_ack_cm_event(ev);
    if (out.type == CmEventType::disconnected || out.type == CmEventType::device_removal) {
        // Our side of it: the QP to the error state (its requests flush, once)
        // and, after the peer's request, the answer.
        id->disconnect();
        if (out.type == CmEventType::device_removal && id->id()->qp != nullptr) {
            ibv_qp_attr attr{};
            attr.qp_state = IBV_QPS_ERR;
            (void)ibv_modify_qp(id->id()->qp, &attr, IBV_QP_STATE);
        }
    }
    return out;
}

void start_cm_event_wait(const std::shared_ptr<CmState>& state, const boost::asio::any_io_executor& executor,
                         CmEventCallback callback) {
    if (!state) {
        callback(boost::system::error_code(make_error_code(errc::invalid_argument)), CmEvent{});
        return;
    }
    if (!state->established) {
        callback(boost::system::error_code(make_error_code(errc::not_connected)), CmEvent{});
        return;
    }
    if (!state->events->watching()) {
        if (!executor) {
            callback(boost::system::error_code(make_error_code(errc::no_executor)), CmEvent{});
            return;
        }
        Status status;
        state->events->watch(executor, status);
        if (!status.ok()) {
            callback(boost::system::error_code(status.code), CmEvent{});
            return;
        }
    }
    state->events->start(std::move(callback));
}

void cancel_cm_event_wait(const std::shared_ptr<CmState>& state) noexcept {
    if (state && state->events) state->events->cancel();
}

} // namespace detail

void CmConnection::disconnect() noexcept {
    if (state_) state_->id->disconnect();
}

void CmConnection::cancel_event_wait() noexcept {
    detail::cancel_cm_event_wait(state_);
}

std::optional<CmEvent> CmConnection::wait_impl(std::optional<std::chrono::milliseconds> timeout,
                                               detail::Status& status) {
    const char* verb = timeout ? "CmConnection::wait_event" : "CmConnection::poll_event";
    if (!state_) {
        status.fail(errc::invalid_argument, verb, "the CmConnection is empty");
        return std::nullopt;
    }
    if (!state_->established) {
        status.fail(errc::not_connected, verb, "the connection is not established: accept() or connect() first");
        return std::nullopt;
    }
    return timeout ? state_->events->wait_for(*timeout, status) : state_->events->read(status);
}

int CmConnection::event_fd() const noexcept {
    return state_ && state_->id ? state_->id->channel()->fd : -1;
}

std::optional<CmEvent> CmConnection::poll_event() {
    return detail::or_throw([&](detail::Status& s) { return wait_impl(std::nullopt, s); });
}
std::optional<CmEvent> CmConnection::poll_event(std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return wait_impl(std::nullopt, s); });
}
std::optional<CmEvent> CmConnection::wait_event(std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return wait_impl(timeout, s); });
}
std::optional<CmEvent> CmConnection::wait_event(std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return wait_impl(timeout, s); });
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
