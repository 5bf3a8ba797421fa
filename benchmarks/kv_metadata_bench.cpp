// What a peer must receive to address a KV cache, and how long making and
// checking it takes: a pool's metadata (KvPool::describe, RemoteKvPool::load)
// against the per-block list of the same blocks (wire::serialize,
// wire::parse_block_list). A 32-layer pool of 16,384 blocks of 16 KiB per
// layer, K and V: 1,048,576 blocks. No device: the records are made from the
// addresses and keys a registration would have given (registering the
// 16 GiB itself is the same for both and not measured here).
//
//   kv_metadata_bench [REPEATS]
#include <gpuverbs/gpuverbs.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0, int repeats) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / repeats;
}
} // namespace

int main(int argc, char** argv) {
    using namespace gpuverbs;
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
    const KvLayout layout = KvLayout::per_layer(32, 16384, 16384);
    std::vector<RemoteMemory> tensors;
    for (std::uint32_t t = 0; t < layout.tensors(); ++t) {
        tensors.push_back({0x7f0000000000 + t * layout.tensor_bytes(), layout.tensor_bytes(), 0x1000 + t});
    }

    auto t0 = Clock::now();
    std::vector<std::byte> metadata;
    for (int i = 0; i < repeats; ++i) metadata = detail::kv_pool_record(layout, 42, tensors);
    const double describe_us = us_since(t0, repeats);
    t0 = Clock::now();
    std::size_t loaded = 0;
    for (int i = 0; i < repeats; ++i) loaded += RemoteKvPool::load(metadata).tensors().size();
    const double load_us = us_since(t0, repeats);

    std::vector<RemoteBlock> blocks;
    blocks.reserve(std::size_t{layout.layers} * layout.halves * layout.blocks);
    t0 = Clock::now();
    for (std::uint32_t l = 0; l < layout.layers; ++l) {
        for (std::uint32_t h = 0; h < layout.halves; ++h) {
            for (std::uint32_t b = 0; b < layout.blocks; ++b) {
                blocks.push_back({tensors[l], layout.offset(l, h, b), layout.block_bytes});
            }
        }
    }
    const double list_us = us_since(t0, 1);
    const int list_repeats = repeats > 3 ? 3 : repeats;
    t0 = Clock::now();
    std::vector<std::byte> list;
    for (int i = 0; i < list_repeats; ++i) list = wire::serialize(blocks);
    const double serialize_us = us_since(t0, list_repeats);
    t0 = Clock::now();
    std::size_t parsed = 0;
    for (int i = 0; i < list_repeats; ++i) parsed += wire::parse_block_list(list).size();
    const double parse_us = us_since(t0, list_repeats);

    std::printf("%zu blocks (32 layers x 2 halves x 16384 blocks of 16 KiB)\n", blocks.size());
    std::printf("%-28s %14s %14s %14s\n", "", "bytes", "make (us)", "check (us)");
    std::printf("%-28s %14zu %14.1f %14.1f\n", "pool metadata (GVKV)", metadata.size(), describe_us, load_us);
    std::printf("%-28s %14zu %14.1f %14.1f\n", "per-block list (GVBL)", list.size(), list_us + serialize_us, parse_us);
    std::printf("ratio (list / metadata)      %14.0f %14.0f %14.0f\n",
                static_cast<double>(list.size()) / static_cast<double>(metadata.size()),
                (list_us + serialize_us) / describe_us, parse_us / load_us);
    return loaded > 0 && parsed > 0 ? 0 : 1;
}
