// A coroutine echo service (the server of examples/03_echo_coroutines, with
// several receives in flight and a heartbeat) whose client process is killed
// with SIGKILL mid-exchange: every operation the survivor started completes
// exactly once, the outstanding ones with errors, and the service accepts and
// serves a new client afterwards. Also: 100 connect / transfer / disconnect
// cycles in one process leave no file descriptors, memory regions or memory
// behind.
#include "child_process.hpp"
#include "process_resources.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>
#include "build_has.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <dirent.h>
#include <malloc.h>

#include <cstring>
#include <fstream>

using namespace gpuverbs;
namespace asio = boost::asio;

namespace {

constexpr auto no_throw = asio::as_tuple(asio::use_awaitable);

/// What the survivor's operations did.
struct Tally {
    int started = 0;
    int succeeded = 0;
    int failed = 0;
    std::vector<std::string> errors;
    void done(const boost::system::error_code& ec) {
        if (ec) {
            ++failed;
            if (errors.size() < 16) errors.push_back(ec.message());
        } else {
            ++succeeded;
        }
    }
};

/// One client session: `receivers` receives in flight, each message echoed
/// from its own slot; a zero-byte RDMA write every 50 ms as heartbeat (a pure
/// receiver cannot otherwise learn that its peer died). Returns how many
/// messages were echoed; ends when the client says goodbye (an empty message)
/// or the connection fails. `on_echo(n)` runs after each echo.
asio::awaitable<int> serve_session(TcpListener& listener, const ProtectionDomain& pd, const CompletionQueue& cq,
                                   Tally& tally, std::function<void(int)> on_echo) {
    constexpr int receivers = 4;
    std::vector<std::byte> buffer(std::size_t{receivers} * 2 * 4096);
    MemoryRegion mr(pd, buffer, Access::local_write);
    PreparedQueuePair prepared(pd, cq, cq);
    auto socket = co_await listener.async_accept(asio::use_awaitable);
    Handshake peer = co_await async_exchange_handshake(socket, {prepared.endpoint(), {}}, asio::use_awaitable);
    ConnectOptions options;
    options.timeout = 12; // a dead peer is noticed after ~4 x 16.8 ms
    options.retry_count = 3;
    auto qp = std::make_unique<QueuePair>(std::move(prepared).connect(peer.endpoint, options));
    bool over = false;
    int echoed = 0;

    auto receiver = [&](int slot) -> asio::awaitable<void> {
        const LocalBuffer in = mr.slice(static_cast<std::size_t>(slot) * 8192, 4096);
        for (;;) {
            ++tally.started;
            auto [ec, got] = co_await qp->async_receive(in, no_throw);
            tally.done(ec);
            if (ec || over) co_return;
            if (got.bytes == 0) { // goodbye: end the session; the other receives are aborted
                over = true;
                qp.reset();
                co_return;
            }
            const auto at = static_cast<std::ptrdiff_t>(slot) * 8192;
            std::memcpy(buffer.data() + at + 4096, buffer.data() + at, got.bytes);
            ++tally.started;
            auto [send_ec, sent] =
                co_await qp->async_send(mr.slice(static_cast<std::size_t>(slot) * 8192 + 4096, got.bytes), no_throw);
            tally.done(send_ec);
            (void)sent;
            if (send_ec) co_return;
            on_echo(++echoed);
        }
    };
    auto heartbeat = [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(cq.get_executor());
        while (!over) {
            timer.expires_after(std::chrono::milliseconds(50));
            co_await timer.async_wait(no_throw);
            if (over) co_return;
            ++tally.started;
            // A zero-length write: it needs the peer's queue pair to grant
            // remote write (03_echo_coroutines grants it for this), no region.
            auto [ec, n] = co_await qp->async_write(mr.slice(0, 0), RemoteMemory{}, 0, no_throw);
            tally.done(ec);
            (void)n;
            if (ec) co_return;
        }
    };
    using namespace asio::experimental::awaitable_operators; // here only: its detail:: would hide gpuverbs::detail
    co_await (receiver(0) && receiver(1) && receiver(2) && receiver(3) && heartbeat());
    co_return echoed;
}

std::vector<std::string> echo_client(std::uint16_t port, int count) {
    auto rig = gpuverbs::test::rig_devices();
    return {gpuverbs::test::example_binary("03_echo_coroutines"),
            "client",
            rig->ip1,
            "--device",
            rig->dev0,
            "--port",
            std::to_string(port),
            "--count",
            std::to_string(count)};
}

std::size_t open_descriptors() {
    std::size_t n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) ++n; // NOLINT(concurrency-mt-unsafe): one thread reads this DIR
        ::closedir(d);
    }
    return n;
}

/// Bytes the allocator holds in use (mallinfo2: this process's heap, all arenas).
std::size_t heap_in_use() {
    return mallinfo2().uordblks;
}

} // namespace

TEST_SUITE("peer death" * doctest::skip(!gpuverbs::test::rig_present() || !gpuverbs::test::build_has::examples)) {
    TEST_CASE(
        "a client killed with SIGKILL mid-exchange: the coroutine server's operations all complete once, "
        "the outstanding ones with errors; it then serves a new client") {
        auto rig = gpuverbs::test::rig_devices();
        asio::io_context io;
        Device device = Device::open(rig->dev1);
        ProtectionDomain pd(device);
        CompletionQueue cq(device, 256, io.get_executor());
        TcpListener listener(io.get_executor(), 0, rig->ip1);
        const std::uint16_t port = listener.port();

        // Session 1: the client is killed after 50 echoes.
        Tally first;
        std::optional<int> first_echoed;
        gpuverbs::test::ChildProcess victim(echo_client(port, 1000000));
        asio::co_spawn(io,
                       serve_session(listener, pd, cq, first,
                                     [&](int n) {
                                         if (n == 50) victim.kill();
                                     }),
                       [&](const std::exception_ptr& e, int echoed) {
                           CHECK_FALSE(e);
                           first_echoed = echoed;
                       });
        io.run_for(std::chrono::seconds(60));
        REQUIRE_MESSAGE(first_echoed, "the server session did not end after its client was killed");
        CHECK(victim.wait() == 128 + SIGKILL);
        CHECK(*first_echoed >= 50);
        CHECK(first.started == first.succeeded + first.failed); // every operation completed, once
        CHECK(first.failed >= 5); // 4 receives + the heartbeat (or an echo) were outstanding
        for (const auto& m : first.errors) MESSAGE("after the kill: " << m);

        // Session 2: a new client, served to the end on the same listener, CQ and PD.
        Tally second;
        std::optional<int> second_echoed;
        gpuverbs::test::ChildProcess client(echo_client(port, 20));
        asio::co_spawn(io, serve_session(listener, pd, cq, second, [](int) {}),
                       [&](const std::exception_ptr& e, int echoed) {
                           CHECK_FALSE(e);
                           second_echoed = echoed;
                       });
        io.restart();
        io.run_for(std::chrono::seconds(60));
        REQUIRE(second_echoed);
        CHECK(*second_echoed == 20);
        CHECK(client.wait() == 0);
        CHECK(second.started == second.succeeded + second.failed);
    }

    TEST_CASE("100 connect / transfer / disconnect cycles leave no descriptors, regions or memory behind") {
        auto cycle = [](std::uint32_t seed) {
            test::Pair p(1 << 16);
            test::fill_pattern(p.a.memory, seed);
            REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.all(), p.b.mr.remote()));
            auto done = test::poll_for(p.a.cq, 1);
            REQUIRE(done.size() == 1);
            REQUIRE(done[0].ok());
            REQUIRE(test::has_pattern(p.b.memory, seed));
        };
        for (std::uint32_t i = 0; i < 5; ++i) cycle(i); // warm-up: libraries' one-time state
        {
            // The region count is a real measurement: it sees a pair's two regions while they exist.
            test::Pair alive(1 << 12);
            CHECK(test::registered_regions() >= 2);
        }
        const std::size_t fds = open_descriptors();
        const int mrs = test::registered_regions();
        const std::size_t heap = heap_in_use();
        for (std::uint32_t i = 0; i < 100; ++i) cycle(100 + i);
        const std::size_t fds_after = open_descriptors();
        const int mrs_after = test::registered_regions();
        const std::size_t heap_after = heap_in_use();
        MESSAGE("descriptors " << fds << " -> " << fds_after << ", registered MRs " << mrs << " -> " << mrs_after
                               << ", heap in use " << heap << " -> " << heap_after << " bytes");
        CHECK(fds_after == fds);
        CHECK(mrs_after == mrs);
        // Each cycle allocates 2 x 64 KiB of buffers and the verbs objects; 100 leaked cycles
        // would leave > 12 MiB. Allow the allocator's own bookkeeping, not a cycle's worth.
        CHECK(heap_after <= heap + std::size_t{64} * 1024);
    }
}
