// The device queue's ring on a real GPU (issue 37), beside the plainest ring
// in the same process on the same memory: descriptors per second into one host
// thread for 1, 32, 32x32 and 132x32 GPU threads; one GPU thread's push; and
// push-to-credit round trips at batch 1 (p50, p99). Ratios are ours over the
// plain ring's (higher is better for rates, lower for times).
//
//   build/gpu/benchmarks/device_queue_bench [--quick]
//   build/gpu/benchmarks/device_queue_bench --sweep   (ours alone: 32 to 256 warps into 4,096 to 16,384 slots)
//
// Built where nvcc is (tests/CMakeLists.txt, beside the kernels it shares
// with the GPU tests); it says so and exits 0 on a machine without a GPU.
#include "device_queue/ring_kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace gpuverbs::device_queue;
using namespace gpuverbs::test::ring;

namespace {

volatile std::uint64_t kept = 0; ///< what the plain reader summed: its copies are not optimized away

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "device_queue_bench: %s\n", why.c_str());
    std::exit(1);
}

/// Our reader: takes `total`, returns credits every `batch`; seconds until the last.
double read_ours(const QueueView& host, std::uint64_t total, std::uint32_t batch) {
    RingReader reader(host);
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = start + std::chrono::seconds(120);
    std::uint32_t spins = 0;
    while (reader.taken() < total) {
        Request r;
        const Decoded d = reader.try_take(r);
        if (d == Decoded::complete) {
            if (reader.taken() % batch == 0) reader.complete(reader.taken());
        } else if (d == Decoded::corrupt) {
            fail("a corrupt descriptor at " + std::to_string(reader.taken()));
        } else if (++spins % 4096 == 0 && std::chrono::steady_clock::now() > give_up) {
            fail("our reader took " + std::to_string(reader.taken()) + " of " + std::to_string(total) + " in 120 s");
        }
    }
    reader.complete(reader.taken());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The plain ring's reader: a slot is there when its sequence word is; it copies the payload.
double read_plain(const QueueView& host, std::uint64_t total, std::uint32_t batch) {
    auto* slots = reinterpret_cast<PlainSlot*>(host.slots);
    const std::uint64_t mask = host.capacity() - 1;
    std::uint64_t next = 0, sink = 0;
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = start + std::chrono::seconds(120);
    std::uint32_t spins = 0;
    while (next < total) {
        PlainSlot& s = slots[next & mask];
        if (detail::load_acquire(&s.sequence) != next + 1) {
            if (++spins % 4096 == 0 && std::chrono::steady_clock::now() > give_up)
                fail("the plain reader took " + std::to_string(next) + " of " + std::to_string(total) + " in 120 s");
            continue;
        }
        for (std::uint64_t w : s.payload) sink += w;
        ++next;
        if (next % batch == 0)
            std::atomic_ref<std::uint64_t>(host.proxy->credit).store(next, std::memory_order_release);
    }
    std::atomic_ref<std::uint64_t>(host.proxy->credit).store(next, std::memory_order_release);
    kept = sink;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Percentiles {
    double p50 = 0, p99 = 0;
};
Percentiles percentiles(std::vector<std::uint64_t> ns) {
    std::sort(ns.begin(), ns.end());
    return {ns[ns.size() / 2] / 1000.0, ns[ns.size() * 99 / 100] / 1000.0};
}

} // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        std::printf("device_queue_bench: no GPU here (cudaGetDeviceCount): nothing to measure\n");
        return 0;
    }
    cudaDeviceProp prop{};
    (void)cudaGetDeviceProperties(&prop, 0);
    std::printf("device_queue_bench on %s; ours vs the plainest ring (fence + sequence word, a credit read per push)\n",
                prop.name);
    std::string why;
    DeviceRing ring;
    if (!ring.create(12, why)) fail(why);

    if (argc > 1 && std::strcmp(argv[1], "--sweep") == 0) {
        // Ours alone, warps against ring sizes: where does the rate fall as pushers outnumber slots?
        std::printf("\n%-10s %-8s %12s\n", "warps", "slots", "ours M/s");
        for (const std::uint32_t log2 : {12U, 13U, 14U}) {
            DeviceRing sized;
            if (!sized.create(log2, why)) fail(why);
            for (const int blocks : {32, 64, 96, 120, 128, 132, 256}) {
                const std::uint64_t per_thread = 20'000'000ULL / (blocks * 32);
                const std::uint64_t total = per_thread * blocks * 32;
                if (!sized.reset(why) || !start_producers(sized.device, blocks, 32, per_thread, 10'000'000'000ULL, why))
                    fail(why);
                const double t = read_ours(sized.host, total, 32);
                std::uint64_t failed = 0;
                if (!finish(failed, why)) fail(why);
                std::printf("%-10d %-8u %12.2f\n", blocks, 1U << log2, total / t / 1e6);
                std::fflush(stdout);
            }
        }
        return 0;
    }

    std::printf("\n%-22s %14s %14s %8s\n", "GPU threads", "ours M/s", "plain M/s", "ratio");
    struct Shape {
        int blocks, threads;
        std::uint64_t total;
    };
    const std::uint64_t scale = quick ? 10 : 1;
    for (const Shape s : {Shape{1, 1, 2'000'000 / scale}, Shape{1, 32, 20'000'000 / scale},
                          Shape{32, 32, 40'000'000 / scale}, Shape{132, 32, 40'000'000 / scale}}) {
        const int n = s.blocks * s.threads;
        const std::uint64_t per_thread = s.total / n;
        const std::uint64_t total = per_thread * n;
        if (!ring.reset(why) || !start_producers(ring.device, s.blocks, s.threads, per_thread, 10'000'000'000ULL, why))
            fail(why);
        const double ours = read_ours(ring.host, total, 32);
        std::uint64_t failed = 0;
        if (!finish(failed, why)) fail(why);
        if (failed != 0) fail(std::to_string(failed) + " of our pushes did not end done");
        if (!ring.reset(why) || !start_plain_producers(ring.device, s.blocks, s.threads, per_thread, why)) fail(why);
        const double plain = read_plain(ring.host, total, 32);
        if (!finish(failed, why)) fail(why);
        const double a = total / ours / 1e6, b = total / plain / 1e6;
        std::printf("%4d x %-3d (%9llu)   %14.2f %14.2f %8.2f\n", s.blocks, s.threads,
                    static_cast<unsigned long long>(total), a, b, a / b);
    }

    // One GPU thread's push, back to back, the reader returning credits every 32.
    const std::uint64_t count = quick ? 100'000 : 1'000'000;
    std::printf("\none GPU thread, %llu pushes back to back:\n", static_cast<unsigned long long>(count));
    for (const bool fenced : {false, true}) {
        std::uint64_t ns = 0;
        if (!ring.reset(why) || !start_pushes(ring.device, count, fenced, why)) fail(why);
        (void)read_ours(ring.host, count, 32);
        if (!finish_pushes(ns, why)) fail(why);
        std::printf(
            "  ours, %-38s %8.3f us per push\n",
            fenced ? "put() (with the data's system fence):" : "push() (descriptor only):", ns / 1000.0 / count);
    }

    // Round trips at batch 1: the reader returns each credit as it takes the descriptor. The ways of
    // waiting for the credit (0: the library's quiet_until, one 16-byte read of credit and error, back
    // to back) run in turn, twice, after a warm-up round: the first round measured after the
    // throughput runs was the slowest whatever it ran, so each way is judged by its better pass.
    const std::uint32_t iterations = quick ? 2000 : 20000;
    std::vector<std::uint64_t> push_ns(iterations), trip_ns(iterations);
    const char* ways[] = {"quiet_until (one 16-byte read, no nap)", "acquire loads of credit and error, 64 ns naps",
                          "one 16-byte read, 64 ns naps",           "one 16-byte read, 256 ns naps",
                          "one 16-byte read, no nap, no fence",     "one 16-byte read, no nap, acquire fence"};
    constexpr int way_count = 6;
    Percentiles best[way_count], best_push;
    for (int pass = 0; pass < 3; ++pass) {
        for (int way = 0; way < way_count; ++way) {
            if (!ring.reset(why) || !start_round_trips(ring.device, iterations, why, way)) fail(why);
            (void)read_ours(ring.host, iterations, 1);
            if (!finish_round_trips(push_ns.data(), trip_ns.data(), iterations, why)) fail(why);
            if (pass == 0) continue; // the warm-up
            const Percentiles p = percentiles(trip_ns);
            if (best[way].p50 == 0 || p.p50 < best[way].p50) best[way] = p;
            if (way == 0) {
                const Percentiles q = percentiles(push_ns);
                if (best_push.p50 == 0 || q.p50 < best_push.p50) best_push = q;
            }
        }
    }
    Percentiles plain_push, plain_trip;
    for (int pass = 0; pass < 2; ++pass) {
        if (!ring.reset(why) || !start_plain_round_trips(ring.device, iterations, why)) fail(why);
        (void)read_plain(ring.host, iterations, 1);
        if (!finish_round_trips(push_ns.data(), trip_ns.data(), iterations, why)) fail(why);
        const Percentiles p = percentiles(push_ns), t = percentiles(trip_ns);
        if (plain_trip.p50 == 0 || t.p50 < plain_trip.p50) {
            plain_trip = t;
            plain_push = p;
        }
    }
    std::printf("\nbatch 1, %u round trips (GPU clock)      ours p50   p99 | plain p50   p99 | ratio p50  p99\n",
                iterations);
    std::printf("  push                                  %6.2f %6.2f | %6.2f %6.2f | %6.2f %6.2f  us\n", best_push.p50,
                best_push.p99, plain_push.p50, plain_push.p99, best_push.p50 / plain_push.p50,
                best_push.p99 / plain_push.p99);
    std::printf("  push to credit                        %6.2f %6.2f | %6.2f %6.2f | %6.2f %6.2f  us\n", best[0].p50,
                best[0].p99, plain_trip.p50, plain_trip.p99, best[0].p50 / plain_trip.p50,
                best[0].p99 / plain_trip.p99);
    for (int way = 0; way < way_count; ++way) {
        std::printf("  push to credit, waiting with %-48s %6.2f %6.2f us\n", ways[way], best[way].p50, best[way].p99);
    }

    // The floor (issue 50's yardstick): a bare GPU -> host -> GPU round trip through the same memory, a
    // host thread answering each number the GPU stores. Push to credit is judged against it (<= 1.25x).
    Percentiles floor;
    for (int pass = 0; pass < 2; ++pass) {
        if (!ring.reset(why) || !start_ping_pong(ring.device, iterations, why)) fail(why);
        auto* ping = ring.host.slots[0].word;
        auto* pong = ring.host.slots[1].word;
        for (std::uint64_t i = 1; i <= iterations; ++i) {
            while (std::atomic_ref<std::uint64_t>(*ping).load(std::memory_order_acquire) != i) {
            }
            std::atomic_ref<std::uint64_t>(*pong).store(i, std::memory_order_release);
        }
        if (!finish_ping_pong(trip_ns.data(), iterations, why)) fail(why);
        const Percentiles p = percentiles(trip_ns);
        if (floor.p50 == 0 || p.p50 < floor.p50) floor = p;
    }
    std::printf(
        "\nthe floor: a bare GPU -> host -> GPU round trip (a store, a host thread's answer, the GPU's reads)\n");
    std::printf("  floor                                 %6.2f %6.2f us\n", floor.p50, floor.p99);
    std::printf("  push to credit / floor                %6.2f %6.2f   (issue 50's target: <= 1.25 at both)\n",
                best[0].p50 / floor.p50, best[0].p99 / floor.p99);
    for (int way = 0; way < way_count; ++way) {
        std::printf("  ... waiting with %-48s %6.2f %6.2f\n", ways[way], best[way].p50 / floor.p50,
                    best[way].p99 / floor.p99);
    }

    // Where a round trip's time goes: the GPU learns of a credit only by reading host memory across PCIe.
    std::uint64_t read_ns = 0;
    if (!ring.reset(why) || !time_host_reads(ring.device, 10000, read_ns, why)) fail(why);
    std::printf(
        "\none GPU read of a host-memory word (10000 dependent reads): %.2f us; a round trip is at least "
        "the push, its write's flight to the host, and one such read\n",
        read_ns / 1000.0 / 10000);
    return 0;
}
