// A KV-cache hand-off by block id, as a connector does it per request: plan
// 1,000 scattered blocks of every layer by id (KvPool::plan), read them
// from the peer's pool (one transfer, ending with its notification), the
// engine's own loop asking progress() until done — the C++ side of
// benchmarks/python/run's "hand-off by block id" (bench.py kv is the same
// from Python). One process, DEV0 reads from DEV1; every sampled byte checked
// after each hand-off, outside the timed part.
//
//   kv_handoff_bench [--layers 32] [--blocks 1024] [--ids 1000] [--block 512] [--repeat 3]
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace gv = gpuverbs;

struct Engine {
    std::vector<std::vector<std::byte>> tensors;
    gv::KvPool pool;
    Engine(const gv::ProtectionDomain& pd, const gv::KvLayout& layout, gv::Access access) {
        std::vector<gv::MemoryRegion> regions;
        for (std::uint32_t t = 0; t < layout.tensors(); ++t) {
            tensors.emplace_back(layout.tensor_bytes());
            regions.emplace_back(pd, tensors.back(), access);
        }
        pool = gv::KvPool(layout, std::move(regions));
    }
};

std::vector<std::uint32_t> scattered(std::uint32_t blocks, std::uint32_t count, unsigned seed) {
    std::vector<std::uint32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    ids.resize(count);
    return ids;
}

} // namespace

int main(int argc, char** argv) {
    std::uint32_t layers = 32, blocks = 1024, count = 1000, block = 512;
    int repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const auto v = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
        if (key == "--layers") layers = v;
        if (key == "--blocks") blocks = v;
        if (key == "--ids") count = v;
        if (key == "--block") block = v;
        if (key == "--repeat") repeat = static_cast<int>(v);
    }
    const char* d0 = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe): one thread
    const char* d1 = std::getenv("GPUVERBS_TEST_DEV1"); // NOLINT(concurrency-mt-unsafe): one thread
    if (d0 == nullptr || d1 == nullptr || count > blocks) {
        std::fprintf(stderr, "kv_handoff_bench: run it in the rig (GPUVERBS_TEST_DEV0/1), with --ids <= --blocks\n");
        return 2;
    }
    boost::asio::io_context io(1);
    const gv::AsyncOptions polled{.mode = gv::CompletionMode::polled, .single_threaded = true};
    gv::Device dev0 = gv::Device::open(d0), dev1 = gv::Device::open(d1);
    gv::ProtectionDomain pd0(dev0), pd1(dev1);
    gv::CompletionQueue cq0(dev0, 4096, io.get_executor(), polled), cq1(dev1, 4096, io.get_executor(), polled);
    gv::QueuePairOptions o;
    o.max_send_sge = 4;
    o.max_send_wr = 512;
    gv::PreparedQueuePair a(pd0, cq0, cq0, o), b(pd1, cq1, cq1, o);
    const gv::Endpoint ea = a.endpoint(), eb = b.endpoint();
    gv::ConnectOptions grant;
    grant.remote_access = gv::Access::remote_read;
    gv::QueuePair qa = std::move(a).connect(eb), qb = std::move(b).connect(ea, grant);

    const gv::KvLayout layout = gv::KvLayout::per_layer(layers, blocks, block);
    Engine decode(pd0, layout, gv::Access::local_write);
    Engine prefill(pd1, layout, gv::Access::local_write | gv::Access::remote_read);
    for (std::size_t t = 0; t < prefill.tensors.size(); ++t) {
        for (std::size_t i = 0; i < prefill.tensors[t].size(); i += 64)
            prefill.tensors[t][i] = std::byte((i / 64 + t) % 251);
    }
    const gv::RemoteKvPool theirs = gv::RemoteKvPool::load(prefill.pool.describe());
    const std::vector<std::uint32_t> mine = scattered(blocks, count, 1), far = scattered(blocks, count, 2);
    const gv::TransferLimits limits{qa.capabilities().max_send_sge};

    auto handoff = [&] {
        const gv::TransferPlan plan = decode.pool.plan(gv::TransferDirection::read, mine, theirs, far, {}, limits);
        gv::PendingTransfer t = gv::start_transfer(qa, plan);
        while (!t.done()) gv::progress(io);
        if (t.error()) {
            std::fprintf(stderr, "hand-off failed: %s: %s\n", t.error().message().c_str(),
                         t.result().failed_blocks.c_str());
            std::exit(1);
        }
    };
    handoff(); // warm-up
    double seconds = 0;
    for (int rep = 0; rep < repeat; ++rep) {
        for (auto& t : decode.tensors) std::fill(t.begin(), t.end(), std::byte{0xff});
        const auto t0 = std::chrono::steady_clock::now();
        handoff();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::size_t bad = 0;
        for (std::uint32_t l = 0; l < layers; ++l) {
            for (std::uint32_t h = 0; h < 2; ++h) {
                for (std::size_t k = 0; k < count; ++k) {
                    const std::size_t at = layout.offset(l, h, mine[k]), from = layout.offset(l, h, far[k]);
                    bad += decode.tensors[l][at] != prefill.tensors[l][from] ? 1 : 0;
                }
            }
        }
        if (bad != 0) {
            std::fprintf(stderr, "kv_handoff_bench: %zu blocks wrong after the hand-off\n", bad);
            return 1;
        }
    }
    const double pieces = static_cast<double>(count) * layers * 2 * repeat;
    std::printf("c++ kv: %u ids x %u layers x %d, %.3f s, %.0f blocks/s\n", count, layers, repeat, seconds,
                pieces / seconds);
    return 0;
}
