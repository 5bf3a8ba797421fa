// The staged path's copy half on a real GPU, against a plain cuMemcpy of the
// same size into pinned memory, in one run: GPU -> host (what a staged writer
// does before each RDMA write) and host -> GPU (the receiver's side). Every
// byte is checked after the timed runs. Reports GB/s and the ratio (target:
// the pipeline moves >= 0.8x of the plain copy). Run on the device machine:
//
//   staging_bench [--size MiB] [--chunk KiB] [--depth N] [--repeat N]
#include <gpuverbs/gpuverbs.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace gv = gpuverbs;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char** argv) {
    std::size_t size = std::size_t{1} << 30;
    gv::StagingOptions o;
    int repeat = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const long v = std::strtol(argv[i + 1], nullptr, 10);
        if (key == "--size")
            size = static_cast<std::size_t>(v) << 20;
        else if (key == "--chunk")
            o.chunk = static_cast<std::size_t>(v) << 10;
        else if (key == "--depth")
            o.depth = static_cast<std::uint32_t>(v);
        else if (key == "--repeat")
            repeat = static_cast<int>(v);
    }
    try {
        gv::GpuBuffer gpu(size);
        std::vector<std::byte> in(size);
        for (std::size_t i = 0; i < size; ++i) in[i] = std::byte((i * 131 + i / 4096) % 251);
        gv::copy_to_gpu(gpu, 0, in);
        // The plain copy: one cuMemcpyDtoH of the whole buffer into pinned memory (the staging buffers' kind).
        gv::StagingOptions whole;
        whole.chunk = size;
        whole.depth = 1;
        gv::StagingBuffers pinned(whole);
        gv::CopyPipeline pipeline(o);
        std::printf("%zu MiB, chunks of %zu KiB, depth %u, pinned: %s\n", size >> 20, o.chunk >> 10, o.depth,
                    pipeline.buffers().cuda_pinned() && pinned.cuda_pinned() ? "yes" : "NO");
        double plain_d2h = 1e9, piped_d2h = 1e9, plain_h2d = 1e9, piped_h2d = 1e9;
        for (int r = 0; r < repeat; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            gv::copy_from_gpu(gpu, 0, pinned.all()); // cuMemcpyDtoH, synchronous
            plain_d2h = std::min(plain_d2h, seconds_since(t0));
            t0 = std::chrono::steady_clock::now();
            pipeline.from_gpu(gpu.memory(), [](std::span<const std::byte>, std::size_t) {});
            piped_d2h = std::min(piped_d2h, seconds_since(t0));
            t0 = std::chrono::steady_clock::now();
            gv::copy_to_gpu(gpu, 0, pinned.all());
            plain_h2d = std::min(plain_h2d, seconds_since(t0));
            t0 = std::chrono::steady_clock::now();
            pipeline.to_gpu(gpu.memory(), [](std::span<std::byte>, std::size_t) {});
            piped_h2d = std::min(piped_h2d, seconds_since(t0));
        }
        // Bytes: through the pipeline out, compared with what went in; then back in through it.
        gv::copy_to_gpu(gpu, 0, in);
        std::size_t bad = 0;
        pipeline.from_gpu(gpu.memory(), [&](std::span<const std::byte> chunk, std::size_t offset) {
            bad += std::memcmp(chunk.data(), in.data() + offset, chunk.size()) != 0 ? 1 : 0;
        });
        pipeline.to_gpu(gpu.memory(), [&](std::span<std::byte> chunk, std::size_t offset) {
            std::memcpy(chunk.data(), in.data() + offset, chunk.size());
        });
        std::vector<std::byte> back(size);
        gv::copy_from_gpu(gpu, 0, back);
        bad += back != in ? 1 : 0;
        const double gb = static_cast<double>(size) / 1e9;
        std::printf("GPU -> host: plain cuMemcpyDtoH %.1f GB/s, pipeline %.1f GB/s: ratio %.3f (target >= 0.8)\n",
                    gb / plain_d2h, gb / piped_d2h, plain_d2h / piped_d2h);
        std::printf("host -> GPU: plain cuMemcpyHtoD %.1f GB/s, pipeline %.1f GB/s: ratio %.3f (target >= 0.8)\n",
                    gb / plain_h2d, gb / piped_h2d, plain_h2d / piped_h2d);
        std::printf("bytes: %s\n", bad == 0 ? "every byte verified both ways" : "WRONG");
        return bad == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "staging_bench: %s\n", e.what());
        return 1;
    }
}
