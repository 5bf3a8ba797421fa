// 04_gpudirect_write: GPUDirect RDMA. One process RDMA-writes a buffer from
// its GPU's memory straight into the other process's GPU memory: the NIC reads
// and writes GPU memory itself, and no byte passes through host memory. The
// receiver checks every byte with a GPU kernel.
//
//   04_gpudirect_write server [--device mlx5_1] [--port 18516] [--gpu 0] [--size BYTES]
//   04_gpudirect_write client HOST [--device mlx5_0] [--port 18516] [--gpu 0] [--size BYTES]
//
// Where the machine lacks a piece of GPUDirect RDMA (no GPU, no RDMA NIC, or
// neither DMA-BUF nor nvidia-peermem), it prints register_gpu_memory's
// reasons and exits with status 0. Compare with 02_rdma_write: only the
// buffer and its registration differ.
#include "04_gpudirect_kernels.hpp"
#include "two_processes.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {

struct Args {
    bool server = true;
    std::string host, device;
    std::uint16_t port = 18516;
    int gpu = 0;
    std::size_t size = 64 << 20;
};

constexpr unsigned seed = 0x5d; // the pattern both sides agree on (see the kernels)

// Busy-polls until one completion arrives (a real service would use the Asio layer).
gpuverbs::Completion wait_one(gpuverbs::CompletionQueue& cq) {
    gpuverbs::Completion c;
    while (cq.poll({&c, 1}) == 0) {
    }
    if (!c.ok()) throw gpuverbs::Error(c.status, to_string(c.opcode).data(), c.status.message());
    return c;
}

// Prints why GPUDirect RDMA cannot run here; not an error of the example.
int unavailable(const char* side, const std::vector<gpuverbs::Rejection>& reasons) {
    std::printf("%s: GPUDirect RDMA is not available on this machine:\n", side);
    for (const auto& r : reasons) std::printf("  %s: %s\n", to_string(r.method).data(), r.reason.c_str());
    return 0;
}

int run(const Args& a) {
    const char* side = a.server ? "server" : "client";

    // 1. The RDMA device, a protection domain and a completion queue, as for host memory.
    gpuverbs::Device device;
    try {
        device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    } catch (const gpuverbs::Error& e) {
        if (e.code() != gpuverbs::errc::no_rdma_device) throw;
        // No NIC at all: the GPU half alone cannot do RDMA. Say what is missing.
        std::printf("%s: GPUDirect RDMA is not available on this machine: no RDMA device\n  %s\n", side, e.what());
        return 0;
    }
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 16);

    // 2. GPU memory: a GpuBuffer, allocated the way GPUDirect RDMA wants it
    //    (VMM with the GPUDirect RDMA flag, or cuMemAlloc with SYNC_MEMOPS).
    std::error_code ec;
    gpuverbs::GpuBuffer gpu = gpuverbs::GpuBuffer::create(a.size, {.gpu = a.gpu}, ec);
    if (!gpu) {
        // No usable GPU: still say what this NIC would and would not have done.
        return unavailable(side, gpuverbs::explain_gpu_registration(pd, a.gpu).plan.rejected);
    }

    // 3. Register it: the one call that picks DMA-BUF or nvidia-peermem. The
    //    region is then used exactly like a host memory region, and asks for
    //    as little: the client writes into the server's buffer; the client's
    //    own is only read, by its own NIC (Access::none).
    auto access = a.server ? gpuverbs::Access::local_write | gpuverbs::Access::remote_write : gpuverbs::Access::none;
    gpuverbs::MemoryRegion mr;
    try {
        mr = gpuverbs::register_gpu_memory(pd, gpu, access);
    } catch (const gpuverbs::GpuRegistrationError& e) {
        return unavailable(side, e.rejections()); // each method, and why it was rejected
    }
    std::printf("%s: %zu bytes on GPU %d (%s), registered on %s by %s\n", side, gpu.size(), gpu.gpu(),
                gpu.pci_bus_id().c_str(), device.name().c_str(), to_string(mr.registration()).data());

    // 4. Queue pair and endpoint exchange over TCP, as in 02_rdma_write.
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);
    boost::asio::io_context io;
    gpuverbs::Handshake ours{prepared.endpoint(), {prepared.advertise(mr)}}; // names GPU memory
    gpuverbs::Handshake peer;
    if (a.server) {
        gpuverbs::TcpListener listener(io, a.port);
        auto socket = listener.accept();
        peer = gpuverbs::exchange_handshake(socket, ours);
    } else {
        auto socket = gpuverbs::tcp_connect(io, a.host, a.port);
        peer = gpuverbs::exchange_handshake(socket, ours);
    }
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);

    if (a.server) {
        // 5s. Wait for the client's closing write-with-immediate: RC delivers in
        //     order, so every byte of the data write has landed in GPU memory.
        gpuverbs::throw_if(qp.post_receive(mr.slice(0, 0)), "post_receive");
        wait_one(cq);
        // GPUs that do not order RDMA writes for their own kernels need a flush first.
        if (!gpuverbs::gpu_orders_rdma_writes(gpu.gpu())) gpuverbs::flush_gpu_direct_rdma_writes(gpu.gpu());
        std::uint64_t bad = example::count_mismatches_on_gpu(gpu.gpu(), gpu.pointer(), gpu.size(), seed);
        std::printf("server: %zu bytes arrived in GPU memory; %s\n", gpu.size(),
                    bad == 0 ? "every byte verified on the GPU" : "MISMATCH");
        return bad == 0 ? 0 : 1;
    }

    // 5c. Fill our GPU buffer on the GPU, then one RDMA write from GPU memory
    //     into the server's GPU memory, then the zero-byte "done" write.
    if (peer.regions.size() != 1 || peer.regions[0].length != gpu.size()) {
        std::fprintf(stderr, "client: the server's buffer has a different size: start both with the same --size\n");
        return 1;
    }
    example::fill_on_gpu(gpu.gpu(), gpu.pointer(), gpu.size(), seed);
    gpuverbs::throw_if(qp.post_write(mr.all(), peer.regions[0]), "post_write");
    wait_one(cq);
    gpuverbs::throw_if(qp.post_write_with_imm(mr.slice(0, 0), peer.regions[0], 0, 1), "post_write_with_imm");
    wait_one(cq);
    std::printf("client: wrote %zu bytes from GPU memory into the server's GPU memory\n", gpu.size());
    return 0;
}

} // namespace

static int main_body(int argc, char** argv) {
    // The command line: server | client HOST, --device, --port (examples/common), and ours.
    Args a;
    tools::CommandLine cli("04_gpudirect_write", "GPUDirect RDMA: writes GPU memory into another process's GPU memory.",
                           2);
    example::add_two_process_options(cli, a);
    cli.app.add_option("--gpu", a.gpu, "CUDA device whose memory is used")->type_name("G");
    cli.app.add_option("--size", a.size, "bytes of GPU memory (start both sides with the same)")->type_name("BYTES");
    if (auto status = cli.parse(argc, argv)) return *status;
    try {
        return run(a);
    } catch (const gpuverbs::Error& e) {
        std::fprintf(stderr, "%s: %s\n", a.server ? "server" : "client", e.what());
        return 1;
    } catch (const std::exception& e) { // a CUDA runtime failure
        std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
        return 1;
    }
}

int main(int argc, char** argv) {
    return tools::run_main("04_gpudirect_write", 1, [&] { return main_body(argc, argv); });
}
