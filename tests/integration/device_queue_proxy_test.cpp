// The device queue's NIC half on real RDMA (issue 37): a CPU thread pushes
// through the same ring header a kernel uses (ring.hpp), the proxy drains it
// onto queue pairs on rxe, and the peer's memory is checked byte for byte.
// Faults: the peer's queue pair destroyed mid-stream, a provider that never
// completes, a request naming a window nobody registered — the producer's
// wait ends with the right code within the proxy's bound — and, over the
// rig's two wires, a rail struck mid-stream (queue pair destroyed, link down,
// every packet dropped), whose requests move to the other rail without the
// producer noticing.
#include "gpuverbs/device_queue/drive.hpp"
#include "gpuverbs/device_queue/proxy.hpp"

#include "build_has.hpp"
#include "child_process.hpp"
#include "host_ring.hpp"
#include "prometheus_parse.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"
#include "rig_rails.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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

/// One wire of the rig with no executor (the proxy polls its CQs): a queue
/// pair on each side, each side's memory registered on its device.
struct ProxyWire {
    Device d0, d1;
    ProtectionDomain pd0, pd1;
    CompletionQueue cq0, cq1;
    MemoryRegion mr0, mr1;
    QueuePair qp0, qp1;
    ProxyWire(const char* a, const char* b, std::span<std::byte> m0, std::span<std::byte> m1,
              const ConnectOptions& connect)
        : d0(Device::open(a)),
          d1(Device::open(b)),
          pd0(d0),
          pd1(d1),
          cq0(d0, 1024),
          cq1(d1, 1024),
          mr0(pd0, m0, Access::local_write | Access::remote_write | Access::remote_atomic),
          mr1(pd1, m1, Access::local_write | Access::remote_write | Access::remote_atomic) {
        PreparedQueuePair a0(pd0, cq0, cq0, proxy_qp_options()), b1(pd1, cq1, cq1, proxy_qp_options());
        std::tie(qp0, qp1) = connect_advertised(a0, mr0, b1, mr1, connect);
    }
    RemoteWindows windows() const { return {{1, mr1.remote(0, signals_at)}, {2, mr1.remote(signals_at, 4096)}}; }
};

/// What strikes the rail that carries the requests, once they flow.
enum class RailStrike {
    queue_pair, ///< the peer's queue pair on it is destroyed
    link,       ///< its link goes down (setup-rxe rail-down: the rxe2 wire)
    silence,    ///< every packet on it is dropped, and the provider retries forever (drop-on: the rxe0 wire)
    both_links, ///< both wires' links go down: no rail is left
};

/// Two rails to one peer: the wire the strike hits carries the requests first
/// (rail 0), the other takes over (rail 1).
struct TwoRails {
    std::vector<std::byte> m0, m1;
    ProxyWire rxe0_wire, rxe2_wire;
    ProxyWire& first;
    ProxyWire& second;
    HostRing ring;
    DeviceQueueProxy proxy;
    TwoRails(RailStrike strike, std::chrono::milliseconds request_timeout, const ConnectOptions& connect)
        : m0(signals_at + 4096),
          m1(signals_at + 4096),
          rxe0_wire("rxe0", "rxe1", m0, m1, connect),
          rxe2_wire("rxe2", "rxe3", m0, m1, connect),
          first(strike == RailStrike::link ? rxe2_wire : rxe0_wire),
          second(strike == RailStrike::link ? rxe0_wire : rxe2_wire),
          ring(10),
          proxy(ring.view, first.pd0, first.cq0, ProxiedRing::options(request_timeout)) {
        for (std::size_t i = 0; i < m0.size(); ++i) m0[i] = pattern(i);
        proxy.add_device(second.pd0, second.cq0);
        proxy.add_window(1, first.mr0);
        proxy.add_window(1, second.mr0);
        proxy.add_peer(0, first.qp0, first.windows());
        proxy.add_rail(0, second.qp0, second.windows());
    }
    [[nodiscard]] std::size_t wrong(std::size_t puts) const {
        std::size_t n = 0;
        for (std::size_t i = 0; i < puts; ++i) {
            const std::size_t src = ((i * 7) % blocks) * block;
            if (std::memcmp(m1.data() + i * block, m0.data() + src, block) != 0) ++n;
        }
        return n;
    }
    [[nodiscard]] std::uint64_t* signal_word(std::size_t k) {
        return reinterpret_cast<std::uint64_t*>(m1.data() + signals_at) + k;
    }
};

/// Strikes `r`'s first rail as `strike` says; the guards heal it.
void strike_rail(TwoRails& r, RailStrike strike, std::vector<std::unique_ptr<Heal>>& heals) {
    switch (strike) {
        case RailStrike::queue_pair: r.first.qp1 = QueuePair(); break;
        case RailStrike::link:
            heals.push_back(std::make_unique<Heal>("rail-up"));
            REQUIRE(fault("rail-down") == 0);
            break;
        case RailStrike::silence:
            heals.push_back(std::make_unique<Heal>("drop-off"));
            REQUIRE(fault("drop-on") == 0);
            break;
        case RailStrike::both_links:
            heals.push_back(std::make_unique<Heal>("rail-up"));
            heals.push_back(std::make_unique<Heal>("link-up"));
            REQUIRE(fault("rail-down") == 0);
            REQUIRE(fault("link-down") == 0);
            break;
    }
}

dq::Request set_signal(std::uint64_t word, std::uint64_t value) {
    dq::Request r;
    r.op = dq::Op::signal;
    r.signal_window = 2;
    r.signal_offset = word * 8;
    r.signal_value = value;
    r.signal_op = dq::SignalOp::set;
    return r;
}

const char* strike_name(RailStrike s) {
    switch (s) {
        case RailStrike::queue_pair: return "the peer's queue pair destroyed";
        case RailStrike::link: return "its link down";
        case RailStrike::silence: return "every packet dropped, the provider retrying forever";
        case RailStrike::both_links: return "both links down";
    }
    return "?";
}

/// The proxy's Prometheus text, read by the Prometheus client's own parser,
/// says what its counters and rails() say.
void check_metrics(const DeviceQueueProxy& proxy) {
    PrometheusText metrics;
    metrics.add("gpu0", proxy);
    const std::string text = metrics.text();
    const ParsedMetrics parsed = parse_prometheus(text);
    REQUIRE_MESSAGE(parsed.error.empty(), parsed.error << "\n" << text);
    auto at = [&](const std::string& key) {
        auto it = parsed.samples.find(key);
        if (it == parsed.samples.end()) FAIL_CHECK("no sample " << key);
        return it == parsed.samples.end() ? -1.0 : it->second;
    };
    const DeviceQueueProxyCounters& c = proxy.counters();
    const std::uint64_t chains_of_one = c.chain_lengths[0];
    const std::pair<const char*, double> samples[] = {
        {R"(gpuverbs_device_queue_descriptors_total{queue="gpu0"})", static_cast<double>(c.descriptors)},
        {R"(gpuverbs_device_queue_completed_total{queue="gpu0"})", static_cast<double>(c.completed)},
        {R"(gpuverbs_device_queue_doorbells_total{queue="gpu0"})", static_cast<double>(c.chains)},
        {R"(gpuverbs_device_queue_rail_failures_total{queue="gpu0"})", 1},
        {R"(gpuverbs_device_queue_reposted_total{queue="gpu0"})", static_cast<double>(c.reposted)},
        {R"(gpuverbs_device_queue_failed{queue="gpu0"})", 0},
        {R"(gpuverbs_device_queue_chain_descriptors_bucket{le="1",queue="gpu0"})", static_cast<double>(chains_of_one)},
        {R"(gpuverbs_device_queue_chain_descriptors_count{queue="gpu0"})", static_cast<double>(c.chains)},
        {R"(gpuverbs_device_queue_chain_descriptors_sum{queue="gpu0"})", static_cast<double>(c.chained)},
        {R"(gpuverbs_device_queue_rail_up{peer="0",queue="gpu0",rail="0"})", 0},
        {R"(gpuverbs_device_queue_rail_up{peer="0",queue="gpu0",rail="1"})", 1},
        {R"(gpuverbs_device_queue_rail_active{peer="0",queue="gpu0",rail="1"})", 1},
    };
    for (const auto& [key, value] : samples) {
        CAPTURE(key);
        CHECK(at(key) == value);
    }
    CHECK(at(R"(gpuverbs_device_queue_completion_seconds_count{queue="gpu0"})") > 0);
    CHECK(c.chained >= c.descriptors); // every descriptor went in a chain (no fences here), some twice
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

    TEST_CASE("a push that gave up leaves no hole: the proxy skips its position and every other request lands") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        for (std::size_t i = 0; i < pair.a.memory.size(); ++i) pair.a.memory[i] = pattern(i);
        HostRing ring(4); // 16 slots
        DeviceQueueProxy proxy(ring.view, pair.a.pd, pair.a.cq);
        proxy.add_window(1, pair.a.mr);
        proxy.add_peer(0, pair.a.qp, {{1, pair.b.mr.remote(0, signals_at)}});
        std::uint64_t position = 0;
        // The proxy not running: 16 pushes fill the ring, the 17th gives up at its deadline.
        for (std::uint64_t i = 0; i < 16; ++i) {
            REQUIRE(dq::push(ring.view, put(i), ring_deadline(1s), position) == dq::WaitResult::done);
        }
        CHECK(dq::push(ring.view, put(16), ring_deadline(20ms), position) == dq::WaitResult::timed_out);
        {
            ProxyThread running(proxy);
            // The proxy takes the 16, skips position 16 and returns its credit with theirs: more pushes go.
            for (std::uint64_t i = 16; i < 32; ++i) {
                REQUIRE(dq::push(ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
            }
            CHECK(position == 32);
            CHECK(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::done);
        }
        INFO("proxy: " << proxy.failure());
        CHECK(proxy.failure().empty());
        const DeviceQueueProxyCounters& c = proxy.counters();
        CHECK(c.skipped == 1);
        CHECK(c.descriptors == 32);
        CHECK(c.completed == 33); // the skipped position's credit too
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < 32; ++i) {
            const std::size_t src = ((i * 7) % blocks) * block;
            if (std::memcmp(pair.b.memory.data() + i * block, pair.a.memory.data() + src, block) != 0) ++wrong;
        }
        CHECK(wrong == 0);
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

    TEST_CASE("a rail struck mid-stream: its requests move to the other rail and the producer never notices") {
        const auto wire = second_wire();
        if (!wire) return;
        for (const RailStrike strike : {RailStrike::queue_pair, RailStrike::link, RailStrike::silence}) {
            const std::string struck = strike_name(strike);
            CAPTURE(struck);
            // Silence: rxe retries forever with retry_count 7, so only the proxy's own bound ends the rail.
            ConnectOptions connect;
            if (strike == RailStrike::silence) connect.retry_count = 7;
            // 2 s: the healthy rail's requests, posted again at once, must not time out as well on a loaded
            // machine (CI's run of the rig beside the sanitizer builds; with 1 s a push once found the ring full).
            TwoRails r(strike, 2000ms, connect);
            std::vector<std::unique_ptr<Heal>> heals;
            std::uint64_t position = 0;
            std::chrono::steady_clock::duration took{};
            {
                ProxyThread running(r.proxy);
                // Read only when a check below fails (a push that did not end `done` says why here).
                INFO("proxy (on failure): " << r.proxy.failure() << "; rail failures "
                                            << r.proxy.counters().rail_failures);
                for (std::uint64_t i = 0; i < 256; ++i) {
                    REQUIRE(dq::push(r.ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
                }
                REQUIRE(dq::push(r.ring.view, set_signal(0, 256), ring_deadline(30s), position) ==
                        dq::WaitResult::done);
                strike_rail(r, strike, heals);
                const auto start = std::chrono::steady_clock::now();
                // The rest, each 256 followed by a signal that sets how many have landed.
                for (std::uint64_t i = 256; i < blocks; ++i) {
                    REQUIRE(dq::push(r.ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
                    if ((i + 1) % 256 == 0) {
                        REQUIRE(dq::push(r.ring.view, set_signal(0, i + 1), ring_deadline(30s), position) ==
                                dq::WaitResult::done);
                    }
                }
                CHECK(dq::quiet(r.ring.view, ring_deadline(30s)) == dq::WaitResult::done);
                took = std::chrono::steady_clock::now() - start;
                CHECK(dq::wait_signal(r.ring.view, r.signal_word(0), blocks, ring_deadline(10s)) ==
                      dq::WaitResult::done);
            }
            INFO("proxy: " << r.proxy.failure());
            CHECK(r.proxy.failure().empty());
            CHECK(r.wrong(blocks) == 0);
            const DeviceQueueProxyCounters& c = r.proxy.counters();
            CHECK(c.rail_failures == 1);
            CHECK(c.reposted > 0);
            CHECK(c.completed == c.descriptors);
            const std::vector<DeviceQueueRailState> rails = r.proxy.rails();
            REQUIRE(rails.size() == 2);
            CHECK(rails[0].failed);
            CHECK_FALSE(rails[0].active);
            CHECK(rails[1].active);
            CHECK_FALSE(rails[1].failed);
            CHECK(r.first.qp0.failure().has_value()); // moved to error: nothing left retrying on it
            check_metrics(r.proxy);
            if (strike == RailStrike::silence) {
                CHECK(rails[0].failure.find("did not complete within 2000 ms") != std::string::npos);
            }
            // The bound: the transport's retries (about half a second) or the proxy's 2 s, then the rest.
            CHECK(took < 20s);
            MESSAGE(std::string(strike_name(strike))
                    << ": " << c.reposted << " descriptors posted again on rail 1, the last " << blocks
                    << " puts quiet after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                    << " ms; rail 0: " << rails[0].failure);
        }
    }

    TEST_CASE("every rail struck: the producer's quiet ends peer failed within the bound, naming each rail") {
        const auto wire = second_wire();
        if (!wire) return;
        TwoRails r(RailStrike::both_links, 1000ms, ConnectOptions{});
        std::vector<std::unique_ptr<Heal>> heals;
        ProxyThread running(r.proxy);
        std::uint64_t position = 0;
        for (std::uint64_t i = 0; i < 64; ++i) {
            REQUIRE(dq::push(r.ring.view, put(i), ring_deadline(30s), position) == dq::WaitResult::done);
        }
        REQUIRE(dq::quiet(r.ring.view, ring_deadline(30s)) == dq::WaitResult::done);
        strike_rail(r, RailStrike::both_links, heals);
        const auto start = std::chrono::steady_clock::now();
        dq::WaitResult last = dq::WaitResult::done;
        for (std::uint64_t i = 64; i < blocks && last == dq::WaitResult::done; ++i) {
            last = dq::push(r.ring.view, put(i), ring_deadline(30s), position);
        }
        const dq::WaitResult quiet = dq::quiet(r.ring.view, ring_deadline(30s));
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(quiet == dq::WaitResult::peer_failed);
        CHECK((last == dq::WaitResult::done || last == dq::WaitResult::peer_failed));
        // Each rail: the transport's retries or the proxy's 1 s, one after the other.
        CHECK(took < 15s);
        INFO("proxy: " << r.proxy.failure());
        CHECK(r.proxy.failure().find("every rail to peer 0 failed: rail 0: ") != std::string::npos);
        CHECK(r.proxy.failure().find("; rail 1: ") != std::string::npos);
        CHECK(r.proxy.counters().rail_failures == 2);
        MESSAGE("both links down: quiet ended peer_failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms; " << r.proxy.failure());
    }

    TEST_CASE("a signal that adds, in flight on a failed rail, is not posted twice: peer failed, saying why") {
        const auto wire = second_wire();
        if (!wire) return;
        TwoRails r(RailStrike::queue_pair, 1000ms, ConnectOptions{});
        std::vector<std::unique_ptr<Heal>> heals;
        ProxyThread running(r.proxy);
        strike_rail(r, RailStrike::queue_pair, heals);
        std::uint64_t position = 0;
        dq::Request adds = put(0);
        adds.op = dq::Op::put_signal;
        adds.signal_window = 2;
        adds.signal_offset = 0;
        adds.signal_value = 1;
        adds.signal_op = dq::SignalOp::add;
        REQUIRE(dq::push(r.ring.view, adds, ring_deadline(30s), position) == dq::WaitResult::done);
        CHECK(dq::quiet(r.ring.view, ring_deadline(30s)) == dq::WaitResult::peer_failed);
        INFO("proxy: " << r.proxy.failure());
        CHECK(r.proxy.failure().find("a signal that adds was in flight on it (position 0): it may have landed or "
                                     "not, and posting it again could count it twice") != std::string::npos);
        CHECK(*r.signal_word(0) == 0); // the peer's queue pair was gone: it did not land
    }

    TEST_CASE("rails and windows the proxy cannot use are refused in words") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        Pair other(4096, proxy_qp_options());
        HostRing ring(4);
        DeviceQueueProxy proxy(ring.view, pair.a.pd, pair.a.cq);
        const std::error_code unknown_peer = thrown_code([&] { proxy.add_rail(0, pair.a.qp, {}); });
        CHECK(unknown_peer == errc::invalid_argument);
        try {
            proxy.add_rail(0, pair.a.qp, {});
        } catch (const Error& e) {
            CHECK(e.detail() == "peer 0 was not added: add_peer() gives its first rail");
        }
        try {
            proxy.add_window(1, other.a.mr);
            FAIL("a window of another protection domain was taken");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(e.detail() ==
                  "window 1 is registered in a protection domain the proxy has not: give its device "
                  "to the constructor or to add_device() first");
        }
        try {
            proxy.add_peer(0, other.a.qp, {});
            FAIL("a queue pair of another protection domain was taken");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(e.detail().find("the queue pair's protection domain is not one the proxy has") == 0);
        }
        // Given its device, both are taken.
        proxy.add_device(other.a.pd, other.a.cq);
        proxy.add_window(1, other.a.mr);
        proxy.add_peer(0, other.a.qp, {});
        CHECK(proxy.rails().size() == 1);
        try {
            proxy.add_peer(0, pair.a.qp, {});
            FAIL("a peer was added twice");
        } catch (const Error& e) {
            CHECK(e.detail() == "peer 0 was added before: add_rail() gives it another rail");
        }
        proxy.add_rail(0, pair.a.qp, {});
        CHECK(proxy.rails().size() == 2);
    }

    TEST_CASE(
        "the error_code forms refuse with the throwing form's code and words, throw nothing, and leave the "
        "proxy usable") {
        Pair pair(signals_at + 4096, proxy_qp_options());
        Pair other(4096, proxy_qp_options());
        HostRing ring(4);
        std::error_code ec = errc::unsupported; // a success clears it
        Diagnostics why;
        DeviceQueueProxy proxy = DeviceQueueProxy::create(ring.view, pair.a.pd, pair.a.cq, {}, ec, why);
        REQUIRE_FALSE(ec);
        CHECK(static_cast<bool>(proxy));
        proxy.add_rail(0, pair.a.qp, {}, ec, why);
        CHECK(ec == errc::invalid_argument);
        CHECK(why.verb() == "DeviceQueueProxy::add_rail");
        CHECK(why.detail() == "peer 0 was not added: add_peer() gives its first rail");
        proxy.add_window(1, other.a.mr, ec);
        CHECK(ec == errc::invalid_argument);
        proxy.add_peer(0, other.a.qp, {}, ec, why);
        CHECK(ec == errc::invalid_argument);
        CHECK(why.detail().find("the queue pair's protection domain is not one the proxy has") == 0);
        CHECK(proxy.rails().empty()); // nothing half-added
        // Then what it can use is taken, by the same forms.
        proxy.add_device(other.a.pd, other.a.cq, ec, why);
        CHECK_FALSE(ec);
        CHECK(why.message().empty());
        proxy.add_window(1, other.a.mr, ec);
        CHECK_FALSE(ec);
        proxy.add_peer(0, other.a.qp, {}, ec);
        CHECK_FALSE(ec);
        proxy.add_peer(0, pair.a.qp, {}, ec, why);
        CHECK(ec == errc::invalid_argument);
        CHECK(why.detail() == "peer 0 was added before: add_rail() gives it another rail");
        proxy.add_rail(0, pair.a.qp, {}, ec);
        CHECK_FALSE(ec);
        CHECK(proxy.rails().size() == 2);
        // Moved, the proxy keeps the queue; the one moved from is empty and closes nothing.
        DeviceQueueProxy moved(std::move(proxy));
        CHECK(static_cast<bool>(moved));
        CHECK_FALSE(static_cast<bool>(proxy)); // NOLINT(bugprone-use-after-move): what a moved-from proxy is
        CHECK(moved.rails().size() == 2);
    }

    TEST_CASE(
        "the proxy driven by an io_context: puts land; a cancellation closes the queue, a failure ends the "
        "drive with its code") {
        namespace asio = boost::asio;
        Pair pair(signals_at + 4096, proxy_qp_options());
        for (std::size_t i = 0; i < pair.a.memory.size(); ++i) pair.a.memory[i] = pattern(i);
        ProxiedRing rig(pair, 8, 1000ms);
        asio::io_context io(1);
        std::optional<async_error_code> ended;
        asio::cancellation_signal cancel;
        DeviceQueueDriveOptions o;
        o.idle_passes_before_nap = 16; // naps between the producer's bursts, too
        async_drive(rig.proxy, io.get_executor(), o,
                    asio::bind_cancellation_slot(cancel.slot(), [&](async_error_code ec) { ended = ec; }));
        std::atomic<bool> produced{false};
        dq::WaitResult quiet = dq::WaitResult::timed_out;
        std::thread producer([&] {
            std::uint64_t position = 0;
            for (std::uint64_t i = 0; i < 1024; ++i) {
                if (dq::push(rig.ring.view, put(i), ring_deadline(30s), position) != dq::WaitResult::done) break;
                if (i % 100 == 0) std::this_thread::sleep_for(1ms); // idle gaps: the drive naps
            }
            quiet = dq::quiet(rig.ring.view, ring_deadline(30s));
            produced = true;
        });
        while (!produced) io.run_for(10ms);
        producer.join();
        CHECK(quiet == dq::WaitResult::done);
        CHECK_FALSE(ended.has_value());
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < 1024; ++i) {
            const std::size_t src = ((i * 7) % blocks) * block;
            if (std::memcmp(pair.b.memory.data() + i * block, pair.a.memory.data() + src, block) != 0) ++wrong;
        }
        CHECK(wrong == 0);
        CHECK(rig.proxy.counters().completed == 1024);
        CHECK(rig.proxy.counters().idle_passes > 0);
        // Cancelled: the drive ends operation_aborted and closes the queue.
        cancel.emit(asio::cancellation_type::terminal);
        io.restart();
        for (int k = 0; k < 100 && !ended; ++k) io.run_for(10ms);
        REQUIRE(ended.has_value());
        CHECK(*ended == asio::error::operation_aborted);
        CHECK(rig.proxy.error() == dq::QueueError::closed);
        // A request pushed now is never taken: its quiet ends queue_closed (the push itself reads the error
        // word only when the ring looks full).
        std::uint64_t late = 0;
        const dq::WaitResult pushed = dq::push(rig.ring.view, put(0), ring_deadline(1s), late);
        CHECK((pushed == dq::WaitResult::done || pushed == dq::WaitResult::queue_closed));
        CHECK(dq::quiet(rig.ring.view, ring_deadline(1s)) == dq::WaitResult::queue_closed);

        // A failure: the peer's queue pair gone; the drive ends with device_queue_failed.
        Pair broken(signals_at + 4096, proxy_qp_options());
        ProxiedRing second(broken, 8, 1000ms);
        broken.b.qp = QueuePair();
        ended.reset();
        async_drive(second.proxy, io.get_executor(), {}, [&](async_error_code ec) { ended = ec; });
        std::uint64_t position = 0;
        REQUIRE(dq::push(second.ring.view, put(0), ring_deadline(30s), position) == dq::WaitResult::done);
        io.restart();
        const auto start = std::chrono::steady_clock::now();
        for (int k = 0; k < 1000 && !ended; ++k) io.run_for(10ms);
        REQUIRE(ended.has_value());
        CHECK(std::error_code(*ended) == errc::device_queue_failed);
        CHECK(second.proxy.error() == dq::QueueError::peer_failed);
        CHECK(std::chrono::steady_clock::now() - start < 5s);
        CHECK(dq::quiet(second.ring.view, ring_deadline(1s)) == dq::WaitResult::peer_failed);
        MESSAGE("the drive ended: " << ended->message() << "; " << second.proxy.failure());
    }

    TEST_CASE("the peer's process killed mid-stream: the producer's quiet ends peer failed within the bound" *
              doctest::skip(!build_has::examples)) {
        // The peer is example 07's server, a process of its own: its blocks and signal word behind one region.
        const auto rig = rig_devices();
        REQUIRE(rig.has_value());
        const std::string log = "/tmp/gpuverbs-dq-peer.log";
        ChildProcess server({example_binary("07_gpu_initiated_put"), "server", "--device", rig->dev1, "--port", "18531",
                             "--blocks", "256", "--block-size", "1024"},
                            ChildProcess::Output{log});
        boost::asio::io_context io;
        Device device = Device::open(rig->dev0);
        ProtectionDomain pd(device);
        CompletionQueue cq(device, 1024);
        std::vector<std::byte> source(blocks * block);
        for (std::size_t i = 0; i < source.size(); ++i) source[i] = pattern(i);
        MemoryRegion mr(pd, source, Access::local_write);
        PreparedQueuePair prepared(pd, cq, cq, proxy_qp_options());
        auto socket = tcp_connect(io, rig->ip1, 18531, std::chrono::seconds(20));
        const Handshake peer = exchange_handshake(socket, {prepared.endpoint(), {}});
        QueuePair qp = std::move(prepared).connect(peer.endpoint);
        REQUIRE(peer.regions.size() == 1);
        const RemoteMemory theirs = peer.regions[0];
        HostRing ring(10);
        DeviceQueueProxy proxy(ring.view, pd, cq, ProxiedRing::options(1000ms));
        proxy.add_window(1, mr);
        proxy.add_peer(0, qp, {{1, {theirs.address, 256 * 1024, theirs.rkey}}});
        ProxyThread running(proxy);
        std::uint64_t position = 0;
        for (std::uint64_t i = 0; i < 64; ++i) {
            dq::Request r = put(i);
            r.dst_offset = (i % 256) * block;
            REQUIRE(dq::push(ring.view, r, ring_deadline(30s), position) == dq::WaitResult::done);
        }
        REQUIRE(dq::quiet(ring.view, ring_deadline(30s)) == dq::WaitResult::done); // the peer is there
        server.kill(); // SIGKILL: its queue pair dies with it
        const auto start = std::chrono::steady_clock::now();
        dq::WaitResult last = dq::WaitResult::done;
        for (std::uint64_t i = 64; i < blocks && last == dq::WaitResult::done; ++i) {
            dq::Request r = put(i);
            r.dst_offset = (i % 256) * block;
            last = dq::push(ring.view, r, ring_deadline(30s), position);
        }
        const dq::WaitResult quiet = dq::quiet(ring.view, ring_deadline(30s));
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(quiet == dq::WaitResult::peer_failed);
        CHECK((last == dq::WaitResult::done || last == dq::WaitResult::peer_failed));
        CHECK(took < 15s); // the transport's retries or the proxy's 1 s, then a pass
        INFO("proxy: " << proxy.failure());
        CHECK(proxy.failure().find("every rail to peer 0 failed: rail 0: ") != std::string::npos);
        MESSAGE("peer process killed: quiet ended peer_failed after "
                << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms; " << proxy.failure());
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
