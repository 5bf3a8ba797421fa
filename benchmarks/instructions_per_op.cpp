// Instructions per RDMA write, counted by callgrind (repeatable, unlike time
// under QEMU): a plain raw-ibverbs loop, gpuverbs' synchronous API, a batch of
// 32 with one signaled request (SendBatch), and the Asio callback and
// coroutine paths. Run by benchmarks/instructions under
// valgrind --tool=callgrind --collect-atstart=no; only the data path is
// collected: posting and the poll that returns the completion. The wait for
// the completion (blocking in the kernel on a completion channel, armed before
// posting so it cannot be missed) is not collected, so no spin loop inflates
// the counts. The async forms are collected whole, reactor included, because
// that is their cost.
//
//   instructions_per_op raw|sync|batched|callback|coroutine [--ops N]   (inside the rig)
#include <gpuverbs/gpuverbs.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else // built without valgrind's headers: runs, but collects nothing
#define CALLGRIND_TOGGLE_COLLECT
#endif
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace asio = boost::asio;
namespace gv = gpuverbs;

namespace {

struct Pair {
    gv::Device d0, d1;
    gv::ProtectionDomain pd0{d0}, pd1{d1};
    gv::CompletionChannel channel{d0};
    gv::CompletionQueue cq0, cq1;
    std::vector<std::byte> m0 = std::vector<std::byte>(4096), m1 = std::vector<std::byte>(4096);
    gv::MemoryRegion mr0{pd0, m0, gv::access_all}, mr1{pd1, m1, gv::access_all};
    gv::QueuePair qp, peer;

    using MakeCq = std::function<gv::CompletionQueue(const gv::Device&, const gv::CompletionChannel&)>;
    Pair(const char* dev0, const char* dev1, const MakeCq& make)
        : d0(gv::Device::open(dev0)), d1(gv::Device::open(dev1)), cq0(make(d0, channel)), cq1(d1, 64) {
        gv::PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
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
};

void collect() {
    CALLGRIND_TOGGLE_COLLECT;
}

} // namespace

int main(int argc, char** argv) {
    const char* dev0 = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe)
    const char* dev1 = std::getenv("GPUVERBS_TEST_DEV1"); // NOLINT(concurrency-mt-unsafe)
    if (argc < 2 || dev0 == nullptr || dev1 == nullptr) {
        std::fprintf(stderr, "usage: instructions_per_op raw|sync|batched|callback|coroutine [--ops N] (in the rig)\n");
        return 2;
    }
    std::string mode = argv[1];
    int ops = 1000;
    if (argc > 3 && std::strcmp(argv[2], "--ops") == 0) ops = std::atoi(argv[3]);
    const std::size_t size = 64;

    if (mode == "raw" || mode == "sync" || mode == "batched") {
        Pair p(dev0, dev1,
               [](const gv::Device& d, const gv::CompletionChannel& c) { return gv::CompletionQueue(d, 256, c); });
        ibv_qp* qp = p.qp.native_handle();
        ibv_cq* cq = p.cq0.native_handle();
        gv::RemoteMemory dst = p.mr1.remote();
        // The raw loop: what a careful raw-ibverbs program writes per operation.
        auto raw_one = [&] {
            ibv_sge sge{reinterpret_cast<std::uintptr_t>(p.m0.data()), static_cast<std::uint32_t>(size), p.mr0.lkey()};
            ibv_send_wr wr{};
            wr.wr_id = 1;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma.remote_addr = dst.address;
            wr.wr.rdma.rkey = dst.rkey;
            ibv_send_wr* bad = nullptr;
            if (ibv_post_send(qp, &wr, &bad) != 0) std::abort();
        };
        enum class Form { raw, sync, batched };
        const Form form = mode == "raw" ? Form::raw : mode == "sync" ? Form::sync : Form::batched;
        const int per_round = form == Form::batched ? 32 : 1;
        std::array<gv::Completion, 4> done;
        ibv_wc wc[4];
        const int rounds = ops / per_round;
        auto round = [&](bool measured) {
            p.arm();
            if (measured) collect();
            if (form == Form::raw) {
                raw_one();
            } else if (form == Form::sync) {
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
            if (form == Form::raw) {
                if (ibv_poll_cq(cq, 4, wc) != 1 || wc[0].status != IBV_WC_SUCCESS) std::abort();
            } else {
                if (p.cq0.poll(done) != 1 || !done[0].ok()) std::abort();
            }
            if (measured) collect();
        };
        for (int i = 0; i < 50; ++i) round(false); // warm-up: first-touch paths are not the steady state
        for (int i = 0; i < rounds; ++i) round(true);
        std::printf("%s: %d operations\n", mode.c_str(), rounds * per_round);
        return 0;
    }

    if (mode == "callback" || mode == "coroutine") {
        asio::io_context io(1);
        gv::AsyncOptions options{gv::CompletionMode::event_driven, std::chrono::microseconds(0)};
        Pair p(dev0, dev1, [&](const gv::Device& d, const gv::CompletionChannel&) {
            return gv::CompletionQueue(d, 256, io.get_executor(), options);
        });
        int completed = 0;
        const bool callback = mode == "callback";
        auto run = [&](int n) {
            // The chain's state lives until io.run() has finished with it.
            int left = n;
            std::function<void(boost::system::error_code, std::size_t)> next;
            if (callback) {
                next = [&](boost::system::error_code ec, std::size_t) {
                    if (ec) std::abort();
                    ++completed;
                    if (--left > 0) p.qp.async_write(p.mr0.slice(0, size), p.mr1.remote(), 0, next);
                };
                p.qp.async_write(p.mr0.slice(0, size), p.mr1.remote(), 0, next);
            } else {
                asio::co_spawn(
                    io,
                    [&]() -> asio::awaitable<void> {
                        for (int i = 0; i < n; ++i) {
                            co_await p.qp.async_write(p.mr0.slice(0, size), p.mr1.remote(), 0, asio::use_awaitable);
                            ++completed;
                        }
                    },
                    asio::detached);
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
            std::fprintf(stderr, "%s: only %d of %d writes completed\n", mode.c_str(), completed, ops);
            return 1;
        }
        std::printf("%s: %d operations\n", mode.c_str(), ops);
        return 0;
    }
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
}
