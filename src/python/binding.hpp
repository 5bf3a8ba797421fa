// What the files of the Python binding share (src/python, the module
// gpuverbs._core). The binding is thin: every decision stays in the C++
// library; these types only carry Python objects across it:
//
//   Context    an io_context that runs completions for Python, driven by an
//              asyncio loop (through one epoll descriptor, fileno()) or by a
//              synchronous wait;
//   Region     a MemoryRegion plus the Python object whose memory it covers,
//              held (and its DLPack export or buffer view) for the region's life;
//   Operation  one asynchronous operation: its result, the Python objects the
//              NIC may touch until it completes, its asyncio future and its
//              cancellation signal.
#pragma once

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs::python {

namespace py = pybind11;

/// Runs completions for Python. One epoll descriptor gathers the completion
/// channels of the CQs made on this context, so an asyncio loop watches one
/// fd (loop.add_reader(ctx.fileno(), ctx.poll)); poll() never blocks.
class Context {
public:
    /// `polled`: its CQs are made in CompletionMode::polled and move only in
    /// progress() (or poll(), run_one_for() and waits, which call it).
    explicit Context(bool polled = false);
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
    ~Context();

    [[nodiscard]] boost::asio::io_context& io() noexcept { return io_; }
    [[nodiscard]] int fileno() const noexcept { return epoll_; }
    /// Adds a completion channel's (or rdma_cm event channel's) fd to the epoll set.
    void watch(int fd);
    void unwatch(int fd) noexcept;
    /// Runs what is ready, without blocking (the GIL is held: handlers touch Python objects).
    std::size_t poll();
    /// Runs at most one handler, waiting up to `timeout` (call with the GIL released).
    /// Polled: calls progress() until something ran or the time is up (it spins).
    std::size_t run_one_for(std::chrono::microseconds timeout);
    /// gpuverbs::progress on this context: never blocks, no system call when idle.
    std::size_t progress() { return gpuverbs::progress(io_); }
    [[nodiscard]] bool polled() const noexcept { return polled_; }
    /// Makes fileno() readable until the next poll(): call it after something
    /// posted a handler without a completion to announce it (a cancellation, a
    /// queue pair or CQ closed, whose operations end with operation_aborted).
    void wake() noexcept;
    /// An awaited operation starts (+1) or ends (-1). While any is awaited,
    /// fileno() is also readable every timer_period, so the library's own
    /// timers (the liveness watch, deadlines, notification bounds), which no
    /// completion announces, run on the loop without the user calling poll().
    void awaited(int change) noexcept;
    /// How late such a timer may run on an asyncio loop (the watch ticks every 50 ms).
    static constexpr std::chrono::milliseconds timer_period{10};

private:
    boost::asio::io_context io_;
    bool polled_ = false;
    int epoll_ = -1;
    int wake_ = -1;           ///< an eventfd in the epoll set
    int timer_ = -1;          ///< a timerfd in the epoll set, armed while operations are awaited
    std::size_t awaited_ = 0; ///< operations with an asyncio future that have not finished
};

/// What a Python object lends us: where its bytes are, on which device, and
/// what must be held so they stay valid (a consumed DLPack capsule's deleter, a
/// buffer view).
struct Borrowed {
    std::uint64_t address = 0;
    std::size_t size = 0;
    bool cuda = false;
    int gpu = 0;
    bool readonly = false;
    std::string via;    ///< "dlpack", "cuda_array_interface" or "buffer"
    std::string device; ///< "cpu", "cuda:0", "cuda_host"
    std::shared_ptr<void> hold;
};

/// Takes `obj`'s memory zero-copy through `via` ("auto": DLPack, then
/// __cuda_array_interface__, then the buffer protocol); raises TypeError or
/// ValueError naming the argument when it cannot.
Borrowed borrow(const py::object& obj, const std::string& via, bool writable);
/// Refuses an empty object (0 bytes), in words (ValueError).
void check_size(std::size_t size);

/// A registered region and what keeps its memory alive: its own registration,
/// or a registration cache's region that covers the object (then `base` is
/// where the object starts in it).
struct Region {
    // Declared first, destroyed last: the memory outlives its registration.
    py::object owner; ///< the registered object itself
    Borrowed memory;
    std::vector<Rejection> reasons; ///< GPU memory: the methods not taken and why
    std::string policy;             ///< GPU memory: the policy in force
    MemoryRegion own;
    std::shared_ptr<const MemoryRegion> cached;
    /// DeviceQueueProxies reading it as a window: close() is refused meanwhile.
    std::uint32_t proxies = 0;
    std::size_t base = 0;
    std::size_t length = 0; ///< the object's bytes
    /// Host memory from a RegistrationCache: tells the cache this object no
    /// longer uses its entry (run once, with the GIL held: the cache is not
    /// thread-safe). The last user gone, the entry is dropped: the object's
    /// memory may be freed now, and a new object at the same address must
    /// never be served the old pinned pages.
    std::function<void()> forget;
    void forget_cached() {
        if (forget) {
            auto f = std::move(forget);
            forget = nullptr;
            f();
        }
    }

    [[nodiscard]] const MemoryRegion& mr() const noexcept { return cached ? *cached : own; }
    [[nodiscard]] LocalBuffer slice(std::size_t offset, std::size_t size) const {
        return mr().slice(base + offset, size);
    }
    [[nodiscard]] RemoteMemory remote(std::size_t offset, std::size_t size) const {
        return mr().remote(base + offset, size);
    }
    void close() noexcept {
        own = MemoryRegion();
        cached.reset();
    }
    Region() = default;
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;
    /// Deregisters, then lets the object go under the GIL (the last reference
    /// may be dropped on a thread that runs completions without it).
    ~Region(); // NOLINT(bugprone-exception-escape): it catches what taking the GIL may throw
};

/// A LocalBuffer that keeps its Region (and so the memory) alive.
struct Slice {
    std::shared_ptr<Region> region;
    std::size_t offset = 0;
    std::size_t length = 0;
    [[nodiscard]] LocalBuffer buffer() const { return region->slice(offset, length); }
};

/// Blocks of a peer's memory (gpuverbs.RemoteBlocks): a block list, and what a lease holds.
struct RemoteBlocks {
    std::vector<RemoteBlock> blocks;
};

/// A completion queue bound to a Context (event-driven: its channel is in the
/// context's epoll set while it lives).
struct Cq {
    Cq(const Device& device, int capacity, std::shared_ptr<Context> ctx);
    Cq(const Cq&) = delete;
    Cq& operator=(const Cq&) = delete;
    ~Cq();
    // Declared before what uses it: members are destroyed in reverse, and a CQ
    // bound to an executor must go before its io_context.
    std::shared_ptr<Context> context;
    CompletionQueue cq;
    int fd = -1;
};

/// A connected queue pair seen from Python: its own, or the one an rdma_cm
/// connection holds (then `owner` keeps that connection alive).
struct Qp {
    // Destroyed in reverse: the queue pair first, then its connection, its CQ,
    // and last the io_context its operations complete on.
    std::shared_ptr<Context> context;
    std::shared_ptr<Cq> cq; ///< held: destroying a CQ ends its queue pairs' operations
    py::object owner;
    QueuePair owned;
    QueuePair* qp = nullptr;
    /// DeviceQueueProxies posting on it: close() is refused meanwhile (the proxy holds a pointer to it).
    std::uint32_t proxies = 0;
    /// An rdma_cm connection's queue pair, looked up on each use (the
    /// connection may have been refused or closed since): null when gone.
    std::function<QueuePair*()> from_connection;
    /// The queue pair, or ValueError when closed.
    [[nodiscard]] QueuePair& get() const;
    ~Qp(); // NOLINT(bugprone-exception-escape): wakes its context (noexcept)
    Qp() = default;
    Qp(const Qp&) = delete;
    Qp& operator=(const Qp&) = delete;
};

/// A KV pool over Python regions (gpuverbs.KvPool), holding every rail's.
struct PyKvPool {
    std::vector<std::shared_ptr<Region>> regions; ///< every rail's
    KvPool pool;
};

/// One rail of a transfer that a KvPool planned (KvPool.rail): its queue pair
/// and the keys that rail uses in place of rail 0's; the pool held (and so
/// its regions) while the rail lives.
struct Rail {
    std::shared_ptr<Qp> qp;
    std::shared_ptr<PyKvPool> pool;
    TransferRail keys; ///< its qp is set when a transfer binds it
};

/// A RailGroup over Python rails: the group (not movable: held by pointer),
/// and per rail what keeps its queue pair (and a KvPool rail's pool) alive.
struct PyRailGroup {
    std::shared_ptr<Context> context;
    std::vector<std::shared_ptr<Qp>> qps; ///< per rail; null: missing for now
    std::vector<std::shared_ptr<Rail>> keyed;
    std::unique_ptr<RailGroup> group;
};

/// time.monotonic() seconds and steady_clock's time points: one clock on Linux (CLOCK_MONOTONIC).
inline double monotonic_seconds(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
}
inline std::chrono::steady_clock::time_point from_monotonic(double seconds) {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)));
}

/// A Python bytes' contents (held in a std::string) as bytes, and bytes back.
inline std::span<const std::byte> bytes_of(const std::string& s) {
    return std::as_bytes(std::span(s.data(), s.size()));
}
inline py::bytes to_py(std::span<const std::byte> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// A C++ default duration in seconds, for a Python keyword's default (the C++ option struct is its one source).
inline double seconds_of(std::chrono::milliseconds ms) {
    return std::chrono::duration<double>(ms).count();
}

/// A duration argument given in seconds, as milliseconds; ValueError naming `name` unless finite and 0 or more.
inline std::chrono::milliseconds checked_milliseconds(double seconds, const char* name) {
    if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e9) {
        throw py::value_error(std::string(name) + " is " + std::to_string(seconds) +
                              " s: give a finite number of seconds, 0 or more");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
}

/// QueuePairOptions from the keyword arguments every queue-pair factory takes.
inline QueuePairOptions qp_options(std::uint32_t max_send_wr, std::uint32_t max_recv_wr, std::uint32_t max_send_sge,
                                   std::uint32_t max_recv_sge, std::uint32_t max_inline_data) {
    QueuePairOptions o;
    o.max_send_wr = max_send_wr;
    o.max_recv_wr = max_recv_wr;
    o.max_send_sge = max_send_sge;
    o.max_recv_sge = max_recv_sge;
    o.max_inline_data = max_inline_data;
    return o;
}

/// A queue pair's grant from Python's gpuverbs.Access flags: remote write,
/// read and atomics only (ValueError naming `step` otherwise).
inline Access remote_access_flags(unsigned bits, const char* step) {
    constexpr auto allowed = static_cast<unsigned>(detail::peer_facing_access);
    if ((bits & ~allowed) != 0) {
        throw py::value_error(std::string(step) + ": remote_access " + std::to_string(bits) +
                              " has flags a queue pair cannot grant; combine gpuverbs.Access.remote_write, "
                              "remote_read and remote_atomic (or 0 for nothing)");
    }
    return static_cast<Access>(bits);
}

/// A queue and the reader of its descriptors (one reader per queue).
struct PyDeviceQueue {
    DeviceQueue queue;
    device_queue::RingReader reader;
    bool proxied = false; ///< a DeviceQueueProxy reads (or read) it: take, complete and fail are the proxy's
    explicit PyDeviceQueue(DeviceQueue q) : queue(std::move(q)), reader(queue.proxy_view()) {}
    void check_reader(const char* what) const {
        if (proxied) {
            throw py::value_error(std::string(what) +
                                  ": a DeviceQueueProxy reads (or read) this queue: one reader per queue, from its "
                                  "start (use the proxy's close() to end it)");
        }
    }
};

/// A proxy and everything it reads: the queue, the protection domains, CQs,
/// regions and queue pairs it was given (declared first: destroyed after the
/// proxy, which closes the queue).
struct PyDeviceQueueProxy {
    std::shared_ptr<PyDeviceQueue> queue;
    std::vector<py::object> held;
    std::optional<DeviceQueueProxy> proxy;
    std::uint64_t idle_streak = 0;                ///< idle passes in a row (drive_passes)
    std::vector<std::shared_ptr<Qp>> qps;         ///< their close() refused while the proxy lives
    std::vector<std::shared_ptr<Region>> regions; ///< likewise
    std::atomic<bool> busy{false};                ///< a member runs (on another thread: refused)
    ~PyDeviceQueueProxy() {
        proxy.reset(); // closes the queue; it stays the proxy's (proxied)
        for (auto& q : qps) --q->proxies;
        for (auto& r : regions) --r->proxies;
    }
    DeviceQueueProxy& get() {
        if (!proxy) throw py::value_error("the DeviceQueueProxy is closed");
        return *proxy;
    }
};

/// Adds the data path (write, read, send, receive, atomics) to the QueuePair class.
void add_operations(py::class_<Qp, std::shared_ptr<Qp>>& cls);

/// A Slice from a Region or a Slice argument (TypeError naming `name` otherwise).
Slice to_slice(const py::handle& arg, const char* name);

/// One asynchronous operation seen from Python.
class Operation {
public:
    enum class Kind { bytes, received, old_value, transfer, none };
    Operation(std::shared_ptr<Context> context, Kind kind, const char* verb)
        : context_(std::move(context)), kind_(kind), verb_(verb) {}
    Operation(const Operation&) = delete;
    Operation& operator=(const Operation&) = delete;
    ~Operation(); // NOLINT(bugprone-exception-escape): it catches what taking the GIL may throw

    [[nodiscard]] bool done() const noexcept { return done_; }
    [[nodiscard]] const std::shared_ptr<Context>& context() const noexcept { return context_; }
    /// The result, or raises the operation's gpuverbs.Error (only once done).
    py::object result();
    /// Attaches an asyncio future: completed (or failed) with the operation.
    void set_future(py::object future);
    /// Asks the operation to stop (C++ cancellation rules: an operation not yet
    /// posted ends with operation_aborted, a posted one completes). On the
    /// context's thread.
    void cancel();
    /// Blocks (GIL released) until done or `timeout` seconds; true when done.
    bool wait(double timeout);

    [[nodiscard]] boost::asio::cancellation_slot slot() { return signal_.slot(); }
    /// Counted in the context's awaited operations (between set_future and finish).
    bool counted_awaited = false;
    /// Called by the handler, GIL held.
    void finish(const boost::system::error_code& ec);
    /// The handler's body: stores nothing more, finishes, and never lets a
    /// Python exception out (into Asio, whose completion paths are noexcept).
    void finish_noexcept(const boost::system::error_code& ec) noexcept;
    /// The regions the NIC may use until the operation completes.
    std::vector<std::shared_ptr<Region>> regions;
    std::size_t bytes = 0;
    Received received;
    std::uint64_t old_value = 0;
    std::string detail;         ///< transfers: the blocks of the request that failed
    TransferReport report;      ///< transfers: what landed
    std::shared_ptr<void> plan; ///< transfers: the plan, held until the end

private:
    py::object value();
    py::object error();
    void deliver();
    std::shared_ptr<Context> context_;
    Kind kind_;
    const char* verb_;
    bool done_ = false;
    boost::system::error_code ec_;
    py::object future_;
    py::object loop_; ///< the future's loop
    boost::asio::cancellation_signal signal_;
};

/// The gpuverbs.Error (or subclass) for `code`, with the C++ library's words.
py::object make_error(const std::error_code& code, std::string_view verb, std::string_view detail);
/// Raises it (as a Python exception: throws py::error_already_set).
[[noreturn]] void raise_error(const std::error_code& code, std::string_view verb, std::string_view detail);
/// Raises `error` (a gpuverbs::Error or another std::exception) as its gpuverbs.Error.
[[noreturn]] void raise_exception(const std::exception& error);

/// Records the keys of the dict a C++ struct becomes in Python, in the
/// module's _struct_fields: call it with the converter applied to a
/// default-constructed struct, so what is recorded is the converter's own
/// output. tests/python/test_stubs.py compares each entry (and the attributes
/// of the classes bound from structs) with the struct's members in its
/// header, without a device.
void record_fields(py::module_& m, const char* cpp_struct, const py::dict& form);

// Called in this order (module.cpp): a class is bound before the functions
// that take or return it, so that their signatures name it
// (gpuverbs._core.X), not its C++ type.
void bind_errors(py::module_& m);
void bind_verbs(py::module_& m); ///< devices, the context, protection domains, CQs
void bind_memory(py::module_& m);
void bind_operations(py::module_& m);
void bind_queue_pairs(py::module_& m); ///< endpoints, prepared and connected queue pairs
void bind_transfers(py::module_& m);
void bind_connections(py::module_& m);
void bind_gpu(py::module_& m);
void bind_leases(py::module_& m);       ///< leases on blocks, and the Prometheus text
void bind_mesh(py::module_& m);         ///< rendezvous (Redis, PMIx) and the Mesh
void bind_device_queue(py::module_& m); ///< DeviceQueue: a ring for kernels started from Python, and its reader

} // namespace gpuverbs::python
