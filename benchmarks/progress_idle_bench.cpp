// What gpuverbs::progress costs on an idle context: a serving engine calls it
// once per step whether or not anything is in flight, so it must cost
// nothing measurable and make no system call. benchmarks/progress-idle runs
// it in the rig (time, instructions under callgrind, system calls under
// strace between two getppid() markers) and scales the time to the host.
//
//   progress_idle_bench idle [--cqs 4] [--calls 1000000]   on an RDMA device (rxe0)
//   progress_idle_bench calibrate [--calls 1000000]        a fixed CPU loop: the guest/host scale
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/io_context.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else // built without valgrind's headers: runs, but collects nothing
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double ns_per(Clock::duration d, std::uint64_t n) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) /
           static_cast<double>(n);
}

/// The same CPU work on the host and in the guest: their times' ratio scales rig times to the host.
double calibrate(std::uint64_t calls) {
    volatile std::uint64_t sink = 0;
    std::uint64_t x = 88172645463325252ULL;
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < calls * 16; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sink = sink + (x & 0xff);
    }
    return ns_per(Clock::now() - t0, calls);
}

} // namespace

int main(int argc, char** argv) {
    using namespace gpuverbs;
    if (argc < 2) {
        std::fprintf(stderr, "usage: progress_idle_bench idle|calibrate [--cqs N] [--calls N]\n");
        return 2;
    }
    const std::string form = argv[1];
    std::uint64_t calls = 1000000;
    int cqs = 4;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--calls") calls = std::stoull(argv[i + 1]);
        if (flag == "--cqs") cqs = std::stoi(argv[i + 1]);
    }
    if (form == "calibrate") {
        std::printf("calibrate: %.2f ns per round\n", calibrate(calls));
        return 0;
    }
    const char* name = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe): one thread
    Device device = name != nullptr ? Device::open(name) : Device::open_first();
    boost::asio::io_context io(1);
    const AsyncOptions polled{.mode = CompletionMode::polled, .single_threaded = true};
    std::vector<CompletionQueue> queues;
    for (int k = 0; k < cqs; ++k) queues.emplace_back(device, 256, io.get_executor(), polled);
    for (int k = 0; k < 1000; ++k) (void)progress(io); // warm

    std::uint64_t ran = 0;
    const auto t0 = Clock::now(); // read outside the markers: the rig's clock may be a system call
    (void)getppid();              // the marker strace finds before the loop
    CALLGRIND_TOGGLE_COLLECT;
    for (std::uint64_t i = 0; i < calls; ++i) ran += progress(io);
    CALLGRIND_TOGGLE_COLLECT;
    (void)getppid(); // … and after it
    const auto took = Clock::now() - t0;
    std::printf("idle: %llu calls over %d polled CQs, %.1f ns per call, %llu handlers run\n",
                static_cast<unsigned long long>(calls), cqs, ns_per(took, calls), static_cast<unsigned long long>(ran));
    return ran == 0 ? 0 : 1;
}
