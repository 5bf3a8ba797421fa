// 06_kv_cache_transfer: the hand-off of disaggregated inference. Each side
// has a paged pool of fixed-size blocks; a request's KV cache sits in some
// of the prefill side's blocks, and the decode side wants it in its own,
// differently scattered blocks. The decode side sends the list of its
// blocks; the prefill side moves every block in ONE transfer that ends with a
// notification; the decode side verifies every byte.
//
//   06_kv_cache_transfer server [--device rxe1] [--port 18517] [--blocks N] [--block-size BYTES]   (decode)
//   06_kv_cache_transfer client HOST [--device rxe0] [--port 18517] [...]                          (prefill)
#include "two_processes.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

namespace {

struct Args {
    bool server = true;
    std::string host, device;
    std::uint16_t port = 18517;
    std::size_t pool_blocks = 1024;
    std::size_t block_size = 16 << 10;
    std::size_t request_blocks = 300;
};

constexpr std::uint32_t request_id = 42;

// Byte i of the request's k-th block: what prefill writes and decode expects.
std::byte pattern(std::size_t k, std::size_t i) {
    return std::byte((k * 131 + i * 7 + request_id) % 251);
}

// `count` distinct block ids of a pool, in a scattered order (seeded: each side its own).
std::vector<std::size_t> scattered_blocks(std::size_t pool, std::size_t count, unsigned seed) {
    std::vector<std::size_t> ids(pool);
    for (std::size_t i = 0; i < pool; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    ids.resize(count);
    return ids;
}

int run(const Args& a) {
    // 1. The pool: pool_blocks blocks of block_size bytes, registered once.
    boost::asio::io_context io;
    gpuverbs::Device device = a.device.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(a.device);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 1024, io.get_executor());
    std::vector<std::byte> pool(a.pool_blocks * a.block_size);
    using gpuverbs::Access;
    auto access = a.server ? Access::local_write | Access::remote_write : Access::none;
    gpuverbs::MemoryRegion mr(pd, pool, access);
    gpuverbs::QueuePairOptions options;
    options.max_send_sge = 4;
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq, options);

    // 2. Connect over TCP (endpoints and the decode side's pool region).
    auto socket = a.server ? gpuverbs::TcpListener(io, a.port).accept() : gpuverbs::tcp_connect(io, a.host, a.port);
    gpuverbs::Handshake peer = gpuverbs::exchange_handshake(socket, {prepared.endpoint(), {prepared.advertise(mr)}});
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);
    // The request's blocks: where decode wants them, where prefill has them.
    std::vector<std::size_t> decode_ids = scattered_blocks(a.pool_blocks, a.request_blocks, 1);
    std::vector<std::size_t> prefill_ids = scattered_blocks(a.pool_blocks, a.request_blocks, 2);

    if (a.server) {
        // 3d. Decode: a receive for the notification, then send our block list (wire::serialize).
        std::optional<std::uint32_t> arrived;
        qp.async_receive(mr.slice(0, 0), [&](boost::system::error_code ec, gpuverbs::Received r) {
            if (ec) throw gpuverbs::Error(ec, "async_receive", ec.message());
            arrived = r.immediate;
        });
        std::vector<gpuverbs::RemoteBlock> wanted;
        wanted.reserve(decode_ids.size());
        for (std::size_t id : decode_ids) wanted.push_back({mr.remote(), id * a.block_size, a.block_size});
        gpuverbs::send_record(socket, gpuverbs::wire::serialize(wanted));
        io.run();
        // 4d. The notification came after the last block: check every byte of every block.
        std::size_t bad = 0;
        for (std::size_t k = 0; k < decode_ids.size(); ++k) {
            const std::byte* block = pool.data() + decode_ids[k] * a.block_size;
            for (std::size_t i = 0; i < a.block_size; ++i) bad += block[i] != pattern(k, i) ? 1 : 0;
        }
        std::printf("decode: request %u: %zu blocks of %zu bytes arrived in my blocks %zu, %zu, ...; %s\n",
                    arrived.value_or(0), decode_ids.size(), a.block_size, decode_ids[0], decode_ids[1],
                    bad == 0 ? "every byte verified" : "MISMATCH");
        return bad == 0 && arrived == request_id ? 0 : 1;
    }

    // 3p. Prefill: fill the request's blocks, read decode's list, move them all in one transfer.
    std::vector<gpuverbs::LocalBuffer> mine;
    mine.reserve(prefill_ids.size());
    for (std::size_t k = 0; k < prefill_ids.size(); ++k) {
        std::byte* block = pool.data() + prefill_ids[k] * a.block_size;
        for (std::size_t i = 0; i < a.block_size; ++i) block[i] = pattern(k, i);
        mine.push_back(mr.slice(prefill_ids[k] * a.block_size, a.block_size));
    }
    std::vector<gpuverbs::RemoteBlock> theirs =
        gpuverbs::wire::parse_block_list(gpuverbs::receive_record(socket, 64 << 20));
    auto plan = gpuverbs::TransferPlan(gpuverbs::TransferDirection::write, mine, theirs, qp.capabilities());
    auto start = std::chrono::steady_clock::now();
    gpuverbs::async_transfer(
        qp, plan, {.notify = request_id}, [&](boost::system::error_code ec, const gpuverbs::TransferResult& result) {
            // On failure the result names the blocks that failed (its report, with .report_blocks, says which landed).
            if (ec) throw gpuverbs::Error(ec, "async_transfer", result.failed_blocks);
            const std::size_t bytes = result.bytes;
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::printf(
                "prefill: request %u: %zu blocks, %zu bytes in %zu work requests, %.2f "
                "ms (%.1f MB/s)\n",
                request_id, mine.size(), bytes, plan.requests().size(), s * 1e3, double(bytes) / s / 1e6);
        });
    io.run();
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    return tools::run_main("06_kv_cache_transfer", 1, [&] {
        Args a;
        tools::CommandLine cli("06_kv_cache_transfer", "Moves a request's KV-cache blocks into another pool's blocks.",
                               2);
        example::add_two_process_options(cli, a);
        cli.app.add_option("--blocks", a.pool_blocks, "blocks in each pool")->type_name("N");
        cli.app.add_option("--block-size", a.block_size, "bytes per block")->type_name("BYTES");
        cli.app.add_option("--request", a.request_blocks, "blocks in the request (at most --blocks)")->type_name("N");
        if (auto status = cli.parse(argc, argv)) return *status;
        if (a.request_blocks < 2 || a.request_blocks > a.pool_blocks) {
            std::fprintf(stderr, "06_kv_cache_transfer: --request must be between 2 and --blocks\n");
            return 2;
        }
        try {
            return run(a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "%s: %s\n", a.server ? "decode" : "prefill", e.what());
            return 1;
        }
    });
}
