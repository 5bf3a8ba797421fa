// 07_gpu_initiated_put: a GPU kernel starts RDMA transfers itself. It pushes
// puts and a signal into a device queue (a ring in pinned host memory); a host
// proxy posts them on the queue pair; the peer waits for the signal and checks
// every byte. The kernel names buffers by window ids (1: the blocks, 2: the
// signal word) that the host registered; it never sees an rkey.
//
//   07_gpu_initiated_put server [--device rxe1] [--port 18518] [--blocks N] [--block-size BYTES]   (the peer)
//   07_gpu_initiated_put client HOST [--device rxe0] [--port 18518] [...]                          (the producer)
//   07_gpu_initiated_put gpu-half [--gpu 0] [...]                                                  (no NIC: the GPU's
//   part)
//
// No machine of ours has both a GPU and an RDMA NIC, so the example runs in
// halves and says which: server and client are the NIC half (the producer a
// CPU thread pushing through the same ring header a kernel uses), gpu-half
// the GPU half (the producer kernel and the peer's checker kernel, with the
// host doing the NIC's copies).
#include "command_line.hpp"
#include "wait_names.hpp"

#include <gpuverbs/gpuverbs.hpp>

// The windows and the pattern both halves agree on; the kernels' functions are
// called only where nvcc built them (GPUVERBS_EXAMPLE_HAVE_KERNELS).
#include "07_gpu_initiated_kernels.hpp"

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace dq = gpuverbs::device_queue;
using namespace std::chrono_literals;

struct Args {
    std::string role, host, device;
    std::uint16_t port = 18518;
    int gpu = 0;
    std::size_t blocks = 256;
    std::size_t block_size = 4096;
};

constexpr std::uint64_t timeout_ns = 10'000'000'000; // every wait: 10 s
using example::name_of;

// Why no GPU takes part here, in the driver's words.
std::string no_gpu_reason() {
    try {
        const auto gpus = gpuverbs::list_gpus();
#if GPUVERBS_EXAMPLE_HAVE_KERNELS
        return gpus.empty() ? "CUDA sees no GPU"
                            : "a GPU is here, yet no RDMA device shares a machine with one in our rigs: the kernel "
                              "path is gpu-half's";
#else
        return "built without nvcc, so the kernels are not here";
#endif
    } catch (const gpuverbs::Error& e) {
        return e.what();
    }
}

// The peer: blocks and a signal word in one region; waits for the signal, checks every byte.
int serve(const Args& a, boost::asio::io_context& io, gpuverbs::Device& device) {
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 64);
    const std::size_t bytes = a.blocks * a.block_size;
    std::vector<std::byte> memory(bytes + 8);
    using gpuverbs::Access;
    gpuverbs::MemoryRegion mr(pd, memory, Access::local_write | Access::remote_write);
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);
    auto socket = gpuverbs::TcpListener(io, a.port).accept();
    gpuverbs::Handshake peer = gpuverbs::exchange_handshake(socket, {prepared.endpoint(), {prepared.advertise(mr)}});
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);
    // The signal lands after the blocks (it follows them on the queue pair): an acquire load sees them all.
    std::atomic_ref<std::uint64_t> signal(*reinterpret_cast<std::uint64_t*>(memory.data() + bytes));
    const auto start = std::chrono::steady_clock::now();
    while (signal.load(std::memory_order_acquire) < a.blocks && std::chrono::steady_clock::now() - start < 10s) {
        std::this_thread::yield();
    }
    const std::uint64_t seen = signal.load(std::memory_order_acquire);
    std::size_t wrong = 0;
    for (std::size_t at = 0; at < bytes; ++at) {
        wrong += memory[at] != std::byte{example::pattern(at / a.block_size, at % a.block_size)} ? 1 : 0;
    }
    std::printf("server: signal %llu of %zu; %zu blocks of %zu bytes: %s\n", static_cast<unsigned long long>(seen),
                a.blocks, a.blocks, a.block_size, wrong == 0 ? "every byte verified" : "MISMATCH");
    gpuverbs::send_record(socket, std::vector<std::byte>(1)); // done: the client may go
    return seen == a.blocks && wrong == 0 ? 0 : 1;
}

// The producer's host: the queue, the proxy on an Asio loop, and a CPU thread as the kernel.
int produce(const Args& a, boost::asio::io_context& io, gpuverbs::Device& device) {
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 1024);
    const std::size_t bytes = a.blocks * a.block_size;
    std::vector<std::byte> source(bytes);
    gpuverbs::MemoryRegion mr(pd, source, gpuverbs::Access::local_write);
    gpuverbs::QueuePairOptions options;
    options.max_inline_data = 64; // a signal that sets goes inline
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq, options);
    auto socket = gpuverbs::tcp_connect(io, a.host, a.port);
    gpuverbs::Handshake peer = gpuverbs::exchange_handshake(socket, {prepared.endpoint(), {}});
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);
    const gpuverbs::RemoteMemory theirs = peer.regions.at(0);

    // 1. The device queue (here in host memory: no GPU), and its proxy: window 1 is our blocks, the peer's
    //    windows 1 and 2 its blocks and its signal word.
    gpuverbs::DeviceQueue queue = gpuverbs::DeviceQueue::on_host(10);
    gpuverbs::DeviceQueueProxy proxy(queue.proxy_view(), pd, cq);
    proxy.add_window(example::blocks_window, mr);
    proxy.add_peer(0, qp,
                   {{example::blocks_window, {theirs.address, bytes, theirs.rkey}},
                    {example::signal_window, {theirs.address + bytes, 8, theirs.rkey}}});
    std::optional<gpuverbs::async_error_code> ended;
    gpuverbs::async_drive(proxy, io.get_executor(), {}, [&](gpuverbs::async_error_code ec) { ended = ec; });

    // 2. The producer: what the kernel does in 07_gpu_initiated_kernels.cu, step for step.
    std::atomic<bool> finished{false};
    dq::WaitResult worst = dq::WaitResult::done, signalled = dq::WaitResult::done, quiet = dq::WaitResult::done;
    std::thread producer([&] {
        for (std::size_t k = 0; k < a.blocks; ++k) {
            for (std::size_t i = 0; i < a.block_size; ++i) {
                source[k * a.block_size + i] = std::byte{example::pattern(k, i)};
            }
            dq::Request put;
            put.op = dq::Op::put;
            put.peer = 0;
            put.src_window = put.dst_window = example::blocks_window;
            put.src_offset = put.dst_offset = k * a.block_size;
            put.bytes = a.block_size;
            std::uint64_t position = 0;
            const dq::WaitResult r = dq::push(queue.view(), put, dq::detail::now_ns() + timeout_ns, position);
            if (r != dq::WaitResult::done) worst = r;
        }
        dq::Request signal;
        signal.op = dq::Op::signal;
        signal.peer = 0;
        signal.signal_window = example::signal_window;
        signal.signal_value = a.blocks;
        signal.signal_op = dq::SignalOp::set;
        std::uint64_t position = 0;
        signalled = dq::push(queue.view(), signal, dq::detail::now_ns() + timeout_ns, position);
        quiet = dq::quiet(queue.view(), dq::detail::now_ns() + timeout_ns);
        finished = true;
    });
    while (!finished) io.run_for(10ms);
    producer.join();
    (void)gpuverbs::receive_record(socket, 16); // the peer checked
    proxy.close();
    io.restart();
    io.run_for(100ms); // the drive ends
    const gpuverbs::DeviceQueueProxyCounters& c = proxy.counters();
    std::printf(
        "client: the producer is a CPU thread, pushing through the ring header a kernel uses (%s): %zu puts "
        "of %zu bytes and a signal, worst put %s, signal %s, quiet %s; the proxy posted %llu requests in "
        "%llu doorbells\n",
        no_gpu_reason().c_str(), a.blocks, a.block_size, name_of(worst), name_of(signalled), name_of(quiet),
        static_cast<unsigned long long>(c.requests), static_cast<unsigned long long>(c.chains));
    const bool ok = worst == dq::WaitResult::done && signalled == dq::WaitResult::done && quiet == dq::WaitResult::done;
    if (!ok) std::printf("client: the proxy says: %s\n", proxy.failure().c_str());
    return ok ? 0 : 1;
}

#if GPUVERBS_EXAMPLE_HAVE_KERNELS
// The GPU half: both kernels on this GPU, a ring mapped into it, and the host taking each request the
// producer pushes and doing what the NIC would (a copy in GPU memory), then returning its credit.
int gpu_half(const Args& a) {
    std::string why;
    gpuverbs::DeviceQueue queue = gpuverbs::DeviceQueue::on_gpu(a.gpu, 10);
    const std::size_t bytes = a.blocks * a.block_size;
    gpuverbs::GpuBuffer source(bytes, gpuverbs::GpuBufferOptions{.gpu = a.gpu});
    gpuverbs::GpuBuffer destination(bytes + 8, gpuverbs::GpuBufferOptions{.gpu = a.gpu});
    auto* signal = reinterpret_cast<std::uint64_t*>(destination.pointer()) + bytes / 8;
    if (!example::store_on_gpu(signal, 0, why) ||
        !example::start_checker(queue.view(), destination.pointer(), signal, a.blocks, a.block_size, timeout_ns, why) ||
        !example::start_producer(queue.view(), source.pointer(), a.blocks, a.block_size, timeout_ns, why)) {
        std::fprintf(stderr, "gpu-half: %s\n", why.c_str());
        return 1;
    }
    dq::RingReader reader(queue.proxy_view());
    std::size_t puts = 0, signals = 0, refused = 0;
    const auto start = std::chrono::steady_clock::now();
    while (puts + signals < a.blocks + 1 && std::chrono::steady_clock::now() - start < 20s) {
        dq::Request r;
        if (reader.try_take(r) != dq::Decoded::complete) continue;
        const bool put_ok = r.op == dq::Op::put && r.peer == 0 && r.src_window == example::blocks_window &&
                            r.dst_window == example::blocks_window && r.src_offset == r.dst_offset &&
                            r.bytes == a.block_size && r.dst_offset + r.bytes <= bytes;
        const bool signal_ok = r.op == dq::Op::signal && r.peer == 0 && r.signal_window == example::signal_window &&
                               r.signal_op == dq::SignalOp::set && r.signal_value == a.blocks;
        if (put_ok) {
            if (!example::copy_on_gpu(static_cast<std::byte*>(destination.pointer()) + r.dst_offset,
                                      static_cast<const std::byte*>(source.pointer()) + r.src_offset, r.bytes, why)) {
                break;
            }
            ++puts;
        } else if (signal_ok) {
            if (!example::store_on_gpu(signal, r.signal_value, why)) break;
            ++signals;
        } else {
            ++refused;
            reader.fail(dq::QueueError::refused);
            break;
        }
        reader.complete(reader.taken()); // done, as the proxy says once the NIC completed it
    }
    std::uint32_t produced[3] = {};
    std::uint32_t waited = 0;
    std::uint64_t wrong = 0;
    if (!why.empty() || !example::finish_producer(produced, why) || !example::finish_checker(waited, wrong, why)) {
        std::fprintf(stderr, "gpu-half: %s\n", why.c_str());
        return 1;
    }
    std::error_code nic;
    gpuverbs::Diagnostics no_nic;
    (void)gpuverbs::Device::open_first(nic, no_nic);
    std::printf(
        "gpu-half: %s\n"
        "gpu-half: the producer kernel pushed %zu puts of %zu bytes and a signal (worst put %s, signal %s, "
        "quiet %s); the host took %zu puts and %zu signal, %zu not as pushed, doing the NIC's copies; the "
        "checker kernel's wait_signal: %s, %s\n",
        nic ? ("no RDMA device here (" + no_nic.message() + "): the host does the NIC's part").c_str()
            : "an RDMA device is here, yet this mode leaves it out: run server and client for the NIC half",
        a.blocks, a.block_size, name_of(static_cast<dq::WaitResult>(produced[0])),
        name_of(static_cast<dq::WaitResult>(produced[1])), name_of(static_cast<dq::WaitResult>(produced[2])), puts,
        signals, refused, name_of(static_cast<dq::WaitResult>(waited)),
        waited != 0  ? "nothing checked"
        : wrong == 0 ? "every byte verified"
                     : "MISMATCH");
    const bool ok = produced[0] == 0 && produced[1] == 0 && produced[2] == 0 && waited == 0 && wrong == 0 &&
                    puts == a.blocks && signals == 1 && refused == 0;
    return ok ? 0 : 1;
}
#endif

int run(const Args& a) {
    if (a.role == "gpu-half") {
#if GPUVERBS_EXAMPLE_HAVE_KERNELS
        const std::string no_gpu = no_gpu_reason();
        if (no_gpu.starts_with("a GPU is here")) return gpu_half(a);
        std::printf(
            "gpu-half: no GPU here (%s): the GPU half runs on a machine with one; server and client run "
            "the NIC half\n",
            no_gpu.c_str());
        return 0;
#else
        std::printf("gpu-half: built without nvcc, so the kernels are not here; server and client run the NIC half\n");
        return 0;
#endif
    }
    boost::asio::io_context io;
    gpuverbs::Device device;
    try {
        device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    } catch (const gpuverbs::Error& e) {
        if (e.code() != gpuverbs::errc::no_rdma_device) throw;
        std::printf(
            "%s: no RDMA device here (%s): the NIC half runs where one is; `07_gpu_initiated_put gpu-half` "
            "runs the GPU half\n",
            a.role.c_str(), e.what());
        return 0;
    }
    return a.role == "server" ? serve(a, io, device) : produce(a, io, device);
}

} // namespace

int main(int argc, char** argv) {
    return tools::run_main("07_gpu_initiated_put", 1, [&] {
        Args a;
        tools::CommandLine cli("07_gpu_initiated_put", "A kernel puts blocks to a peer and signals it.", 2);
        cli.usage({{"server [options]", "the peer: wait for the signal, check every byte"},
                   {"client HOST [options]", "the producer: put the blocks and signal"},
                   {"gpu-half [options]", "no NIC: both kernels on this GPU, the host doing the NIC's copies"}});
        cli.app.add_option("ROLE", a.role, "server, client or gpu-half")
            ->required()
            ->check(CLI::IsMember({"server", "client", "gpu-half"}));
        cli.app.add_option("HOST", a.host, "client: the server's address");
        cli.app.add_option("--device", a.device, "RDMA device (default: the first)")->type_name("D");
        cli.app.add_option("--port", a.port, "TCP port where the server waits")->type_name("P");
        cli.app.add_option("--gpu", a.gpu, "gpu-half: the CUDA device")->type_name("N");
        cli.app.add_option("--blocks", a.blocks, "blocks to put (1 to 512)")->type_name("N");
        cli.app.add_option("--block-size", a.block_size, "bytes per block (a multiple of 8)")->type_name("BYTES");
        cli.app.callback([&a] {
            if (a.role == "client" && a.host.empty()) throw CLI::RequiredError("client HOST");
            if (a.role != "client" && !a.host.empty()) throw CLI::ValidationError("unknown argument '" + a.host + "'");
            if (a.blocks < 1 || a.blocks > 512) throw CLI::ValidationError("--blocks must be between 1 and 512");
            if (a.block_size == 0 || a.block_size % 8 != 0) {
                throw CLI::ValidationError("--block-size must be a positive multiple of 8");
            }
        });
        if (auto status = cli.parse(argc, argv)) return *status;
        try {
            return run(a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s: %s\n", a.role.c_str(), e.what());
            return 1;
        }
    });
}
