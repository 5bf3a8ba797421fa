// What the Asio layer adds per operation over a plain post + poll loop.
//
// One process, two devices (the rig's DEV0 -> DEV1), one connected QP pair per
// form. Each form runs the same dependent chain of 64-byte RDMA writes (the
// next starts when the previous completed), so the time per operation is the
// round trip plus that form's own overhead. The forms alternate, several
// rounds, and the medians are compared in the same run.
//
//   async_overhead [--ops N] [--rounds R]      (inside tests/softroce/run)
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
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
            std::function<void(boost::system::error_code, std::size_t)> next = [&](boost::system::error_code,
                                                                                   std::size_t) {
                if (--left > 0) p.qp.async_write(p.mr0.slice(0, 64), p.mr1.remote(), 0, next);
            };
            auto t0 = Clock::now();
            p.qp.async_write(p.mr0.slice(0, 64), p.mr1.remote(), 0, next);
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

    std::map<std::string, std::vector<double>> results;
    for (auto& [name, run] : forms) (void)run(); // warm-up
    for (int r = 0; r < rounds; ++r) {
        for (auto& [name, run] : forms) results[name].push_back(run());
    }
    double base = median(results["1 plain post+poll"]);
    std::printf("%-26s %12s %14s\n", "form (64 B RDMA write)", "ns/op median", "added vs plain");
    for (auto& [name, v] : results) {
        double m = median(v);
        std::printf("%-26s %12.0f %+14.0f\n", name.c_str(), m, m - base);
    }
    std::printf("(%d dependent writes per run, %d rounds, forms alternated; rxe under QEMU TCG)\n", ops, rounds);
    return 0;
}
