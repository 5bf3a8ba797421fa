// Instructions per block of planning a KV-cache hand-off, counted by
// callgrind (benchmarks/kv-plan runs it in the rig): the plan from block ids
// (KvPool::plan) against the plan from two block lists a connector has
// already built (TransferPlan), for the same 1,000 scattered blocks of 32
// layers, K and V (64,000 pieces). Only the planning is collected.
//
//   kv_plan_cost ids|lists [--device rxe0] [--ids 1000]
#include <gpuverbs/gpuverbs.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else // built without valgrind's headers: runs, but collects nothing
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    using namespace gpuverbs;
    if (argc < 2) {
        std::fprintf(stderr, "usage: kv_plan_cost ids|lists [--device NAME] [--ids N]\n");
        return 2;
    }
    const std::string form = argv[1];
    std::string device_name = std::getenv("GPUVERBS_TEST_DEV0") != nullptr ? std::getenv("GPUVERBS_TEST_DEV0") : "";
    std::size_t count = 1000;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--device") device_name = argv[i + 1];
        if (flag == "--ids") count = std::stoul(argv[i + 1]);
    }
    Device device = device_name.empty() ? Device::open_first() : Device::open(device_name);
    ProtectionDomain pd(device);
    const KvLayout layout = KvLayout::per_layer(32, 4096, 64);
    std::vector<std::vector<std::byte>> tensors;
    std::vector<MemoryRegion> regions;
    for (std::uint32_t t = 0; t < layout.tensors(); ++t) {
        tensors.emplace_back(layout.tensor_bytes());
        regions.emplace_back(pd, tensors.back(), Access::local_write | Access::remote_write);
    }
    const KvPool pool(layout, std::move(regions));
    const RemoteKvPool theirs = RemoteKvPool::load(pool.describe()); // ourselves, as a peer would see us

    std::vector<std::uint32_t> ours(layout.blocks);
    std::iota(ours.begin(), ours.end(), 0u);
    std::vector<std::uint32_t> far = ours;
    std::shuffle(ours.begin(), ours.end(), std::mt19937(1));
    std::shuffle(far.begin(), far.end(), std::mt19937(2));
    ours.resize(count);
    far.resize(count);
    const TransferLimits limits{4};

    std::size_t pieces = 0;
    if (form == "ids") {
        CALLGRIND_TOGGLE_COLLECT;
        const TransferPlan plan = pool.plan(TransferDirection::write, ours, theirs, far, {}, limits);
        CALLGRIND_TOGGLE_COLLECT;
        pieces = plan.local_blocks();
    } else if (form == "lists") {
        // The lists a connector builds without a pool: one entry per layer, half and block.
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::uint32_t layer = 0; layer < layout.layers; ++layer) {
            const MemoryRegion& mr = *pool.regions()[layer];
            for (std::uint32_t half = 0; half < 2; ++half) {
                for (std::size_t i = 0; i < count; ++i) {
                    local.push_back(mr.slice(layout.offset(layer, half, ours[i]), layout.block_bytes));
                    remote.push_back({theirs.tensors()[layer], layout.offset(layer, half, far[i]), layout.block_bytes});
                }
            }
        }
        CALLGRIND_TOGGLE_COLLECT;
        const TransferPlan plan(TransferDirection::write, local, remote, limits);
        CALLGRIND_TOGGLE_COLLECT;
        pieces = plan.local_blocks();
    } else {
        std::fprintf(stderr, "kv_plan_cost: unknown form '%s' (ids or lists)\n", form.c_str());
        return 2;
    }
    std::printf("%s: %zu pieces (%zu ids x %u layers x 2 halves)\n", form.c_str(), pieces, count, layout.layers);
    return 0;
}
