// 02_rdma_write: one process writes a buffer straight into another process's
// memory with RDMA, and the receiver checks every byte. The shortest correct
// version of what ibv_rc_pingpong does.
//
//   02_rdma_write server [--device rxe1] [--port 18515] [--size BYTES]
//   02_rdma_write client HOST [--device rxe0] [--port 18515] [--size BYTES] [--iterations N]
//
// The client writes its buffer `iterations` times, then a zero-byte write with
// immediate data: RC delivers in order, so when that one arrives every earlier
// byte has landed. The server verifies the buffer and both print what moved.
#include "two_processes.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Args {
    bool server = true;
    std::string host, device;
    std::uint16_t port = 18515;
    std::size_t size = 8 << 20;
    std::uint32_t iterations = 8;
};

// The bytes the client sends and the server expects.
std::byte pattern(std::size_t i) {
    return std::byte(i % 251);
}

// Busy-polls until one completion arrives (a real service would use the Asio layer).
gpuverbs::Completion wait_one(gpuverbs::CompletionQueue& cq) {
    gpuverbs::Completion c;
    while (cq.poll({&c, 1}) == 0) {
    }
    if (!c.ok()) throw gpuverbs::Error(c.status, to_string(c.opcode).data(), c.status.message());
    return c;
}

int run(const Args& a) {
    // 1. Open the RDMA device and make what the NIC needs: a protection
    //    domain, a completion queue, and our buffer registered for RDMA with
    //    only the access it needs: the client writes into the server's buffer
    //    (and may read it back); the client's own is only read, by its own NIC.
    gpuverbs::Device device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 256);
    std::vector<std::byte> buffer(a.size);
    using gpuverbs::Access;
    auto access = a.server ? Access::local_write | Access::remote_write | Access::remote_read : Access::none;
    gpuverbs::MemoryRegion mr(pd, buffer, access);

    // 2. Create the queue pair; it is not connected yet.
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);

    // 3. Swap endpoints (and the server's buffer address and key) over TCP.
    boost::asio::io_context io;
    // advertise: the peer gets mr.remote(), and our queue pair grants it what mr allows (and nothing more).
    gpuverbs::Handshake ours{prepared.endpoint(), {prepared.advertise(mr)}};
    gpuverbs::Handshake peer;
    if (a.server) {
        gpuverbs::TcpListener listener(io, a.port);
        auto socket = listener.accept();
        peer = gpuverbs::exchange_handshake(socket, ours);
    } else {
        auto socket = gpuverbs::tcp_connect(io, a.host, a.port);
        peer = gpuverbs::exchange_handshake(socket, ours);
    }

    // 4. Connect: INIT -> RTR -> RTS against the peer's endpoint.
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);
    std::printf("%s: %s QP 0x%x connected to QP 0x%x (%s)\n", a.server ? "server" : "client", device.name().c_str(),
                qp.qp_num(), peer.endpoint.qp_num, peer.endpoint.gid.to_string().c_str());

    if (a.server) {
        // 5s. Post a receive for the client's final write-with-immediate, wait for it, check every byte.
        gpuverbs::throw_if(qp.post_receive(mr.slice(0, 0)), "post_receive");
        gpuverbs::Completion done = wait_one(cq);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < buffer.size(); ++i) bad += buffer[i] != pattern(i) ? 1 : 0;
        std::printf("server: %u writes of %zu bytes arrived; %s\n", done.immediate.value_or(0), buffer.size(),
                    bad == 0 ? "every byte verified" : "MISMATCH");
        return bad == 0 ? 0 : 1;
    }

    // 5c. Fill the buffer and write it into the server's memory, keeping up to 32 writes in flight.
    if (peer.regions.size() != 1 || peer.regions[0].length != buffer.size()) {
        std::fprintf(stderr, "client: the server's buffer is %llu bytes, ours %zu: start both with the same --size\n",
                     peer.regions.empty() ? 0ull : static_cast<unsigned long long>(peer.regions[0].length),
                     buffer.size());
        return 1;
    }
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = pattern(i);
    auto start = std::chrono::steady_clock::now();
    std::uint32_t posted = 0, completed = 0;
    while (completed < a.iterations) {
        while (posted < a.iterations && posted - completed < 32) {
            gpuverbs::throw_if(qp.post_write(mr.all(), peer.regions[0]), "post_write");
            ++posted;
        }
        wait_one(cq);
        ++completed;
    }
    // 6. Tell the server we are done: a zero-byte write carrying the count.
    gpuverbs::throw_if(qp.post_write_with_imm(mr.slice(0, 0), peer.regions[0], 0, a.iterations), "post_write_with_imm");
    wait_one(cq);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double mib = double(a.size) * a.iterations / (1 << 20);
    std::printf("client: wrote %.1f MiB in %.3f s (%.1f MiB/s) with RDMA write\n", mib, seconds, mib / seconds);
    return 0;
}

} // namespace

static int main_body(int argc, char** argv) {
    // The command line: server | client HOST, --device, --port (examples/common), and ours.
    Args a;
    tools::CommandLine cli("02_rdma_write", "Writes a buffer into another process's memory with RDMA.", 2);
    example::add_two_process_options(cli, a);
    cli.app.add_option("--size", a.size, "bytes in the buffer (start both sides with the same)")->type_name("BYTES");
    cli.app.add_option("--iterations", a.iterations, "client: how many times to write it")->type_name("N");
    if (auto status = cli.parse(argc, argv)) return *status;
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", a.server ? "server" : "client", e.what());
        return 1;
    }
}

int main(int argc, char** argv) {
    return tools::run_main("02_rdma_write", 1, [&] { return main_body(argc, argv); });
}
