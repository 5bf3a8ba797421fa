// Block-list transfers against a hand-written raw ibverbs loop doing the same
// work: BLOCKS blocks of BLOCK bytes, scattered through a pool twice their
// size on both sides (no two neighbours coalesce), written in chains of 32
// linked requests with the last one signaled, as many chains in flight as the
// send queue (256) holds, completions waited for on the CQ's channel; with
// two rails, the requests striped over two queue pairs on two devices, halves
// of equal bytes. Run by benchmarks/transfers in the rig.
//
//   transfer_bench FORM [--rails 1|2] [--blocks N] [--block BYTES] [--repeat N]
//     FORM: raw      the raw loop (ibv_post_send, ibv_poll_cq, ibv_get_cq_event)
//           gpuverbs async_transfer of a prepared TransferPlan
//           plan     TransferPlan::make alone (what preparing the plan costs)
//           gpuverbs_lists  as gpuverbs, but each transfer also builds its block
//                    lists and its plan (what a KV-cache hand-off pays per request)
//           group    async_transfer over a RailGroup: striped by each rail's
//                    measured throughput (the warm-up transfer measures it);
//                    benchmarks/rail-health runs it against gpuverbs (equal
//                    halves) with the second rail slowed by netem
//
// Under callgrind (--collect-atstart=no) only the repeated transfers are
// collected, not the set-up; waits in the kernel are never counted.
// Prints "FORM: N blocks, B bytes, S s, blocks/s, GB/s", and each rail's bytes.
// Every byte is checked after each transfer (outside the timed part).
#include <gpuverbs/gpuverbs.hpp>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <boost/asio/io_context.hpp>

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace asio = boost::asio;
namespace gv = gpuverbs;

namespace {

constexpr std::uint32_t chain = 32;
constexpr std::uint32_t depth = 256;

/// One rail: a device on each side, a QP pair, the pools registered on both.
struct Rail {
    gv::Device d0, d1;
    gv::ProtectionDomain pd0{d0}, pd1{d1};
    gv::CompletionChannel channel{d0};
    gv::CompletionQueue cq0, cq1;
    gv::MemoryRegion mr0, mr1;
    gv::QueuePair qp, peer;
    Rail(const char* dev0, const char* dev1, std::span<std::byte> m0, std::span<std::byte> m1,
         const asio::any_io_executor* ex)
        : d0(gv::Device::open(dev0)),
          d1(gv::Device::open(dev1)),
          cq0(ex != nullptr ? gv::CompletionQueue(d0, 1024, *ex) : gv::CompletionQueue(d0, 1024, channel)),
          cq1(d1, 64),
          mr0(pd0, m0, gv::Access::local_write),
          mr1(pd1, m1, gv::Access::local_write | gv::Access::remote_write) {
        gv::QueuePairOptions options;
        options.max_send_wr = depth;
        gv::PreparedQueuePair a(pd0, cq0, cq0, options), b(pd1, cq1, cq1);
        (void)b.advertise(mr1);
        auto ea = a.endpoint(), eb = b.endpoint();
        qp = std::move(a).connect(eb);
        peer = std::move(b).connect(ea);
    }
};

struct Args {
    std::string form;
    int rails = 1;
    std::size_t blocks = 4096;
    std::size_t block = 16384;
    int repeat = 3;
};

/// The raw loop over `rails` QPs: requests [bounds[r], bounds[r+1]) on rail r.
void raw_transfer(std::vector<Rail*>& rails, const std::vector<std::uint32_t>& bounds,
                  const std::vector<std::uint64_t>& src, const std::vector<std::uint64_t>& dst, std::uint32_t length) {
    struct State {
        std::uint32_t next, end, outstanding = 0;
        std::uint32_t chains[depth] = {};
        std::uint32_t head = 0, count = 0;
        bool armed = false;
    };
    std::vector<State> st(rails.size());
    for (std::size_t r = 0; r < rails.size(); ++r) {
        st[r].next = bounds[r];
        st[r].end = bounds[r + 1];
    }
    ibv_send_wr wrs[chain];
    ibv_sge sges[chain];
    ibv_wc wc[16];
    std::size_t busy = rails.size();
    while (busy > 0) {
        busy = 0;
        bool progressed = false;
        for (std::size_t r = 0; r < rails.size(); ++r) {
            State& s = st[r];
            Rail& rail = *rails[r];
            const std::uint32_t lkey = rail.mr0.lkey(), rkey = rail.mr1.remote().rkey;
            // Post chains while the send queue has room for one.
            while (s.next < s.end) {
                const std::uint32_t n = std::min(chain, s.end - s.next);
                if (s.outstanding + n > depth) break;
                for (std::uint32_t k = 0; k < n; ++k) {
                    const std::uint32_t i = s.next + k;
                    sges[k].addr = src[i];
                    sges[k].length = length;
                    sges[k].lkey = lkey;
                    wrs[k].wr_id = i;
                    wrs[k].next = k + 1 < n ? &wrs[k + 1] : nullptr;
                    wrs[k].sg_list = &sges[k];
                    wrs[k].num_sge = 1;
                    wrs[k].opcode = IBV_WR_RDMA_WRITE;
                    wrs[k].send_flags = k + 1 == n ? IBV_SEND_SIGNALED : 0;
                    wrs[k].wr.rdma.remote_addr = dst[i];
                    wrs[k].wr.rdma.rkey = rkey;
                }
                ibv_send_wr* bad = nullptr;
                if (ibv_post_send(rail.qp.native_handle(), wrs, &bad) != 0) std::abort();
                s.chains[(s.head + s.count++) % depth] = n;
                s.outstanding += n;
                s.next += n;
            }
            // Reap; with nothing there, arm the CQ and look once more (a completion
            // that came before arming raises no event).
            auto reap = [&] {
                const int got = ibv_poll_cq(rail.cq0.native_handle(), 16, wc);
                for (int k = 0; k < got; ++k) {
                    if (wc[k].status != IBV_WC_SUCCESS) {
                        std::fprintf(stderr, "raw: %s\n", ibv_wc_status_str(wc[k].status));
                        std::abort();
                    }
                    s.outstanding -= s.chains[s.head];
                    s.head = (s.head + 1) % depth;
                    --s.count;
                }
                return got;
            };
            int got = reap();
            if (got == 0 && s.outstanding > 0 && !s.armed) {
                (void)ibv_req_notify_cq(rail.cq0.native_handle(), 0);
                s.armed = true;
                got = reap();
            }
            if (got > 0) progressed = true;
            if (s.next < s.end || s.outstanding > 0) ++busy;
        }
        if (busy == 0 || progressed) continue;
        // Nothing completed on any rail, every busy one armed: wait for an event.
        pollfd fds[2] = {};
        for (std::size_t r = 0; r < rails.size(); ++r) fds[r] = {rails[r]->channel.native_handle()->fd, POLLIN, 0};
        (void)::poll(fds, rails.size(), 1000);
        for (std::size_t r = 0; r < rails.size(); ++r) {
            if ((fds[r].revents & POLLIN) == 0) continue;
            ibv_cq* cq = nullptr;
            void* context = nullptr;
            if (ibv_get_cq_event(rails[r]->channel.native_handle(), &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
            st[r].armed = false;
        }
    }
}

int run(const Args& a) {
    const char* devs[4] = {std::getenv("GPUVERBS_TEST_DEV0"), std::getenv("GPUVERBS_TEST_DEV1"),  // NOLINT
                           std::getenv("GPUVERBS_TEST_DEV2"), std::getenv("GPUVERBS_TEST_DEV3")}; // NOLINT
    if (devs[0] == nullptr || devs[1] == nullptr || (a.rails == 2 && (devs[2] == nullptr || devs[3] == nullptr))) {
        std::fprintf(stderr,
                     "transfer_bench: GPUVERBS_TEST_DEV0..%d are not set (run it through benchmarks/transfers)\n",
                     a.rails == 2 ? 3 : 1);
        return 2;
    }
    asio::io_context io(1);
    const asio::any_io_executor ex = io.get_executor();
    const bool ours = a.form == "gpuverbs" || a.form == "gpuverbs_lists" || a.form == "group";
    const bool lists = a.form == "gpuverbs_lists";
    // Pools of twice the blocks on both sides; blocks at shuffled slots.
    const std::size_t slots = 2 * a.blocks;
    // Not zeroed (under callgrind that alone takes minutes): only sampled bytes are written and read.
    const std::size_t pool = slots * a.block;
    std::unique_ptr<std::byte[]> p0(new std::byte[pool]), p1(new std::byte[pool]);
    std::span<std::byte> m0(p0.get(), pool), m1(p1.get(), pool);
    std::vector<std::unique_ptr<Rail>> rails;
    for (int r = 0; r < a.rails; ++r) {
        rails.push_back(std::make_unique<Rail>(devs[2 * r], devs[2 * r + 1], m0, m1, ours ? &ex : nullptr));
    }
    std::mt19937 random(7);
    std::vector<std::size_t> from(slots), to(slots);
    std::iota(from.begin(), from.end(), 0);
    std::iota(to.begin(), to.end(), 0);
    std::shuffle(from.begin(), from.end(), random);
    std::shuffle(to.begin(), to.end(), random);
    from.resize(a.blocks);
    to.resize(a.blocks);
    for (std::size_t k = 0; k < a.blocks; ++k) {
        for (std::size_t i = 0; i < a.block; i += 512) m0[from[k] * a.block + i] = std::byte((k + i / 512) % 251);
    }
    std::vector<gv::LocalBuffer> local;
    std::vector<gv::RemoteBlock> remote;
    std::vector<std::uint64_t> src, dst;
    for (std::size_t k = 0; k < a.blocks; ++k) {
        local.push_back(rails[0]->mr0.slice(from[k] * a.block, a.block));
        remote.push_back({rails[0]->mr1.remote(), to[k] * a.block, a.block});
        src.push_back(reinterpret_cast<std::uintptr_t>(m0.data()) + from[k] * a.block);
        dst.push_back(rails[0]->mr1.remote().address + to[k] * a.block);
    }
    gv::TransferLimits limits;
    limits.max_sge = 1;
    if (a.form == "plan") {
        CALLGRIND_TOGGLE_COLLECT;
        for (int rep = 0; rep < a.repeat; ++rep) {
            gv::TransferPlan p = gv::TransferPlan(gv::TransferDirection::write, local, remote, limits);
            if (p.requests().size() != a.blocks) std::abort();
        }
        CALLGRIND_TOGGLE_COLLECT;
        std::printf("plan: %zu blocks x %d\n", a.blocks, a.repeat);
        return 0;
    }
    const gv::TransferPlan plan = gv::TransferPlan(gv::TransferDirection::write, local, remote, limits);
    std::vector<gv::TransferRail> spec;
    for (int r = 0; r < a.rails; ++r) {
        gv::TransferRail rail{&rails[r]->qp, {}, {}};
        if (r > 0) rail.local(rails[0]->mr0, rails[r]->mr0).remote(rails[0]->mr1.remote(), rails[r]->mr1.remote());
        spec.push_back(std::move(rail));
    }
    const std::vector<std::uint32_t> bounds = gv::detail::stripe(plan, spec.size()).bounds;
    gv::RailGroup group(spec);
    std::vector<Rail*> raw_rails;
    for (auto& r : rails) raw_rails.push_back(r.get());
    std::vector<std::uint64_t> rail_bytes(spec.size());
    bool failed = false;
    struct Done { // the handler: allocates nothing
        bool* failed;
        std::vector<std::uint64_t>* rail_bytes;
        void operator()(boost::system::error_code ec, const gv::TransferResult& r) const {
            if (ec) {
                std::fprintf(stderr, "transfer failed: %s: %s\n", ec.message().c_str(), r.failed_blocks.c_str());
                *failed = true;
            }
            // Each rail's bytes (with one rail and no report asked for, the result has no rails: all of them).
            for (std::size_t k = 0; k < rail_bytes->size(); ++k) {
                (*rail_bytes)[k] = k < r.report.rails.size() ? r.report.rails[k].bytes : r.bytes;
            }
        }
    };
    auto once = [&] {
        if (lists) {
            // The request's blocks, as a service knows them (slot numbers), become lists and a plan.
            std::vector<gv::LocalBuffer> mine;
            std::vector<gv::RemoteBlock> theirs;
            mine.reserve(a.blocks);
            theirs.reserve(a.blocks);
            const gv::RemoteMemory peer = rails[0]->mr1.remote();
            for (std::size_t k = 0; k < a.blocks; ++k) {
                mine.push_back(rails[0]->mr0.slice(from[k] * a.block, a.block));
                theirs.push_back({peer, to[k] * a.block, a.block});
            }
            const gv::TransferPlan fresh(gv::TransferDirection::write, mine, theirs, limits);
            gv::TransferOptions options;
            gv::async_transfer(std::span<const gv::TransferRail>(spec), fresh, options, Done{&failed, &rail_bytes});
            io.restart();
            io.run();
        } else if (a.form == "group") {
            gv::TransferOptions options;
            gv::async_transfer(group, plan, options, Done{&failed, &rail_bytes});
            io.restart();
            io.run();
        } else if (ours) {
            gv::TransferOptions options;
            gv::async_transfer(std::span<const gv::TransferRail>(spec), plan, options, Done{&failed, &rail_bytes});
            io.restart();
            io.run();
        } else {
            raw_transfer(raw_rails, bounds, src, dst, static_cast<std::uint32_t>(a.block));
        }
    };
    once(); // warm-up (first touch of every page by the NIC, the allocator's first blocks)
    double seconds = 0;
    for (int rep = 0; rep < a.repeat; ++rep) {
        for (std::size_t k = 0; k < a.blocks; ++k) {
            for (std::size_t i = 0; i < a.block; i += 512) m1[to[k] * a.block + i] = std::byte{0xff};
        }
        const auto t0 = std::chrono::steady_clock::now();
        CALLGRIND_TOGGLE_COLLECT;
        once();
        CALLGRIND_TOGGLE_COLLECT;
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::size_t bad = 0;
        for (std::size_t k = 0; k < a.blocks; ++k) {
            for (std::size_t i = 0; i < a.block; i += 512) {
                bad += m1[to[k] * a.block + i] != std::byte((k + i / 512) % 251) ? 1 : 0;
            }
        }
        if (bad != 0 || failed) {
            std::fprintf(stderr, "%s: %zu samples wrong after the transfer\n", a.form.c_str(), bad);
            return 1;
        }
    }
    const double bytes = static_cast<double>(a.blocks * a.block) * a.repeat;
    std::printf("%s: %zu blocks x %d, %d rail(s), %.3f s, %.0f blocks/s, %.3f GB/s\n", a.form.c_str(), a.blocks,
                a.repeat, a.rails, seconds, static_cast<double>(a.blocks) * a.repeat / seconds, bytes / seconds / 1e9);
    if (ours) {
        for (std::size_t r = 0; r < rail_bytes.size(); ++r) {
            std::printf("  rail %zu: %llu bytes (last transfer)\n", r, static_cast<unsigned long long>(rail_bytes[r]));
        }
        if (a.form == "group") {
            for (std::size_t r = 0; r < group.size(); ++r) {
                std::printf("  rail %zu: measured %.1f MB/s\n", r, group.health(r).bytes_per_second / 1e6);
            }
        }
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    if (argc < 2) {
        std::fprintf(
            stderr,
            "usage: transfer_bench raw|gpuverbs|gpuverbs_lists|group|plan [--rails 1|2] [--blocks N] [--block BYTES] "
            "[--repeat N]\n");
        return 2;
    }
    a.form = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const long v = std::strtol(argv[i + 1], nullptr, 10);
        if (key == "--rails")
            a.rails = static_cast<int>(v);
        else if (key == "--blocks")
            a.blocks = static_cast<std::size_t>(v);
        else if (key == "--block")
            a.block = static_cast<std::size_t>(v);
        else if (key == "--repeat")
            a.repeat = static_cast<int>(v);
    }
    if (a.form != "raw" && a.form != "gpuverbs" && a.form != "gpuverbs_lists" && a.form != "group" &&
        a.form != "plan") {
        std::fprintf(stderr, "unknown form '%s'\n", a.form.c_str());
        return 2;
    }
    if (a.rails < 1 || a.rails > 2 || a.blocks == 0 || a.block == 0 || a.repeat < 1) {
        std::fprintf(stderr, "bad arguments\n");
        return 2;
    }
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "transfer_bench: %s\n", e.what());
        return 1;
    }
}
