// The device queue's NIC half on real RDMA (issue 37): a CPU thread pushes
// through the same ring header a kernel uses (ring.hpp), the proxy drains it
// onto a queue pair on rxe, and the peer's memory is checked byte for byte.
// Faults: the peer's queue pair destroyed mid-stream, and a request naming a
// window nobody registered — the producer's wait ends with the right code
// within the proxy's bound.
#include "gpuverbs/device_queue/proxy.hpp"

#include "host_ring.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace gpuverbs::test {

namespace {

namespace dq = device_queue;
using namespace std::chrono_literals;

constexpr std::size_t block = 1024;
constexpr std::size_t blocks = 2048; // twice the ring's 1024 slots: it wraps
constexpr std::size_t signals_at = blocks * block;

std::byte pattern(std::size_t i) {
    return static_cast<std::byte>((i * 131 + (i >> 10) * 7 + 3) & 0xff);
}

QueuePairOptions proxy_qp_options() {
    QueuePairOptions o;
    o.max_send_wr = 256;
    o.max_inline_data = 64;
    return o;
}

/// The proxy on a thread of its own until stopped.
class ProxyThread {
public:
    explicit ProxyThread(DeviceQueueProxy& proxy)
        : thread_([this, &proxy] {
              while (!stop_.load(std::memory_order_relaxed)) proxy.progress();
          }) {}
    ProxyThread(const ProxyThread&) = delete;
    ProxyThread& operator=(const ProxyThread&) = delete;
    ~ProxyThread() {
        stop_ = true;
        thread_.join();
    }

private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

/// A ring and a proxy draining it onto side a's queue pair, towards side b's
/// blocks (window 1): the set-up of the fault tests.
struct ProxiedRing {
    ProxiedRing(Pair& pair, std::uint32_t log2_capacity, std::chrono::milliseconds request_timeout)
        : ring(log2_capacity), proxy(ring.view, pair.a.pd, pair.a.cq, options(request_timeout)) {
        proxy.add_window(1, pair.a.mr);
        proxy.add_peer(0, pair.a.qp, {{1, pair.b.mr.remote(0, signals_at)}});
    }
    static DeviceQueueProxyOptions options(std::chrono::milliseconds request_timeout) {
        DeviceQueueProxyOptions o;
        o.request_timeout = request_timeout;
        return o;
    }
    HostRing ring;
    DeviceQueueProxy proxy;
};

dq::Request put(std::uint64_t i) {
    dq::Request r;
    r.op = dq::Op::put;
    r.peer = 0;
    r.src_window = 1;
    r.src_offset = ((i * 7) % blocks) * block; // scattered sources
    r.dst_window = 1;
    r.dst_offset = i * block;
    r.bytes = block;
    return r;
}

} // namespace

TEST_SUITE("device queue proxy on real RDMA") {
    TEST_CASE("a CPU producer's puts and signals land on the peer through the proxy, every byte checked") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        for (std::size_t i = 0; i < pair.a.memory.size(); ++i) pair.a.memory[i] = pattern(i);
        HostRing ring(10);
        DeviceQueueProxy proxy(ring.view, pair.a.pd, pair.a.cq);
        proxy.add_window(1, pair.a.mr);
        proxy.add_peer(0, pair.a.qp, {{1, pair.b.mr.remote(0, signals_at)}, {2, pair.b.mr.remote(signals_at, 4096)}});
        std::uint64_t position = 0;
        {
            ProxyThread running(proxy);
            for (std::uint64_t i = 0; i + 1 < blocks; ++i) {
                REQUIRE(dq::push(ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
            }
            dq::Request last = put(blocks - 1);
            last.op = dq::Op::put_signal;
            last.signal_window = 2;
            last.signal_offset = 0;
            last.signal_value = 5;
            last.signal_op = dq::SignalOp::add;
            REQUIRE(dq::push(ring.view, last, ring_deadline(30s), position) == dq::WaitResult::done);
            dq::Request set;
            set.op = dq::Op::signal;
            set.signal_window = 2;
            set.signal_offset = 8;
            set.signal_value = 0xabcdef;
            set.signal_op = dq::SignalOp::set;
            REQUIRE(dq::push(ring.view, set, ring_deadline(30s), position) == dq::WaitResult::done);
            CHECK(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::done);
            auto* signal = reinterpret_cast<std::uint64_t*>(pair.b.memory.data() + signals_at);
            CHECK(dq::wait_signal(ring.view, signal, 5, ring_deadline(10s)) == dq::WaitResult::done);
            CHECK(dq::wait_signal(ring.view, signal + 1, 0xabcdef, ring_deadline(10s)) == dq::WaitResult::done);
        }
        INFO("proxy: " << proxy.failure());
        CHECK(proxy.failure().empty());
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < blocks; ++i) {
            const std::size_t src = ((i * 7) % blocks) * block;
            if (std::memcmp(pair.b.memory.data() + i * block, pair.a.memory.data() + src, block) != 0) ++wrong;
        }
        CHECK(wrong == 0);
        const DeviceQueueProxyCounters& c = proxy.counters();
        CHECK(c.descriptors == blocks + 1);
        CHECK(c.completed == blocks + 1);
        CHECK(c.requests == blocks + 2); // the put_signal is two
        CHECK(c.chains >= 1);
        CHECK(c.chains <= c.descriptors);
        MESSAGE(c.descriptors << " descriptors in " << c.chains << " chains (doorbells); " << c.queue_full
                              << " passes found the send queue full");
    }

    TEST_CASE(
        "the peer's queue pair destroyed mid-stream ends the producer's quiet with peer failed within the bound") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        ProxiedRing rig(pair, 10, 1000ms);
        HostRing& ring = rig.ring;
        DeviceQueueProxy& proxy = rig.proxy;
        ProxyThread running(proxy);
        std::uint64_t position = 0;
        for (std::uint64_t i = 0; i < 64; ++i) {
            REQUIRE(dq::push(ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
        }
        REQUIRE(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::done);
        pair.b.qp = QueuePair(); // the peer's end is gone
        const auto start = std::chrono::steady_clock::now();
        dq::WaitResult last = dq::WaitResult::done;
        for (std::uint64_t i = 64; i < blocks && last == dq::WaitResult::done; ++i) {
            last = dq::push(ring.view, put(i), ring_deadline(30s), position);
        }
        const dq::WaitResult quiet = dq::quiet(ring.view, ring_deadline(30s));
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(quiet == dq::WaitResult::peer_failed);
        CHECK((last == dq::WaitResult::done || last == dq::WaitResult::peer_failed));
        // The bound: the proxy's request timeout (1 s), or the transport's retries if they end first, plus a pass.
        CHECK(took < 15s);
        INFO("proxy: " << proxy.failure());
        CHECK(!proxy.failure().empty());
        MESSAGE("peer gone: quiet ended peer_failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms; " << proxy.failure());
    }

    TEST_CASE("a peer gone where the provider never completes the requests: the proxy's own bound ends the wait") {
        // rxe with retry_count 7 retries forever (../shared/SOFTROCE.md): no completion ever comes, so the
        // only bound is the proxy's request_timeout.
        ConnectOptions forever;
        forever.retry_count = 7;
        Pair pair(signals_at + 4096, proxy_qp_options(), forever);
        ProxiedRing rig(pair, 10, 1000ms);
        HostRing& ring = rig.ring;
        DeviceQueueProxy& proxy = rig.proxy;
        ProxyThread running(proxy);
        pair.b.qp = QueuePair();
        std::uint64_t position = 0;
        for (std::uint64_t i = 0; i < 16; ++i) {
            REQUIRE(dq::push(ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
        }
        const auto start = std::chrono::steady_clock::now();
        CHECK(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::peer_failed);
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(took >= 900ms); // not before the request's timeout (it started when the request was posted)
        CHECK(took < 5s);     // the timeout, one pass, and the wait noticing the error word
        CHECK(proxy.failure().find("did not complete within 1000 ms: the peer or the link is gone") !=
              std::string::npos);
        // The queue pair was moved to error: its requests flushed, nothing is left retrying.
        CHECK(pair.a.qp.failure().has_value());
        MESSAGE("provider silent: quiet ended peer_failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
    }

    TEST_CASE("a request naming a window nobody registered is refused in words, ending the producer's waits refused") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        std::uint64_t position = 0;
        {
            ProxiedRing rig(pair, 6, DeviceQueueProxyOptions{}.request_timeout);
            HostRing& ring = rig.ring;
            DeviceQueueProxy& proxy = rig.proxy;
            ProxyThread running(proxy);
            dq::Request bad = put(0);
            bad.src_window = 9;
            REQUIRE(dq::push(ring.view, bad, ring_deadline(30s), position) == dq::WaitResult::done);
            CHECK(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::refused);
            CHECK(proxy.failure().find(
                      "a put names a window it has not, or a range outside it (peer 0, source window 9") !=
                  std::string::npos);
        }
        // A peer nobody added, on a fresh queue (one proxy polls the CQ at a time).
        HostRing other(6);
        DeviceQueueProxy second(other.view, pair.a.pd, pair.a.cq);
        dq::Request nobody = put(0);
        nobody.peer = 3;
        REQUIRE(dq::push(other.view, nobody, ring_deadline(30s), position) == dq::WaitResult::done);
        second.progress();
        CHECK(dq::quiet(other.view, ring_deadline(1s)) == dq::WaitResult::refused);
        CHECK(second.failure().find("a request names peer 3, which has no queue pair") != std::string::npos);
    }

    TEST_CASE("a closed proxy ends every wait queue closed") {
        Pair pair(4096, proxy_qp_options());
        HostRing ring(4);
        std::uint64_t signal = 0;
        { DeviceQueueProxy proxy(ring.view, pair.a.pd, pair.a.cq); } // destroyed: closed
        CHECK(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::queue_closed);
        CHECK(dq::wait_signal(ring.view, &signal, 1, ring_deadline(30s)) == dq::WaitResult::queue_closed);
    }
}

} // namespace gpuverbs::test
