#include "gpuverbs/verbs/device_events.hpp"
#include "gpuverbs/detail/verbs/device_core.hpp"

#include "event_reader.hpp"
#include "gpuverbs/detail/access.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/system_executor.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

namespace gpuverbs {

namespace {

struct EventInfo {
    DeviceEventType type;
    EventElement element;
};

/// `type` is the raw number: a newer kernel may send a value ibv_event_type
/// does not list, and loading that as the enum would be undefined.
EventInfo classify(int type) noexcept {
    using T = DeviceEventType;
    using E = EventElement;
    switch (type) {
        case IBV_EVENT_PORT_ACTIVE: return {T::port_active, E::port};
        case IBV_EVENT_PORT_ERR: return {T::port_error, E::port};
        case IBV_EVENT_GID_CHANGE: return {T::gid_change, E::port};
        case IBV_EVENT_LID_CHANGE: return {T::lid_change, E::port};
        case IBV_EVENT_PKEY_CHANGE: return {T::pkey_change, E::port};
        case IBV_EVENT_SM_CHANGE: return {T::sm_change, E::port};
        case IBV_EVENT_CLIENT_REREGISTER: return {T::client_reregister, E::port};
        case IBV_EVENT_DEVICE_FATAL: return {T::device_fatal, E::device};
        case IBV_EVENT_QP_FATAL: return {T::qp_fatal, E::queue_pair};
        case IBV_EVENT_QP_REQ_ERR: return {T::qp_request_error, E::queue_pair};
        case IBV_EVENT_QP_ACCESS_ERR: return {T::qp_access_error, E::queue_pair};
        case IBV_EVENT_QP_LAST_WQE_REACHED: return {T::qp_last_wqe_reached, E::queue_pair};
        case IBV_EVENT_COMM_EST: return {T::communication_established, E::queue_pair};
        case IBV_EVENT_SQ_DRAINED: return {T::send_queue_drained, E::queue_pair};
        case IBV_EVENT_PATH_MIG: return {T::path_migrated, E::queue_pair};
        case IBV_EVENT_PATH_MIG_ERR: return {T::path_migration_error, E::queue_pair};
        case IBV_EVENT_SRQ_LIMIT_REACHED: return {T::srq_limit_reached, E::shared_receive_queue};
        case IBV_EVENT_SRQ_ERR: return {T::srq_error, E::shared_receive_queue};
        case IBV_EVENT_CQ_ERR: return {T::cq_error, E::completion_queue};
        default: return {T::unknown, E::device};
    }
}

/// What to do about it, for describe().
std::string_view advice(DeviceEventType type) noexcept {
    using T = DeviceEventType;
    switch (type) {
        case T::port_active: return "the link is up: connections can be made (again)";
        case T::port_error:
            return "the link is down: requests on its queue pairs fail (retry exceeded after retry_count x timeout, or "
                   "at once on Soft-RoCE); reconnect when port_active comes";
        case T::gid_change: return "an address changed: endpoints exchanged before may name a GID that is gone";
        case T::device_fatal:
        case T::device_removed:
            return "every object of this device is unusable: stop posting and destroy its QueuePairs, CQs, MRs, PD and "
                   "Device (a removal waits for that)";
        case T::qp_fatal:
        case T::qp_request_error:
        case T::qp_access_error:
            return "the queue pair is in the error state: its outstanding requests complete with errors; reset and "
                   "reconnect it, or destroy it";
        case T::qp_last_wqe_reached:
            return "the queue pair consumed its last receive from the SRQ: it can be destroyed";
        case T::srq_limit_reached: return "post more receives, then arm the limit again";
        case T::srq_error:
        case T::cq_error: return "its queue pairs are in the error state: destroy and recreate them";
        default: return "";
    }
}

} // namespace

std::string_view to_string(DeviceEventType type) noexcept {
    using T = DeviceEventType;
    switch (type) {
        case T::port_active: return "port_active";
        case T::port_error: return "port_error";
        case T::gid_change: return "gid_change";
        case T::lid_change: return "lid_change";
        case T::pkey_change: return "pkey_change";
        case T::sm_change: return "sm_change";
        case T::client_reregister: return "client_reregister";
        case T::device_fatal: return "device_fatal";
        case T::device_removed: return "device_removed";
        case T::qp_fatal: return "qp_fatal";
        case T::qp_request_error: return "qp_request_error";
        case T::qp_access_error: return "qp_access_error";
        case T::qp_last_wqe_reached: return "qp_last_wqe_reached";
        case T::communication_established: return "communication_established";
        case T::send_queue_drained: return "send_queue_drained";
        case T::path_migrated: return "path_migrated";
        case T::path_migration_error: return "path_migration_error";
        case T::srq_limit_reached: return "srq_limit_reached";
        case T::srq_error: return "srq_error";
        case T::cq_error: return "cq_error";
        case T::unknown: return "unknown";
    }
    return "unknown";
}

namespace {
bool same(const DeviceEvent& e, EventElement element, std::uint64_t id) noexcept {
    return e.element == element && e.object != 0 && e.object == id;
}
} // namespace

bool DeviceEvent::concerns(const QueuePair& qp) const noexcept {
    return same(*this, EventElement::queue_pair, qp.id());
}
bool DeviceEvent::concerns(const UdQueuePair& qp) const noexcept {
    return same(*this, EventElement::queue_pair, qp.id());
}
bool DeviceEvent::concerns(const SharedReceiveQueue& srq) const noexcept {
    return same(*this, EventElement::shared_receive_queue, srq.id());
}
bool DeviceEvent::concerns(const CompletionQueue& cq) const noexcept {
    return same(*this, EventElement::completion_queue, cq.id());
}

std::string DeviceEvent::describe() const {
    std::string out = device;
    switch (element) {
        case EventElement::device: break;
        case EventElement::port: out += " port " + std::to_string(port); break;
        case EventElement::queue_pair:
            out += " QueuePair " + std::to_string(object) + " (QP number " + std::to_string(qp_num) + ")";
            break;
        case EventElement::shared_receive_queue: out += " SharedReceiveQueue " + std::to_string(object); break;
        case EventElement::completion_queue: out += " CompletionQueue " + std::to_string(object); break;
    }
    out += ": ";
    out += to_string(type);
    if (type == DeviceEventType::device_removed) {
        out += " (its verbs node in sysfs is gone)";
    } else {
        out += " (";
        if (type == DeviceEventType::unknown) {
            out += "event type " + std::to_string(native_type);
        } else {
            out += ibv_event_type_str(static_cast<ibv_event_type>(native_type));
        }
        out += ")";
    }
    if (auto a = advice(type); !a.empty()) {
        out += ": ";
        out += a;
    }
    return out;
}

DeviceEvent detail::translate_event(const ibv_async_event& event, const std::string& device_name,
                                    const EventSubjects& subjects) noexcept {
    DeviceEvent out;
    int raw = 0; // the number as the kernel sent it (see classify)
    static_assert(sizeof raw == sizeof event.event_type);
    std::memcpy(&raw, &event.event_type, sizeof raw);
    const EventInfo info = classify(raw);
    out.type = info.type;
    out.element = info.element;
    out.native_type = raw;
    try {
        out.device = device_name;
    } catch (...) { // NOLINT(bugprone-empty-catch): a name too big to copy leaves it empty
    }
    switch (info.element) {
        case EventElement::device: break;
        case EventElement::port: out.port = static_cast<std::uint8_t>(event.element.port_num); break;
        case EventElement::queue_pair:
            if (event.element.qp != nullptr) {
                out.qp_num = event.element.qp->qp_num;
                out.object = subjects.find(event.element.qp);
            }
            break;
        case EventElement::shared_receive_queue: out.object = subjects.find(event.element.srq); break;
        case EventElement::completion_queue: out.object = subjects.find(event.element.cq); break;
    }
    return out;
}

namespace detail {

namespace asio = boost::asio;

/// A device's asynchronous events, read from its async_fd (the shared reader
/// in event_reader.hpp does the waiting), plus the removal check in sysfs.
class DeviceEventsState final : public EventReader<DeviceEvent> {
public:
    explicit DeviceEventsState(std::shared_ptr<DeviceCore> device)
        : EventReader(device->context()->async_fd, DeviceEvents::removal_check_interval, "device " + device->name()),
          device_(std::move(device)) {
        const ibv_device* dev = device_->context()->device;
        // Watched only where it exists now and names this device (a container may not show it).
        if (dev != nullptr && dev->dev_path[0] != '\0' && node_names_device(dev->dev_path)) {
            verbs_node_ = dev->dev_path;
        }
    }
    DeviceEventsState(const DeviceEventsState&) = delete;
    DeviceEventsState& operator=(const DeviceEventsState&) = delete;
    ~DeviceEventsState() override {
        release();
        // The last reader gives ibverbs its descriptor back as it found it.
        if (nonblocking_ && device_->nonblocking_readers.fetch_sub(1) == 1) {
            (void)::fcntl(device_->context()->async_fd, F_SETFL, original_flags_);
        }
    }

    /// Claims the context's events and sets up the descriptor.
    void open(const asio::any_io_executor* executor, Status& status) {
        if (device_->events_taken.exchange(true)) {
            status.fail(errc::invalid_argument, "DeviceEvents",
                        "device " + device_->name() +
                            " already has a DeviceEvents reader (the kernel hands each event to one reader): share "
                            "that one");
            return;
        }
        claimed_ = true;
        const int fd = device_->context()->async_fd;
        // Reads never block: waits use poll(2) or the executor's reactor.
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
            status.fail_errno(errno, "fcntl", "cannot make " + device_->name() + "'s event descriptor non-blocking");
            return;
        }
        original_flags_ = flags & ~O_NONBLOCK;
        nonblocking_ = true;
        device_->nonblocking_readers.fetch_add(1);
        if (executor != nullptr && *executor) watch(*executor, status);
    }

    /// Gives the events back (from ~DeviceEvents: a new reader may start at once).
    void release() noexcept {
        if (claimed_) {
            close();
            device_->events_taken.store(false);
            claimed_ = false;
        }
    }

    std::optional<DeviceEvent> read(Status& status) override {
        if (closed() || lost_) return std::nullopt;
        ibv_context* context = device_->context();
        ibv_async_event event{};
        errno = 0;
        if (ibv_get_async_event(context, &event) == 0) {
            DeviceEvent out = translate_event(event, device_->name(), device_->subjects());
            ibv_ack_async_event(&event);
            lost_ = out.device_lost();
            return out;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != 0) {
            status.fail_errno(errno, "ibv_get_async_event", "cannot read " + device_->name() + "'s events");
            return std::nullopt;
        }
        if (!verbs_node_.empty() && !node_names_device(verbs_node_)) {
            lost_ = true;
            DeviceEvent out;
            out.type = DeviceEventType::device_removed;
            out.device = device_->name();
            return out;
        }
        return std::nullopt;
    }

private:
    [[nodiscard]] bool exhausted() const noexcept override { return lost_; }

    /// Whether the verbs node at `path` exists and belongs to this device (its
    /// number may be reused by a device registered after a removal).
    [[nodiscard]] bool node_names_device(const std::string& path) const {
        std::ifstream in(path + "/ibdev");
        std::string name;
        return static_cast<bool>(in >> name) && name == device_->name();
    }

    std::shared_ptr<DeviceCore> device_;
    std::string verbs_node_;
    int original_flags_ = 0;
    bool nonblocking_ = false;
    bool claimed_ = false;
    bool lost_ = false; ///< device_fatal or device_removed was reported
};

void cancel_event_wait(const std::shared_ptr<DeviceEventsState>& state) noexcept {
    if (state) state->cancel();
}

asio::any_io_executor events_executor(const std::shared_ptr<DeviceEventsState>& state) noexcept {
    if (state && state->executor()) return state->executor();
    return asio::system_executor();
}

void start_event_wait(const std::shared_ptr<DeviceEventsState>& state, DeviceEventCallback handler) {
    if (!state) {
        handler(boost::system::error_code(make_error_code(errc::invalid_argument)), DeviceEvent{});
        return;
    }
    state->start(std::move(handler));
}

} // namespace detail

DeviceEvents DeviceEvents::create_impl(const Device& device, const boost::asio::any_io_executor* executor,
                                       detail::Status& status) {
    if (!device) {
        status.fail(errc::invalid_argument, "DeviceEvents", "the Device is empty");
        return {};
    }
    auto state = std::make_shared<detail::DeviceEventsState>(detail::access::core(device));
    state->open(executor, status);
    if (!status.ok()) return {};
    DeviceEvents events;
    events.state_ = std::move(state);
    return events;
}

DeviceEvents::DeviceEvents(const Device& device)
    : DeviceEvents(detail::or_throw([&](detail::Status& s) { return create_impl(device, nullptr, s); })) {}

DeviceEvents::DeviceEvents(const Device& device, const boost::asio::any_io_executor& executor)
    : DeviceEvents(detail::or_throw([&](detail::Status& s) { return create_impl(device, &executor, s); })) {}

DeviceEvents DeviceEvents::create(const Device& device, const boost::asio::any_io_executor& executor,
                                  std::error_code& ec) {
    return detail::or_code(ec,
                           [&](detail::Status& s) { return create_impl(device, executor ? &executor : nullptr, s); });
}

DeviceEvents::DeviceEvents(DeviceEvents&&) noexcept = default;
DeviceEvents& DeviceEvents::operator=(DeviceEvents&& other) noexcept {
    if (this != &other) {
        if (state_) {
            state_->release();
            state_->cancel();
        }
        state_ = std::move(other.state_);
    }
    return *this;
}

DeviceEvents::~DeviceEvents() {
    if (state_) {
        state_->release();
        state_->cancel();
    }
}

boost::asio::any_io_executor DeviceEvents::get_executor() const noexcept {
    return state_ ? state_->executor() : boost::asio::any_io_executor();
}

void DeviceEvents::cancel() noexcept {
    if (state_) state_->cancel();
}

std::optional<DeviceEvent> DeviceEvents::poll() {
    return detail::or_throw([&](detail::Status& s) { return poll_impl(s); });
}
std::optional<DeviceEvent> DeviceEvents::poll(std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return poll_impl(s); });
}
std::optional<DeviceEvent> DeviceEvents::wait_for(std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return wait_impl(timeout, s); });
}
std::optional<DeviceEvent> DeviceEvents::wait_for(std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return wait_impl(timeout, s); });
}

std::optional<DeviceEvent> DeviceEvents::poll_impl(detail::Status& status) {
    if (!state_) {
        status.fail(errc::invalid_argument, "DeviceEvents::poll", "the DeviceEvents is empty");
        return std::nullopt;
    }
    return state_->read(status);
}

std::optional<DeviceEvent> DeviceEvents::wait_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    if (!state_) {
        status.fail(errc::invalid_argument, "DeviceEvents::wait_for", "the DeviceEvents is empty");
        return std::nullopt;
    }
    return state_->wait_for(timeout, status);
}

} // namespace gpuverbs
