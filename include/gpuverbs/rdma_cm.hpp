// Connecting queue pairs with librdmacm: addresses and routes are resolved by
// the RDMA connection manager instead of an out-of-band TCP exchange.
//
//   // server                                         // client
//   gpuverbs::CmListener listener("10.0.0.2", 7471);  auto conn = gpuverbs::cm_resolve("10.0.0.2", 7471);
//   auto conn = listener.accept();                    gpuverbs::ProtectionDomain pd(conn.device());
//   gpuverbs::ProtectionDomain pd(conn.device());     gpuverbs::CompletionQueue cq(conn.device(), 256);
//   gpuverbs::CompletionQueue cq(conn.device(), 256); auto qp = std::move(conn).establish(pd, cq, cq);
//   auto qp = std::move(conn).establish(pd, cq, cq);
//
// The connection manager picks the device from the address, so the protection
// domain, CQs and memory regions are made on conn.device(). Exchange
// RemoteMemory afterwards with a send/receive, or over TCP.
//
// Each step has a throwing form and a std::error_code& form that returns an
// empty object instead; establish and cm_resolve also take a Diagnostics that
// keeps the words the exception would carry:
//
//   std::error_code ec;
//   auto conn = gpuverbs::cm_resolve("10.0.0.2", 7471, 5s, "", ec);
//   if (ec == std::errc::timed_out) …
// Only available when gpuverbs was built with librdmacm (GPUVERBS_HAVE_RDMACM).
#pragma once

#include "gpuverbs/completion_queue.hpp"
#include "gpuverbs/device.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/protection_domain.hpp"
#include "gpuverbs/queue_pair.hpp"

#if GPUVERBS_HAVE_RDMACM

#include "gpuverbs/detail/async_op.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

struct rdma_cm_id;
struct rdma_event_channel;

namespace gpuverbs {

namespace detail {
class CmIdCore;

/// The private threads rdma_cm's blocking steps run on for the async_* forms
/// (as Asio's resolver runs getaddrinfo on one of its own); up to 16 steps
/// wait at once.
boost::asio::thread_pool& cm_thread();

/// Runs `step` — the error_code form of a step, `Result(std::error_code&)` —
/// on the rdma_cm thread, then completes `handler` with (error_code, result)
/// on its associated executor.
template <class Result, class Handler, class Step>
void run_cm_step(Handler&& handler, Step step) {
    auto executor = boost::asio::get_associated_executor(handler, boost::asio::system_executor());
    auto work = boost::asio::make_work_guard(executor);
    boost::asio::post(cm_thread(),
                      [h = std::forward<Handler>(handler), work = std::move(work), step = std::move(step)]() mutable {
                          boost::system::error_code ec;
                          Result result{};
                          try {
                              std::error_code failed;
                              result = step(failed);
                              if (failed) ec = to_asio_error(failed);
                          } catch (const std::bad_alloc&) {
                              ec = boost::asio::error::no_memory;
                          } catch (const std::system_error& e) { // never let one escape into the pool's thread
                              ec = to_asio_error(e.code());
                          }
                          auto ex = work.get_executor();
                          boost::asio::post(ex, boost::asio::append(std::move(h), ec, std::move(result)));
                      });
}
} // namespace detail

class CmConnection;

namespace detail {
CmConnection cm_resolve_impl(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                             const std::string& source, Status& status);
} // namespace detail

/// A connection on its way: a request a CmListener accepted, or an outgoing
/// connection whose address and route cm_resolve found. Move-only.
class CmConnection {
public:
    CmConnection() noexcept = default;
    CmConnection(CmConnection&&) noexcept = default;
    CmConnection& operator=(CmConnection&&) noexcept = default;
    CmConnection(const CmConnection&) = delete;
    CmConnection& operator=(const CmConnection&) = delete;
    ~CmConnection() = default;

    explicit operator bool() const noexcept { return id_ != nullptr; }
    /// The device the connection manager chose; make the PD, CQs and MRs on it.
    [[nodiscard]] const Device& device() const noexcept { return device_; }
    /// The peer's IP address.
    [[nodiscard]] std::string peer_address() const;

    /// Creates an RC queue pair on the connection and establishes it (the
    /// server accepts, the client connects), waiting at most `timeout`.
    /// Errors name the connection-manager event that ended the attempt
    /// (e.g. REJECTED: no listener on that port).
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
    /// establish(), asynchronously: pd and the CQs must outlive the operation.
    /// Signature: void(boost::system::error_code, gpuverbs::QueuePair).
    template <class Token = default_token_t<boost::asio::any_io_executor>>
    auto async_establish(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                         const QueuePairOptions& options, std::chrono::milliseconds timeout,
                         Token&& token = Token()) && {
        return boost::asio::async_initiate<Token, void(boost::system::error_code, QueuePair)>(
            [](auto&& handler, CmConnection c, const ProtectionDomain* pd, const CompletionQueue* s,
               const CompletionQueue* r, QueuePairOptions o, std::chrono::milliseconds t) {
                detail::run_cm_step<QueuePair>(
                    std::forward<decltype(handler)>(handler),
                    [c = std::make_shared<CmConnection>(std::move(c)), pd, s, r, o, t](std::error_code& ec) mutable {
                        return std::move(*c).establish(*pd, *s, *r, o, t, ec);
                    });
            },
            token, std::move(*this), &pd, &send_cq, &recv_cq, options, timeout);
    }
    /// Server side: refuses the request; the client's establish() fails with REJECTED.
    void reject() &&;

private:
    friend class CmListener;
    friend CmConnection detail::cm_resolve_impl(const std::string&, std::uint16_t, std::chrono::milliseconds,
                                                const std::string&, detail::Status&);
    QueuePair establish_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                             const QueuePairOptions& options, std::chrono::milliseconds timeout,
                             detail::Status& status);

    std::shared_ptr<detail::CmIdCore> id_;
    Device device_;
    bool incoming_ = false;
};

/// Listens for rdma_cm connection requests on an IP address and port.
class CmListener {
public:
    CmListener() noexcept = default;
    /// Binds to `address` (an IP of an RDMA device's interface, or "0.0.0.0")
    /// and `port` (0: any free port; see port()).
    explicit CmListener(const std::string& address, std::uint16_t port = 0);
    /// The error_code form: an empty CmListener on failure.
    static CmListener create(const std::string& address, std::uint16_t port, std::error_code& ec);
    CmListener(CmListener&&) noexcept = default;
    CmListener& operator=(CmListener&&) noexcept = default;
    CmListener(const CmListener&) = delete;
    CmListener& operator=(const CmListener&) = delete;
    ~CmListener() = default;

    explicit operator bool() const noexcept { return id_ != nullptr; }
    /// The port it listens on (0 when empty).
    [[nodiscard]] std::uint16_t port() const;
    /// Waits for one connection request (std::errc::timed_out after `timeout`).
    CmConnection accept(std::chrono::milliseconds timeout = std::chrono::seconds(30));
    /// The error_code form: an empty CmConnection on failure.
    CmConnection accept(std::chrono::milliseconds timeout, std::error_code& ec);
    /// accept(), asynchronously; the listener must outlive the operation.
    /// Signature: void(boost::system::error_code, gpuverbs::CmConnection).
    template <class Token = default_token_t<boost::asio::any_io_executor>>
    auto async_accept(std::chrono::milliseconds timeout, Token&& token = Token()) {
        return boost::asio::async_initiate<Token, void(boost::system::error_code, CmConnection)>(
            [this, timeout](auto&& handler) {
                detail::run_cm_step<CmConnection>(std::forward<decltype(handler)>(handler),
                                                  [this, timeout](std::error_code& ec) { return accept(timeout, ec); });
            },
            token);
    }

private:
    static CmListener create_impl(const std::string& address, std::uint16_t port, detail::Status& status);
    CmConnection accept_impl(std::chrono::milliseconds timeout, detail::Status& status);

    std::shared_ptr<detail::CmIdCore> id_;
};

/// Resolves the address and route to host:port (optionally from `source`, an
/// IP of ours) for an outgoing connection.
CmConnection cm_resolve(const std::string& host, std::uint16_t port,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30), const std::string& source = "");
/// The error_code form: an empty CmConnection on failure (e.g. std::errc::timed_out).
CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec);
/// … with the explanation the exception would carry kept in `diagnostics`.
CmConnection cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                        const std::string& source, std::error_code& ec, Diagnostics& diagnostics);

/// cm_resolve(), asynchronously.
/// Signature: void(boost::system::error_code, gpuverbs::CmConnection).
template <class Token = default_token_t<boost::asio::any_io_executor>>
auto async_cm_resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                      const std::string& source, Token&& token = Token()) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, CmConnection)>(
        [](auto&& handler, const std::string& h, std::uint16_t p, std::chrono::milliseconds t, const std::string& s) {
            detail::run_cm_step<CmConnection>(std::forward<decltype(handler)>(handler),
                                              [h, p, t, s](std::error_code& ec) { return cm_resolve(h, p, t, s, ec); });
        },
        token, host, port, timeout, source);
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
