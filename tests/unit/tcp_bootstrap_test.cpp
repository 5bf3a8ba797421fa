// The TCP bootstrap over real loopback sockets: a good exchange, and every
// way a peer can send something wrong or nothing at all.
#include "gpuverbs/connections/tcp_bootstrap.hpp"

#include "allocation_counter.hpp"
#include "black_hole.hpp"
#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

using namespace gpuverbs;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

Handshake sample(std::uint32_t qpn) {
    Handshake h;
    h.endpoint.qp_num = qpn;
    h.endpoint.psn = 7;
    h.endpoint.gid = *Gid::parse("::ffff:127.0.0.1");
    h.endpoint.mtu = Mtu::mtu_1024;
    h.endpoint.link_layer = LinkLayer::ethernet;
    h.regions.push_back({0x1000, 4096, 9});
    return h;
}

// Runs `peer` on the accepted server socket in a thread, and exchanges as the client.
template <class Peer>
std::error_code client_against(Peer peer, std::string* detail = nullptr, std::chrono::milliseconds timeout = 5s) {
    asio::io_context io;
    TcpListener listener(io, 0, "127.0.0.1");
    std::uint16_t port = listener.port();
    std::thread server([&] {
        auto s = listener.accept(5s);
        peer(s);
    });
    auto socket = tcp_connect(io, "127.0.0.1", port, 5s);
    detail::Status status;
    (void)detail::exchange_impl(socket, sample(1), timeout, status);
    server.join();
    if (detail != nullptr) *detail = status.detail;
    return status.code;
}

void send_raw(asio::ip::tcp::socket& s, std::vector<std::byte> bytes) {
    asio::write(s, asio::buffer(bytes));
}

std::vector<std::byte> frame(std::uint32_t length, std::vector<std::byte> payload) {
    std::vector<std::byte> out(4 + payload.size());
    for (std::size_t i = 0; i < 4; ++i) out[i] = std::byte(length >> (24 - 8 * i));
    std::copy(payload.begin(), payload.end(), out.begin() + 4);
    return out;
}

std::array<std::byte, 4> header(std::uint32_t length) {
    std::array<std::byte, 4> out{};
    for (std::size_t i = 0; i < 4; ++i) out[i] = std::byte(length >> (24 - 8 * i));
    return out;
}

// The asynchronous exchange against `bytes` from the peer, who then shuts down
// its side for writing: the code, and the words kept in a Diagnostics.
boost::system::error_code async_against(const std::vector<std::byte>& bytes, Diagnostics& diagnostics) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    REQUIRE(::write(fds[1], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::shutdown(fds[1], SHUT_WR);
    asio::io_context io;
    asio::ip::tcp::socket socket(io);
    socket.assign(asio::ip::tcp::v4(), fds[0]);
    boost::system::error_code got = asio::error::would_block;
    async_exchange_handshake(socket, sample(1), diagnostics,
                             [&](boost::system::error_code ec, const Handshake&) { got = ec; });
    io.run();
    ::close(fds[1]);
    return got;
}

} // namespace

TEST_SUITE("tcp frame length") {
    TEST_CASE("a length up to the maximum is read big-endian and passes") {
        detail::Status status;
        CHECK(detail::frame_length(header(0), 1840, status) == 0u);
        CHECK(detail::frame_length(header(76), 1840, status) == 76u);
        CHECK(detail::frame_length(header(1840), 1840, status) == 1840u);
        CHECK(detail::frame_length(header(0x01020304), 0x01020304, status) == 0x01020304u);
        CHECK(status.ok());
    }

    TEST_CASE("a length above the maximum is a malformed record naming the length and the maximum") {
        detail::Status status;
        CHECK_FALSE(detail::frame_length(header(1841), 1840, status));
        CHECK(status.code == errc::malformed_record);
        CHECK(status.verb == "receive");
        CHECK(status.detail ==
              "the peer announced a 1841-byte record; at most 1840 are allowed (not a gpuverbs peer?)");
    }

    TEST_CASE("the largest length a header can hold is refused without wrapping") {
        detail::Status status;
        CHECK_FALSE(detail::frame_length(header(0xffffffff), wire::max_handshake_size, status));
        CHECK(status.code == errc::malformed_record);
        CHECK(status.detail.find("a 4294967295-byte record; at most 1840") != std::string::npos);
    }
}

TEST_SUITE("tcp bootstrap") {
    TEST_CASE("two sides exchange handshakes over TCP and each gets the other's") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        auto server = std::async(std::launch::async, [&] {
            auto s = listener.accept(5s);
            return exchange_handshake(s, sample(2), 5s);
        });
        auto socket = tcp_connect(io, "127.0.0.1", listener.port(), 5s);
        Handshake from_server = exchange_handshake(socket, sample(1), 5s);
        CHECK(from_server == sample(2));
        CHECK(server.get() == sample(1));
    }

    TEST_CASE("the socket comes back in the mode it was given, so plain blocking reads work after the exchange") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        auto server = std::async(std::launch::async, [&] {
            auto s = listener.accept(5s);
            (void)exchange_handshake(s, sample(2), 5s);
            CHECK_FALSE(s.non_blocking());
            std::uint64_t v = 42;
            asio::write(s, asio::buffer(&v, sizeof v));
        });
        auto socket = tcp_connect(io, "127.0.0.1", listener.port(), 5s);
        REQUIRE_FALSE(socket.non_blocking());
        (void)exchange_handshake(socket, sample(1), 5s);
        CHECK_FALSE(socket.non_blocking());
        std::uint64_t v = 0;
        asio::read(socket, asio::buffer(&v, sizeof v)); // would throw "would block" if the mode leaked
        CHECK(v == 42);
        server.get();
        // A caller that chose non-blocking keeps it.
        auto server2 = std::async(std::launch::async, [&] {
            auto s = listener.accept(5s);
            (void)exchange_handshake(s, sample(2), 5s);
        });
        auto socket2 = tcp_connect(io, "127.0.0.1", listener.port(), 5s);
        socket2.non_blocking(true);
        (void)exchange_handshake(socket2, sample(1), 5s);
        CHECK(socket2.non_blocking());
        server2.get();
    }

    TEST_CASE("garbage from the peer is refused as a malformed record") {
        std::string why;
        auto ec =
            client_against([](auto& s) { send_raw(s, frame(60, std::vector<std::byte>(60, std::byte{0x5a}))); }, &why);
        CHECK(ec == errc::malformed_record);
        CHECK(why.find("not a gpuverbs handshake record") != std::string::npos);
    }

    TEST_CASE("an oversized record is refused before reading it") {
        std::string why;
        auto ec = client_against([](auto& s) { send_raw(s, frame(1u << 30, {})); }, &why);
        CHECK(ec == errc::malformed_record);
        CHECK(why.find("announced a 1073741824-byte record") != std::string::npos);
    }

    TEST_CASE("the blocking and the asynchronous exchange refuse an oversized length with the same words") {
        std::string blocking;
        auto ec = client_against([](auto& s) { send_raw(s, frame(1u << 30, {})); }, &blocking);
        CHECK(ec == errc::malformed_record);
        Diagnostics diagnostics;
        CHECK(async_against(frame(1u << 30, {}), diagnostics) == errc::malformed_record);
        CHECK(diagnostics.verb() == "receive");
        CHECK(diagnostics.detail() == blocking);
        CHECK(diagnostics.message() ==
              "receive: the peer announced a 1073741824-byte record; at most 1840 are allowed (not a gpuverbs peer?)");
    }

    TEST_CASE("the asynchronous exchange explains an early close and a bad record as the blocking one does") {
        auto full = wire::serialize(sample(2));
        Diagnostics closed;
        CHECK(async_against(frame(static_cast<std::uint32_t>(full.size()), {full.begin(), full.begin() + 20}),
                            closed) == errc::peer_closed);
        CHECK(closed.message() == "receive: the peer closed the connection after 20 of 76 bytes of its record");
        Diagnostics short_header;
        CHECK(async_against({std::byte{0}, std::byte{0}}, short_header) == errc::peer_closed);
        CHECK(short_header.detail() == "the peer closed the connection after 2 of 4 bytes of its record length");
        Diagnostics garbage;
        std::string blocking;
        auto bad = frame(60, std::vector<std::byte>(60, std::byte{0x5a}));
        CHECK(client_against([&](auto& s) { send_raw(s, bad); }, &blocking) == errc::malformed_record);
        CHECK(async_against(bad, garbage) == errc::malformed_record);
        CHECK(garbage.detail() == blocking);
    }

    TEST_CASE("a successful asynchronous exchange leaves the diagnostics empty") {
        Diagnostics diagnostics;
        CHECK(async_against(frame(60, std::vector<std::byte>(60, std::byte{0x5a})), diagnostics));
        CHECK_FALSE(diagnostics.message().empty());
        auto full = wire::serialize(sample(2));
        CHECK_FALSE(async_against(frame(static_cast<std::uint32_t>(full.size()), full), diagnostics));
        CHECK(diagnostics.message().empty());
    }

    TEST_CASE("a truncated record followed by a close is reported as the peer closing") {
        std::string why;
        auto ec = client_against(
            [](auto& s) {
                auto full = wire::serialize(sample(2));
                send_raw(s, frame(static_cast<std::uint32_t>(full.size()), {full.begin(), full.begin() + 20}));
                s.close();
            },
            &why);
        CHECK(ec == errc::peer_closed);
        CHECK(why.find("after 20 of 76 bytes") != std::string::npos);
    }

    TEST_CASE("a short record is refused as truncated") {
        auto ec = client_against([](auto& s) {
            auto full = wire::serialize(sample(2));
            send_raw(s, frame(20, {full.begin(), full.begin() + 20}));
        });
        CHECK(ec == errc::malformed_record);
    }

    TEST_CASE("a record of another version is refused") {
        auto ec = client_against([](auto& s) {
            auto full = wire::serialize(sample(2));
            full[5] = std::byte{7};
            send_raw(s, frame(static_cast<std::uint32_t>(full.size()), full));
        });
        CHECK(ec == errc::unsupported_version);
    }

    TEST_CASE("a silent peer times out instead of hanging") {
        std::promise<void> release;
        auto released = release.get_future();
        std::string why;
        auto start = std::chrono::steady_clock::now();
        std::error_code ec = client_against(
            [&](auto& s) {
                (void)s;
                released.wait_for(3s); // holds the connection open, says nothing
            },
            &why, 300ms);
        CHECK(ec == std::errc::timed_out);
        CHECK(why.find("timed out") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - start < 5s);
        release.set_value();
    }

    TEST_CASE("connecting to a port nobody listens on fails with a hint") {
        asio::io_context io;
        std::uint16_t port = 0;
        {
            TcpListener l(io, 0, "127.0.0.1");
            port = l.port();
        }
        try {
            (void)tcp_connect(io, "127.0.0.1", port, 200ms);
            FAIL("connected");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("is the server running?") != std::string::npos);
        }
    }

    TEST_CASE("attack: a 4-byte header announcing 60 MiB, then silence, allocates nothing large") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        auto client = tcp_connect(io, "127.0.0.1", listener.port(), 5s);
        auto server = listener.accept(5s);
        const std::array<std::byte, 4> announce = header(60u << 20);
        send_raw(client, {announce.begin(), announce.end()});
        send_raw(client, std::vector<std::byte>(1000, std::byte{1})); // a little of it
        test::reset_largest_allocation();
        CHECK_THROWS_WITH_AS((void)receive_record(server, 64u << 20, 300ms),
                             "receive: receiving the peer's record: timed out waiting for the peer", Error);
        MESSAGE("largest allocation while waiting: " << test::largest_allocation() << " bytes");
        CHECK(test::largest_allocation() <= (128u << 10)); // was 60 MiB, zero-filled, until the deadline
    }

    TEST_CASE("a record larger than the first chunk arrives whole and exact, through the growing buffer") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        auto client = tcp_connect(io, "127.0.0.1", listener.port(), 5s);
        auto server = listener.accept(5s);
        std::vector<std::byte> payload(3u << 20);
        for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte(i * 131 % 251);
        std::thread sender([&] { send_record(client, payload, 5s); });
        const std::vector<std::byte> got = receive_record(server, 4u << 20, 5s);
        sender.join();
        CHECK(got == payload);
    }

    TEST_CASE(
        "attack: a listener that drops our SYN (its accept queue full) holds tcp_connect only until the deadline") {
        const test::BlackHole hole; // a blocking connect would wait for the kernel's retries (about two minutes)
        asio::io_context io;
        const auto t0 = std::chrono::steady_clock::now();
        try {
            (void)tcp_connect(io, "127.0.0.1", hole.port(), 300ms);
            FAIL("connected through a full accept queue");
        } catch (const Error& e) {
            const std::string what = e.what();
            MESSAGE(what);
            CHECK(e.code() == std::errc::timed_out);
            CHECK(what.find("within 300 ms: nothing answered") != std::string::npos);
        }
        CHECK(std::chrono::steady_clock::now() - t0 < 2s); // bounded by our deadline, not the kernel's retries
    }

    TEST_CASE("accept gives up after its timeout") {
        asio::io_context io;
        TcpListener l(io, 0, "127.0.0.1");
        CHECK_THROWS_AS((void)l.accept(100ms), Error);
    }
}

namespace {

/// One end of a connected stream socket pair, as a tcp::socket; the other
/// end is a plain descriptor the test writes to or closes.
struct SocketPair {
    asio::io_context io;
    asio::ip::tcp::socket ours{io};
    int theirs = -1;
    SocketPair() {
        int fds[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
        ours.assign(asio::ip::tcp::v4(), fds[0]);
        theirs = fds[1];
    }
    SocketPair(const SocketPair&) = delete;
    SocketPair& operator=(const SocketPair&) = delete;
    ~SocketPair() {
        if (theirs >= 0) ::close(theirs);
    }
    /// The peer sends `bytes`, then closes its end.
    SocketPair& then_close(const std::vector<std::byte>& bytes = {}) {
        REQUIRE(::write(theirs, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
        ::close(theirs);
        theirs = -1;
        return *this;
    }
};

/// A port on 127.0.0.1 that nothing listens on (it was free a moment ago).
std::uint16_t closed_port() {
    asio::io_context io;
    TcpListener l(io, 0, "127.0.0.1");
    return l.port();
}

} // namespace

TEST_SUITE("tcp bootstrap: throwing, error_code and Diagnostics forms") {
    TEST_CASE("a listener on a port already taken fails alike in the three forms") {
        asio::io_context io;
        TcpListener taken(io, 0, "127.0.0.1");
        const std::uint16_t port = taken.port();
        const std::string what = test::check_fails_alike(
            std::errc::address_in_use, [&] { return TcpListener(io, port, "127.0.0.1"); },
            [&](std::error_code& ec) { return TcpListener::create(io, port, "127.0.0.1", ec); },
            [&](std::error_code& ec, Diagnostics& d) { return TcpListener::create(io, port, "127.0.0.1", ec, d); });
        CHECK(what.starts_with("TcpListener: cannot listen on 127.0.0.1:" + std::to_string(port) + ": "));
    }

    TEST_CASE("a listener address that is not an IP address fails alike, through the executor forms too") {
        asio::io_context io;
        const asio::any_io_executor ex = io.get_executor();
        const std::string what = test::check_fails_alike(
            std::errc::invalid_argument, [&] { return TcpListener(ex, 0, "not-an-address"); },
            [&](std::error_code& ec) { return TcpListener::create(ex, 0, "not-an-address", ec); },
            [&](std::error_code& ec, Diagnostics& d) { return TcpListener::create(ex, 0, "not-an-address", ec, d); });
        CHECK(what == "TcpListener: 'not-an-address' is not an IP address");
    }

    TEST_CASE("a listener that can listen clears the error_code and the Diagnostics") {
        asio::io_context io;
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                TcpListener l = TcpListener::create(io, 0, "127.0.0.1", ec);
                CHECK(l.port() != 0);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                TcpListener l = TcpListener::create(io.get_executor(), 0, "127.0.0.1", ec, d);
                CHECK(l.port() != 0);
            });
    }

    TEST_CASE("tcp_connect to a closed port fails alike in the three forms, within its timeout") {
        asio::io_context io;
        const std::uint16_t port = closed_port();
        const auto start = std::chrono::steady_clock::now();
        const std::string what = test::check_fails_alike(
            std::errc::connection_refused, [&] { return tcp_connect(io, "127.0.0.1", port, 100ms); },
            [&](std::error_code& ec) { return tcp_connect(io, "127.0.0.1", port, 100ms, ec); },
            [&](std::error_code& ec, Diagnostics& d) { return tcp_connect(io, "127.0.0.1", port, 100ms, ec, d); });
        CHECK(what.ends_with("(is the server running?)"));
        CHECK(std::chrono::steady_clock::now() - start < 3s);
    }

    TEST_CASE("tcp_connect that reaches a listener clears the error_code and the Diagnostics") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        test::check_succeeds_clean(
            [&](std::error_code& ec) { CHECK(tcp_connect(io, "127.0.0.1", listener.port(), 5s, ec).is_open()); },
            [&](std::error_code& ec, Diagnostics& d) {
                CHECK(tcp_connect(io, "127.0.0.1", listener.port(), 5s, ec, d).is_open());
            });
    }

    TEST_CASE("receive_record fails alike in the three forms for each way a peer can fail it") {
        struct Case {
            const char* name;
            std::vector<std::byte> sent; // then the peer closes
            std::size_t max_size;
            std::error_code expected;
            std::string what;
        };
        const std::vector<Case> cases{
            {"closed before the length",
             {},
             64,
             errc::peer_closed,
             "receive: the peer closed the connection after 0 of 4 bytes of its record length"},
            {"closed inside the record", frame(10, {std::byte{1}, std::byte{2}}), 64, errc::peer_closed,
             "receive: the peer closed the connection after 2 of 10 bytes of its record"},
            {"a record over max_size", frame(100, {}), 10, errc::malformed_record,
             "receive: the peer announced a 100-byte record; at most 10 are allowed (not a gpuverbs peer?)"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            const std::string what = test::check_fails_alike(
                c.expected, [&] { return receive_record(SocketPair().then_close(c.sent).ours, c.max_size, 1s); },
                [&](std::error_code& ec) {
                    return receive_record(SocketPair().then_close(c.sent).ours, c.max_size, 1s, ec);
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    return receive_record(SocketPair().then_close(c.sent).ours, c.max_size, 1s, ec, d);
                });
            CHECK(what == c.what);
        }
    }

    TEST_CASE("receive_record of a whole record clears the error_code and the Diagnostics and returns it") {
        const std::vector<std::byte> payload{std::byte{7}, std::byte{8}, std::byte{9}};
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                CHECK(receive_record(SocketPair().then_close(frame(3, payload)).ours, 64, 1s, ec) == payload);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                CHECK(receive_record(SocketPair().then_close(frame(3, payload)).ours, 64, 1s, ec, d) == payload);
            });
    }

    TEST_CASE("send_record on a socket shut down for sending fails alike in the three forms") {
        const std::vector<std::byte> record(16, std::byte{1});
        auto shut = [](SocketPair& p) -> asio::ip::tcp::socket& {
            p.ours.shutdown(asio::socket_base::shutdown_send);
            return p.ours;
        };
        const std::string what = test::check_fails_alike(
            std::errc::broken_pipe,
            [&] {
                SocketPair p;
                send_record(shut(p), record, 1s);
                return 0;
            },
            [&](std::error_code& ec) {
                SocketPair p;
                send_record(shut(p), record, 1s, ec);
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) {
                SocketPair p;
                send_record(shut(p), record, 1s, ec, d);
                return 0;
            });
        CHECK(what == "send: cannot send our record: Broken pipe (errno 32)");
    }

    TEST_CASE("accept fails alike in the three forms: at its timeout, and on a listener create() refused") {
        asio::io_context io;
        TcpListener l(io, 0, "127.0.0.1");
        const std::string what = test::check_fails_alike(
            std::errc::timed_out, [&] { return l.accept(20ms); },
            [&](std::error_code& ec) {
                asio::ip::tcp::socket s = l.accept(20ms, ec);
                CHECK_FALSE(s.is_open());
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) { return l.accept(20ms, ec, d); });
        CHECK(what == "accept: no bootstrap connection on port " + std::to_string(l.port()) + " within 20 ms");

        std::error_code refused;
        TcpListener closed = TcpListener::create(io, 0, "not an address", refused);
        REQUIRE(refused);
        CHECK(test::check_fails_alike(
                  errc::invalid_argument, [&] { return closed.accept(20ms); },
                  [&](std::error_code& ec) { return closed.accept(20ms, ec); },
                  [&](std::error_code& ec, Diagnostics& d) { return closed.accept(20ms, ec, d); }) ==
              "accept: the listener is closed (create() refused it, or it was moved from)");

        TcpListener taken = std::move(l); // a moved-from listener refuses alike, and never throws from the code form
        std::error_code ec;
        CHECK_FALSE(l.accept(20ms, ec).is_open()); // NOLINT(bugprone-use-after-move): what this checks
        CHECK(ec == errc::invalid_argument);
        CHECK(taken.port() != 0);
    }

    TEST_CASE("accept that gets a connection clears the error_code and the Diagnostics") {
        asio::io_context io;
        TcpListener l(io, 0, "127.0.0.1");
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                asio::ip::tcp::socket client = tcp_connect(io, "127.0.0.1", l.port(), 2s);
                CHECK(l.accept(2s, ec).is_open());
            },
            [&](std::error_code& ec, Diagnostics& d) {
                asio::ip::tcp::socket client = tcp_connect(io, "127.0.0.1", l.port(), 2s);
                CHECK(l.accept(2s, ec, d).is_open());
            });
    }

    TEST_CASE("exchange_handshake fails alike in the three forms: too many regions, a peer that closes at once") {
        Handshake ours;
        ours.regions.resize(wire::max_regions + 1, RemoteMemory{0x1000, 64, 1});
        SocketPair p;
        CHECK(test::check_fails_alike(
                  errc::invalid_argument, [&] { return exchange_handshake(p.ours, ours, 1s); },
                  [&](std::error_code& ec) { return exchange_handshake(p.ours, ours, 1s, ec); },
                  [&](std::error_code& ec, Diagnostics& d) { return exchange_handshake(p.ours, ours, 1s, ec, d); }) ==
              "exchange_handshake: a handshake carries at most " + std::to_string(wire::max_regions) + " regions");

        const Handshake small;
        const auto [code, what] = test::check_forms_agree(
            [&] {
                SocketPair closing;
                closing.then_close();
                return exchange_handshake(closing.ours, small, 1s);
            },
            [&](std::error_code& ec) {
                SocketPair closing;
                closing.then_close();
                return exchange_handshake(closing.ours, small, 1s, ec);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                SocketPair closing;
                closing.then_close();
                return exchange_handshake(closing.ours, small, 1s, ec, d);
            });
        CHECK(code == std::errc::broken_pipe); // its end is gone before we send
        CHECK(what == "send: cannot send our handshake: Broken pipe (errno 32)");
    }

    TEST_CASE("send_record that is sent clears the error_code and the Diagnostics") {
        const std::vector<std::byte> record(16, std::byte{1});
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                SocketPair p;
                send_record(p.ours, record, 1s, ec);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                SocketPair p;
                send_record(p.ours, record, 1s, ec, d);
            });
    }
}
