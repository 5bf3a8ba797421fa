// Two processes: this test is the client, examples/02_rdma_write is the server
// process. Byte-exact transfers both ways, and a peer killed mid-stream.
#include "child_process.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>
#include "build_has.hpp"

#include <signal.h>

#include <thread>

using namespace gpuverbs;
using gpuverbs::test::poll_for;

namespace {

/// examples/02_rdma_write as the server process.
class ServerProcess : public gpuverbs::test::ChildProcess {
public:
    ServerProcess(std::uint16_t port, std::size_t size)
        : ChildProcess({gpuverbs::test::example_binary("02_rdma_write"), "server", "--device",
                        gpuverbs::test::rig_devices()->dev1, "--port", std::to_string(port), "--size",
                        std::to_string(size)}) {}
};

struct Client {
    Device device{Device::open(gpuverbs::test::rig_devices()->dev0)};
    ProtectionDomain pd{device};
    CompletionQueue cq{device, 1024};
    std::vector<std::byte> memory;
    MemoryRegion mr;
    QueuePair qp;
    RemoteMemory server_memory;

    Client(std::uint16_t port, std::size_t size, const ConnectOptions& options = {}) : memory(size) {
        mr = MemoryRegion(pd, memory, access_all);
        PreparedQueuePair prepared(pd, cq, cq);
        boost::asio::io_context io;
        auto socket = tcp_connect(io, gpuverbs::test::rig_devices()->ip1, port, std::chrono::seconds(20));
        Handshake peer = exchange_handshake(socket, Handshake{prepared.endpoint(), {prepared.advertise(mr)}});
        REQUIRE(peer.regions.size() == 1);
        server_memory = peer.regions[0];
        qp = std::move(prepared).connect(peer.endpoint, options);
    }
};

std::byte pattern(std::size_t i) {
    return std::byte(i % 251);
} // what 02_rdma_write's server expects

} // namespace

TEST_SUITE("two processes on real RDMA" *
           doctest::skip(!gpuverbs::test::rig_present() || !gpuverbs::test::build_has::examples)) {
    TEST_CASE("another process receives every byte we write, and we read back every byte") {
        constexpr std::size_t size = 3 << 20;
        ServerProcess server(18611, size);
        Client client(18611, size);
        CHECK(client.server_memory.length == size);
        for (std::size_t i = 0; i < size; ++i) client.memory[i] = pattern(i);
        REQUIRE_FALSE(client.qp.post_write(client.mr.all(), client.server_memory));
        REQUIRE(poll_for(client.cq, 1).at(0).ok());
        // Read the server process's memory back into a cleared buffer.
        std::fill(client.memory.begin(), client.memory.end(), std::byte{0});
        REQUIRE_FALSE(client.qp.post_read(client.mr.all(), client.server_memory));
        REQUIRE(poll_for(client.cq, 1).at(0).ok());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) bad += client.memory[i] != pattern(i) ? 1 : 0;
        CHECK(bad == 0);
        // The zero-byte write with immediate tells the server to verify and exit.
        REQUIRE_FALSE(client.qp.post_write_with_imm(client.mr.slice(0, 0), client.server_memory, 0, 1));
        REQUIRE(poll_for(client.cq, 1).at(0).ok());
        CHECK(server.wait() == 0); // the server process verified every byte
    }

    TEST_CASE("a peer process killed mid-stream: every request completes, later ones with errors, no hang") {
        constexpr std::size_t size = 1 << 20;
        ServerProcess server(18612, size);
        ConnectOptions fast_fail;
        fast_fail.timeout = 10; // ~4 ms per try
        fast_fail.retry_count = 2;
        Client client(18612, size, fast_fail);
        std::uint64_t posted = 0;
        std::vector<Completion> done;
        // Stream writes; kill the server after the first 20 complete.
        bool failed_early = false;
        while (done.size() < 20 && !failed_early) {
            if (posted - done.size() < 16) {
                if (const std::error_code ec =
                        client.qp.post_write(client.mr.all(), client.server_memory, 0, {.context = posted})) {
                    // On a loaded emulated machine (the asan build) the ~4 ms ACK timeout can run out
                    // before the kill: the queue pair failed already, and its posts are refused at once.
                    REQUIRE(ec == errc::queue_pair_in_error);
                    failed_early = true;
                    break;
                }
                ++posted;
            }
            auto got = poll_for(client.cq, 1, std::chrono::milliseconds(1));
            done.insert(done.end(), got.begin(), got.end());
        }
        server.kill();
        CHECK(server.wait() == 128 + SIGKILL);
        std::uint64_t posted_after_kill = posted;
        for (int i = 0; i < 16; ++i) {
            if (client.qp.post_write(client.mr.all(), client.server_memory, 0, {.context = posted})) break;
            ++posted;
        }
        auto rest = poll_for(client.cq, posted - done.size(), std::chrono::seconds(60));
        done.insert(done.end(), rest.begin(), rest.end());
        REQUIRE(done.size() == posted); // nothing lost, nothing hung
        for (std::size_t i = 0; i < done.size(); ++i) CHECK(done[i].context == i);
        for (std::size_t i = posted_after_kill; i < done.size(); ++i) CHECK_FALSE(done[i].ok());
        auto first_error = std::find_if(done.begin(), done.end(), [](const Completion& c) { return !c.ok(); });
        REQUIRE(first_error != done.end());
        CHECK(first_error->status == make_wc_error(IBV_WC_RETRY_EXC_ERR));
        CHECK(client.qp.state() == QpState::error);
    }
}
