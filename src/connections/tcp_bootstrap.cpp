#include "gpuverbs/connections/tcp_bootstrap.hpp"
#include "gpuverbs/detail/deadline.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <thread>

namespace gpuverbs {
namespace {

using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

// Waits until fd is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd p{fd, events, 0};
        int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
        if (rc > 0) return true;
        if (rc < 0 && errno != EINTR) return true; // let the next I/O call report the error
    }
}

// Why an Asio call failed: errno_text for an errno (Asio's system category),
// the code's own words otherwise (a resolver error, end of file).
std::string error_text(const boost::system::error_code& ec) {
    return ec.category() == asio::error::get_system_category() ? detail::errno_text(ec.value()) : ec.message();
}

void fail_timeout(detail::Status& status, const char* verb, const std::string& what) {
    status.fail(std::make_error_code(std::errc::timed_out), verb, what + ": timed out waiting for the peer");
}

} // namespace

TcpListener TcpListener::create_impl(const asio::any_io_executor& executor, std::uint16_t port,
                                     const std::string& address, detail::Status& status) {
    TcpListener listener(executor, Closed{});
    boost::system::error_code ec;
    auto ip = asio::ip::make_address(address, ec);
    if (ec) {
        status.fail(ec, "TcpListener", "'" + address + "' is not an IP address");
        return listener;
    }
    asio::ip::tcp::endpoint where(ip, port);
    asio::ip::tcp::acceptor& acceptor = listener.acceptor_;
    acceptor.open(where.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(where, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
        boost::system::error_code ignored;
        acceptor.close(ignored); // a failed listener holds no socket
        status.fail(ec, "TcpListener",
                    "cannot listen on " + address + ":" + std::to_string(port) + ": " + error_text(ec));
    }
    return listener;
}

TcpListener::TcpListener(asio::io_context& io, std::uint16_t port, const std::string& address)
    : TcpListener(io.get_executor(), port, address) {}

TcpListener::TcpListener(const asio::any_io_executor& executor, std::uint16_t port, const std::string& address)
    : TcpListener(detail::or_throw([&](detail::Status& s) { return create_impl(executor, port, address, s); })) {}

TcpListener TcpListener::create(asio::io_context& io, std::uint16_t port, const std::string& address,
                                std::error_code& ec) {
    return create(io.get_executor(), port, address, ec);
}

TcpListener TcpListener::create(asio::io_context& io, std::uint16_t port, const std::string& address,
                                std::error_code& ec, Diagnostics& diagnostics) {
    return create(io.get_executor(), port, address, ec, diagnostics);
}

TcpListener TcpListener::create(const asio::any_io_executor& executor, std::uint16_t port, const std::string& address,
                                std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(executor, port, address, s); });
}

TcpListener TcpListener::create(const asio::any_io_executor& executor, std::uint16_t port, const std::string& address,
                                std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return create_impl(executor, port, address, s); });
}

std::uint16_t TcpListener::port() const {
    return acceptor_.local_endpoint().port();
}

asio::ip::tcp::socket TcpListener::accept_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    if (!acceptor_.is_open()) {
        status.fail(errc::invalid_argument, "accept",
                    "the listener is closed (create() refused it, or it was moved from)");
        return asio::ip::tcp::socket(acceptor_.get_executor()); // a moved-from listener has no executor_
    }
    auto deadline = detail::deadline_after(timeout);
    boost::system::error_code ec;
    // Non-blocking, so that a connection reset between poll and accept sends
    // us back to poll until the deadline instead of blocking past it.
    const bool was_non_blocking = acceptor_.non_blocking();
    acceptor_.non_blocking(true, ec);
    struct Restore {
        asio::ip::tcp::acceptor& a;
        bool mode;
        ~Restore() {
            boost::system::error_code ignored;
            a.non_blocking(mode, ignored);
        }
    } restore{acceptor_, was_non_blocking};
    for (;;) {
        if (!wait_ready(acceptor_.native_handle(), POLLIN, deadline)) {
            status.fail(std::make_error_code(std::errc::timed_out), "accept",
                        "no bootstrap connection on port " + std::to_string(port()) + " within " +
                            std::to_string(timeout.count()) + " ms");
            return asio::ip::tcp::socket(acceptor_.get_executor()); // a moved-from listener has no executor_
        }
        asio::ip::tcp::socket socket(executor_);
        acceptor_.accept(socket, ec);
        if (!ec) {
            socket.non_blocking(false, ec);
            return socket;
        }
        if (ec != asio::error::would_block && ec != asio::error::try_again && ec != asio::error::connection_aborted) {
            status.fail(ec, "accept", "cannot accept a bootstrap connection: " + error_text(ec));
            return asio::ip::tcp::socket(acceptor_.get_executor()); // a moved-from listener has no executor_
        }
    }
}

asio::ip::tcp::socket TcpListener::accept(std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return accept_impl(timeout, s); });
}

asio::ip::tcp::socket TcpListener::accept(std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return accept_impl(timeout, s); });
}

asio::ip::tcp::socket TcpListener::accept(std::chrono::milliseconds timeout, std::error_code& ec,
                                          Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return accept_impl(timeout, s); });
}

namespace {

/// One connection attempt to `where`, bounded by `deadline` (a SYN nobody
/// answers, dropped by a firewall, waits for the deadline, not the kernel's
/// two minutes). The error when it fails; std::errc::timed_out at the deadline.
boost::system::error_code connect_once(asio::ip::tcp::socket& socket, const asio::ip::tcp::endpoint& where,
                                       Clock::time_point deadline) {
    boost::system::error_code ec;
    socket.open(where.protocol(), ec);
    if (!ec) socket.non_blocking(true, ec);
    if (ec) return ec;
    // ::connect, not socket.connect: Asio's synchronous connect waits for the
    // handshake itself (without a bound) even on a non-blocking socket.
    if (::connect(socket.native_handle(), where.data(), static_cast<socklen_t>(where.size())) != 0) {
        ec = boost::system::error_code(errno, asio::error::get_system_category());
    }
    if (ec == asio::error::in_progress || ec == asio::error::would_block) {
        if (!wait_ready(socket.native_handle(), POLLOUT, deadline)) return asio::error::timed_out;
        int error = 0;
        socklen_t length = sizeof error;
        if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
        ec = error == 0 ? boost::system::error_code{}
                        : boost::system::error_code(error, asio::error::get_system_category());
    }
    if (!ec) socket.non_blocking(false, ec);
    return ec;
}

/// tcp_connect, its failure in `status`; the socket is closed on failure.
asio::ip::tcp::socket connect_impl(asio::io_context& io, const std::string& host, std::uint16_t port,
                                   std::chrono::milliseconds timeout, detail::Status& status) {
    auto deadline = detail::deadline_after(timeout);
    asio::ip::tcp::resolver resolver(io);
    boost::system::error_code ec;
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) {
        status.fail(ec, "resolve", "cannot resolve '" + host + "': " + error_text(ec));
        return asio::ip::tcp::socket(io);
    }
    bool refused = false; // a refusal seen: the last attempt's timeout is that refusal at the deadline
    for (;;) {
        for (const auto& entry : endpoints) {
            asio::ip::tcp::socket socket(io);
            ec = connect_once(socket, entry.endpoint(), deadline);
            if (!ec) {
                socket.set_option(asio::ip::tcp::no_delay(true), ec);
                return socket;
            }
        }
        if (ec == asio::error::timed_out && refused) ec = asio::error::connection_refused;
        refused = refused || ec == asio::error::connection_refused;
        if (ec == asio::error::timed_out) {
            status.fail(std::make_error_code(std::errc::timed_out), "connect",
                        "cannot connect to " + host + ":" + std::to_string(port) + " within " +
                            std::to_string(timeout.count()) +
                            " ms: nothing answered (a firewall dropping packets, a wrong address, or no route)");
            return asio::ip::tcp::socket(io);
        }
        // The peer's listener may not be up yet: retry refusals until the deadline.
        if (ec != asio::error::connection_refused || Clock::now() >= deadline) {
            status.fail(ec, "connect",
                        "cannot connect to " + host + ":" + std::to_string(port) + ": " + error_text(ec) +
                            (ec == asio::error::connection_refused ? " (is the server running?)" : ""));
            return asio::ip::tcp::socket(io);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

} // namespace

asio::ip::tcp::socket tcp_connect(asio::io_context& io, const std::string& host, std::uint16_t port,
                                  std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return connect_impl(io, host, port, timeout, s); });
}

asio::ip::tcp::socket tcp_connect(asio::io_context& io, const std::string& host, std::uint16_t port,
                                  std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return connect_impl(io, host, port, timeout, s); });
}

asio::ip::tcp::socket tcp_connect(asio::io_context& io, const std::string& host, std::uint16_t port,
                                  std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return connect_impl(io, host, port, timeout, s); });
}

namespace detail {

std::optional<std::uint32_t> frame_length(std::span<const std::byte, 4> header, std::size_t max_size, Status& status) {
    std::uint32_t n = 0;
    for (std::byte b : header) n = (n << 8) | std::to_integer<std::uint32_t>(b);
    if (n > max_size) {
        status.fail(errc::malformed_record, "receive",
                    "the peer announced a " + std::to_string(n) + "-byte record; at most " + std::to_string(max_size) +
                        " are allowed (not a gpuverbs peer?)");
        return std::nullopt;
    }
    return n;
}

void fail_io(const boost::system::error_code& ec, bool sending, const char* what, std::size_t got, std::size_t wanted,
             Status& status) {
    const char* verb = sending ? "send" : "receive";
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
        status.fail(errc::peer_closed, verb,
                    std::string("the peer closed the connection after ") + std::to_string(got) + " of " +
                        std::to_string(wanted) + " bytes of " + (sending ? "our " : "its ") + what);
        return;
    }
    status.fail(
        ec, verb,
        std::string(sending ? "cannot send our " : "cannot receive the peer's ") + what + ": " + error_text(ec));
}

std::vector<std::byte> frame_record(std::span<const std::byte> payload) {
    std::vector<std::byte> frame(4 + payload.size());
    auto n = static_cast<std::uint32_t>(payload.size());
    for (std::size_t i = 0; i < 4; ++i) frame[i] = std::byte(n >> (24 - 8 * i));
    std::copy(payload.begin(), payload.end(), frame.begin() + 4);
    return frame;
}

void write_frame(asio::ip::tcp::socket& socket, std::span<const std::byte> payload, Clock::time_point deadline,
                 Status& status, const char* what) {
    std::vector<std::byte> frame = frame_record(payload);
    boost::system::error_code ec;
    socket.non_blocking(true, ec);
    std::size_t done = 0;
    while (!ec && done < frame.size()) {
        done += socket.write_some(asio::buffer(frame.data() + done, frame.size() - done), ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again) {
            ec.clear();
            if (!wait_ready(socket.native_handle(), POLLOUT, deadline)) {
                fail_timeout(status, "send", std::string("sending the ") + what);
                return;
            }
        }
    }
    if (ec) fail_io(ec, true, what, done, frame.size(), status);
}

/// The first bytes read_frame sets aside for a record's payload.
constexpr std::size_t first_chunk = std::size_t{64} << 10;

std::vector<std::byte> read_frame(asio::ip::tcp::socket& socket, std::size_t max_size, Clock::time_point deadline,
                                  Status& status) {
    boost::system::error_code ec;
    socket.non_blocking(true, ec);
    // `before` and `total`: where this read sits in the part `what` names (the
    // record is read in chunks; a close is reported against all of it).
    auto read_exactly = [&](std::byte* out, std::size_t n, const char* what, std::size_t before, std::size_t total) {
        std::size_t got = 0;
        while (got < n) {
            got += socket.read_some(asio::buffer(out + got, n - got), ec);
            if (ec == asio::error::would_block || ec == asio::error::try_again) {
                ec.clear();
                if (!wait_ready(socket.native_handle(), POLLIN, deadline)) {
                    fail_timeout(status, "receive", std::string("receiving the peer's ") + what);
                    return false;
                }
            } else if (ec) {
                fail_io(ec, false, what, before + got, total, status);
                return false;
            }
        }
        return true;
    };
    std::array<std::byte, 4> header{};
    if (!read_exactly(header.data(), 4, "record length", 0, 4)) return {};
    std::optional<std::uint32_t> n = frame_length(header, max_size, status);
    if (!n) return {};
    // The buffer grows with the bytes that arrived (at most twice them, from
    // 64 KiB): a peer that announces 64 MiB and sends nothing costs 64 KiB,
    // not 64 MiB held until the deadline.
    std::vector<std::byte> payload;
    while (payload.size() < *n) {
        const std::size_t have = payload.size();
        const std::size_t step = std::min<std::size_t>(*n - have, std::max<std::size_t>(have, first_chunk));
        payload.resize(have + step);
        if (!read_exactly(payload.data() + have, step, "record", have, *n)) return {};
    }
    return payload;
}

// The exchanges work non-blocking, for their deadline; the socket goes back
// to the caller in the mode it came in (blocking asio reads afterwards would
// otherwise fail with "would block").
struct RestoreMode {
    asio::ip::tcp::socket& socket;
    bool non_blocking;
    explicit RestoreMode(asio::ip::tcp::socket& s) : socket(s), non_blocking(s.non_blocking()) {}
    RestoreMode(const RestoreMode&) = delete;
    RestoreMode& operator=(const RestoreMode&) = delete;
    ~RestoreMode() {
        boost::system::error_code ignored;
        socket.non_blocking(non_blocking, ignored);
    }
};

Handshake exchange_impl(asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout,
                        Status& status) {
    auto deadline = detail::deadline_after(timeout);
    if (ours.regions.size() > wire::max_regions) {
        status.fail(errc::invalid_argument, "exchange_handshake",
                    "a handshake carries at most " + std::to_string(wire::max_regions) + " regions");
        return {};
    }
    RestoreMode restore(socket);
    std::vector<std::byte> payload = wire::serialize(ours);
    write_frame(socket, payload, deadline, status);
    if (!status.ok()) return {};
    std::vector<std::byte> theirs = read_frame(socket, wire::max_handshake_size, deadline, status);
    if (!status.ok()) return {};
    return wire::detail::parse_handshake(theirs, status);
}

} // namespace detail

namespace {

bool send_record_impl(asio::ip::tcp::socket& socket, std::span<const std::byte> record,
                      std::chrono::milliseconds timeout, detail::Status& status) {
    if (record.size() > UINT32_MAX) {
        status.fail(errc::invalid_argument, "send_record",
                    "a record of " + std::to_string(record.size()) + " bytes does not fit a frame (at most 2^32 - 1)");
        return false;
    }
    detail::RestoreMode restore(socket);
    detail::write_frame(socket, record, detail::deadline_after(timeout), status, "record");
    return status.ok();
}

std::vector<std::byte> receive_record_impl(asio::ip::tcp::socket& socket, std::size_t max_size,
                                           std::chrono::milliseconds timeout, detail::Status& status) {
    detail::RestoreMode restore(socket);
    return detail::read_frame(socket, max_size, detail::deadline_after(timeout), status);
}

} // namespace

void send_record(asio::ip::tcp::socket& socket, std::span<const std::byte> record, std::chrono::milliseconds timeout) {
    (void)detail::or_throw([&](detail::Status& s) { return send_record_impl(socket, record, timeout, s); });
}

void send_record(asio::ip::tcp::socket& socket, std::span<const std::byte> record, std::chrono::milliseconds timeout,
                 std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return send_record_impl(socket, record, timeout, s); });
}

void send_record(asio::ip::tcp::socket& socket, std::span<const std::byte> record, std::chrono::milliseconds timeout,
                 std::error_code& ec, Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics,
                          [&](detail::Status& s) { return send_record_impl(socket, record, timeout, s); });
}

std::vector<std::byte> receive_record(asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return receive_record_impl(socket, max_size, timeout, s); });
}

std::vector<std::byte> receive_record(asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return receive_record_impl(socket, max_size, timeout, s); });
}

std::vector<std::byte> receive_record(asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout, std::error_code& ec,
                                      Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return receive_record_impl(socket, max_size, timeout, s); });
}

Handshake exchange_handshake(asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout) {
    return detail::or_throw([&](detail::Status& s) { return detail::exchange_impl(socket, ours, timeout, s); });
}

Handshake exchange_handshake(asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout,
                             std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return detail::exchange_impl(socket, ours, timeout, s); });
}

Handshake exchange_handshake(asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout,
                             std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return detail::exchange_impl(socket, ours, timeout, s); });
}

} // namespace gpuverbs
