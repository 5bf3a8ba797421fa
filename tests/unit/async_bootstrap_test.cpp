// The asynchronous TCP bootstrap over real loopback sockets, as coroutines.
#include "gpuverbs/connections/tcp_bootstrap.hpp"

#include "black_hole.hpp"

#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <thread>
#include <vector>

using namespace gpuverbs;
namespace asio = boost::asio;

namespace {

Handshake async_sample(std::uint32_t qpn) {
    Handshake h;
    h.endpoint.qp_num = qpn;
    h.endpoint.psn = 3;
    h.endpoint.gid = *Gid::parse("::ffff:127.0.0.1");
    h.endpoint.mtu = Mtu::mtu_4096;
    h.endpoint.link_layer = LinkLayer::ethernet;
    h.regions.push_back({0x2000, 8192, 5});
    return h;
}

} // namespace

TEST_SUITE("async tcp bootstrap") {
    TEST_CASE("a server and a client coroutine accept, connect and swap handshakes") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        Handshake server_got, client_got;
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
                auto socket = co_await listener.async_accept(asio::use_awaitable);
                server_got = co_await async_exchange_handshake(socket, async_sample(2), asio::use_awaitable);
            },
            asio::detached);
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
                auto socket = co_await async_tcp_connect(io.get_executor(), "127.0.0.1", listener.port(),
                                                         std::chrono::seconds(5), asio::use_awaitable);
                client_got = co_await async_exchange_handshake(socket, async_sample(1)); // default token: deferred
            },
            asio::detached);
        io.run();
        CHECK(server_got == async_sample(1));
        CHECK(client_got == async_sample(2));
    }

    TEST_CASE("garbage from the peer fails the async exchange with malformed_record") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        boost::system::error_code got;
        listener.async_accept([&](boost::system::error_code, asio::ip::tcp::socket s) {
            static std::array<std::byte, 24> garbage{};
            garbage.fill(std::byte{0x61});
            garbage[3] = std::byte{20}; // length 20, then 20 bytes of 'a'
            garbage[0] = garbage[1] = garbage[2] = std::byte{0};
            asio::write(s, asio::buffer(garbage));
        });
        async_tcp_connect(io.get_executor(), "127.0.0.1", listener.port(), std::chrono::seconds(5),
                          [&](boost::system::error_code ec, asio::ip::tcp::socket s) {
                              REQUIRE_FALSE(ec);
                              auto kept = std::make_shared<asio::ip::tcp::socket>(std::move(s));
                              async_exchange_handshake(
                                  *kept, async_sample(1),
                                  [&, kept](boost::system::error_code e, const Handshake&) { got = e; });
                          });
        io.run();
        CHECK(got == errc::malformed_record);
    }

    TEST_CASE("a peer that closes early fails the async exchange with peer_closed") {
        asio::io_context io;
        TcpListener listener(io, 0, "127.0.0.1");
        boost::system::error_code got;
        listener.async_accept([&](boost::system::error_code, asio::ip::tcp::socket s) { s.close(); });
        async_tcp_connect(io.get_executor(), "127.0.0.1", listener.port(), std::chrono::seconds(5),
                          [&](boost::system::error_code ec, asio::ip::tcp::socket s) {
                              REQUIRE_FALSE(ec);
                              auto kept = std::make_shared<asio::ip::tcp::socket>(std::move(s));
                              async_exchange_handshake(
                                  *kept, async_sample(1),
                                  [&, kept](boost::system::error_code e, const Handshake&) { got = e; });
                          });
        io.run();
        CHECK(got == errc::peer_closed);
        CHECK(got.message().find("closed the connection") != std::string::npos);
    }
}

TEST_SUITE("async tcp bootstrap") {
    TEST_CASE("an asynchronous connect waits for a server that starts listening later") {
        asio::io_context io;
        std::uint16_t port = 0;
        {
            TcpListener probe(io, 0, "127.0.0.1"); // find a free port, then free it
            port = probe.port();
        }
        boost::system::error_code connected = asio::error::would_block;
        async_tcp_connect(io.get_executor(), "127.0.0.1", port, std::chrono::seconds(10),
                          [&](boost::system::error_code ec, asio::ip::tcp::socket) { connected = ec; });
        std::unique_ptr<TcpListener> late;
        asio::steady_timer timer(io, std::chrono::milliseconds(200));
        timer.async_wait([&](boost::system::error_code) {
            late = std::make_unique<TcpListener>(io, port, "127.0.0.1");
            late->async_accept([](boost::system::error_code, asio::ip::tcp::socket) {});
        });
        io.run();
        CHECK_FALSE(connected);
    }

    TEST_CASE("an asynchronous connect gives up after its timeout when nobody listens") {
        asio::io_context io;
        std::uint16_t port = 0;
        {
            TcpListener probe(io, 0, "127.0.0.1");
            port = probe.port();
        }
        boost::system::error_code got;
        async_tcp_connect(io.get_executor(), "127.0.0.1", port, std::chrono::milliseconds(150),
                          [&](boost::system::error_code ec, asio::ip::tcp::socket) { got = ec; });
        io.run();
        CHECK(got == asio::error::connection_refused);
    }

    TEST_CASE(
        "attack: a listener that drops our SYN (its accept queue full) holds async_tcp_connect only until the "
        "deadline, which ends it with timed_out; a negative or enormous timeout means what it says") {
        const test::BlackHole hole; // the kernel alone would retry its SYNs for about two minutes
        const std::uint16_t port = hole.port();
        for (const auto timeout : {std::chrono::milliseconds(300), std::chrono::milliseconds(-5)}) {
            asio::io_context io;
            std::optional<boost::system::error_code> got;
            bool open = true;
            const auto t0 = std::chrono::steady_clock::now();
            async_tcp_connect(io.get_executor(), "127.0.0.1", port, timeout,
                              [&](boost::system::error_code ec, asio::ip::tcp::socket s) {
                                  got = ec;
                                  open = s.is_open();
                              });
            io.run_for(std::chrono::seconds(10)); // the kernel alone would take ~2 minutes
            const auto took = std::chrono::steady_clock::now() - t0;
            REQUIRE(got.has_value());
            CHECK(*got == asio::error::timed_out);
            CHECK_FALSE(open);
            CHECK(took >= std::max(timeout, std::chrono::milliseconds(0)));
            CHECK(took < std::chrono::seconds(2));
        }
        {
            // An enormous timeout (milliseconds::max() would wrap steady_clock into the past) still waits:
            // it is still pending after 300 ms, not ended at once by a deadline in the past.
            asio::io_context io;
            std::optional<boost::system::error_code> got;
            async_tcp_connect(io.get_executor(), "127.0.0.1", port, std::chrono::milliseconds::max(),
                              [&](boost::system::error_code ec, asio::ip::tcp::socket) { got = ec; });
            io.run_for(std::chrono::milliseconds(300));
            CHECK_FALSE(got.has_value());
        }
    }
}
