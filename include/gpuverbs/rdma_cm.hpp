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
// Only available when gpuverbs was built with librdmacm (GPUVERBS_HAVE_RDMACM).
#pragma once

#include "gpuverbs/completion_queue.hpp"
#include "gpuverbs/device.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/protection_domain.hpp"
#include "gpuverbs/queue_pair.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

struct rdma_cm_id;
struct rdma_event_channel;

namespace gpuverbs {

namespace detail {
class CmIdCore;
}

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
    /// Server side: refuses the request; the client's establish() fails with REJECTED.
    void reject() &&;

private:
    friend class CmListener;
    friend CmConnection cm_resolve(const std::string&, std::uint16_t, std::chrono::milliseconds, const std::string&);
    std::shared_ptr<detail::CmIdCore> id_;
    Device device_;
    bool incoming_ = false;
};

/// Listens for rdma_cm connection requests on an IP address and port.
class CmListener {
public:
    /// Binds to `address` (an IP of an RDMA device's interface, or "0.0.0.0")
    /// and `port` (0: any free port; see port()).
    explicit CmListener(const std::string& address, std::uint16_t port = 0);
    CmListener(CmListener&&) noexcept = default;
    CmListener& operator=(CmListener&&) noexcept = default;
    ~CmListener() = default;

    [[nodiscard]] std::uint16_t port() const;
    /// Waits for one connection request (std::errc::timed_out after `timeout`).
    CmConnection accept(std::chrono::milliseconds timeout = std::chrono::seconds(30));

private:
    std::shared_ptr<detail::CmIdCore> id_;
};

/// Resolves the address and route to host:port (optionally from `source`, an
/// IP of ours) for an outgoing connection.
CmConnection cm_resolve(const std::string& host, std::uint16_t port,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30), const std::string& source = "");

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
