// gpuverbs-perf: perftest's measurements (ib_write_bw, ib_read_bw,
// ib_send_bw, ib_write_lat, ib_send_lat) made with gpuverbs, on host or GPU
// memory, so they can be set beside perftest's on the same devices.
//
//   gpuverbs-perf write_bw server --device rxe1
//   gpuverbs-perf write_bw client 10.0.0.2 --device rxe0 --sweep
//   gpuverbs-perf write_lat loopback --device rxe0 --device2 rxe1 --size 4096
//
// Per size, the client tells the server the size and the iteration count
// over the TCP connection (control.hpp: the server refuses what its buffer
// cannot hold), the server gets ready (posts receives), both run, and the
// client reports. Each side registers its buffer with only the access the
// mode uses (access_for).
// Bandwidth: iterations back to back with up to --tx-depth in flight, timed
// from the first post to the last completion. Latency: ping-pong with a
// write each way, one way = half the round trip, as perftest reports it.
// On host memory the receiver sees a write arrive by polling the buffer's
// last byte (as ib_write_lat does); on GPU memory, which the CPU cannot poll,
// by the completion of a write-with-immediate; send_lat by the receive's completion.
#include "control.hpp"
#include "perf_options.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;
using perf::Mode;
using perf::Options;
using perf::Result;
namespace gv = gpuverbs;

// What the NIC may do with one side's buffer: only what the mode uses it for.
//   write_bw   the client RDMA-writes into the server's buffer; its own is only read
//   read_bw    the client RDMA-reads the server's buffer into its own
//   send_bw    the server's receives land in its buffer; the client's is only read
//   write_lat  each side RDMA-writes into the other's buffer
//   send_lat   each side receives into its own buffer
// No mode runs atomics, so no side allows them.
gv::Access access_for(Mode mode, bool server) {
    using gv::Access;
    switch (mode) {
        case Mode::write_bw: return server ? Access::local_write | Access::remote_write : Access::none;
        case Mode::read_bw: return server ? Access::remote_read : Access::local_write;
        case Mode::send_bw: return server ? Access::local_write : Access::none;
        case Mode::write_lat: return Access::local_write | Access::remote_write;
        case Mode::send_lat: return Access::local_write;
    }
    throw std::logic_error("access_for: unknown mode");
}

// One end: device, memory (host or GPU) registered for RDMA, CQ and QP.
struct End {
    gv::Access access;      // what the peer (and our NIC) may do with our buffer
    std::size_t capacity{}; // the largest message the buffer holds
    gv::Device device;
    gv::ProtectionDomain pd;
    gv::CompletionQueue cq;
    std::vector<std::byte> host;
    gv::GpuBuffer gpu;
    gv::MemoryRegion mr;
    gv::PreparedQueuePair prepared;
    gv::QueuePair qp;
    gv::RemoteMemory peer;

    End(const Options& o, const std::string& name, bool server)
        : access(access_for(o.mode, server)),
          capacity(*std::max_element(o.sizes.begin(), o.sizes.end())),
          device(name.empty() ? gv::Device::open_first() : gv::Device::open(name)),
          pd(device),
          cq(device, static_cast<int>(o.tx_depth + o.rx_depth + 16)) {
        if (o.gpu) {
            gpu = gv::GpuBuffer(capacity, {.gpu = *o.gpu});
            auto policy = gv::parse_gpu_registration(o.registration);
            if (!policy) throw gv::Error(gv::errc::invalid_argument, "--registration", "auto, dmabuf or peermem");
            mr = gv::register_gpu_memory(pd, gpu, access, *policy);
        } else {
            // write_lat polls memory: writes arrive in the lower half and are sent from the upper half.
            host.resize(o.mode == Mode::write_lat ? 2 * capacity : capacity);
            mr = gv::MemoryRegion(pd, host, access);
        }
        gv::QueuePairOptions q;
        q.max_send_wr = o.tx_depth + 1;
        q.max_recv_wr = o.rx_depth + 1;
        q.max_inline_data = o.inline_size;
        q.port = o.ib_port;
        prepared = gv::PreparedQueuePair(pd, cq, cq, q);
    }

    void connect(const Options& o, const gv::Handshake& theirs) {
        gv::ConnectOptions c;
        if (o.mtu) c.path_mtu = static_cast<gv::Mtu>(std::log2(*o.mtu) - 7); // 256 -> mtu_256 (1)
        if (theirs.regions.empty()) {
            throw std::runtime_error(
                "the peer's handshake offers no memory region; gpuverbs-perf offers exactly one (is the peer "
                "gpuverbs-perf?)");
        }
        qp = std::move(prepared).connect(theirs.endpoint, c);
        peer = theirs.regions.front();
    }
};

// The control channel: sizes, "ready" and "done" over the bootstrap socket.
struct Control {
    boost::asio::ip::tcp::socket socket;
    explicit Control(boost::asio::ip::tcp::socket s) : socket(std::move(s)) {
        socket.set_option(boost::asio::ip::tcp::no_delay(true));
    }
    void put(std::uint64_t v) { boost::asio::write(socket, boost::asio::buffer(&v, sizeof v)); }
    std::uint64_t get() {
        std::uint64_t v = 0;
        boost::asio::read(socket, boost::asio::buffer(&v, sizeof v));
        return v;
    }
};

using perf::control::done;
using perf::control::finished;
using perf::control::ready;

void check(std::error_code ec, const char* what) {
    if (ec) throw gv::Error(ec, what, ec.message());
}

// Throws for a completion with an error status, naming its operation.
const gv::Completion& check_ok(const gv::Completion& c) {
    if (!c.ok()) throw gv::Error(c.status, std::string(to_string(c.opcode)), c.status.message());
    return c;
}

// Polls one completion (busy), failing on an error status.
gv::Completion poll_one(gv::CompletionQueue& cq) {
    gv::Completion c;
    while (cq.poll({&c, 1}) == 0) {
    }
    return check_ok(c);
}

bool is_send_mode(Mode m) {
    return m == Mode::send_bw || m == Mode::send_lat;
}

// Receives for one size: exactly `iterations` in all, at most rx_depth ahead,
// so nothing is left posted when the size ends.
struct Receives {
    End& e;
    gv::LocalBuffer buffer;
    std::uint32_t left; // still to post for this size
    Receives(const Options& o, End& end, std::size_t size)
        : e(end), buffer(end.mr.slice(0, is_send_mode(o.mode) ? size : 0)), left(o.iterations) {
        for (std::uint32_t n = std::min(o.rx_depth, o.iterations); n > 0; --n) post();
    }
    void post() {
        if (left == 0) return;
        check(e.qp.post_receive(buffer), "post_receive");
        --left;
    }
    // Up to 32 receives with one doorbell (the bandwidth receiver, after a batch of completions).
    void post(std::uint32_t n) {
        std::array<gv::LocalBuffer, 32> same;
        same.fill(buffer);
        n = std::min({n, left, static_cast<std::uint32_t>(same.size())});
        if (n == 0) return;
        check(e.qp.post_receives(std::span(same.data(), n)), "post_receives");
        left -= n;
    }
};

// The client's bandwidth run: iterations back to back, up to tx_depth in flight.
Result bandwidth(const Options& o, End& e, std::size_t size) {
    const std::uint32_t iters = o.iterations;
    std::uint32_t posted = 0, completed = 0;
    gv::LocalBuffer src = e.mr.slice(0, size);
    auto options_for = [&](std::uint32_t index) {
        gv::SendOptions s;
        s.signaled = (index + 1) % o.signal_every == 0 || index + 1 == iters;
        s.context = index + 1; // completions say how many requests are done
        s.inline_data = size <= o.inline_size;
        return s;
    };
    auto add = [&](auto& target, std::uint32_t index) {
        gv::SendOptions s = options_for(index);
        switch (o.mode) {
            case Mode::read_bw: return target.read(src, e.peer, 0, s);
            case Mode::send_bw: return target.send(src, s);
            default: return target.write(src, e.peer, 0, s);
        }
    };
    struct Direct { // the plain post_* calls, shaped like SendBatch's
        gv::QueuePair& qp;
        std::error_code write(const gv::LocalBuffer& b, const gv::RemoteMemory& r, std::uint64_t off,
                              const gv::SendOptions& s) {
            return qp.post_write(b, r, off, s);
        }
        std::error_code read(const gv::LocalBuffer& b, const gv::RemoteMemory& r, std::uint64_t off,
                             const gv::SendOptions& s) {
            return qp.post_read(b, r, off, s);
        }
        std::error_code send(const gv::LocalBuffer& b, const gv::SendOptions& s) { return qp.post_send(b, s); }
    } direct{e.qp};
    std::array<gv::Completion, 32> done_batch;
    auto start = Clock::now();
    while (completed < iters) {
        while (posted < iters && posted - completed + o.batch <= o.tx_depth) {
            if (o.batch == 1) {
                check(add(direct, posted), "post");
                ++posted;
            } else {
                auto batch = e.qp.batch();
                for (std::uint32_t k = 0; k < o.batch && posted + k < iters; ++k)
                    check(add(batch, posted + k), "batch");
                posted += static_cast<std::uint32_t>(batch.size());
                check(batch.post(), "SendBatch::post");
            }
        }
        std::size_t n = e.cq.poll(done_batch);
        for (std::size_t k = 0; k < n; ++k) {
            completed = std::max(completed, static_cast<std::uint32_t>(check_ok(done_batch[k]).context));
        }
    }
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    Result r;
    r.bytes = size;
    r.iterations = iters;
    r.seconds = seconds;
    r.bw_mib_s = double(size) * iters / seconds / (1 << 20);
    r.msg_rate_mpps = iters / seconds / 1e6;
    return r;
}

// One ping or pong: a write-with-immediate (or a send) of `size` bytes.
void post_message(const Options& o, End& e, std::size_t size) {
    gv::SendOptions s;
    s.inline_data = size <= o.inline_size;
    if (o.mode == Mode::send_lat) {
        check(e.qp.post_send(e.mr.slice(0, size), s), "post_send");
    } else {
        check(e.qp.post_write_with_imm(e.mr.slice(0, size), e.peer, 0, 1, s), "post_write_with_imm");
    }
}

// Waits for the peer's message (a receive completion), reaping our own sends on the way.
void wait_message(End& e, Receives& receives) {
    for (;;) {
        gv::Completion c = poll_one(e.cq);
        if (c.opcode == gv::Opcode::receive || c.opcode == gv::Opcode::receive_with_imm) {
            receives.post();
            return;
        }
    }
}

// write_lat on host memory detects arrival as perftest does: by polling the
// last byte of the buffer, which each write sets to the exchange's number.
// (GPU memory cannot be polled by the CPU: there it is write-with-immediate.)
bool polls_memory(const Options& o) {
    return o.mode == Mode::write_lat && !o.gpu;
}

std::uint8_t mark(std::uint32_t i) {
    return static_cast<std::uint8_t>(i % 255 + 1);
}

void post_marked_write(const Options& o, End& e, std::size_t size, std::uint32_t i) {
    // Signal now and then and at the end of the size, and reap it: unsignaled
    // requests are only freed by a later signaled one, so the queue never fills.
    std::size_t from = e.host.size() / 2; // send from the upper half; the peer polls its lower half
    e.host[from + size - 1] = std::byte{mark(i)};
    gv::SendOptions s;
    s.inline_data = size <= o.inline_size;
    s.signaled = i % 64 == 63 || i + 1 == o.iterations;
    check(e.qp.post_write(e.mr.slice(from, size), e.peer, 0, s), "post_write");
    if (s.signaled) poll_one(e.cq);
}

void wait_mark(End& e, std::size_t size, std::uint32_t i) {
    const volatile auto* last = reinterpret_cast<const volatile std::uint8_t*>(e.host.data() + size - 1);
    while (*last != mark(i)) {
    }
}

Result latency(const Options& o, End& e, std::size_t size, std::optional<Receives>& receives) {
    std::vector<double> us;
    us.reserve(o.iterations);
    for (std::uint32_t i = 0; i < o.iterations; ++i) {
        auto t0 = Clock::now();
        if (polls_memory(o)) {
            post_marked_write(o, e, size, i);
            wait_mark(e, size, i);
        } else {
            post_message(o, e, size);
            wait_message(e, *receives);
        }
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    }
    // Our last send's completion may still be queued: reap it so the next size starts clean.
    gv::Completion c;
    while (e.cq.poll({&c, 1}) != 0) {
    }
    Result r;
    r.bytes = size;
    r.iterations = o.iterations;
    std::sort(us.begin(), us.end());
    double sum = 0, sq = 0;
    for (double v : us) sum += v;
    r.lat_avg = sum / us.size();
    for (double v : us) sq += (v - r.lat_avg) * (v - r.lat_avg);
    r.lat_stdev = std::sqrt(sq / us.size());
    r.lat_min = us.front();
    r.lat_max = us.back();
    r.lat_typical = us[us.size() / 2];
    r.lat_p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    r.seconds = sum * 2 / 1e6;
    return r;
}

// The server's part of one round, checked by perf::control::ServerRounds
// (1 <= size <= e.capacity): receives for sends, the pong for latency.
void serve(const Options& o, End& e, Control& control, std::size_t size) {
    std::optional<Receives> receives;
    if (polls_memory(o)) {
        e.host[size - 1] = std::byte{0};
    } else if (o.mode == Mode::send_bw || perf::is_latency(o.mode)) {
        receives.emplace(o, e, size);
    }
    control.put(ready);
    if (o.mode == Mode::send_bw) {
        // As perftest's receiver: poll a batch, then repost as many receives with one doorbell.
        std::array<gv::Completion, 32> batch;
        for (std::uint32_t got = 0; got < o.iterations;) {
            const std::size_t n = e.cq.poll(batch);
            std::uint32_t received = 0;
            for (std::size_t k = 0; k < n; ++k) {
                if (check_ok(batch[k]).opcode == gv::Opcode::receive) ++received;
            }
            got += received;
            receives->post(received);
        }
    } else if (polls_memory(o)) {
        for (std::uint32_t i = 0; i < o.iterations; ++i) {
            wait_mark(e, size, i);
            post_marked_write(o, e, size, i);
        }
    } else if (perf::is_latency(o.mode)) {
        for (std::uint32_t i = 0; i < o.iterations; ++i) {
            wait_message(e, *receives);
            post_message(o, e, size);
        }
    }
}

// Both sides must run the same test: the client says which, the server answers
// whether it matches, and each side says so in words before anything runs.
constexpr std::uint64_t same_mode = 1, other_mode = 2;

std::vector<Result> run_client(const Options& o, End& e, Control& control) {
    control.put(static_cast<std::uint64_t>(o.mode));
    if (control.get() != same_mode) {
        throw std::runtime_error(std::string("the server runs another test than ") + perf::name_of(o.mode) +
                                 ": start both sides with the same MODE");
    }
    std::size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
    if (e.peer.length < largest) {
        throw std::runtime_error("the server's buffer is " + std::to_string(e.peer.length) + " bytes, smaller than " +
                                 std::to_string(largest) + ": start the server with --size " + std::to_string(largest) +
                                 " (or the same --max-size)");
    }
    std::vector<Result> results;
    for (std::size_t i = 0; i < o.sizes.size(); ++i) {
        std::size_t size = o.sizes[i];
        if (o.progress && ::isatty(STDERR_FILENO) != 0) {
            std::fprintf(stderr, "\r%s: %zu bytes (%zu of %zu)   ", perf::name_of(o.mode), size, i + 1, o.sizes.size());
        }
        // One measured round of `iterations` messages of `size` bytes, server in step.
        auto round = [&](std::uint32_t iterations) {
            Options with = o;
            with.iterations = iterations;
            std::optional<Receives> receives;
            if (polls_memory(with)) {
                e.host[size - 1] = std::byte{0};
            } else if (perf::is_latency(with.mode)) {
                receives.emplace(with, e, size);
            }
            control.put(size);
            control.put(iterations);
            if (std::uint64_t answer = control.get(); answer != ready) {
                if (answer == perf::control::refused) {
                    throw std::runtime_error("the server refused a round of " + std::to_string(iterations) + " " +
                                             std::to_string(size) + "-byte messages (its output says why)");
                }
                throw std::runtime_error("the peer is out of step with this gpuverbs-perf (a different version?)");
            }
            Result r = perf::is_latency(with.mode) ? latency(with, e, size, receives) : bandwidth(with, e, size);
            control.put(done);
            if (control.get() != done)
                throw std::runtime_error("the peer is out of step with this gpuverbs-perf (a different version?)");
            return r;
        };
        std::uint32_t iterations = o.iterations;
        if (o.duration > 0) {
            // --duration: a short probe gives the rate, the count follows from it.
            std::uint32_t probe = perf::is_latency(o.mode) ? 20 : 64;
            Result p = round(probe);
            double per = p.seconds / probe;
            iterations = static_cast<std::uint32_t>(std::clamp(o.duration / (per > 0 ? per : 1e-6), 1.0, 1e7));
        }
        results.push_back(round(iterations));
    }
    control.put(finished);
    if (o.progress && ::isatty(STDERR_FILENO) != 0) std::fprintf(stderr, "\r%60s\r", "");
    return results;
}

void run_server(const Options& o, End& e, Control& control) {
    std::uint64_t theirs = control.get();
    control.put(theirs == static_cast<std::uint64_t>(o.mode) ? same_mode : other_mode);
    if (theirs != static_cast<std::uint64_t>(o.mode)) {
        throw std::runtime_error(std::string("the client runs another test than ") + perf::name_of(o.mode) +
                                 ": start both sides with the same MODE");
    }
    // The client decides each size and its iteration count; the server
    // follows, within its buffer (perf::control::check_round).
    perf::control::ServerRounds rounds(e.capacity);
    for (;;) {
        perf::control::Action next = rounds.on_word(control.get());
        switch (next.kind) {
            using Kind = perf::control::Action::Kind;
            case Kind::read: break;
            case Kind::run: {
                Options follow = o;
                follow.iterations = next.round.iterations;
                serve(follow, e, control, next.round.size);
                break;
            }
            case Kind::end_round: {
                // Our last reply's send completion: reap it so the next size starts with an empty CQ.
                gv::Completion c;
                while (e.cq.poll({&c, 1}) != 0) {
                }
                control.put(done);
                break;
            }
            case Kind::finish: return;
            case Kind::refuse: control.put(perf::control::refused); throw std::runtime_error(next.error);
            case Kind::fail: throw std::runtime_error(next.error);
        }
    }
}

// Server side of a connection: accept, swap handshakes, connect.
void accept_side(const Options& o, End& e, boost::asio::io_context& io, gv::TcpListener& listener,
                 std::optional<Control>& control) {
    control.emplace(listener.accept());
    gv::Handshake theirs =
        gv::exchange_handshake(control->socket, {e.prepared.endpoint(), {e.prepared.advertise(e.mr)}});
    e.connect(o, theirs);
    (void)io;
}

void print(const Options& o, const std::vector<Result>& results) {
    switch (o.output) {
        case Options::Output::json: std::fputs(perf::json(o, results).c_str(), stdout); break;
        case Options::Output::csv: std::fputs(perf::csv(o, results).c_str(), stdout); break;
        default: std::fputs(perf::table(o, results).c_str(), stdout);
    }
    if (!o.svg.empty()) std::ofstream(o.svg) << perf::svg(o, results);
}

int run(const Options& o) {
    boost::asio::io_context io;
    if (o.role == perf::Role::server) {
        End e(o, o.device, true);
        gv::TcpListener listener(io, o.tcp_port);
        std::optional<Control> control;
        accept_side(o, e, io, listener, control);
        run_server(o, e, *control);
        return 0;
    }
    if (o.role == perf::Role::loopback) {
        // Both ends in this process: the server on device2 in a thread, over 127.0.0.1.
        End server_end(o, o.device2, true);
        gv::TcpListener listener(io, o.tcp_port);
        std::exception_ptr failure;
        std::jthread server([&] { // joins on every way out of this scope
            try {
                std::optional<Control> control;
                accept_side(o, server_end, io, listener, control);
                run_server(o, server_end, *control);
            } catch (...) {
                failure = std::current_exception();
            }
        });
        End e(o, o.device, false);
        boost::asio::io_context client_io;
        Control control(gv::tcp_connect(client_io, "127.0.0.1", o.tcp_port));
        e.connect(o, gv::exchange_handshake(control.socket, {e.prepared.endpoint(), {e.prepared.advertise(e.mr)}}));
        auto results = run_client(o, e, control);
        server.join();
        if (failure) std::rethrow_exception(failure);
        print(o, results);
        return 0;
    }
    End e(o, o.device, false);
    Control control(gv::tcp_connect(io, o.host, o.tcp_port));
    e.connect(o, gv::exchange_handshake(control.socket, {e.prepared.endpoint(), {e.prepared.advertise(e.mr)}}));
    print(o, run_client(o, e, control));
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    perf::Options options;
    if (auto status = perf::parse(argc, argv, options)) return *status;
    try {
        return run(options);
    } catch (const gv::GpuRegistrationError& e) {
        std::fprintf(stderr, "gpuverbs-perf: GPU memory cannot be registered here:\n");
        for (const auto& r : e.rejections()) {
            std::fprintf(stderr, "  %s: %s\n", std::string(to_string(r.method)).c_str(), r.reason.c_str());
        }
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpuverbs-perf: %s\n", e.what());
        return 1;
    }
}
