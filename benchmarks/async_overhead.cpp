// What the Asio layer adds per operation over a plain post + poll loop.
//
// One process, two devices (the rig's DEV0 -> DEV1), one connected QP pair per
// form. Each form runs the same dependent chain of 64-byte RDMA writes (the
// next starts when the previous completed), so the time per operation is the
// round trip plus that form's own overhead. The forms alternate, several
// rounds, and the medians are compared in the same run: with the plain loop,
// and (issue 49) each asynchronous form with the same chain written by hand
// with Asio and raw verbs — the completion channel's descriptor watched by an
// asio::posix::stream_descriptor, one signaled ibv_post_send and one
// async_wait per write, then ibv_get_cq_event, ibv_ack_cq_events,
// ibv_req_notify_cq and ibv_poll_cq until empty — as operations per second
// and as ratios (ours over hand-written: above 1 is faster than by hand).
//
//   async_overhead [--ops N] [--rounds R]      (inside tests/softroce/run)
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

struct Pair {
    gpuverbs::Device d0, d1;
    gpuverbs::ProtectionDomain pd0{d0}, pd1{d1};
    gpuverbs::CompletionQueue cq0, cq1;
    std::vector<std::byte> m0 = std::vector<std::byte>(4096), m1 = std::vector<std::byte>(4096);
    // m0 is only the source of the writes; m1 their target.
    gpuverbs::MemoryRegion mr0{pd0, m0, gpuverbs::Access::none},
        mr1{pd1, m1, gpuverbs::Access::local_write | gpuverbs::Access::remote_write};
    gpuverbs::QueuePair qp; // on d0, writing to d1
    gpuverbs::QueuePair peer;

    using MakeCq = std::function<gpuverbs::CompletionQueue(const gpuverbs::Device&)>;
    Pair(const char* dev0, const char* dev1, const MakeCq& make_cq)
        : d0(gpuverbs::Device::open(dev0)), d1(gpuverbs::Device::open(dev1)), cq0(make_cq(d0)), cq1(make_cq(d1)) {
        gpuverbs::PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
        (void)b.advertise(mr1);
        auto ea = a.endpoint(), eb = b.endpoint();
        qp = std::move(a).connect(eb);
        peer = std::move(b).connect(ea);
    }
};

/// The callback chain's handler: small and copyable, allocates nothing.
struct Next {
    Pair* p;
    int* left;
    void operator()(boost::system::error_code ec, std::size_t /*bytes*/) const {
        if (ec) std::abort();
        if (--*left > 0) p->qp.async_write(p->mr0.slice(0, 64), p->mr1.remote(), 0, *this);
    }
};

/// The hand-written loop's pieces: a channel-bound CQ polled with raw verbs.
struct Hand {
    gpuverbs::Device d0, d1;
    gpuverbs::ProtectionDomain pd0{d0}, pd1{d1};
    gpuverbs::CompletionChannel channel{d0};
    gpuverbs::CompletionQueue cq0, cq1;
    std::vector<std::byte> m0 = std::vector<std::byte>(4096), m1 = std::vector<std::byte>(4096);
    gpuverbs::MemoryRegion mr0{pd0, m0, gpuverbs::Access::none},
        mr1{pd1, m1, gpuverbs::Access::local_write | gpuverbs::Access::remote_write};
    gpuverbs::QueuePair qp, peer;
    asio::posix::stream_descriptor fd;

    Hand(const char* dev0, const char* dev1, asio::io_context& io)
        : d0(gpuverbs::Device::open(dev0)),
          d1(gpuverbs::Device::open(dev1)),
          cq0(d0, 256, channel),
          cq1(d1, 256),
          fd(io, channel.native_handle()->fd) {
        gpuverbs::PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
        (void)b.advertise(mr1);
        auto ea = a.endpoint(), eb = b.endpoint();
        qp = std::move(a).connect(eb);
        peer = std::move(b).connect(ea);
        fd.non_blocking(true);
        (void)ibv_req_notify_cq(cq0.native_handle(), 0);
    }
    Hand(const Hand&) = delete;
    Hand& operator=(const Hand&) = delete;
    ~Hand() { (void)fd.release(); } // the channel owns the descriptor
    void post() {
        ibv_sge sge{reinterpret_cast<std::uintptr_t>(m0.data()), 64, mr0.lkey()};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = mr1.remote().address;
        wr.wr.rdma.rkey = mr1.remote().rkey;
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(qp.native_handle(), &wr, &bad) != 0) std::abort();
    }
    void reap() {
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(channel.native_handle(), &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
        (void)ibv_req_notify_cq(cq0.native_handle(), 0);
        ibv_wc wc[4];
        for (int n; (n = ibv_poll_cq(cq0.native_handle(), 4, wc)) > 0;) {
            for (int k = 0; k < n; ++k) {
                if (wc[k].status != IBV_WC_SUCCESS) std::abort();
            }
        }
    }
};

struct HandNext {
    Hand* h;
    int* left;
    void operator()(const boost::system::error_code& ec) const {
        if (ec) std::abort();
        h->reap();
        if (--*left > 0) start();
    }
    void start() const {
        h->post();
        h->fd.async_wait(asio::posix::stream_descriptor::wait_read, *this);
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    const char* dev0 = std::getenv("GPUVERBS_TEST_DEV0");
    const char* dev1 = std::getenv("GPUVERBS_TEST_DEV1");
    if (dev0 == nullptr || dev1 == nullptr) {
        std::fprintf(stderr, "run inside tests/softroce/run (needs GPUVERBS_TEST_DEV0/1)\n");
        return 2;
    }
    int ops = 5000, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--ops") ops = std::atoi(argv[i + 1]);
        if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
    }

    // Plain: post, then spin on poll until the completion arrives.
    Pair plain(dev0, dev1, [](const gpuverbs::Device& d) { return gpuverbs::CompletionQueue(d, 256); });
    auto run_plain = [&] {
        std::array<gpuverbs::Completion, 4> done;
        auto t0 = Clock::now();
        for (int i = 0; i < ops; ++i) {
            (void)plain.qp.post_write(plain.mr0.slice(0, 64), plain.mr1.remote());
            while (plain.cq0.poll(done) == 0) {
            }
        }
        return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
    };

    std::map<std::string, std::function<double()>> forms;
    forms["1 plain post+poll"] = run_plain;
    std::vector<std::unique_ptr<asio::io_context>> contexts;
    std::vector<std::unique_ptr<Pair>> pairs;
    for (auto [name, mode] : {std::pair{"adaptive", gpuverbs::CompletionMode::adaptive},
                              std::pair{"event", gpuverbs::CompletionMode::event_driven}}) {
        auto& io = *contexts.emplace_back(std::make_unique<asio::io_context>(1));
        gpuverbs::AsyncOptions options{mode, std::chrono::microseconds(200)};
        auto& p = *pairs.emplace_back(std::make_unique<Pair>(dev0, dev1, [&](const gpuverbs::Device& d) {
            return gpuverbs::CompletionQueue(d, 256, io.get_executor(), options);
        }));
        forms[std::string("2 callback, ") + name] = [&io, &p, ops] {
            int left = ops;
            auto t0 = Clock::now();
            p.qp.async_write(p.mr0.slice(0, 64), p.mr1.remote(), 0, Next{&p, &left});
            io.restart();
            io.run();
            return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
        };
        forms[std::string("3 coroutine, ") + name] = [&io, &p, ops] {
            auto t0 = Clock::now();
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    for (int i = 0; i < ops; ++i) {
                        co_await p.qp.async_write(p.mr0.slice(0, 64), p.mr1.remote(), 0, asio::use_awaitable);
                    }
                },
                asio::detached);
            io.restart();
            io.run();
            return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
        };
    }

    // The same chains written by hand (one io_context of their own, as a program without gpuverbs has).
    auto& hand_io = *contexts.emplace_back(std::make_unique<asio::io_context>(1));
    Hand hand(dev0, dev1, hand_io);
    forms["4 hand-written callback"] = [&hand_io, &hand, ops] {
        int left = ops;
        auto t0 = Clock::now();
        HandNext{&hand, &left}.start();
        hand_io.restart();
        hand_io.run();
        return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
    };
    forms["5 hand-written coroutine"] = [&hand_io, &hand, ops] {
        auto t0 = Clock::now();
        asio::co_spawn(
            hand_io,
            [&]() -> asio::awaitable<void> {
                for (int i = 0; i < ops; ++i) {
                    hand.post();
                    co_await hand.fd.async_wait(asio::posix::stream_descriptor::wait_read, asio::use_awaitable);
                    hand.reap();
                }
            },
            asio::detached);
        hand_io.restart();
        hand_io.run();
        return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / ops;
    };

    std::map<std::string, std::vector<double>> results;
    for (auto& [name, run] : forms) (void)run(); // warm-up
    for (int r = 0; r < rounds; ++r) {
        for (auto& [name, run] : forms) results[name].push_back(run());
    }
    double base = median(results["1 plain post+poll"]);
    const double hand_callback = median(results["4 hand-written callback"]);
    const double hand_coroutine = median(results["5 hand-written coroutine"]);
    std::printf("%-26s %12s %14s %10s  %s\n", "form (64 B RDMA write)", "ns/op median", "added vs plain", "ops/s",
                "against the hand-written loop (its ns/op over ours)");
    for (auto& [name, v] : results) {
        double m = median(v);
        std::string against;
        if (name.starts_with("2 "))
            against = std::to_string(hand_callback / m).substr(0, 5) + "x of hand-written callback";
        if (name.starts_with("3 ")) {
            against = std::to_string(hand_coroutine / m).substr(0, 5) + "x of hand-written coroutine";
        }
        std::printf("%-26s %12.0f %+14.0f %10.0f  %s\n", name.c_str(), m, m - base, 1e9 / m, against.c_str());
    }
    std::printf("(%d dependent writes per run, %d rounds, forms alternated; rxe under QEMU TCG)\n", ops, rounds);
    return 0;
}
