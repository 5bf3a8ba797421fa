// The device queue's proxy against a host loop doing the same work, in the
// Soft-RoCE rig (benchmarks/device-queue-proxy runs it): N RDMA writes of
// 64 bytes from rxe0 to rxe1, in chains of up to 32 with the send queue kept
// full (256). The loop posts them through our data path (SendBatch, the last
// of each chain signaled) and polls the CQ; the proxy takes them as
// descriptors a producer thread pushes into a ring (ring.hpp, the header a
// kernel uses) and posts them itself, one signaled request per descriptor.
//
//   gpuverbs_device_queue_proxy_bench loop|proxy|proxy_single [--ops N]
//
// Prints "FORM: N puts in S s (R puts/s)"; under callgrind
// (--collect-atstart=no) only the measured part is counted: the loop, or the
// proxy's progress() calls on one thread (proxy_single: the pushes between
// them, the kernel's work, are not counted).
#include <gpuverbs/gpuverbs.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace gv = gpuverbs;
namespace dq = gpuverbs::device_queue;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t payload = 64;
constexpr std::uint32_t depth = 256;

struct Ends {
    gv::Device dev0, dev1;
    gv::ProtectionDomain pd0, pd1;
    gv::CompletionQueue cq0, cq1;
    std::vector<std::byte> src, dst;
    gv::MemoryRegion src_mr, dst_mr;
    gv::QueuePair qa, qb;

    Ends(const char* d0, const char* d1)
        : dev0(gv::Device::open(d0)),
          dev1(gv::Device::open(d1)),
          pd0(dev0),
          pd1(dev1),
          cq0(dev0, 4096),
          cq1(dev1, 4096),
          src(1 << 20),
          dst(1 << 20),
          src_mr(pd0, src, gv::Access::local_write),
          dst_mr(pd1, dst, gv::Access::local_write | gv::Access::remote_write) {
        gv::QueuePairOptions o;
        o.max_send_wr = depth;
        o.max_inline_data = 64;
        gv::PreparedQueuePair a(pd0, cq0, cq0, o), b(pd1, cq1, cq1, o);
        const gv::Endpoint ea = a.endpoint(), eb = b.endpoint();
        (void)b.advertise(dst_mr);
        qa = std::move(a).connect(eb);
        qb = std::move(b).connect(ea);
    }
};

std::uint64_t offset_of(std::uint64_t i) {
    return (i * 64) % (1 << 20);
}

/// The `i`th put: 64 bytes from window 1 to the peer's window 1, at the loop's offsets.
dq::Request put_of(std::uint64_t i) {
    dq::Request r;
    r.op = dq::Op::put;
    r.src_window = 1;
    r.src_offset = offset_of(i);
    r.dst_window = 1;
    r.dst_offset = offset_of(i);
    r.bytes = payload;
    return r;
}

double host_loop(Ends& e, std::uint64_t ops) {
    const gv::RemoteMemory peer = e.dst_mr.remote();
    std::array<gv::Completion, 64> got;
    std::uint64_t posted = 0, completed = 0, in_flight = 0;
    const auto start = Clock::now();
    CALLGRIND_TOGGLE_COLLECT;
    while (completed < ops) {
        while (posted < ops && in_flight + 32 <= depth) {
            gv::SendBatch chain = e.qa.batch();
            const std::uint64_t n = std::min<std::uint64_t>(32, ops - posted);
            for (std::uint64_t k = 0; k < n; ++k) {
                gv::WorkRequest r =
                    gv::WorkRequest::write(e.src_mr.slice(offset_of(posted + k), payload), peer, offset_of(posted + k));
                if (k + 1 < n) r.unsignaled();
                r.context(n);
                if (chain.add(r)) std::abort();
            }
            if (chain.post()) std::abort();
            posted += n;
            in_flight += n;
        }
        const std::size_t c = e.cq0.poll(got);
        for (std::size_t i = 0; i < c; ++i) {
            if (!got[i].ok()) std::abort();
            completed += got[i].context;
            in_flight -= got[i].context;
        }
    }
    CALLGRIND_TOGGLE_COLLECT;
    return std::chrono::duration<double>(Clock::now() - start).count();
}

double through_proxy(Ends& e, std::uint64_t ops, gv::DeviceQueueProxyCounters& counters) {
    const gv::DeviceQueue ring = gv::DeviceQueue::on_host(10); // zeroed, on the proxy's words' alignment
    const dq::QueueView q = ring.view();
    gv::DeviceQueueProxy proxy(q, e.pd0, e.cq0);
    proxy.add_window(1, e.src_mr);
    proxy.add_peer(0, e.qa, {{1, e.dst_mr.remote()}});
    std::atomic<bool> started{false};
    std::thread producer_thread([&] {
        while (!started.load(std::memory_order_acquire)) {
        }
        for (std::uint64_t i = 0; i < ops; ++i) {
            std::uint64_t position = 0;
            if (dq::push(q, put_of(i), dq::detail::now_ns() + 30'000'000'000ULL, position) != dq::WaitResult::done)
                std::abort();
        }
    });
    const auto start = Clock::now();
    started.store(true, std::memory_order_release);
    CALLGRIND_TOGGLE_COLLECT;
    while (proxy.counters().completed < ops && proxy.failure().empty()) proxy.progress();
    CALLGRIND_TOGGLE_COLLECT;
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    producer_thread.join();
    if (!proxy.failure().empty()) {
        std::fprintf(stderr, "proxy failed: %s\n", proxy.failure().c_str());
        std::exit(1);
    }
    counters = proxy.counters();
    return s;
}

/// The proxy on this thread alone: push what fits (not counted: the kernel's work), then one progress()
/// (counted). What callgrind measures per descriptor; two threads under valgrind, which runs one at a
/// time, would count the proxy's spinning while the producer waits for its turn.
double proxy_single(Ends& e, std::uint64_t ops, gv::DeviceQueueProxyCounters& counters) {
    const gv::DeviceQueue ring = gv::DeviceQueue::on_host(10); // zeroed, on the proxy's words' alignment
    const dq::QueueView q = ring.view();
    gv::DeviceQueueProxy proxy(q, e.pd0, e.cq0);
    proxy.add_window(1, e.src_mr);
    proxy.add_peer(0, e.qa, {{1, e.dst_mr.remote()}});
    std::uint64_t pushed = 0;
    const auto start = Clock::now();
    while (proxy.counters().completed < ops && proxy.failure().empty()) {
        while (pushed < ops && pushed < proxy.counters().completed + q.capacity()) {
            std::uint64_t position = 0;
            if (dq::push(q, put_of(pushed), dq::detail::now_ns() + 30'000'000'000ULL, position) != dq::WaitResult::done)
                std::abort();
            ++pushed;
        }
        CALLGRIND_TOGGLE_COLLECT;
        proxy.progress();
        CALLGRIND_TOGGLE_COLLECT;
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (!proxy.failure().empty()) {
        std::fprintf(stderr, "proxy failed: %s\n", proxy.failure().c_str());
        std::exit(1);
    }
    counters = proxy.counters();
    return s;
}

} // namespace

int main(int argc, char** argv) {
    const char* d0 = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe): before any thread
    const char* d1 = std::getenv("GPUVERBS_TEST_DEV1"); // NOLINT(concurrency-mt-unsafe): before any thread
    if (argc < 2 || d0 == nullptr || d1 == nullptr) {
        std::fprintf(stderr, "usage (in the rig): %s loop|proxy [--ops N]\n", argv[0]);
        return 2;
    }
    const std::string form = argv[1];
    std::uint64_t ops = 100000;
    for (int i = 2; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--ops") == 0) ops = std::strtoull(argv[i + 1], nullptr, 10);
    Ends e(d0, d1);
    if (form == "loop") {
        const double s = host_loop(e, ops);
        std::printf("loop: %llu puts in %.3f s (%.0f puts/s)\n", static_cast<unsigned long long>(ops), s, ops / s);
    } else if (form == "proxy") {
        gv::DeviceQueueProxyCounters c;
        const double s = through_proxy(e, ops, c);
        std::printf(
            "proxy: %llu puts in %.3f s (%.0f puts/s); %llu chains, %.1f descriptors per chain, %llu passes "
            "found the send queue full\n",
            static_cast<unsigned long long>(ops), s, ops / s, static_cast<unsigned long long>(c.chains),
            static_cast<double>(c.descriptors) / static_cast<double>(c.chains),
            static_cast<unsigned long long>(c.queue_full));
    } else if (form == "proxy_single") {
        gv::DeviceQueueProxyCounters c;
        const double s = proxy_single(e, ops, c);
        std::printf("proxy_single: %llu puts in %.3f s (%.0f puts/s); %llu chains, %llu passes (%llu idle)\n",
                    static_cast<unsigned long long>(ops), s, ops / s, static_cast<unsigned long long>(c.chains),
                    static_cast<unsigned long long>(c.passes), static_cast<unsigned long long>(c.idle_passes));
    } else {
        std::fprintf(stderr, "unknown form %s\n", form.c_str());
        return 2;
    }
    return 0;
}
