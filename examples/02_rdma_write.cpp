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
    //    domain, a completion queue, and our buffer registered for RDMA.
    gpuverbs::Device device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 256);
    std::vector<std::byte> buffer(a.size);
    gpuverbs::MemoryRegion mr(pd, buffer, gpuverbs::access_all);

    // 2. Create the queue pair; it is not connected yet.
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);

    // 3. Swap endpoints (and the server's buffer address and key) over TCP.
    boost::asio::io_context io;
    gpuverbs::Handshake ours{prepared.endpoint(), {mr.remote()}};
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

int main(int argc, char** argv) {
    Args a;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || (args[0] != "server" && args[0] != "client") || (args[0] == "client" && args.size() < 2)) {
        std::fprintf(stderr, "usage: %s server|client HOST [--device D] [--port P] [--size B] [--iterations N]\n",
                     argv[0]);
        return 2;
    }
    a.server = args[0] == "server";
    std::size_t i = 1;
    if (!a.server) a.host = args[i++];
    try {
        for (; i + 1 < args.size(); i += 2) {
            if (args[i] == "--device")
                a.device = args[i + 1];
            else if (args[i] == "--port")
                a.port = static_cast<std::uint16_t>(std::stoul(args[i + 1]));
            else if (args[i] == "--size")
                a.size = std::stoull(args[i + 1]);
            else if (args[i] == "--iterations")
                a.iterations = static_cast<std::uint32_t>(std::stoul(args[i + 1]));
        }
        return run(a);
    } catch (const gpuverbs::Error& e) {
        std::fprintf(stderr, "%s: %s\n", a.server ? "server" : "client", e.what());
        return 1;
    } catch (const std::exception& e) { // a malformed number in the arguments
        std::fprintf(stderr, "%s: bad argument: %s\n", argv[0], e.what());
        return 2;
    }
}
