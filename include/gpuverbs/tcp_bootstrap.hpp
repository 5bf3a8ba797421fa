// Out-of-band connection set-up over TCP with Boost.Asio: each side sends a
// Handshake (its Endpoint and the RemoteMemory it offers) and receives the
// peer's, framed as a 4-byte big-endian length and the wire.hpp record.
//
//   // server                                   // client
//   gpuverbs::TcpListener listener(io, 18515);  auto s = gpuverbs::tcp_connect(io, "10.0.0.2", 18515);
//   auto s = listener.accept();                 auto peer = gpuverbs::exchange_handshake(s, ours);
//   auto peer = gpuverbs::exchange_handshake(s, ours);
//
// A truncated, oversized, wrong-version or garbage record fails with
// errc::malformed_record / errc::unsupported_version before anything touches a
// queue pair; a peer that closes early gives errc::peer_closed, one that goes
// silent std::errc::timed_out. (Asynchronous forms come with the Asio layer.)
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/wire.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>

namespace gpuverbs {

/// How long a bootstrap step may take by default.
inline constexpr std::chrono::milliseconds default_bootstrap_timeout{30000};

/// A TCP listener for bootstrap connections.
class TcpListener {
public:
    /// Listens on `address`:`port` (port 0: any free port; see port()).
    explicit TcpListener(boost::asio::io_context& io, std::uint16_t port = 0, const std::string& address = "0.0.0.0");

    [[nodiscard]] std::uint16_t port() const;
    /// Accepts one connection, waiting at most `timeout` (std::errc::timed_out).
    boost::asio::ip::tcp::socket accept(std::chrono::milliseconds timeout = default_bootstrap_timeout);

    [[nodiscard]] boost::asio::ip::tcp::acceptor& native_handle() noexcept { return acceptor_; }

private:
    boost::asio::io_context* io_;
    boost::asio::ip::tcp::acceptor acceptor_;
};

/// Connects to host:port, retrying while the listener is not up yet, for at
/// most `timeout`.
boost::asio::ip::tcp::socket tcp_connect(boost::asio::io_context& io, const std::string& host, std::uint16_t port,
                                         std::chrono::milliseconds timeout = default_bootstrap_timeout);

/// Sends `ours` and receives the peer's handshake on a connected socket.
Handshake exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours,
                             std::chrono::milliseconds timeout = default_bootstrap_timeout);
Handshake exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours,
                             std::chrono::milliseconds timeout, std::error_code& ec);

namespace detail {
/// Writes one framed record (4-byte big-endian length + payload).
void write_frame(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> payload,
                 std::chrono::steady_clock::time_point deadline, Status& status);
/// exchange_handshake with the full explanation kept in `status`.
Handshake exchange_impl(boost::asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout,
                        Status& status);
/// Reads one framed record of at most `max_size` bytes.
std::vector<std::byte> read_frame(boost::asio::ip::tcp::socket& socket, std::size_t max_size,
                                  std::chrono::steady_clock::time_point deadline, Status& status);
} // namespace detail

} // namespace gpuverbs
