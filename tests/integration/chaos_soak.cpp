// The chaos soak: an owner and its peers move blocks over two rails each,
// continuously, while tests/integration/chaos-soak breaks the rig under them
// (links down and up, a silent wire, a slow rail, queue pairs destroyed and
// reconnected, peers killed and restarted). What a user relies on is checked
// all the time, in each process, and summed by tests/integration/chaos_check.py:
// - every transfer's handler runs exactly once, and no later than its
//   deadline plus the bound docs/transfers.md states;
// - what a report calls landed is exact at the destination (reads: in our
//   memory; writes: read back), what it calls never posted is untouched;
// - a notification reaches the owner at most once, and once for every
//   transfer that succeeded with one;
// - a post on a queue pair known to be in error is refused at once;
// - open descriptors and resident memory stay flat after warm-up.
//
//   gpuverbs_chaos_soak owner --port P --peers N --log FILE
//   gpuverbs_chaos_soak peer  --id K --port P --log FILE [--seconds S]
//
// Rail 0 is the rig's first wire (the owner on rxe0, peers on rxe1), rail 1
// its second (rxe2, rxe3: setup-rxe rails-up). Each peer has its own slice
// of the owner's write area; every peer reads the owner's read area, which
// holds a fixed pattern.
#include "gpuverbs/gpuverbs.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace gpuverbs;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t block = 16384;
constexpr std::size_t slots = 256; ///< blocks in each peer's slice of the write area, and in the read area
constexpr std::size_t max_peers = 8;
constexpr const char* devices[2][2] = {{"rxe0", "rxe2"}, {"rxe1", "rxe3"}}; // [owner|peer][rail]

std::atomic<bool> stopping{false};

/// Wall-clock seconds, as the soak's script writes its faults' times (date +%s.%N).
double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
std::atomic<bool> chaos_destroy{false}; // SIGUSR1: destroy rail 1's queue pair mid-transfer

/// The read area's bytes: a fixed pattern every peer can check.
std::byte read_pattern(std::size_t i) {
    return std::byte(((i * 2654435761U) >> 11) & 0xff);
}
/// What peer `peer` writes in transfer `seq` at byte i of block `b`.
std::byte write_pattern(std::uint32_t peer, std::uint32_t seq, std::size_t b, std::size_t i) {
    return std::byte((i * 131 + b * 7 + seq * 13 + peer * 101 + (i >> 9)) & 0xff);
}
std::uint32_t notification_of(std::uint32_t peer, std::uint32_t seq) {
    return (peer << 24) | (seq & 0xffffff);
}

/// The process's open descriptors and resident kilobytes.
std::pair<std::size_t, std::size_t> resources() {
    std::size_t fds = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (readdir(d) != nullptr) ++fds;
        closedir(d);
    }
    std::size_t rss = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmRSS:", 0) == 0) rss = std::stoul(line.substr(6));
    }
    return {fds, rss};
}

class Log {
public:
    explicit Log(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
        if (f_ == nullptr) throw std::runtime_error("cannot open " + path);
    }
    Log(const Log&) = delete;
    Log& operator=(const Log&) = delete;
    ~Log() { std::fclose(f_); }
    template <class... A>
    void line(const char* format, A... a) {
        std::lock_guard lock(mutex_);
        std::fprintf(f_, format, a...);
        std::fputc('\n', f_);
        std::fflush(f_);
    }

private:
    std::FILE* f_;
    std::mutex mutex_;
};

std::string arg(int argc, char** argv, const char* name, const char* fallback = "") {
    for (int i = 1; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
    }
    return fallback;
}

// --- the owner ----------------------------------------------------------------

/// What a peer says first on a bootstrap connection: who it is and which rail.
struct Hello {
    std::uint32_t peer = 0;
    std::uint32_t rail = 0;
};

int run_owner(std::uint16_t port, std::size_t peers, Log& log) {
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::vector<std::byte> write_area(max_peers * slots * block);
    std::vector<std::byte> read_area(slots * block);
    for (std::size_t i = 0; i < read_area.size(); ++i) read_area[i] = read_pattern(i);
    struct Rail {
        Device device;
        ProtectionDomain pd;
        CompletionQueue cq;
        MemoryRegion writes, reads;
        Rail(const char* name, const asio::any_io_executor& ex, std::span<std::byte> w, std::span<std::byte> r)
            : device(Device::open(name)),
              pd(device),
              cq(device, 4096, ex),
              writes(pd, w, Access::local_write | Access::remote_write | Access::remote_read),
              // Remote write too: a read transfer's notification is a zero-byte write to its last block.
              reads(pd, r, Access::local_write | Access::remote_read | Access::remote_write) {}
    };
    std::array<std::unique_ptr<Rail>, 2> rails;
    for (int k = 0; k < 2; ++k)
        rails[k] = std::make_unique<Rail>(devices[0][k], io.get_executor(), write_area, read_area);
    // The queue pairs by (peer, rail), touched only on the io thread.
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::shared_ptr<QueuePair>> qps;
    std::map<std::uint32_t, int> seen; // notifications received, by immediate
    std::uint64_t duplicates = 0;
    std::vector<std::byte> sink(64);
    MemoryRegion sink0(rails[0]->pd, sink, Access::local_write), sink1(rails[1]->pd, sink, Access::local_write);
    std::function<void(std::shared_ptr<QueuePair>, std::uint32_t)> receive = [&](std::shared_ptr<QueuePair> qp,
                                                                                 std::uint32_t rail) {
        const MemoryRegion& mr = rail == 0 ? sink0 : sink1;
        qp->async_receive(mr.slice(0, 0),
                          [&, weak = std::weak_ptr<QueuePair>(qp), rail](boost::system::error_code ec, Received got) {
                              if (ec || !got.immediate) return; // the queue pair failed or was replaced
                              if (++seen[*got.immediate] > 1) ++duplicates;
                              log.line("notified %u %u", *got.immediate >> 24, *got.immediate & 0xffffff);
                              if (auto qp = weak.lock()) receive(qp, rail);
                          });
    };

    std::thread runner([&] { io.run(); });
    TcpListener listener(io, port, "127.0.0.1");
    log.line("owner ready %u", static_cast<unsigned>(port));
    std::fprintf(stdout, "owner: listening on %u for %zu peers\n", static_cast<unsigned>(port), peers);
    std::fflush(stdout);
    std::uint64_t connections = 0;
    auto last_resources = Clock::now();
    while (!stopping) {
        if (Clock::now() - last_resources > 5s) {
            const auto [fds, rss] = resources();
            log.line("resources %zu %zu", fds, rss);
            last_resources = Clock::now();
        }
        try {
            asio::ip::tcp::socket s = listener.accept(1000ms);
            const std::vector<std::byte> hello_bytes = receive_record(s, sizeof(Hello), 5s);
            Hello hello;
            if (hello_bytes.size() != sizeof hello) continue;
            std::memcpy(&hello, hello_bytes.data(), sizeof hello);
            if (hello.peer >= max_peers || hello.rail > 1) continue;
            Rail& r = *rails[hello.rail];
            QueuePairOptions o;
            o.max_send_wr = 64;
            o.max_recv_wr = 64;
            PreparedQueuePair prepared(r.pd, r.cq, r.cq, o);
            RemoteMemory mine = prepared.advertise(r.writes); // this peer's slots of it, below
            mine.address += std::uint64_t{hello.peer} * slots * block;
            mine.length = slots * block;
            const Handshake theirs =
                exchange_handshake(s, {prepared.endpoint(), {mine, prepared.advertise(r.reads)}}, 5s);
            auto qp = std::make_shared<QueuePair>(std::move(prepared).connect(theirs.endpoint));
            ++connections;
            asio::post(io, [&, qp, hello] {
                qps[{hello.peer, hello.rail}] = qp; // the one it replaces goes: its receives end aborted
                for (int i = 0; i < 16; ++i) receive(qp, hello.rail);
            });
            log.line("connected %u %u", hello.peer, hello.rail);
        } catch (const std::exception& e) {
            if (std::strstr(e.what(), "timed out") == nullptr) log.line("bootstrap-error %s", e.what());
        }
    }
    std::promise<void> drained;
    asio::post(io, [&] {
        qps.clear();
        drained.set_value();
    });
    drained.get_future().wait();
    work.reset();
    io.stop();
    runner.join();
    log.line("owner-summary connections=%llu notifications=%zu duplicates=%llu",
             static_cast<unsigned long long>(connections), seen.size(), static_cast<unsigned long long>(duplicates));
    return duplicates == 0 ? 0 : 1;
}

// --- a peer -------------------------------------------------------------------

struct PeerStats {
    std::uint64_t transfers = 0, writes = 0, reads = 0, succeeded = 0, failed = 0;
    std::uint64_t bytes_verified = 0, blocks_verified = 0, untouched_verified = 0;
    std::uint64_t corrupt = 0, handler_missing = 0, handler_doubled = 0, late = 0;
    std::uint64_t failovers = 0, reconnects = 0, reuse_refused = 0, reuse_wrong = 0, destroyed = 0;
    std::uint64_t qps_declared_failed = 0, completed_by_library = 0;
};

class Peer {
public:
    Peer(std::uint32_t id, std::uint32_t epoch, std::uint16_t port, Log& log)
        : id_(id), port_(port), log_(log), source_(slots * block), scratch_(slots * block), seq_(epoch * 100000) {
        for (int k = 0; k < 2; ++k) {
            rails_[k] = std::make_unique<Rail>(devices[1][k], io_.get_executor(), source_, scratch_);
        }
    }

    int run(std::chrono::seconds seconds) {
        const auto end = Clock::now() + seconds;
        std::mt19937_64 rng(0x5eed0000ULL + id_ * 7919 +
                            static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
        auto last_resources = Clock::now();
        log_.line("peer ready %u", id_); // a new process: chaos_check.py counts its resources apart
        for (int k = 0; k < 2; ++k) reconnect(k);
        while (!stopping && Clock::now() < end) {
            for (int k = 0; k < 2; ++k) {
                if (!rails_[k]->qp || rails_[k]->qp->failure()) {
                    if (rails_[k]->qp && rails_[k]->qp->failure()) reuse_after_error(k);
                    if (Clock::now() >= rails_[k]->retry_at) reconnect(k);
                }
            }
            if (!rails_[0]->qp && !rails_[1]->qp) {
                std::this_thread::sleep_for(200ms);
                continue;
            }
            one_transfer(rng);
            if (Clock::now() - last_resources > 5s) {
                const auto [fds, rss] = resources();
                log_.line("resources %zu %zu", fds, rss);
                last_resources = Clock::now();
            }
        }
        for (int k = 0; k < 2; ++k) {
            const AsyncStatistics s = rails_[k]->cq.async_statistics();
            stats_.qps_declared_failed += s.queue_pairs_failed;
            stats_.completed_by_library += s.completed_by_library;
        }
        const PeerStats& s = stats_;
        log_.line(
            "peer-summary transfers=%llu writes=%llu reads=%llu succeeded=%llu failed=%llu bytes_verified=%llu "
            "blocks_verified=%llu untouched_verified=%llu corrupt=%llu handler_missing=%llu "
            "handler_doubled=%llu late=%llu failovers=%llu reconnects=%llu reuse_refused=%llu reuse_wrong=%llu "
            "destroyed=%llu qps_declared_failed=%llu completed_by_library=%llu",
            u(s.transfers), u(s.writes), u(s.reads), u(s.succeeded), u(s.failed), u(s.bytes_verified),
            u(s.blocks_verified), u(s.untouched_verified), u(s.corrupt), u(s.handler_missing), u(s.handler_doubled),
            u(s.late), u(s.failovers), u(s.reconnects), u(s.reuse_refused), u(s.reuse_wrong), u(s.destroyed),
            u(s.qps_declared_failed), u(s.completed_by_library));
        const bool clean =
            s.corrupt == 0 && s.handler_missing == 0 && s.handler_doubled == 0 && s.late == 0 && s.reuse_wrong == 0;
        return clean ? 0 : 1;
    }

private:
    static unsigned long long u(std::uint64_t v) { return v; }

    struct Rail {
        Device device;
        ProtectionDomain pd;
        CompletionQueue cq;
        MemoryRegion source, scratch;
        std::unique_ptr<QueuePair> qp;
        RemoteMemory writes, reads; ///< the owner's, as this rail's queue pair reaches them
        Clock::time_point retry_at{};
        Rail(const char* name, const asio::any_io_executor& ex, std::span<std::byte> s, std::span<std::byte> t)
            : device(Device::open(name)),
              pd(device),
              cq(device, 4096, ex),
              source(pd, s, Access::local_write),
              scratch(pd, t, Access::local_write) {}
    };

    /// A new queue pair on rail k, and the owner's for it (a new bootstrap connection).
    void reconnect(int k) {
        Rail& r = *rails_[k];
        if (r.qp) { // account for what the old one's CQ saw before it goes
            r.qp.reset();
            drain(50ms);
        }
        try {
            asio::io_context bootstrap;
            asio::ip::tcp::socket s = tcp_connect(bootstrap, "127.0.0.1", port_, 2s);
            const Hello hello{id_, static_cast<std::uint32_t>(k)};
            send_record(s, std::as_bytes(std::span(&hello, 1)), 2s);
            QueuePairOptions o;
            o.max_send_wr = 128;
            PreparedQueuePair prepared(r.pd, r.cq, r.cq, o);
            const Handshake theirs = exchange_handshake(s, {prepared.endpoint(), {}}, 5s);
            if (theirs.regions.size() != 2) throw std::runtime_error("the owner gave no regions");
            r.qp = std::make_unique<QueuePair>(std::move(prepared).connect(theirs.endpoint));
            r.writes = theirs.regions[0];
            r.reads = theirs.regions[1];
            ++stats_.reconnects;
            log_.line("connected %d", k);
        } catch (const std::exception& e) {
            r.qp.reset();
            r.retry_at = Clock::now() + 1s;
            log_.line("reconnect-failed %d %s", k, e.what());
        }
    }

    /// A post on a queue pair gpuverbs knows is in error: refused at once, with the words that say so.
    void reuse_after_error(int k) {
        Rail& r = *rails_[k];
        std::optional<boost::system::error_code> got;
        const auto t0 = Clock::now();
        r.qp->async_write(r.source.slice(0, 64), r.writes, 0,
                          [&](boost::system::error_code ec, std::size_t) { got = ec; });
        io_.restart();
        while (!got && Clock::now() - t0 < 5s) io_.run_for(10ms);
        if (got && *got == std::error_code(errc::queue_pair_in_error) && Clock::now() - t0 < 1s) {
            ++stats_.reuse_refused;
        } else {
            ++stats_.reuse_wrong;
            log_.line("violation reuse rail=%d got=%s", k, got ? got->message().c_str() : "nothing");
        }
    }

    void drain(std::chrono::milliseconds d) {
        io_.restart();
        io_.run_for(d);
    }

    void one_transfer(std::mt19937_64& rng) {
        const std::uint32_t seq = ++seq_;
        const bool write = rng() % 10 < 7;
        const std::size_t count = 16 + rng() % 49;
        // Distinct slots, in random order.
        std::vector<std::size_t> chosen(slots);
        for (std::size_t i = 0; i < slots; ++i) chosen[i] = i;
        std::shuffle(chosen.begin(), chosen.end(), rng);
        chosen.resize(count);
        std::vector<TransferRail> rails;
        std::vector<int> rail_of;
        for (int k = 0; k < 2; ++k) {
            if (!rails_[k]->qp || rails_[k]->qp->failure()) continue;
            rails.push_back(TransferRail{rails_[k]->qp.get(), {}, {}});
            rail_of.push_back(k);
        }
        if (rails.empty()) return;
        Rail& base = *rails_[rail_of[0]]; // the plan's keys are this rail's
        for (std::size_t j = 1; j < rails.size(); ++j) {
            Rail& other = *rails_[rail_of[j]];
            rails[j].local(base.source, other.source).local(base.scratch, other.scratch);
            rails[j].remote(write ? base.writes : base.reads, write ? other.writes : other.reads);
        }
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t b = 0; b < count; ++b) {
            const std::size_t slot = chosen[b];
            if (write) {
                std::byte* at = source_.data() + b * block;
                for (std::size_t i = 0; i < block; ++i) at[i] = write_pattern(id_, seq, slot, i);
                local.push_back(base.source.slice(b * block, block));
                remote.push_back({base.writes, slot * block, block});
            } else {
                std::memset(scratch_.data() + b * block, 0xee, block); // never posted stays poison
                local.push_back(base.scratch.slice(b * block, block));
                remote.push_back({base.reads, slot * block, block});
            }
        }
        const TransferPlan plan(write ? TransferDirection::write : TransferDirection::read, local, remote,
                                TransferLimits{1});
        TransferResult got;
        const TransferReport& report = got.report;
        const std::string& why = got.failed_blocks;
        TransferOptions options;
        options.report_blocks = true;
        options.notify = notification_of(id_, seq);
        const double started_at = wall_seconds(); // chaos_check.py judges it against the faults it met
        const auto deadline = Clock::now() + 8s;
        options.deadline = deadline;
        int calls = 0;
        boost::system::error_code result;
        Clock::time_point ended{};
        async_transfer(std::span<const TransferRail>(rails), plan, options,
                       [&](boost::system::error_code ec, TransferResult r) {
                           ++calls;
                           result = ec;
                           got = std::move(r);
                           ended = Clock::now();
                       });
        ++stats_.transfers;
        ++(write ? stats_.writes : stats_.reads);
        io_.restart();
        const bool destroy = chaos_destroy.exchange(false) && rails.size() == 2;
        if (destroy) {
            io_.run_for(5ms);
            rails_[rail_of[1]]->qp.reset(); // mid-transfer: its requests fail over
            rails_[rail_of[1]]->retry_at = Clock::now();
            ++stats_.destroyed;
            log_.line("fault qp-destroyed %d", rail_of[1]);
        }
        // The bound: the deadline, then what the watch needs to end what the provider holds
        // (stall bound + two ticks + grace, ~1.8 s with the defaults), and a second for the rig.
        const auto bound = deadline + 3s;
        while (calls == 0 && Clock::now() < bound + 10s) io_.run_for(10ms);
        io_.run_for(20ms); // a second call would come now
        if (calls == 0) {
            ++stats_.handler_missing;
            log_.line("violation handler-missing seq=%u", seq);
            stopping = true; // the transfer still refers to our memory: stop here
            return;
        }
        if (calls > 1) {
            ++stats_.handler_doubled;
            log_.line("violation handler-doubled seq=%u", seq);
        }
        if (ended > bound) {
            ++stats_.late;
            log_.line(
                "violation late seq=%u by=%lldms", seq,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(ended - bound).count()));
        }
        for (const auto& r : report.rails) {
            if (r.took_over > 0) ++stats_.failovers;
        }
        const double ended_at = wall_seconds() - std::chrono::duration<double>(Clock::now() - ended).count();
        if (!result) {
            ++stats_.succeeded;
            log_.line("ok %s %u notify %u t0=%.6f t1=%.6f", write ? "write" : "read", seq, options.notify.value_or(0),
                      started_at, ended_at);
        } else {
            ++stats_.failed;
            log_.line("failed %s %u t0=%.6f t1=%.6f %s (%s)", write ? "write" : "read", seq, started_at, ended_at,
                      result.message().c_str(), why.c_str());
        }
        check(write, seq, chosen, report, !result);
    }

    /// What the report says against the memory: landed blocks exact, never-posted ones untouched.
    void check(bool write, std::uint32_t seq, const std::vector<std::size_t>& chosen, const TransferReport& report,
               bool success) {
        const std::size_t count = chosen.size();
        if (report.remote_blocks.size() != count) {
            ++stats_.corrupt;
            log_.line("violation report-size seq=%u", seq);
            return;
        }
        if (success && report.landed != count) {
            ++stats_.corrupt;
            log_.line("violation success-not-landed seq=%u", seq);
        }
        if (!write) {
            for (std::size_t b = 0; b < count; ++b) {
                const std::byte* at = scratch_.data() + b * block;
                const std::size_t from = chosen[b] * block;
                if (report.remote_blocks[b] == BlockState::landed) {
                    bool ok = true;
                    for (std::size_t i = 0; i < block && ok; ++i) ok = at[i] == read_pattern(from + i);
                    if (!ok) {
                        ++stats_.corrupt;
                        log_.line("violation read-landed-wrong seq=%u block=%zu", seq, b);
                    } else {
                        ++stats_.blocks_verified;
                        stats_.bytes_verified += block;
                    }
                } else if (report.remote_blocks[b] == BlockState::not_posted) {
                    bool ok = true;
                    for (std::size_t i = 0; i < block && ok; ++i) ok = at[i] == std::byte{0xee};
                    if (!ok) {
                        ++stats_.corrupt;
                        log_.line("violation read-not-posted-touched seq=%u block=%zu", seq, b);
                    } else {
                        ++stats_.untouched_verified;
                    }
                }
            }
            return;
        }
        // Writes: read the landed blocks back (over any rail that works; skipped when none does).
        std::vector<std::size_t> landed;
        for (std::size_t b = 0; b < count; ++b) {
            if (report.remote_blocks[b] == BlockState::landed) landed.push_back(b);
        }
        if (landed.empty()) return;
        int k = -1;
        for (int j = 0; j < 2 && k < 0; ++j) {
            if (rails_[j]->qp && !rails_[j]->qp->failure()) k = j;
        }
        if (k < 0) return;
        Rail& r = *rails_[k];
        std::vector<LocalBuffer> local;
        std::vector<RemoteBlock> remote;
        for (std::size_t n = 0; n < landed.size(); ++n) {
            std::memset(scratch_.data() + n * block, 0xee, block);
            local.push_back(r.scratch.slice(n * block, block));
            remote.push_back({r.writes, chosen[landed[n]] * block, block});
        }
        const TransferPlan back(TransferDirection::read, local, remote, TransferLimits{1});
        TransferOptions o;
        o.deadline = Clock::now() + 5s;
        std::optional<boost::system::error_code> got;
        async_transfer(*r.qp, back, o, [&](boost::system::error_code ec, std::size_t) { got = ec; });
        io_.restart();
        const auto limit = Clock::now() + 20s;
        while (!got && Clock::now() < limit) io_.run_for(10ms);
        if (!got) {
            ++stats_.handler_missing;
            log_.line("violation readback-handler-missing seq=%u", seq);
            stopping = true;
            return;
        }
        if (*got) return; // the read-back itself met a fault: nothing to conclude
        for (std::size_t n = 0; n < landed.size(); ++n) {
            const std::byte* at = scratch_.data() + n * block;
            bool ok = true;
            for (std::size_t i = 0; i < block && ok; ++i) ok = at[i] == write_pattern(id_, seq, chosen[landed[n]], i);
            if (!ok) {
                ++stats_.corrupt;
                log_.line("violation write-landed-wrong seq=%u block=%zu", seq, landed[n]);
            } else {
                ++stats_.blocks_verified;
                stats_.bytes_verified += block;
            }
        }
    }

    std::uint32_t id_;
    std::uint16_t port_;
    Log& log_;
    asio::io_context io_{1};
    std::vector<std::byte> source_, scratch_;
    std::array<std::unique_ptr<Rail>, 2> rails_;
    std::uint32_t seq_;
    PeerStats stats_;
};

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s owner|peer --port P [--peers N] [--id K] [--seconds S] --log FILE\n", argv[0]);
        return 2;
    }
    std::signal(SIGTERM, [](int) { stopping = true; });
    std::signal(SIGINT, [](int) { stopping = true; });
    std::signal(SIGUSR1, [](int) { chaos_destroy = true; });
    std::signal(SIGPIPE, SIG_IGN);
    // The soak's script sends its signals only once this file exists: a signal that came before the
    // handlers above would kill the process with its default action (status 143), not stop it.
    if (const std::string ready = arg(argc, argv, "--ready"); !ready.empty()) {
        std::ofstream(ready) << getpid() << '\n';
    }
    const std::string role = argv[1];
    const auto port = static_cast<std::uint16_t>(std::stoi(arg(argc, argv, "--port", "18600")));
    try {
        Log log(arg(argc, argv, "--log", "/dev/stderr"));
        if (role == "owner") return run_owner(port, std::stoul(arg(argc, argv, "--peers", "2")), log);
        if (role == "peer") {
            // A restarted peer gets a new epoch: its transfers' notifications never repeat an earlier life's.
            Peer peer(static_cast<std::uint32_t>(std::stoul(arg(argc, argv, "--id", "1"))),
                      static_cast<std::uint32_t>(std::stoul(arg(argc, argv, "--epoch", "0"))), port, log);
            return peer.run(std::chrono::seconds(std::stoi(arg(argc, argv, "--seconds", "100000"))));
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chaos_soak %s: %s\n", role.c_str(), e.what());
        return 3;
    }
    return 2;
}
