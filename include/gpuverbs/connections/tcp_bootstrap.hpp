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
// silent std::errc::timed_out. The blocking and asynchronous forms check a
// frame with the same functions (detail::frame_length, wire's parsers), so
// they refuse the same bytes with the same code and words.
#pragma once

#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/error.hpp"

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/deadline.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// How long a bootstrap step may take by default.
inline constexpr std::chrono::milliseconds default_bootstrap_timeout{30000};

/// A TCP listener for bootstrap connections.
class TcpListener {
public:
    /// Listens on `address`:`port` (port 0: any free port; see port()).
    /// Throws gpuverbs::Error: an address that is not an IP address, or a
    /// port that cannot be listened on (taken, privileged).
    explicit TcpListener(boost::asio::io_context& io, std::uint16_t port = 0, const std::string& address = "0.0.0.0");
    explicit TcpListener(const boost::asio::any_io_executor& executor, std::uint16_t port = 0,
                         const std::string& address = "0.0.0.0");
    /// The same without throwing: on failure `ec` is set and the listener
    /// returned is closed (only destroy it or assign to it).
    static TcpListener create(boost::asio::io_context& io, std::uint16_t port, const std::string& address,
                              std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static TcpListener create(boost::asio::io_context& io, std::uint16_t port, const std::string& address,
                              std::error_code& ec, Diagnostics& diagnostics);
    static TcpListener create(const boost::asio::any_io_executor& executor, std::uint16_t port,
                              const std::string& address, std::error_code& ec);
    static TcpListener create(const boost::asio::any_io_executor& executor, std::uint16_t port,
                              const std::string& address, std::error_code& ec, Diagnostics& diagnostics);

    [[nodiscard]] std::uint16_t port() const;
    /// Accepts one connection, waiting at most `timeout` (std::errc::timed_out).
    boost::asio::ip::tcp::socket accept(std::chrono::milliseconds timeout = default_bootstrap_timeout);
    /// The same without throwing: on failure `ec` is set and the socket returned is not open.
    boost::asio::ip::tcp::socket accept(std::chrono::milliseconds timeout, std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    boost::asio::ip::tcp::socket accept(std::chrono::milliseconds timeout, std::error_code& ec,
                                        Diagnostics& diagnostics);
    /// Accepts one connection asynchronously: Asio's acceptor operation, so
    /// the listener must outlive it and not be moved while it is outstanding
    /// (as an Asio acceptor). Signature: void(async_error_code, boost::asio::ip::tcp::socket).
    template <boost::asio::completion_token_for<void(async_error_code, boost::asio::ip::tcp::socket)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_accept(Token&& token = Token()) {
        return acceptor_.async_accept(std::forward<Token>(token));
    }

    [[nodiscard]] boost::asio::ip::tcp::acceptor& native_handle() noexcept { return acceptor_; }

private:
    struct Closed {};
    TcpListener(const boost::asio::any_io_executor& executor, Closed) : executor_(executor), acceptor_(executor) {}
    static TcpListener create_impl(const boost::asio::any_io_executor& executor, std::uint16_t port,
                                   const std::string& address, detail::Status& status);
    boost::asio::ip::tcp::socket accept_impl(std::chrono::milliseconds timeout, detail::Status& status);
    boost::asio::any_io_executor executor_;
    boost::asio::ip::tcp::acceptor acceptor_;
};

/// Connects to host:port, retrying while the listener is not up yet, for at
/// most `timeout`. Throws gpuverbs::Error: a host that does not resolve, a
/// refusal until the deadline, nothing answering (std::errc::timed_out).
boost::asio::ip::tcp::socket tcp_connect(boost::asio::io_context& io, const std::string& host, std::uint16_t port,
                                         std::chrono::milliseconds timeout = default_bootstrap_timeout);
/// The same without throwing: on failure `ec` is set and the socket is closed.
boost::asio::ip::tcp::socket tcp_connect(boost::asio::io_context& io, const std::string& host, std::uint16_t port,
                                         std::chrono::milliseconds timeout, std::error_code& ec);
/// … with the words of the failure in `diagnostics` (cleared on success).
boost::asio::ip::tcp::socket tcp_connect(boost::asio::io_context& io, const std::string& host, std::uint16_t port,
                                         std::chrono::milliseconds timeout, std::error_code& ec,
                                         Diagnostics& diagnostics);

/// Sends `ours` and receives the peer's handshake on a connected socket.
Handshake exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours,
                             std::chrono::milliseconds timeout = default_bootstrap_timeout);
Handshake exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours,
                             std::chrono::milliseconds timeout, std::error_code& ec);
/// … with the words of the failure in `diagnostics` (cleared on success).
Handshake exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours,
                             std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics);

/// Sends one framed record (any wire.hpp record after the handshake, e.g. a
/// block list) and receives one of at most `max_size` bytes: the same frame,
/// checks and words as the handshake's. Throw gpuverbs::Error.
void send_record(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> record,
                 std::chrono::milliseconds timeout = default_bootstrap_timeout);
/// send_record without throwing: the failure in `ec`.
void send_record(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> record,
                 std::chrono::milliseconds timeout, std::error_code& ec);
/// … with its words in `diagnostics` (cleared on success).
void send_record(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> record,
                 std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics);
std::vector<std::byte> receive_record(boost::asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout = default_bootstrap_timeout);
/// receive_record without throwing: the failure in `ec` (and no bytes).
std::vector<std::byte> receive_record(boost::asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout, std::error_code& ec);
/// … with its words in `diagnostics` (cleared on success).
std::vector<std::byte> receive_record(boost::asio::ip::tcp::socket& socket, std::size_t max_size,
                                      std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics);

namespace detail {

/// A record as it goes on the wire: 4-byte big-endian length, then the payload.
std::vector<std::byte> frame_record(std::span<const std::byte> payload);

/// The length a frame's 4-byte big-endian `header` announces, when it is at
/// most `max_size`. Otherwise nothing, and `status` fails with
/// errc::malformed_record in words naming the length and the limit: the one
/// check of a peer's length, before anything is allocated for it, for the
/// blocking (read_frame) and the asynchronous (ExchangeHandshakeOp) exchange.
std::optional<std::uint32_t> frame_length(std::span<const std::byte, 4> header, std::size_t max_size, Status& status);

/// The words for a failed read or write of the exchange, in `status`: the
/// peer closing the connection (end of file, reset) after `got` of `wanted`
/// bytes is errc::peer_closed; anything else keeps `ec` and says what failed.
/// `what` names the part: "handshake" (ours) when `sending`, else the peer's
/// "record length" or "record".
void fail_io(const boost::system::error_code& ec, bool sending, const char* what, std::size_t got, std::size_t wanted,
             Status& status);

/// The composed operation behind async_exchange_handshake: write our record,
/// read the peer's length, check it, read the record, parse it. A failure is
/// put in words as the blocking form's are (fail_io, frame_length, wire's
/// parsers) and, when a Diagnostics is given, kept there.
class ExchangeHandshakeOp {
public:
    ExchangeHandshakeOp(boost::asio::ip::tcp::socket& socket, const Handshake& ours, Diagnostics* diagnostics = nullptr)
        : socket_(&socket), diagnostics_(diagnostics), state_(std::make_unique<State>()) {
        state_->out = frame_record(wire::serialize(ours));
    }

    template <class Self>
    void operator()(Self& self, boost::system::error_code ec = {}, std::size_t transferred = 0) {
        namespace asio = boost::asio;
        if (ec) {
            Status status;
            switch (step_) {
                case Step::wrote: fail_io(ec, true, "handshake", transferred, state_->out.size(), status); break;
                case Step::read_length: fail_io(ec, false, "record length", transferred, 4, status); break;
                default: fail_io(ec, false, "record", transferred, state_->in.size(), status); break;
            }
            // The code is Asio's own (operation_aborted stays itself), but for a close.
            bool closed = status.code == errc::peer_closed;
            return finish(self, closed ? to_asio_error(status.code) : ec, status, Handshake{});
        }
        switch (step_) {
            case Step::start:
                step_ = Step::wrote;
                return asio::async_write(*socket_, asio::buffer(state_->out), std::move(self));
            case Step::wrote:
                step_ = Step::read_length;
                return asio::async_read(*socket_, asio::buffer(state_->length), std::move(self));
            case Step::read_length: {
                Status status;
                std::optional<std::uint32_t> n = frame_length(state_->length, wire::max_handshake_size, status);
                if (!n) return finish(self, to_asio_error(status.code), status, Handshake{});
                state_->in.resize(*n);
                step_ = Step::read_record;
                return asio::async_read(*socket_, asio::buffer(state_->in), std::move(self));
            }
            case Step::read_record: {
                Status status;
                Handshake peer = wire::detail::parse_handshake(state_->in, status);
                return finish(self, to_asio_error(status.code), status, std::move(peer));
            }
        }
    }

private:
    enum class Step { start, wrote, read_length, read_record };
    struct State {
        std::vector<std::byte> out;
        std::array<std::byte, 4> length{};
        std::vector<std::byte> in;
    };

    template <class Self>
    void finish(Self& self, boost::system::error_code ec, const Status& status, Handshake peer) {
        if (diagnostics_ != nullptr) status.report(*diagnostics_);
        self.complete(ec, std::move(peer));
    }

    boost::asio::ip::tcp::socket* socket_;
    Diagnostics* diagnostics_;
    std::unique_ptr<State> state_;
    Step step_ = Step::start;
};

/// The composed operation behind async_tcp_connect: resolve, then connect,
/// retrying refusals (the server may not listen yet), all within one
/// deadline. A timer of its own races every step: at the deadline it cancels
/// what is pending (a SYN the peer drops is retransmitted by the kernel for
/// minutes), and the operation completes with timed_out.
class TcpConnectOp {
public:
    TcpConnectOp(const boost::asio::any_io_executor& executor, std::string host, std::uint16_t port,
                 std::chrono::milliseconds timeout)
        : state_(std::make_shared<State>(executor, std::move(host), port, timeout)) {}

    template <class Self>
    void operator()(Self& self) {
        // The deadline's handler holds the state, never the operation: it only
        // cancels. It and every step run on one strand over the handler's own
        // executor (so the final handler still runs where it belongs), and
        // never touch the socket at once on an io_context run by several threads.
        state_->strand = boost::asio::make_strand(
            boost::asio::any_io_executor(boost::asio::get_associated_executor(self, state_->resolver.get_executor())));
        state_->deadline_timer.expires_at(state_->deadline);
        state_->deadline_timer.async_wait(
            boost::asio::bind_executor(state_->strand, [state = state_](const boost::system::error_code& ec) {
                if (ec || state->done) return;
                state->expired = true;
                boost::system::error_code ignored;
                state->resolver.cancel();
                state->socket.cancel(ignored);
                state->socket.close(ignored);
                state->retry_timer.cancel();
            }));
        // (self holds state_: the state is read through a copy, never after self was moved.)
        const std::shared_ptr<State> state = state_;
        state->resolver.async_resolve(state->host, std::to_string(state->port),
                                      boost::asio::bind_executor(state->strand, std::move(self)));
    }
    template <class Self>
    void operator()(Self& self, boost::system::error_code ec,
                    const boost::asio::ip::tcp::resolver::results_type& endpoints) {
        if (ec || state_->expired) return finish(self, ec);
        const std::shared_ptr<State> state = state_;
        state->endpoints = endpoints;
        boost::asio::async_connect(state->socket, state->endpoints,
                                   boost::asio::bind_executor(state->strand, std::move(self)));
    }
    template <class Self>
    void operator()(Self& self, boost::system::error_code ec, const boost::asio::ip::tcp::endpoint&) {
        if (ec == boost::asio::error::connection_refused && !state_->expired &&
            std::chrono::steady_clock::now() < state_->deadline) {
            const std::shared_ptr<State> state = state_;
            state->refused = true;
            state->socket = boost::asio::ip::tcp::socket(state->resolver.get_executor());
            state->retry_timer.expires_after(std::chrono::milliseconds(20));
            return state->retry_timer.async_wait(boost::asio::bind_executor(state->strand, std::move(self)));
        }
        if (!ec && !state_->expired) state_->socket.set_option(boost::asio::ip::tcp::no_delay(true), ec);
        finish(self, ec);
    }
    template <class Self>
    void operator()(Self& self, boost::system::error_code ec) { // the retry timer
        if (ec || state_->expired) return finish(self, ec);
        const std::shared_ptr<State> state = state_;
        boost::asio::async_connect(state->socket, state->endpoints,
                                   boost::asio::bind_executor(state->strand, std::move(self)));
    }

private:
    template <class Self>
    void finish(Self& self, boost::system::error_code ec) {
        state_->done = true;
        state_->deadline_timer.cancel();
        if (state_->expired) { // whatever the cancelled step said, the deadline is why (or the refusals before it)
            ec = state_->refused ? boost::asio::error::connection_refused : boost::asio::error::timed_out;
            boost::system::error_code ignored;
            state_->socket.close(ignored);
        }
        self.complete(ec, std::move(state_->socket));
    }

    struct State {
        State(const boost::asio::any_io_executor& ex, std::string h, std::uint16_t p, std::chrono::milliseconds t)
            : strand(boost::asio::make_strand(ex)),
              resolver(ex),
              socket(ex),
              retry_timer(ex),
              deadline_timer(ex),
              host(std::move(h)),
              port(p),
              deadline(deadline_after(t)) {}
        boost::asio::strand<boost::asio::any_io_executor> strand; ///< the steps' and the deadline's
        boost::asio::ip::tcp::resolver resolver;
        boost::asio::ip::tcp::socket socket;
        boost::asio::steady_timer retry_timer;
        boost::asio::steady_timer deadline_timer;
        boost::asio::ip::tcp::resolver::results_type endpoints;
        std::string host;
        std::uint16_t port;
        std::chrono::steady_clock::time_point deadline;
        bool expired = false; ///< the deadline passed: what was pending is cancelled
        bool refused = false; ///< a refusal was seen: at the deadline that is the answer, as tcp_connect's
        bool done = false;    ///< the operation completed: the deadline's handler does nothing
    };
    std::shared_ptr<State> state_;
};

/// Writes one framed record (4-byte big-endian length + payload); `what` names it in errors.
void write_frame(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> payload,
                 std::chrono::steady_clock::time_point deadline, Status& status, const char* what = "handshake");
/// exchange_handshake with the full explanation kept in `status`.
Handshake exchange_impl(boost::asio::ip::tcp::socket& socket, const Handshake& ours, std::chrono::milliseconds timeout,
                        Status& status);
/// Reads one framed record of at most `max_size` bytes.
std::vector<std::byte> read_frame(boost::asio::ip::tcp::socket& socket, std::size_t max_size,
                                  std::chrono::steady_clock::time_point deadline, Status& status);
} // namespace detail

/// Sends `ours` and receives the peer's handshake, asynchronously. The same
/// checks as exchange_handshake (malformed, oversized, wrong version, early
/// close → errc::peer_closed); bound the time with the token (e.g. a
/// cancellation slot, or asio::experimental::awaitable_operators with a timer).
/// The socket must outlive the operation and not be moved while it runs.
/// Signature: void(async_error_code, gpuverbs::Handshake).
template <boost::asio::completion_token_for<void(async_error_code, Handshake)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours, Token&& token = Token()) {
    return boost::asio::async_compose<Token, void(async_error_code, Handshake)>(
        detail::ExchangeHandshakeOp(socket, ours), token, socket);
}

/// The same, with the explanation of a failure kept in `diagnostics` (as
/// Boost.MySQL's diagnostics): the verb and words the blocking form's Error
/// would carry, e.g. "receive: the peer announced a 1073741824-byte record; at
/// most 1840 are allowed (not a gpuverbs peer?)". Cleared when the exchange
/// succeeds. `diagnostics` must outlive the operation.
/// Signature: void(async_error_code, gpuverbs::Handshake).
template <boost::asio::completion_token_for<void(async_error_code, Handshake)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_exchange_handshake(boost::asio::ip::tcp::socket& socket, const Handshake& ours, Diagnostics& diagnostics,
                              Token&& token = Token()) {
    return boost::asio::async_compose<Token, void(async_error_code, Handshake)>(
        detail::ExchangeHandshakeOp(socket, ours, &diagnostics), token, socket);
}

/// Resolves host:port and connects, asynchronously, retrying refusals while
/// the server is not listening yet, for at most `timeout` (as tcp_connect):
/// at the deadline whatever is pending (a SYN nobody answers, a listener
/// whose backlog is full) is cancelled and the operation
/// completes with boost::asio::error::timed_out (connection_refused when the
/// server refused until then, as tcp_connect). A negative timeout is already
/// past; one longer than ten years is ten years. (A name lookup that hangs
/// in the system's resolver ends when getaddrinfo returns: it cannot be
/// interrupted; use an address.)
/// Signature: void(async_error_code, boost::asio::ip::tcp::socket).
template <boost::asio::completion_token_for<void(async_error_code, boost::asio::ip::tcp::socket)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_tcp_connect(const boost::asio::any_io_executor& executor, const std::string& host, std::uint16_t port,
                       std::chrono::milliseconds timeout, Token&& token = Token()) {
    return boost::asio::async_compose<Token, void(async_error_code, boost::asio::ip::tcp::socket)>(
        detail::TcpConnectOp(executor, host, port, timeout), token, executor);
}

} // namespace gpuverbs
