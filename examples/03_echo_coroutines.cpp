// 03_echo_coroutines: an RDMA echo service and its client, each one C++20
// coroutine on an Asio io_context. The client sends messages with RDMA send;
// the server receives each and sends it back; a zero-byte message ends it.
//
//   03_echo_coroutines server [--device rxe1] [--port 18520]
//   03_echo_coroutines client HOST [--device rxe0] [--port 18520] [--count N]
#include "two_processes.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>
#include <cstring>
#include <string>

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;
using asio::use_awaitable;

struct Args {
    bool server = true;
    std::string host, device;
    std::uint16_t port = 18520;
    int count = 1000;
};

asio::awaitable<void> run(asio::any_io_executor ex, Args a) {
    // 1. The device, and a completion queue bound to our executor.
    auto device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 256, ex);
    std::vector<std::byte> buffer(8192);
    gpuverbs::MemoryRegion mr(pd, buffer, gpuverbs::Access::local_write);
    auto in = mr.slice(0, 4096);
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);

    // 2. Swap endpoints over TCP, without blocking the io_context, and connect.
    asio::ip::tcp::socket socket(ex);
    if (a.server) {
        gpuverbs::TcpListener listener(ex, a.port);
        socket = co_await listener.async_accept(use_awaitable);
    } else {
        socket = co_await gpuverbs::async_tcp_connect(ex, a.host, a.port, gpuverbs::default_bootstrap_timeout,
                                                      use_awaitable);
    }
    auto peer = co_await gpuverbs::async_exchange_handshake(socket, {prepared.endpoint(), {}}, use_awaitable);
    // Sends only, and no region offered: the queue pair grants the peer
    // nothing but remote write, so a server may probe us with zero-length
    // writes (a heartbeat, which touches no memory; no region here allows
    // remote writes, so no key could reach one).
    gpuverbs::ConnectOptions options;
    options.remote_access = gpuverbs::Access::remote_write;
    auto qp = std::move(prepared).connect(peer.endpoint, options);

    if (a.server) {
        // 3s. Echo every message back until an empty one arrives.
        int echoed = 0;
        for (;;) {
            gpuverbs::Received r = co_await qp.async_receive(in, use_awaitable);
            if (r.bytes == 0) break;
            std::memcpy(buffer.data() + 4096, buffer.data(), r.bytes);
            co_await qp.async_send(mr.slice(4096, r.bytes), use_awaitable);
            ++echoed;
        }
        std::printf("server: echoed %d messages\n", echoed);
        co_return;
    }
    // 3c. Send numbered messages; receive each echo while sending (&& runs both at once).
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < a.count; ++i) {
        int n = std::snprintf(reinterpret_cast<char*>(buffer.data() + 4096), 64, "message %d", i);
        auto [got, sent] = co_await (qp.async_receive(in, use_awaitable) &&
                                     qp.async_send(mr.slice(4096, static_cast<std::size_t>(n)), use_awaitable));
        if (got.bytes != sent || std::memcmp(buffer.data(), buffer.data() + 4096, sent) != 0) {
            throw std::runtime_error("echo " + std::to_string(i) + " differs");
        }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    co_await qp.async_send(mr.slice(4096, 0), use_awaitable); // an empty message ends the session
    std::printf("client: %d echoes verified, %.1f us per round trip\n", a.count, us / a.count);
}

static int main_body(int argc, char** argv) {
    // The command line: server | client HOST, --device, --port (examples/common), and --count.
    Args a;
    tools::CommandLine cli("03_echo_coroutines", "An RDMA echo service and its client, each one C++20 coroutine.", 2);
    example::add_two_process_options(cli, a);
    cli.app.add_option("--count", a.count, "client: messages to send and check")->type_name("N");
    if (auto status = cli.parse(argc, argv)) return *status;
    try {
        asio::io_context io;
        int status = 0;
        asio::co_spawn(io, run(io.get_executor(), a), [&](const std::exception_ptr& e) {
            if (!e) return;
            status = 1;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                std::fprintf(stderr, "%s: %s\n", a.server ? "server" : "client", ex.what());
            }
        });
        io.run();
        return status;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}

int main(int argc, char** argv) {
    return tools::run_main("03_echo_coroutines", 1, [&] { return main_body(argc, argv); });
}
