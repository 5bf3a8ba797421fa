// rdma_cm ids and their event channels: creation, waiting for an event, and
// copying what an event carried before it is acknowledged.
#include "cm_state.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpuverbs {

boost::asio::thread_pool& detail::cm_thread() {
    // The steps are waits for the connection manager, and a server's accept
    // must not hold up a client's resolve in the same process: enough threads
    // for that many steps to wait at once (more queue behind them).
    static boost::asio::thread_pool pool(16);
    return pool;
}

namespace detail {

int last_errno(int fallback) {
    return errno != 0 ? errno : fallback;
}

rdma_event_channel* new_channel(Status& status) {
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

std::shared_ptr<CmIdCore> new_cm_id(Status& status) {
    rdma_event_channel* ch = new_channel(status);
    if (ch == nullptr) return nullptr;
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
        status.fail_errno(last_errno(ENOMEM), "rdma_create_id", "cannot create an rdma_cm id");
        rdma_destroy_event_channel(ch);
        return nullptr;
    }
    return std::make_shared<CmIdCore>(ch, id);
}

namespace {
thread_local const std::atomic<bool>* step_cancel =
    nullptr; // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
} // namespace

void set_cm_step_cancel(const std::atomic<bool>* flag) noexcept {
    step_cancel = flag;
}

rdma_cm_event* next_event(rdma_event_channel* ch, Clock::time_point deadline, const std::string& waiting_for,
                          Status& status) {
    // An asynchronous step looks at its cancellation every 50 ms.
    const long long slice = step_cancel != nullptr ? 50 : 1000;
    for (;;) {
        if (step_cancel != nullptr && step_cancel->load()) {
            status.fail(aborted_error(), "rdma_get_cm_event", "cancelled while waiting for " + waiting_for);
            return nullptr;
        }
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
        (void)::poll(&p, 1, static_cast<int>(std::min<long long>(left, slice)));
    }
}

void copy_conn_param(const rdma_conn_param& param, CmParameters& into, std::vector<std::byte>& data) {
    // rdma_get_cm_event(3) reports both from the recipient's side: its
    // responder_resources is the sender's initiator depth and its
    // initiator_depth the sender's responder resources. CmParameters describes
    // the peer (what it asked for or answered), so they are crossed back here,
    // once; cm_negotiate() crosses the peer's values against ours.
    into.responder_resources = param.initiator_depth;
    into.initiator_depth = param.responder_resources;
    into.retry_count = param.retry_count;
    into.rnr_retry_count = param.rnr_retry_count;
    into.flow_control = param.flow_control != 0;
    into.srq = param.srq != 0;
    into.qp_num = param.qp_num;
    const auto* bytes = static_cast<const std::byte*>(param.private_data);
    if (bytes != nullptr) {
        data.assign(bytes, bytes + param.private_data_len);
    } else {
        data.clear();
    }
}

std::string address_text(const sockaddr* a) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a == nullptr) return {};
    if (a->sa_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, text, sizeof text);
    } else if (a->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, text, sizeof text);
    }
    return text;
}

} // namespace detail
} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
