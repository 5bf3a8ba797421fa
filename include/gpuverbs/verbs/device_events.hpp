// DeviceEvents: a device's asynchronous events (ibv_get_async_event) as typed
// values — a port that went down or came back, a GID that changed, a fatal
// device, a queue pair or shared receive queue that needs attention — read
// synchronously or on an Asio executor with any completion token.
//
//   gpuverbs::DeviceEvents events(device, io.get_executor());
//   events.async_wait([&](boost::system::error_code ec, gpuverbs::DeviceEvent e) {
//       if (!ec) std::cerr << e.describe() << '\n';       // "rxe0 port 1: link down (IBV_EVENT_PORT_ERR) …"
//       if (e.concerns(qp)) reconnect();                   // which QueuePair, not a pointer
//   });
//
// Every event is acknowledged (ibv_ack_async_event) as soon as it is read, so
// destroying a queue pair, SRQ or CQ never waits for the reader.
//
// Device removal: drivers that support it (mlx5 and most hardware) report
// IBV_EVENT_DEVICE_FATAL. Soft-RoCE and siw do not: removing one of them
// (`rdma link delete rxe1`) makes the kernel wait until every process has
// closed the device, and tells nobody. DeviceEvents therefore also watches the
// device's verbs node in sysfs (/sys/class/infiniband_verbs/uverbsN, deleted
// at once on removal) and reports DeviceEventType::device_removed within
// removal_check_interval. On either event: stop posting, destroy the
// QueuePairs (their operations complete), CQs, MRs, PD and Device — only then
// can the removal finish. docs/events.md has the whole recipe.
//
// One DeviceEvents per Device at a time (the kernel hands each event to one
// reader); a second one fails with errc::invalid_argument. One async_wait at a
// time. Thread safety: like an Asio socket — one thread at a time.
#pragma once

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/async/event_wait.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/datagram.hpp"
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace gpuverbs::detail {
class EventSubjects; // detail/verbs/event_subjects.hpp
} // namespace gpuverbs::detail

namespace gpuverbs {

/// What happened (ibv_event_type, plus device_removed, which gpuverbs observes itself).
enum class DeviceEventType : std::uint8_t {
    // The port: element is a port number.
    port_active,       ///< the link came up (IBV_EVENT_PORT_ACTIVE)
    port_error,        ///< the link went down (IBV_EVENT_PORT_ERR)
    gid_change,        ///< the GID table changed (an IP address came or went)
    lid_change,        ///< InfiniBand: the port's LID changed
    pkey_change,       ///< InfiniBand: the P_Key table changed
    sm_change,         ///< InfiniBand: a new subnet manager
    client_reregister, ///< InfiniBand: the SM asks clients to register again
    // The device.
    device_fatal,   ///< the device failed or was removed (IBV_EVENT_DEVICE_FATAL): every object is unusable
    device_removed, ///< the device's verbs node disappeared (removal on drivers without DEVICE_FATAL)
    // A queue pair: element is a QueuePair.
    qp_fatal,                  ///< the QP hit an error and went to the error state
    qp_request_error,          ///< a request of the QP broke the transport rules (invalid request)
    qp_access_error,           ///< the QP violated an access rule as target (bad rkey or range)
    qp_last_wqe_reached,       ///< a QP on an SRQ in the error state consumed its last receive
    communication_established, ///< first packet arrived while in RTR
    send_queue_drained,        ///< the send queue drained after a move to SQD
    path_migrated,             ///< automatic path migration switched to the alternate path
    path_migration_error,      ///< … and failed
    // A shared receive queue: element is a SharedReceiveQueue.
    srq_limit_reached, ///< fewer receives posted than the armed limit (SharedReceiveQueue::arm_limit)
    srq_error,         ///< the SRQ failed; its QPs are in error
    // A completion queue: element is a CompletionQueue.
    cq_error, ///< the CQ overran or failed; its QPs are in error
    unknown,  ///< an event type this gpuverbs does not know (native_type says which)
};
std::string_view to_string(DeviceEventType type) noexcept;

/// Which kind of object an event is about.
enum class EventElement : std::uint8_t { device, port, queue_pair, shared_receive_queue, completion_queue };

/// One event, copied out of the kernel's record before it was acknowledged.
struct DeviceEvent {
    DeviceEventType type = DeviceEventType::unknown;
    EventElement element = EventElement::device;
    std::string device;       ///< the device's name
    std::uint8_t port = 0;    ///< element == port
    std::uint32_t qp_num = 0; ///< element == queue_pair
    /// element is a QP, SRQ or CQ: that object's id(); 0 when it was not made
    /// by gpuverbs through this Device (a raw verbs object).
    std::uint64_t object = 0;
    int native_type = -1; ///< the ibv_event_type; -1 for device_removed

    /// Whether the event is about this object (same device, same id).
    [[nodiscard]] bool concerns(const QueuePair& qp) const noexcept;
    [[nodiscard]] bool concerns(const UdQueuePair& qp) const noexcept;
    [[nodiscard]] bool concerns(const SharedReceiveQueue& srq) const noexcept;
    [[nodiscard]] bool concerns(const CompletionQueue& cq) const noexcept;
    /// Whether every object of the device is now unusable (device_fatal, device_removed).
    [[nodiscard]] bool device_lost() const noexcept {
        return type == DeviceEventType::device_fatal || type == DeviceEventType::device_removed;
    }
    /// One line for a log: what happened, to what, and what to do.
    [[nodiscard]] std::string describe() const;
};

namespace detail {
class DeviceEventsState;
/// The typed form of a kernel event; `subjects` names the QP/SRQ/CQ it is
/// about. Pure: unit-tested with injected records, beside the rig's real ones.
DeviceEvent translate_event(const ibv_async_event& event, const std::string& device_name,
                            const EventSubjects& subjects) noexcept;

using DeviceEventCallback = EventCallback<DeviceEvent>;

/// The executor async_wait's handlers default to (the DeviceEvents' own).
boost::asio::any_io_executor events_executor(const std::shared_ptr<DeviceEventsState>& state) noexcept;
void start_event_wait(const std::shared_ptr<DeviceEventsState>& state, DeviceEventCallback callback);
/// What a cancellation slot's emission does (DeviceEvents::cancel()).
void cancel_event_wait(const std::shared_ptr<DeviceEventsState>& state) noexcept;

/// The named initiation of DeviceEvents::async_wait: its executor is the
/// DeviceEvents' own, where a handler without one of its own completes.
struct InitiateDeviceEventWait {
    std::shared_ptr<DeviceEventsState> state;
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return events_executor(state); }
    template <class Handler>
    void operator()(Handler&& handler) const {
        start_event_wait(state, bind_event_handler<DeviceEvent>(std::forward<Handler>(handler), events_executor(state),
                                                                [weak = std::weak_ptr<DeviceEventsState>(state)] {
                                                                    cancel_event_wait(weak.lock());
                                                                }));
    }
};
} // namespace detail

class DeviceEvents {
public:
    /// How often a wait checks whether the device's verbs node still exists.
    static constexpr std::chrono::milliseconds removal_check_interval{100};

    DeviceEvents() noexcept = default;
    /// Reads `device`'s events synchronously (poll, wait_for).
    explicit DeviceEvents(const Device& device);
    /// … and asynchronously on `executor` (async_wait).
    DeviceEvents(const Device& device, const boost::asio::any_io_executor& executor);
    /// The error_code form: an empty DeviceEvents on failure.
    static DeviceEvents create(const Device& device, const boost::asio::any_io_executor& executor, std::error_code& ec);
    DeviceEvents(DeviceEvents&&) noexcept;
    DeviceEvents& operator=(DeviceEvents&&) noexcept;
    DeviceEvents(const DeviceEvents&) = delete;
    DeviceEvents& operator=(const DeviceEvents&) = delete;
    /// An async_wait in progress completes with operation_aborted.
    ~DeviceEvents();

    explicit operator bool() const noexcept { return state_ != nullptr; }

    /// The next event if one is pending, without waiting.
    std::optional<DeviceEvent> poll();
    std::optional<DeviceEvent> poll(std::error_code& ec);
    /// Waits up to `timeout` for the next event; nullopt when none came.
    std::optional<DeviceEvent> wait_for(std::chrono::milliseconds timeout);
    std::optional<DeviceEvent> wait_for(std::chrono::milliseconds timeout, std::error_code& ec);

    using executor_type = boost::asio::any_io_executor;
    /// The executor given at construction (an empty one without).
    [[nodiscard]] executor_type get_executor() const noexcept;

    /// Waits for the next event. Signature: void(async_error_code,
    /// gpuverbs::DeviceEvent); the error is operation_aborted after cancel(),
    /// a cancellation slot's emission or destruction, errc::no_executor
    /// without an executor, or the errno of a failed read. The handler runs
    /// once, on its associated executor (the DeviceEvents' by default), posted
    /// (never inside async_wait).
    template <
        boost::asio::completion_token_for<void(async_error_code, DeviceEvent)> Token = default_token_t<executor_type>>
    auto async_wait(Token&& token = Token()) {
        return boost::asio::async_initiate<Token, void(async_error_code, DeviceEvent)>(
            detail::InitiateDeviceEventWait{state_}, token);
    }
    /// Ends a pending async_wait with operation_aborted.
    void cancel() noexcept;

private:
    static DeviceEvents create_impl(const Device& device, const boost::asio::any_io_executor* executor,
                                    detail::Status& status);
    std::optional<DeviceEvent> poll_impl(detail::Status& status);
    std::optional<DeviceEvent> wait_impl(std::chrono::milliseconds timeout, detail::Status& status);
    std::shared_ptr<detail::DeviceEventsState> state_;
};

} // namespace gpuverbs
