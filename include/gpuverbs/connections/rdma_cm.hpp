// Connecting queue pairs with librdmacm, the way any other rdma_cm program
// does: the connection manager resolves addresses and routes, the two sides
// agree on the connection's parameters, and may carry private data in the
// request, the answer or a refusal. docs/rdma-cm.md walks through it.
//
// In steps (what a program speaking an existing protocol needs: its receives
// are posted before the peer can send):
//
//   // server                                         // client
//   gpuverbs::CmListener listener("::", 7471);        auto conn = gpuverbs::cm_resolve("fd00::2", 7471);
//   auto conn = listener.accept();                    ProtectionDomain pd(conn.device());
//   ProtectionDomain pd(conn.device());               CompletionQueue cq(conn.device(), 256);
//   CompletionQueue cq(conn.device(), 256);           QueuePair& qp = conn.create_qp(pd, cq, cq);
//   QueuePair& qp = conn.create_qp(pd, cq, cq);       qp.post_receive(…);
//   qp.post_receive(…);                               conn.connect({}, hello);   // private data
//   conn.accept({}, answer);  // or std::move(conn).reject(reason_bytes)
//   auto event = conn.wait_event(10s);  // CmEventType::disconnected when the peer leaves
//
// The short form, establish(), does create_qp + accept/connect and hands the
// queue pair over (without the connection's events).
//
// The connection manager picks the device from the address, so the protection
// domain, CQs and memory regions are made on conn.device().
//
// Each step has a throwing form and a std::error_code& form; the waits have
// Asio forms (async_accept, async_connect, async_wait_event) that take any
// completion token. Only available when gpuverbs was built with librdmacm
// (GPUVERBS_HAVE_RDMACM).
#pragma once

#include "gpuverbs/config.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#if GPUVERBS_HAVE_RDMACM

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/async/event_wait.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_allocator.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

struct rdma_cm_id;
struct rdma_event_channel;

namespace gpuverbs {

/// What one side asks for when it connects or accepts. The read depths are
/// upper bounds: the agreed value is the smallest of this, what the device
/// allows and what the peer asked for (CmConnection::parameters()).
struct CmOptions {
    /// RDMA reads and atomics the peer may have outstanding at us (we answer them).
    std::uint8_t responder_resources = 16;
    /// RDMA reads and atomics we may have outstanding at the peer.
    std::uint8_t initiator_depth = 16;
    /// Transport retries before a request fails with IBV_WC_RETRY_EXC_ERR
    /// (0-7). The connection request carries the client's count and both queue
    /// pairs use it; a server's value is not sent (the answer has no field).
    /// Finite by default (6, as ConnectOptions): 7 is "retry forever" on
    /// Soft-RoCE, so a write to a peer that is gone would never complete there.
    std::uint8_t retry_count = 6;
    /// Receiver-not-ready retries the *peer* makes when a send of its finds no
    /// receive of ours posted, before its send fails with
    /// IBV_WC_RNR_RETRY_EXC_ERR (0-6; 7 retries forever). The connection
    /// manager carries it to the peer (InfiniBand CM: the request holds the
    /// server's, the answer the client's); our own queue pair retries as the
    /// peer asked — parameters().rnr_retry_count. Finite by default: a peer
    /// that sends while we have no receive posted for longer than about
    /// 7 x min_rnr_timer (~18 ms with the defaults) gets an error instead of
    /// stalling silently. Post receives before accept/connect and ahead of the
    /// peer's sends; docs/rdma-cm.md.
    std::uint8_t rnr_retry_count = 6;
    /// How long a peer waits before retrying a send we had no receive for, in
    /// the InfiniBand encoding (16 = 2.56 ms, 12 = 0.64 ms, 0 = 655 ms: what
    /// rdma_cm alone leaves). Set on our queue pair once it is connected.
    std::uint8_t min_rnr_timer = 16;
    /// End-to-end flow control (the responder's credits); hardware may ignore it.
    bool flow_control = true;
    /// What the peer may do to our memory through this connection's queue
    /// pair (remote write, read, atomics). Default: what the connection
    /// advertised (CmConnection::advertise), nothing when it advertised none.
    /// rdma_cm itself sets a queue pair's access when it connects it (write,
    /// plus read and atomics when we answer reads), so gpuverbs asks for no
    /// responder resources when the grant has neither read nor atomics, and
    /// narrows the access (RTS → RTS) as soon as the connection is
    /// established: a write the peer sends before that is still bounded by the
    /// region's own access (docs/security.md).
    std::optional<Access> remote_access;
};

/// The parameters of a connection: what the peer asked for
/// (CmConnection::requested()), or what the connection runs with
/// (CmConnection::parameters(), read back from the queue pair).
struct CmParameters {
    std::uint8_t responder_resources = 0; ///< reads/atomics the peer may have outstanding at us
    std::uint8_t initiator_depth = 0;     ///< reads/atomics we may have outstanding at the peer
    std::uint8_t retry_count = 0;         ///< transport retries of our queue pair (the request's count)
    std::uint8_t rnr_retry_count = 0;     ///< RNR retries of our queue pair (what the peer asked of us)
    std::uint8_t min_rnr_timer = 0;       ///< ours (parameters() only)
    bool flow_control = false;            ///< end-to-end flow control (ours in parameters(), the peer's in requested())
    bool srq = false;                     ///< the peer's receives come from a shared receive queue
    std::uint32_t qp_num = 0;             ///< the peer's queue pair number
    std::uint8_t path_mtu = 0;            ///< IBV_MTU_* (parameters() only)
};

/// Why a connection was refused, as the connecting side sees it.
struct CmRejection {
    int reason = 0;                      ///< the transport's reject reason (28: the peer's program refused)
    bool by_peer = false;                ///< the peer's program refused (rdma_reject), not its transport
    std::string reason_text;             ///< rdma_reject_msg(): "consumer defined", "invalid service ID", …
    std::vector<std::byte> private_data; ///< what the refusal carried (padded by the transport)
};

/// The most private data each message carries on this transport.
struct CmPrivateDataLimits {
    std::size_t connect = 0; ///< in a connection request (56 over RoCE/InfiniBand)
    std::size_t accept = 0;  ///< in the answer that accepts it (196)
    std::size_t reject = 0;  ///< in a refusal (148)
};

/// What happened to an established connection.
enum class CmEventType : std::uint8_t {
    disconnected,   ///< the peer disconnected, or we did (RDMA_CM_EVENT_DISCONNECTED)
    device_removal, ///< the device is going away (RDMA_CM_EVENT_DEVICE_REMOVAL)
    address_change, ///< the local address changed (RDMA_CM_EVENT_ADDR_CHANGE)
    timewait_exit,  ///< the queue pair left time-wait: its number may be reused (RDMA_CM_EVENT_TIMEWAIT_EXIT)
    other,          ///< another rdma_cm event (native_type says which)
};
/// "disconnected", "device_removal", … (the enumerator's name).
std::string_view to_string(CmEventType type) noexcept;

/// One event of an established connection.
struct CmEvent {
    CmEventType type = CmEventType::other;
    int native_type = -1; ///< the rdma_cm_event_type
    int status = 0;       ///< the event's status
    /// One line: what happened, what gpuverbs did about it, what to do.
    [[nodiscard]] std::string describe() const;
};

class CmConnection;

namespace detail {
class CmIdCore;
class CmState;

/// The private threads rdma_cm's blocking steps run on for the async_* forms
/// (as Asio's resolver runs getaddrinfo on one of its own); up to 16 steps
/// wait at once.
boost::asio::thread_pool& cm_thread();

/// The cancellation flag of the step running on this thread (nullptr: none):
/// its waits for rdma_cm events look at it every 50 ms and end with
/// operation_aborted once it is set.
void set_cm_step_cancel(const std::atomic<bool>* flag) noexcept;

/// Runs `step` — the error_code form of a step, `Result(std::error_code&)` —
/// on the rdma_cm thread, then completes `handler` with (error_code, result),
/// or (error_code) when Result is void, on its associated executor (else the
/// system executor). The handler's allocator carries the step to the thread;
/// its cancellation slot, when connected, ends the step's waits with
/// operation_aborted (a step already past its last wait completes as it is).
template <class Result, class Handler, class Step>
void run_cm_step(Handler&& handler, Step step) {
    auto executor = boost::asio::get_associated_executor(handler, boost::asio::system_executor());
    auto allocator = boost::asio::get_associated_allocator(handler);
    auto slot = boost::asio::get_associated_cancellation_slot(handler);
    auto cancelled = std::allocate_shared<std::atomic<bool>>(allocator, false);
    if (slot.is_connected()) {
        slot.assign([cancelled](boost::asio::cancellation_type type) {
            if (type != boost::asio::cancellation_type::none) cancelled->store(true);
        });
    }
    auto work = boost::asio::make_work_guard(executor);
    auto run = [h = std::forward<Handler>(handler), work = std::move(work), step = std::move(step), slot,
                cancelled]() mutable {
        async_error_code ec;
        using Stored = std::conditional_t<std::is_void_v<Result>, bool, Result>;
        Stored result{};
        set_cm_step_cancel(cancelled.get());
        try {
            std::error_code failed;
            if constexpr (std::is_void_v<Result>) {
                step(failed);
            } else {
                result = step(failed);
            }
            if (failed) ec = to_asio_error(failed);
        } catch (const std::bad_alloc&) {
            ec = boost::asio::error::no_memory;
        } catch (const std::system_error& e) { // never let one escape into the pool's thread
            ec = to_asio_error(e.code());
        }
        set_cm_step_cancel(nullptr);
        auto ex = work.get_executor();
        // The slot is the handler's: cleared on the handler's executor, before it runs.
        auto finish = [slot](auto h2, auto&&... args) mutable {
            if (slot.is_connected()) slot.clear();
            std::move(h2)(std::forward<decltype(args)>(args)...);
        };
        if constexpr (std::is_void_v<Result>) {
            boost::asio::post(
                ex, [finish = std::move(finish), h = std::move(h), ec]() mutable { finish(std::move(h), ec); });
        } else {
            boost::asio::post(ex,
                              [finish = std::move(finish), h = std::move(h), ec, result = std::move(result)]() mutable {
                                  finish(std::move(h), ec, std::move(result));
                              });
        }
    };
    boost::asio::post(cm_thread(), boost::asio::bind_allocator(allocator, std::move(run)));
}

/// The named initiation of every rdma_cm step's async_* form (async_accept,
/// async_connect, async_establish, CmListener::async_accept,
/// async_cm_resolve): the step has no I/O object, so its executor is the
/// system executor, where a handler without one of its own completes.
template <class Result>
struct InitiateCmStep {
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return boost::asio::system_executor(); }
    template <class Handler, class Step>
    void operator()(Handler&& handler, Step step) const {
        run_cm_step<Result>(std::forward<Handler>(handler), std::move(step));
    }
};

CmConnection cm_resolve_impl(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                             const std::string& source, Status& status);

using CmEventCallback = EventCallback<CmEvent>;
/// Starts the connection's one async wait, its reader watching on `executor` (set at the first wait).
void start_cm_event_wait(const std::shared_ptr<CmState>& state, const boost::asio::any_io_executor& executor,
                         CmEventCallback callback);
void cancel_cm_event_wait(const std::shared_ptr<CmState>& state) noexcept;

/// The named initiation of CmConnection::async_wait_event: the wait's reader
/// runs on the handler's associated executor (there is no other I/O executor).
struct InitiateCmEventWait {
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return boost::asio::system_executor(); }
    template <class Handler>
    void operator()(Handler&& handler, const std::shared_ptr<CmState>& state) const {
        using Executor = decltype(boost::asio::get_associated_executor(handler));
        boost::asio::any_io_executor executor;
        if constexpr (!std::is_same_v<Executor, boost::asio::system_executor>) {
            executor = boost::asio::get_associated_executor(handler);
        }
        auto fallback = executor ? executor : boost::asio::any_io_executor(boost::asio::system_executor());
        start_cm_event_wait(
            state, executor,
            bind_event_handler<CmEvent>(std::forward<Handler>(handler), fallback,
                                        [weak = std::weak_ptr<CmState>(state)] { cancel_cm_event_wait(weak.lock()); }));
    }
};

/// What to accept with, from what the peer asked for, what the device allows
/// and what the user set (pure; unit-tested).
struct CmDeviceLimits {
    std::uint8_t max_responder_resources = 0; ///< ibv_device_attr::max_qp_rd_atom
    std::uint8_t max_initiator_depth = 0;     ///< ibv_device_attr::max_qp_init_rd_atom
};
CmParameters cm_negotiate(const CmOptions& ours, const CmDeviceLimits& device, const CmParameters* peer);
/// Checks `options` and `private_data` before anything is sent ("connect",
/// "accept" or "reject"); fails `status` naming the value and its limit.
bool cm_check_request(std::string_view step, const CmOptions& options, std::size_t private_data,
                      const CmPrivateDataLimits& limits, Status& status);
CmPrivateDataLimits cm_private_data_limits(bool iwarp) noexcept;
} // namespace detail

/// A connection: a request a CmListener accepted, or an outgoing connection
/// whose address and route cm_resolve found; then, after accept() or
/// connect(), an established connection with its queue pair and events.
/// Move-only; references to its queue pair stay valid when it moves.
/// Thread safety: like an Asio socket, one thread at a time; disconnect() may
/// be called from any thread.
class CmConnection {
public:
    CmConnection() noexcept = default;
    CmConnection(CmConnection&&) noexcept = default;
    CmConnection& operator=(CmConnection&&) noexcept = default;
    CmConnection(const CmConnection&) = delete;
    CmConnection& operator=(const CmConnection&) = delete;
    /// Disconnects (when established) and ends a pending async_wait_event.
    ~CmConnection();

    explicit operator bool() const noexcept { return state_ != nullptr; }
    /// The device the connection manager chose; make the PD, CQs and MRs on it.
    [[nodiscard]] const Device& device() const noexcept;
    /// The peer's IP address ("10.0.0.1", "fd00::1") and port.
    [[nodiscard]] std::string peer_address() const;
    [[nodiscard]] std::uint16_t peer_port() const;
    /// Our IP address and port on this connection.
    [[nodiscard]] std::string local_address() const;
    [[nodiscard]] std::uint16_t local_port() const;
    /// Whether this is a request a listener received (the server side).
    [[nodiscard]] bool incoming() const noexcept;
    /// The most private data this transport carries per message.
    [[nodiscard]] CmPrivateDataLimits private_data_limits() const;

    /// Server: what the peer asked for in its request. Client, after
    /// connect(): what the peer answered with.
    [[nodiscard]] const CmParameters& requested() const;
    /// The peer's private data: its request's (server), its answer's (client
    /// after connect()). The transport pads it (to 56 and 196 bytes over
    /// RoCE): carry your own length in it when it matters.
    [[nodiscard]] std::span<const std::byte> peer_private_data() const;

    /// Step 1: creates the connection's RC queue pair (in INIT: receives can be
    /// posted, nothing can be sent until the connection is established).
    QueuePair& create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options = {});
    /// … whose receives come from a shared receive queue (it must outlive the connection).
    QueuePair& create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const SharedReceiveQueue& srq, const QueuePairOptions& options = {});
    /// The error_code form: nullptr on failure.
    QueuePair* create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options, std::error_code& ec);
    /// The queue pair create_qp made (errc::invalid_argument before).
    [[nodiscard]] QueuePair& qp();
    /// Tells the connection that its peer will be given `mr`: returns what the
    /// peer needs (mr.remote()), and accept()/connect()/establish() grant the
    /// peer the remote access `mr` allows (with other advertised regions, the
    /// union), unless CmOptions::remote_access says otherwise. A connection
    /// that advertised nothing grants nothing. Throws invalid_argument for an
    /// empty region, one of another protection domain than the queue pair's,
    /// or a connection already established.
    RemoteMemory advertise(const MemoryRegion& mr);

    /// Step 2, server: accepts the request with `options` (negotiated against
    /// requested() and the device) and up to private_data_limits().accept
    /// bytes of private data, and waits until the connection is established.
    void accept(const CmOptions& options = {}, std::span<const std::byte> private_data = {},
                std::chrono::milliseconds timeout = std::chrono::seconds(30));
    void accept(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    void accept(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                std::error_code& ec, Diagnostics& diagnostics);
    /// Step 2, client: connects with `options` and up to
    /// private_data_limits().connect bytes, and waits for the answer. A refusal
    /// fails with errc::connection_rejected; rejection() then says why.
    void connect(const CmOptions& options = {}, std::span<const std::byte> private_data = {},
                 std::chrono::milliseconds timeout = std::chrono::seconds(30));
    void connect(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                 std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    void connect(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                 std::error_code& ec, Diagnostics& diagnostics);

    /// accept() and connect(), asynchronously (on the rdma_cm threads):
    /// `private_data` and the queue pair's parts must outlive the operation;
    /// the connection may be moved meanwhile (the step holds its state).
    /// Signature: void(boost::system::error_code).
    template <
        boost::asio::completion_token_for<void(async_error_code)> Token = default_token_t<boost::asio::any_io_executor>>
    auto async_accept(const CmOptions& options, std::span<const std::byte> private_data,
                      std::chrono::milliseconds timeout, Token&& token = Token()) {
        return async_step(true, options, private_data, timeout, std::forward<Token>(token));
    }
    template <
        boost::asio::completion_token_for<void(async_error_code)> Token = default_token_t<boost::asio::any_io_executor>>
    auto async_connect(const CmOptions& options, std::span<const std::byte> private_data,
                       std::chrono::milliseconds timeout, Token&& token = Token()) {
        return async_step(false, options, private_data, timeout, std::forward<Token>(token));
    }

    /// Server: refuses the request, with up to private_data_limits().reject
    /// bytes saying why; the client's connect() fails with connection_rejected.
    /// Oversized data throws (invalid_argument) and leaves the request to be
    /// accepted or refused again.
    void reject(std::span<const std::byte> private_data = {}) &&;
    void reject(std::span<const std::byte> private_data, std::error_code& ec) &&;
    /// Client: why the peer refused (after connect() failed with connection_rejected).
    [[nodiscard]] const std::optional<CmRejection>& rejection() const;

    /// Whether the connection is established and not disconnected.
    [[nodiscard]] bool connected() const noexcept;
    /// What the connection runs with, read back from the queue pair (after accept/connect).
    [[nodiscard]] const CmParameters& parameters() const;

    /// Moves the queue pair to the error state (every outstanding operation
    /// completes, once, with IBV_WC_WR_FLUSH_ERR) and tells the peer, whose
    /// side then reports CmEventType::disconnected. Idempotent.
    void disconnect() noexcept;

    /// The connection's next event, if one is pending (an established
    /// connection only). Reading `disconnected` or `device_removal` moves the
    /// queue pair to the error state (its operations complete once) and
    /// answers the peer: keep an event wait pending to learn of it promptly.
    std::optional<CmEvent> poll_event();
    std::optional<CmEvent> poll_event(std::error_code& ec);
    /// Waits up to `timeout` for the next event; nullopt when none came.
    std::optional<CmEvent> wait_event(std::chrono::milliseconds timeout);
    std::optional<CmEvent> wait_event(std::chrono::milliseconds timeout, std::error_code& ec);
    /// Waits for the next event on the handler's associated executor (an
    /// io_context's: a coroutine's, or asio::bind_executor; a plain callback
    /// completes with errc::no_executor). One wait at a time. Signature:
    /// void(async_error_code, gpuverbs::CmEvent); operation_aborted
    /// after cancel_event_wait(), a cancellation slot's emission or the
    /// connection's destruction. From the first wait on, the connection's
    /// reader is an I/O object of that executor's context: destroy the
    /// connection before its io_context, as any Asio socket.
    template <boost::asio::completion_token_for<void(async_error_code, CmEvent)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_wait_event(Token&& token = Token()) {
        return boost::asio::async_initiate<Token, void(async_error_code, CmEvent)>(detail::InitiateCmEventWait{}, token,
                                                                                   state_);
    }
    /// Ends a pending async_wait_event with operation_aborted.
    void cancel_event_wait() noexcept;
    /// The descriptor of the connection's event channel (non-blocking): it is
    /// readable when poll_event() may have an event, so a loop that is not
    /// Asio (Python's asyncio, an epoll of your own) can wait for events.
    /// -1 when the connection is empty.
    [[nodiscard]] int event_fd() const noexcept;

    /// The short form: create_qp + accept (server) or connect (client) with
    /// default CmOptions, then the queue pair is handed over (it keeps the
    /// connection; destroying it disconnects). Errors name the connection-
    /// manager event that ended the attempt (e.g. REJECTED: no listener on that port).
    QueuePair establish(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                        const QueuePairOptions& options = {},
                        std::chrono::milliseconds timeout = std::chrono::seconds(30)) &&;
    /// The error_code form: an empty QueuePair on failure.
    QueuePair establish(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                        const QueuePairOptions& options, std::chrono::milliseconds timeout, std::error_code& ec) &&;
    /// … with the explanation the exception would carry kept in `diagnostics`.
    QueuePair establish(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                        const QueuePairOptions& options, std::chrono::milliseconds timeout, std::error_code& ec,
                        Diagnostics& diagnostics) &&;
    /// establish(), asynchronously: pd and the CQs must outlive the operation
    /// (neither destroyed nor moved from until it completes); the connection
    /// is moved into the operation when it is made.
    /// Signature: void(async_error_code, gpuverbs::QueuePair).
    template <boost::asio::completion_token_for<void(async_error_code, QueuePair)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_establish(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options, std::chrono::milliseconds timeout,
                         Token&& token = Token()) && {
        return boost::asio::async_initiate<Token, void(async_error_code, QueuePair)>(
            detail::InitiateCmStep<QueuePair>{}, token,
            [c = std::make_shared<CmConnection>(std::move(*this)), pd = &pd, s = &send_cq, r = &recv_cq, options,
             timeout](std::error_code& ec) mutable {
                return std::move(*c).establish(*pd, *s, *r, options, timeout, ec);
            });
    }

private:
    friend class CmListener;
    friend CmConnection detail::cm_resolve_impl(const std::string&, std::uint16_t, std::chrono::milliseconds,
                                                const std::string&, detail::Status&);
    /// The step runs on a second handle to the same state, taken now: the
    /// connection may be moved, or even destroyed, while it runs.
    template <class Token>
    auto async_step(bool server, const CmOptions& options, std::span<const std::byte> private_data,
                    std::chrono::milliseconds timeout, Token&& token) {
        return boost::asio::async_initiate<Token, void(async_error_code)>(
            detail::InitiateCmStep<void>{}, token,
            [state = state_, server, options, private_data, timeout](std::error_code& ec) {
                CmConnection same;
                same.state_ = state;
                if (server) {
                    same.accept(options, private_data, timeout, ec);
                } else {
                    same.connect(options, private_data, timeout, ec);
                }
            });
    }
    QueuePair* create_qp_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                              const CompletionQueue& recv_cq, const SharedReceiveQueue* srq,
                              const QueuePairOptions& options, detail::Status& status);
    bool step_impl(bool server, const CmOptions& options, std::span<const std::byte> private_data,
                   std::chrono::milliseconds timeout, detail::Status& status);
    bool reject_impl(std::span<const std::byte> private_data, detail::Status& status);
    QueuePair establish_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                             const QueuePairOptions& options, std::chrono::milliseconds timeout,
                             detail::Status& status);
    std::optional<CmEvent> wait_impl(std::optional<std::chrono::milliseconds> timeout, detail::Status& status);

    std::shared_ptr<detail::CmState> state_;
};

/// Listens for rdma_cm connection requests on an IP address and port.
class CmListener {
public:
    CmListener() noexcept = default;
    /// Binds to `address` (an IPv4 or IPv6 address of an RDMA device's
    /// interface, a host name, or "0.0.0.0" / "::" for every one: "::" takes
    /// IPv4 too) and `port` (0: any free port; see port()).
    explicit CmListener(const std::string& address, std::uint16_t port = 0);
    /// The error_code form: an empty CmListener on failure.
    static CmListener create(const std::string& address, std::uint16_t port, std::error_code& ec);
    CmListener(CmListener&&) noexcept = default;
    CmListener& operator=(CmListener&&) noexcept = default;
    CmListener(const CmListener&) = delete;
    CmListener& operator=(const CmListener&) = delete;
    ~CmListener() = default;

    explicit operator bool() const noexcept { return id_ != nullptr; }
    /// The port it listens on (the one chosen when bound to port 0; 0 when empty).
    [[nodiscard]] std::uint16_t port() const;
    /// The address it is bound to, as text ("::", "10.0.0.2").
    [[nodiscard]] std::string address() const;
    /// Waits for one connection request (std::errc::timed_out after `timeout`).
    CmConnection accept(std::chrono::milliseconds timeout = std::chrono::seconds(30));
    /// The error_code form: an empty CmConnection on failure.
    CmConnection accept(std::chrono::milliseconds timeout, std::error_code& ec);
    /// accept(), asynchronously. The operation holds the listening id: the
    /// listener may be moved or destroyed meanwhile (the id then closes when
    /// the operation ends). Signature: void(async_error_code, gpuverbs::CmConnection).
    template <boost::asio::completion_token_for<void(async_error_code, CmConnection)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_accept(std::chrono::milliseconds timeout, Token&& token = Token()) {
        return boost::asio::async_initiate<Token, void(async_error_code, CmConnection)>(
            detail::InitiateCmStep<CmConnection>{}, token, [id = id_, timeout](std::error_code& ec) {
                CmListener same;
                same.id_ = id;
                return same.accept(timeout, ec);
            });
    }

private:
    static CmListener create_impl(const std::string& address, std::uint16_t port, detail::Status& status);
    CmConnection accept_impl(std::chrono::milliseconds timeout, detail::Status& status);

    std::shared_ptr<detail::CmIdCore> id_;
};

/// Resolves the address and route to host:port (an IPv4 or IPv6 address or a
/// host name, through rdma_getaddrinfo; optionally from `source`, an address
/// of ours) for an outgoing connection.
CmConnection cm_resolve(const std::string& host, std::uint16_t port,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30), const std::string& source = "");
/// The error_code form: an empty CmConnection on failure (e.g. std::errc::timed_out).
CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec);
/// … with the explanation the exception would carry kept in `diagnostics`.
CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec, Diagnostics& diagnostics);

/// cm_resolve(), asynchronously.
/// Signature: void(async_error_code, gpuverbs::CmConnection).
template <boost::asio::completion_token_for<void(async_error_code, CmConnection)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                      const std::string& source, Token&& token = Token()) {
    return boost::asio::async_initiate<Token, void(async_error_code, CmConnection)>(
        detail::InitiateCmStep<CmConnection>{}, token,
        [host, port, timeout, source](std::error_code& ec) { return cm_resolve(host, port, timeout, source, ec); });
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
