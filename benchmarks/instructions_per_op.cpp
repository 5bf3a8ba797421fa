// Instructions per RDMA write, counted by callgrind (repeatable, unlike time
// under QEMU). Run by benchmarks/instructions under
// valgrind --tool=callgrind --collect-atstart=no: only the data path is
// collected, never a wait.
//
//   instructions_per_op FORM [--ops N]        (inside the rig)
//
// Forms (64-byte RDMA writes from DEV0 to DEV1, one QP):
//   raw                 raw ibverbs: one WR per ibv_post_send, signaled, then ibv_poll_cq
//   raw_batched         raw ibverbs: 32 linked WRs per ibv_post_send, the last signaled, then one poll
//   sync                gpuverbs post_write + CompletionQueue::poll
//   batched             gpuverbs SendBatch of 32, the last signaled, + poll
//   raw_poll_one        as raw, each ibv_poll_cq asking for exactly one completion (as rdmapp polls)
//   sync_poll_one       as sync, each CompletionQueue::poll asking for exactly one
//   FORM_ex             raw, raw_batched, sync or batched on a queue pair made with the extended
//                       verbs (QueuePairOptions::extended_verbs): raw_ex posts with ibv_wr_start,
//                       ibv_wr_rdma_write, ibv_wr_set_sge, ibv_wr_complete
//   callback            async_write with a callback, event-driven CQ, a dependent chain
//   coroutine           co_await async_write, event-driven CQ, a dependent chain
//   callback_adaptive   as callback, adaptive CQ (polls from the executor)
//   coroutine_adaptive  as coroutine, adaptive CQ
//   callback_pipelined  callbacks, event-driven, 32 writes in flight (each completion starts the next)
//   hand_callback       the same dependent chain written by hand with Asio, without gpuverbs' async
//                       layer (issue 49's fair anchor for the event-driven forms): the completion
//                       channel's fd watched by an asio::posix::stream_descriptor; per write one
//                       signaled ibv_post_send and async_wait(wait_read), then ibv_get_cq_event,
//                       ibv_ack_cq_events, ibv_req_notify_cq and ibv_poll_cq until empty; the
//                       handler posts the next write
//   hand_coroutine      the same with co_await of the wait in a loop
//   FORM_single         any async form above with AsyncOptions::single_threaded (no lock, no poll guard)
//   FORM_unsafe         … and an io_context made with BOOST_ASIO_CONCURRENCY_HINT_UNSAFE (Asio's own locks off)
//
// How waits are kept out of the counts:
// - raw, raw_batched, sync, batched: the CQ's event is armed before posting and
//   the wait for it (blocked in the kernel) is not collected;
// - event-driven forms: the wait is blocked in epoll_wait, in the kernel; the
//   user-space work around it (re-arming, the reactor, reading the event) is
//   the price of the form and is collected;
// - adaptive forms would otherwise count every empty poll of the spin: right
//   after each write is started (inside the initiation, through the `settled`
//   token adapter below) the benchmark stops collecting, waits until the write
//   has landed in the peer's memory and its completion has had time to reach
//   the CQ, and collects again. The driver's next poll then finds the
//   completion; the number of polls that found nothing is printed beside the
//   count (CompletionQueue::async_statistics) so the claim can be checked.
#include <gpuverbs/gpuverbs.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else // built without valgrind's headers: runs, but collects nothing
#define CALLGRIND_TOGGLE_COLLECT
#endif
#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace asio = boost::asio;
namespace gv = gpuverbs;

namespace {

constexpr std::size_t size = 64;
constexpr int batch_size = 32;

void collect() {
    CALLGRIND_TOGGLE_COLLECT;
}

struct Pair {
    gv::Device d0, d1;
    gv::ProtectionDomain pd0{d0}, pd1{d1};
    gv::CompletionChannel channel{d0};
    gv::CompletionQueue cq0, cq1;
    std::vector<std::byte> m0 = std::vector<std::byte>(4096), m1 = std::vector<std::byte>(4096);
    // m0 is only the source of the writes; m1 their target.
    gv::MemoryRegion mr0{pd0, m0, gv::Access::none}, mr1{pd1, m1, gv::Access::local_write | gv::Access::remote_write};
    gv::QueuePair qp, peer;

    template <class MakeCq>
    Pair(const char* dev0, const char* dev1, MakeCq make, bool extended = false)
        : d0(gv::Device::open(dev0)), d1(gv::Device::open(dev1)), cq0(make(d0, channel)), cq1(d1, 64) {
        gv::QueuePairOptions options;
        options.max_send_wr = 256;
        options.extended_verbs = extended;
        gv::PreparedQueuePair a(pd0, cq0, cq0, options), b(pd1, cq1, cq1);
        (void)b.advertise(mr1);
        auto ea = a.endpoint(), eb = b.endpoint();
        qp = std::move(a).connect(eb);
        peer = std::move(b).connect(ea);
    }
    // Arms the CQ's event before posting, so the wait after posting cannot miss it.
    void arm() const { (void)ibv_req_notify_cq(cq0.native_handle(), 0); }
    // Blocks in the kernel until the armed event fires (not collected).
    void wait() const {
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(channel.native_handle(), &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
    }

    // Each write carries a sequence number in its first 8 bytes; the peer's
    // copy shows when the write has landed.
    std::uint64_t sequence = 0;
    void stamp() { std::memcpy(m0.data(), &++sequence, sizeof sequence); }
    void wait_landed() const {
        for (;;) {
            std::uint64_t seen = 0;
            std::atomic_thread_fence(std::memory_order_acquire);
            std::memcpy(&seen, m1.data(), sizeof seen);
            if (seen == sequence) break;
            std::this_thread::yield();
        }
        // The requester's completion follows the responder's ACK.
        std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
};

// A completion token adapter: starts the operation with the inner token, then
// runs `after` (here: stop collecting, wait until the completion is in the
// CQ, collect again) before control returns to the driver.
template <class Inner, class After>
struct settled_t {
    Inner inner;
    After after;
};
template <class Inner, class After>
settled_t<Inner, After> settled(Inner inner, After after) {
    return {std::move(inner), std::move(after)};
}

} // namespace

template <class Inner, class After, class Signature>
struct boost::asio::async_result<settled_t<Inner, After>, Signature> {
    template <class Initiation, class RawToken, class... Args>
    static auto initiate(Initiation&& initiation, RawToken&& token, Args&&... args) {
        // The initiation moved in (a pointer or two): an awaitable runs it
        // when the co_await suspends, after the library function that made
        // it (async_write) has returned and its temporaries are gone — a
        // reference to it dangled there (found as a crash of coroutine_adaptive).
        return boost::asio::async_initiate<Inner, Signature>(
            [initiation = std::forward<Initiation>(initiation), after = token.after](auto&& handler,
                                                                                     auto&&... a) mutable {
                std::move(initiation)(std::forward<decltype(handler)>(handler), std::forward<decltype(a)>(a)...);
                after();
            },
            token.inner, std::forward<Args>(args)...);
    }
};

namespace {

// `Extended`: the raw forms post through ibv_wr_* (a template parameter, so
// the classic raw loop carries no test of it).
template <bool Extended>
int run_polled(Pair& p, const std::string& form, int ops) {
    ibv_qp* qp = p.qp.native_handle();
    ibv_cq* cq = p.cq0.native_handle();
    const gv::RemoteMemory dst = p.mr1.remote();
    const bool raw = form.starts_with("raw");
    constexpr bool extended = Extended;
    const std::string shape = extended ? form.substr(0, form.size() - 3) : form;
    const int poll_max = form.ends_with("_poll_one") ? 1 : 4;
    const int per_round = shape == "batched" || shape == "raw_batched" ? batch_size : 1;
    ibv_qp_ex* qpx = extended ? ibv_qp_to_qp_ex(qp) : nullptr;
    if (extended && !p.qp.uses_extended_verbs()) {
        std::fprintf(stderr, "%s: the provider has no extended verbs\n", form.c_str());
        std::exit(1);
    }
    // What a careful raw-ibverbs program writes: each field the request needs
    // set once (no zeroing of the whole ibv_send_wr), the same work gpuverbs does.
    std::array<ibv_sge, batch_size> sges;
    std::array<ibv_send_wr, batch_size> wrs;
    auto fill = [&](ibv_send_wr& wr, ibv_sge& sge, std::uint64_t id, ibv_send_wr* next, unsigned flags) {
        sge.addr = reinterpret_cast<std::uintptr_t>(p.m0.data());
        sge.length = static_cast<std::uint32_t>(size);
        sge.lkey = p.mr0.lkey();
        wr.wr_id = id;
        wr.next = next;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = flags;
        wr.wr.rdma.remote_addr = dst.address;
        wr.wr.rdma.rkey = dst.rkey;
    };
    // The same requests through ibv_wr_*: what a raw program on the extended verbs writes.
    auto raw_post_ex = [&](int n) {
        ibv_wr_start(qpx);
        for (int k = 0; k < n; ++k) {
            qpx->wr_id = static_cast<std::uint64_t>(k);
            qpx->wr_flags = k + 1 == n ? IBV_SEND_SIGNALED : 0;
            ibv_wr_rdma_write(qpx, dst.rkey, dst.address);
            ibv_wr_set_sge(qpx, p.mr0.lkey(), reinterpret_cast<std::uintptr_t>(p.m0.data()),
                           static_cast<std::uint32_t>(size));
        }
        if (ibv_wr_complete(qpx) != 0) std::abort();
    };
    auto raw_post = [&](int n) {
        if constexpr (Extended) return raw_post_ex(n);
        ibv_send_wr* bad = nullptr;
        if (n == 1) { // one request on the stack, as a plain loop writes it
            ibv_sge sge;
            ibv_send_wr wr;
            fill(wr, sge, 1, nullptr, IBV_SEND_SIGNALED);
            if (ibv_post_send(qp, &wr, &bad) != 0) std::abort();
            return;
        }
        for (int k = 0; k < n; ++k) {
            fill(wrs[k], sges[k], static_cast<std::uint64_t>(k), k + 1 < n ? &wrs[k + 1] : nullptr,
                 k + 1 == n ? IBV_SEND_SIGNALED : 0);
        }
        if (ibv_post_send(qp, wrs.data(), &bad) != 0) std::abort();
    };
    std::array<gv::Completion, 4> done;
    ibv_wc wc[4];
    auto round = [&](bool measured) {
        p.arm();
        if (measured) collect();
        if (raw) {
            raw_post(per_round);
        } else if (per_round == 1) {
            if (p.qp.post_write(p.mr0.slice(0, size), dst)) std::abort();
        } else {
            auto batch = p.qp.batch();
            for (int k = 0; k < per_round; ++k) {
                gv::SendOptions s;
                s.signaled = k + 1 == per_round; // selective signaling: one completion per batch
                if (batch.write(p.mr0.slice(0, size), dst, 0, s)) std::abort();
            }
            if (batch.post()) std::abort();
        }
        if (measured) collect();
        p.wait();
        if (measured) collect();
        if (raw) {
            if (ibv_poll_cq(cq, poll_max, wc) != 1 || wc[0].status != IBV_WC_SUCCESS) std::abort();
        } else {
            if (p.cq0.poll(std::span(done).first(static_cast<std::size_t>(poll_max))) != 1 || !done[0].ok())
                std::abort();
        }
        if (measured) collect();
    };
    for (int i = 0; i < 50; ++i) round(false); // warm-up: first-touch paths are not the steady state
    const int rounds = ops / per_round;
    for (int i = 0; i < rounds; ++i) round(true);
    std::printf("%s: %d operations\n", form.c_str(), rounds * per_round);
    return 0;
}

// The handler of the callback forms: a small copyable function object that
// allocates nothing (a std::function would allocate per copy).
struct Chain {
    Pair* p;
    int* left;
    int* completed;
    bool settle;
    void operator()(boost::system::error_code ec, std::size_t /*bytes*/) const {
        if (ec) {
            std::fprintf(stderr, "write failed: %s\n", ec.message().c_str());
            std::abort();
        }
        ++*completed;
        if (*left > 0) start(*this);
    }
    static void start(const Chain& c) {
        --*c.left;
        c.p->stamp();
        if (c.settle) {
            c.p->qp.async_write(c.p->mr0.slice(0, size), c.p->mr1.remote(), 0, settled(c, [p = c.p] {
                                    collect();
                                    p->wait_landed();
                                    collect();
                                }));
        } else {
            c.p->qp.async_write(c.p->mr0.slice(0, size), c.p->mr1.remote(), 0, c);
        }
    }
};

int run_async(const char* dev0, const char* dev1, const std::string& form, int ops) {
    // _unsafe: the io_context itself without locks (BOOST_ASIO_CONCURRENCY_HINT_UNSAFE), single-threaded engine.
    const bool unsafe = form.ends_with("_unsafe");
    const bool single = unsafe || form.ends_with("_single");
    const std::string shape = single ? form.substr(0, form.size() - 7) : form;
    asio::io_context io(unsafe ? BOOST_ASIO_CONCURRENCY_HINT_UNSAFE : 1);
    const bool adaptive = shape.ends_with("_adaptive");
    const bool pipelined = shape.ends_with("_pipelined");
    const bool coroutine = shape.starts_with("coroutine");
    gv::AsyncOptions options{adaptive ? gv::CompletionMode::adaptive : gv::CompletionMode::event_driven,
                             std::chrono::microseconds(adaptive ? 100000 : 0), single};
    // GPUVERBS_LIVENESS_TICK_MS=0 turns the liveness watch off (what it costs: docs/performance.md).
    if (const char* tick = std::getenv("GPUVERBS_LIVENESS_TICK_MS")) { // NOLINT(concurrency-mt-unsafe): one thread
        options.liveness_tick = std::chrono::milliseconds(std::atoi(tick));
    }
    Pair p(dev0, dev1, [&](const gv::Device& d, const gv::CompletionChannel&) {
        return gv::CompletionQueue(d, 256, io.get_executor(), options);
    });
    int completed = 0;
    auto run = [&](int n) {
        int left = n;
        if (coroutine) {
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    for (int i = 0; i < n; ++i) {
                        p.stamp();
                        if (adaptive) {
                            co_await p.qp.async_write(p.mr0.slice(0, size), p.mr1.remote(), 0,
                                                      settled(asio::use_awaitable, [&p] {
                                                          collect();
                                                          p.wait_landed();
                                                          collect();
                                                      }));
                        } else {
                            co_await p.qp.async_write(p.mr0.slice(0, size), p.mr1.remote(), 0, asio::use_awaitable);
                        }
                        ++completed;
                    }
                },
                asio::detached);
        } else {
            Chain chain{&p, &left, &completed, adaptive};
            const int in_flight = pipelined ? std::min(batch_size, n) : 1;
            for (int i = 0; i < in_flight; ++i) Chain::start(chain);
        }
        io.restart();
        io.run();
    };
    run(50); // warm-up
    completed = 0;
    collect();
    run(ops);
    collect();
    if (completed != ops) {
        std::fprintf(stderr, "%s: only %d of %d writes completed\n", form.c_str(), completed, ops);
        return 1;
    }
    const gv::AsyncStatistics stats = p.cq0.async_statistics();
    std::printf("%s: %d operations (polls %llu, empty %llu, wake-ups %llu)\n", form.c_str(), ops,
                static_cast<unsigned long long>(stats.polls), static_cast<unsigned long long>(stats.empty_polls),
                static_cast<unsigned long long>(stats.wakeups));
    return 0;
}

// --- the hand-written loop: what a user writes with Asio and raw verbs -------

/// One 64-byte RDMA write, signaled, built on the stack (as raw_post does).
void hand_post(Pair& p) {
    ibv_sge sge;
    sge.addr = reinterpret_cast<std::uintptr_t>(p.m0.data());
    sge.length = static_cast<std::uint32_t>(size);
    sge.lkey = p.mr0.lkey();
    ibv_send_wr wr;
    wr.wr_id = 1;
    wr.next = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    const gv::RemoteMemory dst = p.mr1.remote();
    wr.wr.rdma.remote_addr = dst.address;
    wr.wr.rdma.rkey = dst.rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(p.qp.native_handle(), &wr, &bad) != 0) std::abort();
}

/// After the channel's fd was readable: take and acknowledge the event, re-arm,
/// poll until the CQ is empty. Returns the completions reaped.
int hand_reap(Pair& p) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(p.channel.native_handle(), &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
    ibv_cq* own = p.cq0.native_handle();
    if (ibv_req_notify_cq(own, 0) != 0) std::abort();
    ibv_wc wc[4];
    int reaped = 0;
    for (int n; (n = ibv_poll_cq(own, 4, wc)) > 0;) {
        for (int k = 0; k < n; ++k) {
            if (wc[k].status != IBV_WC_SUCCESS) std::abort();
        }
        reaped += n;
    }
    return reaped;
}

/// The callback form: the wait's handler reaps, then posts the next write and waits again.
struct HandChain {
    Pair* p;
    asio::posix::stream_descriptor* fd;
    int* left;
    int* completed;
    void operator()(const boost::system::error_code& ec) const {
        if (ec) std::abort();
        *completed += hand_reap(*p);
        if (*left > 0) start(*this);
    }
    static void start(const HandChain& c) {
        --*c.left;
        c.p->stamp();
        hand_post(*c.p);
        c.fd->async_wait(asio::posix::stream_descriptor::wait_read, c);
    }
};

int run_hand_written(const char* dev0, const char* dev1, const std::string& form, int ops) {
    asio::io_context io(1);
    Pair p(dev0, dev1,
           [](const gv::Device& d, const gv::CompletionChannel& c) { return gv::CompletionQueue(d, 256, c); });
    asio::posix::stream_descriptor fd(io, p.channel.native_handle()->fd);
    fd.non_blocking(true);
    p.arm(); // armed once; each wake-up re-arms before it polls
    const bool coroutine = form == "hand_coroutine";
    int completed = 0;
    auto run = [&](int n) {
        int left = n;
        if (coroutine) {
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    for (int i = 0; i < n; ++i) {
                        p.stamp();
                        hand_post(p);
                        co_await fd.async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable);
                        completed += hand_reap(p);
                    }
                },
                asio::detached);
        } else {
            HandChain::start(HandChain{&p, &fd, &left, &completed});
        }
        io.restart();
        io.run();
    };
    run(50); // warm-up
    completed = 0;
    collect();
    run(ops);
    collect();
    (void)fd.release(); // the channel owns the fd
    if (completed != ops) {
        std::fprintf(stderr, "%s: only %d of %d writes completed\n", form.c_str(), completed, ops);
        return 1;
    }
    std::printf("%s: %d operations\n", form.c_str(), ops);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    const char* dev0 = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe)
    const char* dev1 = std::getenv("GPUVERBS_TEST_DEV1"); // NOLINT(concurrency-mt-unsafe)
    if (argc < 2 || dev0 == nullptr || dev1 == nullptr) {
        std::fprintf(stderr, "usage: instructions_per_op FORM [--ops N]   (in the rig; forms: see the source)\n");
        return 2;
    }
    const std::string form = argv[1];
    int ops = 1000;
    if (argc > 3 && std::strcmp(argv[2], "--ops") == 0) ops = std::atoi(argv[3]);

    const std::string polled = form.ends_with("_ex") ? form.substr(0, form.size() - 3) : form;
    if (polled == "raw" || polled == "raw_batched" || polled == "sync" || polled == "batched" ||
        form == "raw_poll_one" || form == "sync_poll_one") {
        Pair p(
            dev0, dev1,
            [](const gv::Device& d, const gv::CompletionChannel& c) { return gv::CompletionQueue(d, 256, c); },
            form.ends_with("_ex"));
        return form.ends_with("_ex") ? run_polled<true>(p, form, ops) : run_polled<false>(p, form, ops);
    }
    const std::string shape =
        form.ends_with("_single") || form.ends_with("_unsafe") ? form.substr(0, form.size() - 7) : form;
    if (shape == "callback" || shape == "coroutine" || shape == "callback_adaptive" || shape == "coroutine_adaptive" ||
        shape == "callback_pipelined") {
        return run_async(dev0, dev1, form, ops);
    }
    if (form == "hand_callback" || form == "hand_coroutine") return run_hand_written(dev0, dev1, form, ops);
    std::fprintf(stderr, "unknown form '%s'\n", form.c_str());
    return 2;
}
