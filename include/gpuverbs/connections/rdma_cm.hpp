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
// (GPUVERBS_HAVE_RDMACM). The values are rdma_cm_types.hpp; the machinery
// of the Asio forms is detail/connections/cm_steps.hpp.
#pragma once

#include "gpuverbs/config.hpp"
#include "gpuverbs/connections/rdma_cm_types.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#if GPUVERBS_HAVE_RDMACM

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/async/event_wait.hpp"
#include "gpuverbs/detail/connections/cm_steps.hpp"

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
                std::chrono::milliseconds timeout = default_cm_timeout);
    void accept(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    void accept(const CmOptions& options, std::span<const std::byte> private_data, std::chrono::milliseconds timeout,
                std::error_code& ec, Diagnostics& diagnostics);
    /// Step 2, client: connects with `options` and up to
    /// private_data_limits().connect bytes, and waits for the answer. A refusal
    /// fails with errc::connection_rejected; rejection() then says why.
    void connect(const CmOptions& options = {}, std::span<const std::byte> private_data = {},
                 std::chrono::milliseconds timeout = default_cm_timeout);
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
                        std::chrono::milliseconds timeout = default_cm_timeout) &&;
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
    CmConnection accept(std::chrono::milliseconds timeout = default_cm_timeout);
    /// The error_code form: an empty CmConnection on failure.
    CmConnection accept(std::chrono::milliseconds timeout, std::error_code& ec);
    CmConnection accept(std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics);
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
                        std::chrono::milliseconds timeout = default_cm_timeout, const std::string& source = "");
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
