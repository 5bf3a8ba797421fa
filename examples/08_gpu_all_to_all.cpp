// 08_gpu_all_to_all: a mixture-of-experts layer's dispatch and combine, the
// moves kernels start themselves (the pattern DeepEP serves). Each of N ranks
// holds T tokens; a token goes to the rank that owns its expert. Dispatch: the
// producers put each token's row into its expert's rank, then signal each
// destination how many rows it sent; each rank waits for its own inputs.
// The experts "work" (each byte + 1); combine puts every processed row back to
// the rank the token came from, signals again, and each rank checks every
// byte it got, both ways.
//
//   mpirun -np 4 08_gpu_all_to_all [--devices rxe0,rxe1] [--second-rail rxe2,rxe3] [--tokens 512]
//                                  [--row 1024] [--experts 2] [--producers 4] [--rounds 1] [--host-loop]
//                                  [--progress]
//   08_gpu_all_to_all --gpu-half [--gpu 0] [--ranks 4] [--tokens 512] [--row 1024] [--rounds 3]
//
// The NIC half (this program): CPU threads play the kernels, pushing through
// the device queue's header (gpuverbs/device_queue/ring.hpp, what device.cuh
// calls), and the proxy posts on Soft-RoCE through a Mesh. Windows, as the
// kernels name them: 1 the tokens, 2 the inbox (rows from every source), 3
// the results (rows back from the experts), 4 the experts' outbox, 5 the
// signal words (dispatch counts, then combine counts). --host-loop does the
// same moves without the ring: this thread posts them through the data path
// (chains of up to 32 writes per peer, the last signaled), the baseline the
// proxy's tokens per second are compared with. --second-rail gives every
// peer a second rail (another device, the same memory registered there, a
// second mesh): when the first rail's link goes down mid-run, the proxy posts
// the unfinished requests again on the second and the kernels never notice.
//
// The GPU half (--gpu-half, no launcher, no NIC): N ranks' kernels on one GPU
// (08_gpu_all_to_all_kernels.cu), a block per rank, each pushing through its
// own device queue with device.cuh; the host plays the NIC, taking each
// request from each ring (RingReader) and doing its copy in GPU memory.
#include "08_gpu_all_to_all_kernels.hpp"
#include "command_line.hpp"
#include "wait_names.hpp"

#include <gpuverbs/device_queue/proxy.hpp>
#include <gpuverbs/device_queue/queue.hpp>
#include <gpuverbs/gpuverbs.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace dq = gpuverbs::device_queue;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Args {
    std::string devices;
    std::string second_rail; ///< devices of each peer's second rail (none: one rail)
    bool progress = false;
    bool gpu_half = false;
    int gpu = 0;
    std::uint32_t ranks = 4; ///< --gpu-half: ranks on the GPU
    std::uint32_t tokens = 512;
    std::size_t row = 1024;
    std::uint32_t experts = 2; ///< per rank
    std::uint32_t producers = 4;
    std::uint32_t rounds = 1;
    bool host_loop = false;
};

using example::inbox_window;
using example::outbox_window;
using example::results_window;
using example::signals_window;
using example::tokens_window;
using example::Window;
constexpr std::uint64_t timeout_ns = 10'000'000'000; // every wait: 10 s
/// The proxy's bound on a request: a rail whose request has not completed by
/// then fails over, and its flushes are waited for as long again, so a
/// failover holds the queue at most 4 s, well inside every wait.
constexpr auto request_timeout = std::chrono::milliseconds(2000);

/// Where token t of rank r goes: the rank owning its expert (a fixed hash, so every rank knows every route),
/// worked out once for every rank's tokens (a kernel would get these tables from the router).
class Routes {
public:
    Routes(std::uint32_t ranks, std::uint32_t tokens, std::uint32_t experts)
        : ranks_(ranks),
          tokens_(tokens),
          owner_(std::size_t{ranks} * tokens),
          index_(owner_.size()),
          count_(std::size_t{ranks} * ranks, 0) {
        for (std::uint32_t r = 0; r < ranks; ++r) {
            for (std::uint32_t t = 0; t < tokens; ++t) {
                const std::uint64_t expert =
                    (std::uint64_t{r} * 7919 + std::uint64_t{t} * 104729 + 17) % (std::uint64_t{ranks} * experts);
                const auto to = static_cast<std::uint32_t>(expert / experts);
                owner_[at(r, t)] = to;
                index_[at(r, t)] = count_[std::size_t{r} * ranks + to]++; // the how-many-th of r's to `to`
            }
        }
    }
    [[nodiscard]] std::uint32_t owner(std::uint32_t r, std::uint32_t t) const { return owner_[at(r, t)]; }
    /// Token t of r is the index()-th of r's tokens that go to owner(r, t).
    [[nodiscard]] std::uint32_t index(std::uint32_t r, std::uint32_t t) const { return index_[at(r, t)]; }
    [[nodiscard]] std::uint32_t count(std::uint32_t from, std::uint32_t to) const {
        return count_[std::size_t{from} * ranks_ + to];
    }

private:
    [[nodiscard]] std::size_t at(std::uint32_t r, std::uint32_t t) const { return std::size_t{r} * tokens_ + t; }
    std::uint32_t ranks_, tokens_;
    std::vector<std::uint32_t> owner_, index_, count_;
};

/// Byte i of token t of rank r (the kernels' pattern, example::pattern).
std::byte pattern(std::uint32_t r, std::uint32_t t, std::size_t i, std::uint32_t round) {
    return std::byte(example::pattern(r, t, i, round));
}

/// One request through the ring, as device::push would write it from a kernel.
dq::WaitResult push(const dq::QueueView& q, const dq::Request& r) {
    std::uint64_t position = 0;
    return dq::push(q, r, dq::detail::now_ns() + timeout_ns, position);
}

dq::Request put(std::uint32_t peer, Window dst, std::uint64_t dst_offset, Window src, std::uint64_t src_offset,
                std::uint64_t bytes) {
    dq::Request r;
    r.op = dq::Op::put;
    r.peer = static_cast<std::uint16_t>(peer);
    r.dst_window = dst;
    r.dst_offset = dst_offset;
    r.src_window = src;
    r.src_offset = src_offset;
    r.bytes = bytes;
    return r;
}

/// A signal that sets: posted again after a failover, it sets the same value (an add could count twice).
dq::Request signal(std::uint32_t peer, std::uint64_t offset, std::uint64_t value) {
    dq::Request r;
    r.op = dq::Op::signal;
    r.peer = static_cast<std::uint16_t>(peer);
    r.signal_window = signals_window;
    r.signal_offset = offset;
    r.signal_value = value;
    r.signal_op = dq::SignalOp::set;
    return r;
}

/// The baseline: the same moves posted by the host thread itself, per peer in chains of up to 32 writes
/// (the last signaled), at most `depth` requests in flight; a signal is an inline write of its value.
class HostLoop {
public:
    HostLoop(gpuverbs::Mesh& mesh, gpuverbs::CompletionQueue& cq, const gpuverbs::MemoryRegion& values_mr,
             std::vector<std::uint64_t>& values)
        : mesh_(mesh), cq_(cq), values_mr_(values_mr), values_(values) {}
    void window(std::uint16_t id, const gpuverbs::MemoryRegion& mr) { windows_[id] = &mr; }
    /// `remote`: the peer's region in the mesh's order (0 inbox, 1 results, 2 signals).
    void row(std::uint32_t to, std::size_t remote, std::uint64_t dst_offset, std::uint16_t src,
             std::uint64_t src_offset, std::uint64_t bytes) {
        pending_[to].push_back(gpuverbs::WorkRequest::write(windows_[src]->slice(src_offset, bytes),
                                                            mesh_.peer(to).regions.at(remote), dst_offset));
    }
    void signal(std::uint32_t to, std::uint64_t offset, std::uint64_t value) {
        values_[to] = value; // sent inline: copied when posted
        pending_[to].push_back(
            gpuverbs::WorkRequest::write(values_mr_.slice(std::size_t{to} * 8, 8), mesh_.peer(to).regions.at(2), offset)
                .inline_data());
    }
    /// Posts what is pending and waits until all of it completed.
    void flush() {
        for (auto& [to, requests] : pending_) {
            gpuverbs::QueuePair& qp = mesh_.peer(to).qp;
            for (std::size_t at = 0; at < requests.size(); at += 32) {
                const std::size_t n = std::min<std::size_t>(32, requests.size() - at);
                while (in_flight_ + n > depth) reap();
                gpuverbs::SendBatch chain = qp.batch();
                for (std::size_t k = 0; k < n; ++k) {
                    gpuverbs::WorkRequest r = requests[at + k];
                    if (k + 1 < n) r.unsignaled();
                    r.context(n);
                    gpuverbs::throw_if(chain.add(r), "SendBatch::add");
                }
                gpuverbs::throw_if(chain.post(), "SendBatch::post");
                in_flight_ += n;
            }
            requests.clear();
        }
        while (in_flight_ > 0) reap();
    }

private:
    static constexpr std::size_t depth = 128;
    void reap() {
        std::array<gpuverbs::Completion, 16> got;
        const std::size_t c = cq_.poll(got);
        for (std::size_t i = 0; i < c; ++i) {
            if (!got[i].ok()) throw gpuverbs::Error(got[i].status, "host loop", got[i].status.message());
            in_flight_ -= got[i].context;
        }
    }
    gpuverbs::Mesh& mesh_;
    gpuverbs::CompletionQueue& cq_;
    const gpuverbs::MemoryRegion& values_mr_;
    std::vector<std::uint64_t>& values_;
    std::map<std::uint16_t, const gpuverbs::MemoryRegion*> windows_;
    std::map<std::uint32_t, std::vector<gpuverbs::WorkRequest>> pending_;
    std::size_t in_flight_ = 0;
};

/// The devices of a comma-separated list.
std::vector<std::string> device_names(const std::string& list) {
    std::vector<std::string> names;
    std::stringstream in(list);
    for (std::string name; std::getline(in, name, ',');) names.push_back(name);
    return names;
}

/// One rail of this rank: a device (ranks take turns over `devices`), the
/// memory the windows name registered on it, and a mesh to every rank.
struct Rail {
    gpuverbs::Device device;
    gpuverbs::ProtectionDomain pd;
    gpuverbs::CompletionQueue cq;
    gpuverbs::MemoryRegion tokens, inbox, results, outbox, signals;
    gpuverbs::Mesh mesh;

    template <gpuverbs::Rendezvous R>
    Rail(R& rendezvous, const std::string& devices, const std::string& mesh_name, std::span<std::byte> tokens_memory,
         std::span<std::byte> inbox_memory, std::span<std::byte> results_memory, std::span<std::byte> outbox_memory,
         std::span<std::uint64_t> signal_words)
        : device(open(devices, rendezvous.rank())),
          pd(device),
          cq(device, 4096),
          tokens(pd, tokens_memory, gpuverbs::Access::local_write),
          inbox(pd, inbox_memory, gpuverbs::Access::local_write | gpuverbs::Access::remote_write),
          results(pd, results_memory, gpuverbs::Access::local_write | gpuverbs::Access::remote_write),
          outbox(pd, outbox_memory, gpuverbs::Access::local_write),
          signals(pd, std::as_writable_bytes(signal_words),
                  gpuverbs::Access::local_write | gpuverbs::Access::remote_write | gpuverbs::Access::remote_atomic),
          mesh(rendezvous, pd, cq, {inbox, results, signals}, options(mesh_name)) {
        mesh.connect_all();
    }
    /// The peer's windows as this rail's queue pair reaches them.
    [[nodiscard]] gpuverbs::RemoteWindows windows_of(std::uint32_t peer) {
        const gpuverbs::MeshPeer& p = mesh.peer(peer);
        return {{inbox_window, p.regions.at(0)}, {results_window, p.regions.at(1)}, {signals_window, p.regions.at(2)}};
    }

private:
    static gpuverbs::Device open(const std::string& devices, std::uint32_t rank) {
        const std::vector<std::string> names = device_names(devices);
        return names.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(names[rank % names.size()]);
    }
    static gpuverbs::MeshOptions options(const std::string& name) {
        gpuverbs::MeshOptions o;
        o.queue_pair.max_inline_data = 64; // signals that set go inline
        o.name = name;                     // two meshes on one rendezvous publish under different names
        return o;
    }
};

template <gpuverbs::Rendezvous R>
int all_to_all(R& rendezvous, const Args& a) {
    const std::uint32_t me = rendezvous.rank();
    const std::uint32_t n = rendezvous.world_size();
    const Routes routes(n, a.tokens, a.experts);
    const std::size_t row = a.row;
    const std::size_t rows = std::size_t{n} * a.tokens; // the inbox and outbox: room for every source's tokens

    // 1. The memory the windows name, and a rail over it (a second with --second-rail).
    std::vector<std::byte> tokens(a.tokens * row), inbox(rows * row), results(a.tokens * row), outbox(rows * row);
    std::vector<std::uint64_t> signals(2 * std::size_t{n}, 0);
    std::vector<std::unique_ptr<Rail>> rails;
    for (const std::string& devices : {a.devices, a.second_rail}) {
        if (!rails.empty() && devices.empty()) break;
        rails.push_back(std::make_unique<Rail>(rendezvous, devices, "all-to-all.rail" + std::to_string(rails.size()),
                                               tokens, inbox, results, outbox, signals));
    }
    Rail& first = *rails.front();
    std::vector<std::uint64_t> values(n, 0); // the host loop's signal values
    gpuverbs::MemoryRegion values_mr(first.pd, std::as_writable_bytes(std::span(values)),
                                     gpuverbs::Access::local_write);
    HostLoop host(first.mesh, first.cq, values_mr, values);
    host.window(tokens_window, first.tokens);
    host.window(outbox_window, first.outbox);

    // 2. The device queue and its proxy on a thread of its own (a kernel's proxy, as example 07's): every
    //    peer's first rail, then its second (the proxy fails over to it when the first fails).
    gpuverbs::DeviceQueue queue = gpuverbs::DeviceQueue::on_host(12);
    gpuverbs::DeviceQueueProxyOptions proxy_options;
    proxy_options.request_timeout = request_timeout;
    gpuverbs::DeviceQueueProxy proxy(queue.proxy_view(), first.pd, first.cq, proxy_options);
    for (const auto& rail : rails) {
        proxy.add_device(rail->pd, rail->cq);
        proxy.add_window(tokens_window, rail->tokens);
        proxy.add_window(outbox_window, rail->outbox);
        for (std::uint32_t q : rail->mesh.peers()) {
            const auto peer = static_cast<std::uint16_t>(q);
            if (rail.get() == &first) {
                proxy.add_peer(peer, rail->mesh.peer(q).qp, rail->windows_of(q));
            } else {
                proxy.add_rail(peer, rail->mesh.peer(q).qp, rail->windows_of(q));
            }
        }
    }
    std::atomic<bool> stop{false};
    std::thread driver([&] { // the host loop polls the CQ itself: no proxy then
        while (!a.host_loop && !stop.load(std::memory_order_relaxed) && proxy.error() == dq::QueueError::none)
            proxy.progress();
    });
    const dq::QueueView& q = queue.view();
    std::atomic<std::uint32_t> not_done{0};

    // The producers ("kernels"): thread p takes the tokens t with t % producers == p (the host loop: this thread).
    const std::uint32_t producers = a.host_loop ? 1 : a.producers;
    const auto produce = [&](const auto& one_token) {
        if (producers == 1) {
            for (std::uint32_t t = 0; t < a.tokens; ++t) one_token(t);
            return;
        }
        std::vector<std::thread> threads;
        for (std::uint32_t p = 0; p < producers; ++p) {
            threads.emplace_back([&, p] {
                for (std::uint32_t t = p; t < a.tokens; t += producers) one_token(t);
            });
        }
        for (std::thread& t : threads) t.join();
    };
    const auto wait_for = [&](std::uint64_t* word, std::uint64_t value) {
        if (dq::wait_signal(q, word, value, dq::detail::now_ns() + timeout_ns) != dq::WaitResult::done)
            not_done.fetch_add(1);
    };

    std::size_t bad = 0;
    const auto start = Clock::now();
    for (std::uint32_t round = 0; round < a.rounds; ++round) {
        for (std::uint32_t t = 0; t < a.tokens; ++t) {
            for (std::size_t i = 0; i < row; ++i) tokens[t * row + i] = pattern(me, t, i, round);
        }
        // 3. Dispatch: each token's row to its expert's rank (a copy when that is this rank), then per
        //    destination a signal with the count so far (set: cumulative over rounds).
        produce([&](std::uint32_t t) {
            const std::uint32_t to = routes.owner(me, t);
            const std::uint64_t at = (std::uint64_t{me} * a.tokens + routes.index(me, t)) * row;
            if (to == me) {
                std::memcpy(&inbox[at], &tokens[t * row], row);
            } else if (a.host_loop) {
                host.row(to, 0, at, tokens_window, t * row, row);
            } else if (push(q, put(to, inbox_window, at, tokens_window, t * row, row)) != dq::WaitResult::done) {
                not_done.fetch_add(1);
            }
        });
        for (std::uint32_t to = 0; to < n; ++to) {
            const std::uint64_t value = (round + 1) * std::uint64_t{routes.count(me, to)};
            if (to == me) continue;
            if (a.host_loop) {
                host.signal(to, std::uint64_t{me} * 8, value);
            } else if (push(q, signal(to, std::uint64_t{me} * 8, value)) != dq::WaitResult::done) {
                not_done.fetch_add(1);
            }
        }
        if (a.host_loop) host.flush();
        // 4. Our inputs: every source's count, then the experts' work on every row that came.
        for (std::uint32_t from = 0; from < n; ++from) {
            if (from != me) wait_for(&signals[from], (round + 1) * std::uint64_t{routes.count(from, me)});
        }
        for (std::uint32_t from = 0; from < n; ++from) {
            for (std::uint32_t t = 0; t < a.tokens; ++t) {
                if (routes.owner(from, t) != me) continue;
                const std::size_t at = (std::size_t{from} * a.tokens + routes.index(from, t)) * row;
                for (std::size_t i = 0; i < row; ++i) {
                    bad += inbox[at + i] != pattern(from, t, i, round) ? 1 : 0;
                    outbox[at + i] = std::byte(std::to_integer<unsigned>(inbox[at + i]) + 1);
                }
            }
        }
        // 5. Combine: every processed row back to the rank its token came from, at the token's place.
        produce([&](std::uint32_t k) { // here k walks the sources' tokens: every producer a share of each source
            for (std::uint32_t from = 0; from < n; ++from) {
                if (routes.owner(from, k) != me) continue;
                const std::uint64_t at = (std::uint64_t{from} * a.tokens + routes.index(from, k)) * row;
                if (from == me) {
                    std::memcpy(&results[k * row], &outbox[at], row);
                } else if (a.host_loop) {
                    host.row(from, 1, k * row, outbox_window, at, row);
                } else if (push(q, put(from, results_window, k * row, outbox_window, at, row)) !=
                           dq::WaitResult::done) {
                    not_done.fetch_add(1);
                }
            }
        });
        for (std::uint32_t to = 0; to < n; ++to) {
            const std::uint64_t value = (round + 1) * std::uint64_t{routes.count(to, me)};
            if (to == me) continue;
            if (a.host_loop) {
                host.signal(to, std::uint64_t{n + me} * 8, value);
            } else if (push(q, signal(to, std::uint64_t{n + me} * 8, value)) != dq::WaitResult::done) {
                not_done.fetch_add(1);
            }
        }
        if (a.host_loop) host.flush();
        for (std::uint32_t expert_rank = 0; expert_rank < n; ++expert_rank) {
            if (expert_rank != me)
                wait_for(&signals[n + expert_rank], (round + 1) * std::uint64_t{routes.count(me, expert_rank)});
        }
        for (std::uint32_t t = 0; t < a.tokens; ++t) {
            for (std::size_t i = 0; i < row; ++i) {
                bad += std::to_integer<unsigned>(results[t * row + i]) !=
                               ((std::to_integer<unsigned>(pattern(me, t, i, round)) + 1) & 0xff)
                           ? 1
                           : 0;
            }
        }
        // The next round rewrites the tokens and the outbox: what was posted from them must be done.
        if (dq::quiet(q, dq::detail::now_ns() + timeout_ns) != dq::WaitResult::done) not_done.fetch_add(1);
        if (a.progress && me == 0) {
            std::printf("rank 0: round %u of %u done at %.0f ms\n", round + 1, a.rounds,
                        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
            std::fflush(stdout);
        }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

    // 6. Every rank done before any tears its queue pairs down.
    rendezvous.fence(30s);
    stop = true;
    driver.join();
    proxy.close();
    const gpuverbs::DeviceQueueProxyCounters& c = proxy.counters();
    std::printf(
        "rank %u of %u on %s (%s): %u rounds of dispatch and combine, %u tokens of %zu bytes, %s; %u waits not "
        "done; %.0f tokens/s; the proxy posted %llu requests in %llu doorbells\n",
        me, n, first.device.name().c_str(), a.host_loop ? "host loop" : "device queue", a.rounds, a.tokens, row,
        bad == 0 ? "every byte verified" : "MISMATCH", not_done.load(), a.rounds * a.tokens / seconds,
        static_cast<unsigned long long>(c.requests), static_cast<unsigned long long>(c.chains));
    if (!a.host_loop && proxy.error() != dq::QueueError::closed)
        std::printf("rank %u: the proxy says: %s\n", me, proxy.failure().c_str());
    if (!a.host_loop && c.rail_failures > 0) {
        // What failed over: each peer's rails as the proxy saw them.
        std::printf("rank %u: %llu rails failed, %llu descriptors posted again on the next rail\n", me,
                    static_cast<unsigned long long>(c.rail_failures), static_cast<unsigned long long>(c.reposted));
        for (const gpuverbs::DeviceQueueRailState& r : proxy.rails()) {
            if (r.failed) std::printf("rank %u: peer %u rail %u: %s\n", me, r.peer, r.rail, r.failure.c_str());
        }
    }
    return bad == 0 && not_done.load() == 0 ? 0 : 1;
}

#if GPUVERBS_EXAMPLE_HAVE_KERNELS
using example::name_of;

/// The GPU half: every rank's kernel on this GPU, the host doing the NIC's part for every ring.
int gpu_half(const Args& a) {
    const std::uint32_t n = a.ranks;
    const Routes routes(n, a.tokens, a.experts);
    const std::size_t row = a.row;
    const std::size_t rows = std::size_t{n} * a.tokens;
    std::vector<gpuverbs::DeviceQueue> queues;
    std::vector<gpuverbs::GpuBuffer> memory; // per rank: tokens, inbox, results, outbox, signals
    std::vector<example::RankMemory> ranks(n);
    for (std::uint32_t r = 0; r < n; ++r) {
        queues.push_back(gpuverbs::DeviceQueue::on_gpu(a.gpu, 12));
        ranks[r].queue = queues.back().view();
        const gpuverbs::GpuBufferOptions on{.gpu = a.gpu};
        for (const std::size_t bytes : {a.tokens * row, rows * row, a.tokens * row, rows * row, 2 * std::size_t{n} * 8})
            memory.emplace_back(bytes, on);
        auto* at = &memory[std::size_t{r} * 5];
        ranks[r].tokens = static_cast<std::uint8_t*>(at[0].pointer());
        ranks[r].inbox = static_cast<std::uint8_t*>(at[1].pointer());
        ranks[r].results = static_cast<std::uint8_t*>(at[2].pointer());
        ranks[r].outbox = static_cast<std::uint8_t*>(at[3].pointer());
        ranks[r].signals = static_cast<std::uint64_t*>(at[4].pointer());
    }
    std::vector<std::uint32_t> owner(rows), index(rows), count(std::size_t{n} * n);
    for (std::uint32_t r = 0; r < n; ++r) {
        for (std::uint32_t t = 0; t < a.tokens; ++t) {
            owner[std::size_t{r} * a.tokens + t] = routes.owner(r, t);
            index[std::size_t{r} * a.tokens + t] = routes.index(r, t);
        }
        for (std::uint32_t to = 0; to < n; ++to) count[std::size_t{r} * n + to] = routes.count(r, to);
    }
    std::string why;
    const example::Shape shape{n, a.tokens, row, a.rounds, timeout_ns};
    const auto start = Clock::now();
    if (!example::start_ranks(ranks, shape, owner, index, count, why)) {
        std::fprintf(stderr, "gpu-half: %s\n", why.c_str());
        return 1;
    }
    // The NIC: each ring's requests in order, each one's copy (or signal) done before its credit returns.
    std::vector<dq::RingReader> readers;
    readers.reserve(n);
    for (gpuverbs::DeviceQueue& q : queues) readers.emplace_back(q.proxy_view());
    std::uint64_t puts = 0, signals = 0, refused = 0;
    bool running = true;
    while (running && why.empty() && Clock::now() - start < std::chrono::seconds(120)) {
        for (std::uint32_t r = 0; r < n && why.empty(); ++r) {
            dq::Request q;
            if (readers[r].try_take(q) != dq::Decoded::complete) continue;
            const example::RankMemory* to = q.peer < n ? &ranks[q.peer] : nullptr;
            const std::uint8_t* src = q.src_window == tokens_window   ? ranks[r].tokens
                                      : q.src_window == outbox_window ? ranks[r].outbox
                                                                      : nullptr;
            const std::size_t src_bytes = q.src_window == tokens_window ? a.tokens * row : rows * row;
            std::uint8_t* dst = to == nullptr                    ? nullptr
                                : q.dst_window == inbox_window   ? to->inbox
                                : q.dst_window == results_window ? to->results
                                                                 : nullptr;
            const std::size_t dst_bytes = q.dst_window == inbox_window ? rows * row : a.tokens * row;
            if (q.op == dq::Op::put && src != nullptr && dst != nullptr && q.src_offset + q.bytes <= src_bytes &&
                q.dst_offset + q.bytes <= dst_bytes) {
                if (!example::copy_on_gpu(dst + q.dst_offset, src + q.src_offset, q.bytes, why)) break;
                ++puts;
            } else if (q.op == dq::Op::signal && to != nullptr && q.signal_window == signals_window &&
                       q.signal_op == dq::SignalOp::set && q.signal_offset + 8 <= 2 * std::size_t{n} * 8) {
                if (!example::store_on_gpu(to->signals + q.signal_offset / 8, q.signal_value, why)) break;
                ++signals;
            } else {
                ++refused; // not what these kernels push: the ring ends, every wait with `refused`
                readers[r].fail(dq::QueueError::refused);
                continue;
            }
            readers[r].complete(readers[r].taken()); // done, as the proxy says once the NIC completed it
        }
        if (!example::ranks_running(running, why)) break;
    }
    std::vector<std::uint32_t> worst;
    std::vector<unsigned long long> wrong;
    if (!why.empty() || !example::finish_ranks(worst, wrong, why)) {
        std::fprintf(stderr, "gpu-half: %s\n", why.c_str());
        return 1;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    int failed = 0;
    for (std::uint32_t r = 0; r < n; ++r) {
        const bool ok = worst[r] == 0 && wrong[r] == 0;
        failed += ok ? 0 : 1;
        std::printf(
            "gpu-half: rank %u of %u (a thread block): %u rounds of dispatch and combine, %u tokens of %zu "
            "bytes, %s; worst wait %s\n",
            r, n, a.rounds, a.tokens, row, wrong[r] == 0 ? "every byte verified" : "MISMATCH",
            name_of(static_cast<dq::WaitResult>(worst[r])));
    }
    std::printf(
        "gpu-half: the host, as the NIC, did %llu puts and %llu signals (%llu not as pushed) in %.3f s: "
        "%.0f tokens/s per rank, both ways\n",
        static_cast<unsigned long long>(puts), static_cast<unsigned long long>(signals),
        static_cast<unsigned long long>(refused), seconds, a.rounds * a.tokens / seconds);
    return failed == 0 && refused == 0 ? 0 : 1;
}
#endif

/// --gpu-half where it can run: a GPU and the kernels.
int gpu_half_or_why(const Args& a) {
#if GPUVERBS_EXAMPLE_HAVE_KERNELS
    std::string no_gpu = "CUDA sees no GPU";
    try {
        if (!gpuverbs::list_gpus().empty()) return gpu_half(a);
    } catch (const gpuverbs::Error& e) {
        if (e.code() != gpuverbs::errc::no_gpu_driver && e.code() != gpuverbs::errc::no_gpu) throw;
        no_gpu = e.what();
    }
    std::printf("gpu-half: no GPU here (%s): the GPU half runs on a machine with one; mpirun runs the NIC half\n",
                no_gpu.c_str());
#else
    (void)a;
    std::printf("gpu-half: built without nvcc, so the kernels are not here (mpirun runs the NIC half)\n");
#endif
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    return tools::run_main("08_gpu_all_to_all", 1, [&] {
        Args a;
        tools::CommandLine cli("08_gpu_all_to_all", "N ranks dispatch tokens to their experts and combine them back.",
                               2);
        cli.usage({{"[options]", "under mpirun / srun (PMIx)"}});
        cli.app.add_option("--devices", a.devices, "RDMA devices, taken in turn by rank (default: the first)")
            ->type_name("D1,D2");
        cli.app
            .add_option("--second-rail", a.second_rail,
                        "devices of every peer's second rail, taken in turn by rank (the proxy fails over to it)")
            ->type_name("D1,D2");
        cli.app.add_option("--tokens", a.tokens, "tokens per rank")->check(CLI::Range(1U, 1U << 16));
        cli.app.add_option("--row", a.row, "bytes per token's row")
            ->check(CLI::Range(std::size_t(1), std::size_t(1) << 20));
        cli.app.add_option("--experts", a.experts, "experts per rank")->check(CLI::Range(1U, 64U));
        cli.app.add_option("--producers", a.producers, "CPU threads playing the kernels")->check(CLI::Range(1U, 64U));
        cli.app.add_option("--rounds", a.rounds, "dispatch and combine rounds")->check(CLI::Range(1U, 100000U));
        cli.app.add_flag("--host-loop", a.host_loop, "the baseline: this thread posts the same moves, no ring");
        cli.app.add_flag("--progress", a.progress, "rank 0 says when each round is done");
        cli.app.add_flag("--gpu-half", a.gpu_half,
                         "no launcher, no NIC: every rank's kernel on one GPU, the host as the NIC");
        cli.app.add_option("--gpu", a.gpu, "--gpu-half: the CUDA device")->type_name("N");
        cli.app.add_option("--ranks", a.ranks, "--gpu-half: ranks (a thread block each)")->check(CLI::Range(2U, 64U));
        if (auto status = cli.parse(argc, argv)) return *status;
        if (a.gpu_half) return gpu_half_or_why(a);
        try {
            gpuverbs::PmixRendezvous job; // rank and size from mpirun / srun
            return all_to_all(job, a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "08_gpu_all_to_all: %s\n", e.what());
            return 1;
        }
    });
}
