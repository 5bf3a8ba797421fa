// gpuverbs.DeviceQueue: a device queue's memory (device_queue/queue.hpp) for a
// kernel started from Python (CuPy, Numba, PyTorch extensions), and its
// reader's side. Its `view` is the four kernel arguments
// gpuverbs::device::queue_view() takes; device_queue_include_dir() (the
// package) is where the kernel's #include <gpuverbs/device_queue/device.cuh>
// is found. gpuverbs.DeviceQueueProxy: the host proxy (device_queue/proxy.hpp)
// that posts a queue's requests on rails, with its counters, rails and
// failure; gpuverbs.async_drive (the package's _device_queue.py) drives it on
// asyncio as async_drive (drive.hpp) does on an Asio executor.
#include "binding.hpp"

#include "gpuverbs/device_queue/drive.hpp"
#include "gpuverbs/device_queue/proxy.hpp"

#include <optional>

namespace gpuverbs::python {

namespace dq = device_queue;

namespace {

/// One member of a proxy at a time (the C++ proxy's rule): a call while another thread is inside one (progress()
/// without the GIL, say) is refused, never run beside it.
class Busy {
public:
    explicit Busy(PyDeviceQueueProxy& self) : self_(self) {
        if (self_.busy.exchange(true)) {
            throw std::runtime_error(
                "DeviceQueueProxy: another thread is in one of its members (progress(), "
                "drive_passes()): call them from one thread at a time");
        }
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    ~Busy() { self_.busy.store(false); }

private:
    PyDeviceQueueProxy& self_;
};

/// An rdma_cm connection's queue pair goes with its connection, which the proxy cannot hold back.
void refuse_connection_qp(const Qp& qp, const char* verb) {
    if (qp.from_connection) {
        throw py::value_error(std::string(verb) +
                              ": the queue pair is an rdma_cm connection's, which may close under the proxy: give one "
                              "of connect_tcp or PreparedQueuePair");
    }
}

/// The proxy polls its CQ itself: a polled Context's poll() would take its completions.
void refuse_polled(const py::object& cq, const char* verb) {
    if (cq.cast<Cq&>().context->polled()) {
        throw py::value_error(std::string(verb) +
                              ": the CompletionQueue belongs to a polled Context, whose poll() would take the "
                              "proxy's completions: give one of an event-driven Context (gv.Context()), used by "
                              "no operation but the proxy's");
    }
}

const char* error_name(dq::QueueError e) {
    switch (e) {
        case dq::QueueError::none: return "none";
        case dq::QueueError::peer_failed: return "peer_failed";
        case dq::QueueError::closed: return "closed";
        case dq::QueueError::refused: return "refused";
    }
    return "unknown";
}

RemoteWindows windows_of(const std::map<std::uint16_t, RemoteMemory>& windows) {
    return {windows.begin(), windows.end()};
}

/// Raises the C++ error_code form's result as Python's gpuverbs.Error.
void check(const std::error_code& ec, const Diagnostics& why, const char* verb) {
    if (ec) raise_error(ec, why.verb().empty() ? verb : why.verb(), why.detail());
}

/// add_peer and add_rail: the proxy's error_code form of `add`, and the queue pair held (its close() refused).
void add_rail_of(PyDeviceQueueProxy& self, std::uint16_t peer, const std::shared_ptr<Qp>& qp,
                 const std::map<std::uint16_t, RemoteMemory>& windows,
                 void (DeviceQueueProxy::*add)(std::uint16_t, QueuePair&, const RemoteWindows&, std::error_code&,
                                               Diagnostics&),
                 const char* verb) {
    const Busy busy(self);
    refuse_connection_qp(*qp, verb);
    std::error_code ec;
    Diagnostics why;
    (self.get().*add)(peer, qp->get(), windows_of(windows), ec, why);
    check(ec, why, verb);
    ++qp->proxies;
    self.qps.push_back(qp);
}

py::dict rail_dict(const DeviceQueueRailState& r) {
    py::dict d;
    d["peer"] = r.peer;
    d["rail"] = r.rail;
    d["qp_num"] = r.qp_num;
    d["active"] = r.active;
    d["failed"] = r.failed;
    d["failure"] = r.failure;
    return d;
}

py::dict counters_dict(const DeviceQueueProxyCounters& c) {
    py::dict d;
    d["descriptors"] = c.descriptors;
    d["chains"] = c.chains;
    d["requests"] = c.requests;
    d["completed"] = c.completed;
    d["queue_full"] = c.queue_full;
    d["passes"] = c.passes;
    d["idle_passes"] = c.idle_passes;
    d["ring_full"] = c.ring_full;
    d["rail_failures"] = c.rail_failures;
    d["reposted"] = c.reposted;
    d["skipped"] = c.skipped;
    d["chain_lengths"] = py::list(py::cast(std::vector<std::uint64_t>(c.chain_lengths.begin(), c.chain_lengths.end())));
    d["chained"] = c.chained;
    d["completion_times"] =
        py::list(py::cast(std::vector<std::uint64_t>(c.completion_times.begin(), c.completion_times.end())));
    d["completion_seconds"] = c.completion_seconds;
    return d;
}

const char* op_name(dq::Op op) {
    switch (op) {
        case dq::Op::put: return "put";
        case dq::Op::put_signal: return "put_signal";
        case dq::Op::signal: return "signal";
        case dq::Op::fence: return "fence";
    }
    return "?";
}

const char* result_name(dq::WaitResult r) {
    switch (r) {
        case dq::WaitResult::done: return "done";
        case dq::WaitResult::timed_out: return "timed_out";
        case dq::WaitResult::peer_failed: return "peer_failed";
        case dq::WaitResult::queue_closed: return "queue_closed";
        case dq::WaitResult::refused: return "refused";
    }
    return "?";
}

dq::Op op_of(const std::string& s) {
    if (s == "put") return dq::Op::put;
    if (s == "put_signal") return dq::Op::put_signal;
    if (s == "signal") return dq::Op::signal;
    if (s == "fence") return dq::Op::fence;
    throw py::value_error("op is '" + s + "': give 'put', 'put_signal', 'signal' or 'fence'");
}

std::uint64_t deadline_after(double seconds) {
    return dq::detail::now_ns() +
           static_cast<std::uint64_t>(
               std::chrono::duration_cast<std::chrono::nanoseconds>(checked_milliseconds(seconds, "timeout")).count());
}

void host_only(const PyDeviceQueue& q, const char* what) {
    if (q.queue.gpu() >= 0) {
        throw py::value_error(std::string(what) + ": this queue's producer words are in GPU " +
                              std::to_string(q.queue.gpu()) + "'s memory: push and wait from a kernel");
    }
}

std::uintptr_t address(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p);
}

} // namespace

void bind_device_queue(py::module_& m) {
    py::class_<PyDeviceQueue, std::shared_ptr<PyDeviceQueue>>(
        m, "DeviceQueue",
        "A device queue: a ring a kernel pushes requests into (gpuverbs/device_queue/device.cuh), mapped into a GPU "
        "(on_gpu) or in host memory (on_host); and its reader's side.")
        .def_static(
            "on_gpu",
            [](int gpu, std::uint32_t log2_capacity) {
                return std::make_shared<PyDeviceQueue>(DeviceQueue::on_gpu(gpu, log2_capacity));
            },
            py::arg("gpu"), py::arg("log2_capacity"),
            "2**log2_capacity slots in pinned host memory mapped into GPU gpu, the producers' words in its memory.")
        .def_static(
            "on_host",
            [](std::uint32_t log2_capacity) {
                return std::make_shared<PyDeviceQueue>(DeviceQueue::on_host(log2_capacity));
            },
            py::arg("log2_capacity"), "The same in host memory, for producers on CPU threads.")
        .def_property_readonly(
            "view",
            [](const PyDeviceQueue& q) {
                const dq::QueueView& v = q.queue.view();
                return py::make_tuple(address(v.slots), address(v.producer), address(v.proxy), v.log2_capacity);
            },
            "(slots, producer, proxy, log2_capacity): a kernel's arguments for gpuverbs::device::queue_view().")
        .def_property_readonly("capacity", [](const PyDeviceQueue& q) { return q.queue.view().capacity(); })
        .def_property_readonly(
            "gpu", [](const PyDeviceQueue& q) { return q.queue.gpu(); },
            "The GPU it is mapped into; -1 for a host queue.")
        .def(
            "take",
            [](PyDeviceQueue& q) -> std::optional<py::dict> {
                q.check_reader("take");
                dq::Request r;
                const std::uint64_t position = q.reader.taken();
                const dq::Decoded d = q.reader.try_take(r);
                if (d == dq::Decoded::incomplete) return std::nullopt;
                if (d == dq::Decoded::corrupt) {
                    throw py::value_error("the descriptor at position " + std::to_string(position) +
                                          " is corrupt (stamped for its lap, yet not what a producer writes)");
                }
                py::dict out;
                out["position"] = position;
                if (d == dq::Decoded::skipped) { // its producer gave up: no request, a credit like any other's
                    out["op"] = "skipped";
                    return out;
                }
                out["op"] = op_name(r.op);
                out["peer"] = r.peer;
                out["src_window"] = r.src_window;
                out["src_offset"] = r.src_offset;
                out["dst_window"] = r.dst_window;
                out["dst_offset"] = r.dst_offset;
                out["bytes"] = r.bytes;
                out["signal_window"] = r.signal_window;
                out["signal_offset"] = r.signal_offset;
                out["signal_value"] = r.signal_value;
                out["signal_op"] = r.signal_op == dq::SignalOp::add ? "add" : "set";
                return out;
            },
            "The next request as a dict (with its position), or None while there is none; a position whose producer "
            "gave up comes as {'position': p, 'op': 'skipped'} (no request: complete it as any other); ValueError "
            "for a corrupt descriptor.")
        .def_property_readonly(
            "taken", [](const PyDeviceQueue& q) { return q.reader.taken(); }, "How many requests take() returned.")
        .def(
            "complete",
            [](PyDeviceQueue& q, std::uint64_t position) {
                q.check_reader("complete");
                if (position > q.reader.taken()) {
                    throw py::value_error("complete(" + std::to_string(position) + "): only " +
                                          std::to_string(q.reader.taken()) + " requests were taken");
                }
                q.reader.complete(position);
            },
            py::arg("position"),
            "Returns the credit of every request below position: their sources may be reused, waits on them end.")
        .def(
            "fail",
            [](PyDeviceQueue& q, const std::string& why) {
                q.check_reader("fail");
                if (why == "peer_failed") {
                    q.reader.fail(dq::QueueError::peer_failed);
                } else if (why == "closed") {
                    q.reader.fail(dq::QueueError::closed);
                } else if (why == "refused") {
                    q.reader.fail(dq::QueueError::refused);
                } else {
                    throw py::value_error("fail('" + why + "'): give 'peer_failed', 'closed' or 'refused'");
                }
            },
            py::arg("why"), "Ends the queue: every producer's wait ends with why.")
        .def(
            "push",
            [](PyDeviceQueue& q, const std::string& op, std::uint16_t peer, std::uint16_t src_window,
               std::uint64_t src_offset, std::uint16_t dst_window, std::uint64_t dst_offset, std::uint64_t bytes,
               std::uint16_t signal_window, std::uint64_t signal_offset, std::uint64_t signal_value,
               const std::string& signal_op, double timeout) {
                host_only(q, "push");
                if (signal_op != "set" && signal_op != "add") {
                    throw py::value_error("signal_op is '" + signal_op + "': give 'set' or 'add'");
                }
                dq::Request r;
                r.op = op_of(op);
                r.peer = peer;
                r.src_window = src_window;
                r.src_offset = src_offset;
                r.dst_window = dst_window;
                r.dst_offset = dst_offset;
                r.bytes = bytes;
                r.signal_window = signal_window;
                r.signal_offset = signal_offset;
                r.signal_value = signal_value;
                r.signal_op = signal_op == "add" ? dq::SignalOp::add : dq::SignalOp::set;
                const std::uint64_t deadline = deadline_after(timeout);
                std::uint64_t position = 0;
                dq::WaitResult got{};
                {
                    py::gil_scoped_release release;
                    got = dq::push(q.queue.view(), r, deadline, position);
                }
                return result_name(got);
            },
            py::arg("op"), py::arg("peer") = 0, py::arg("src_window") = 0, py::arg("src_offset") = 0,
            py::arg("dst_window") = 0, py::arg("dst_offset") = 0, py::arg("bytes") = 0, py::arg("signal_window") = 0,
            py::arg("signal_offset") = 0, py::arg("signal_value") = 0, py::arg("signal_op") = "set",
            py::arg("timeout") = 1.0,
            "A host queue's producer side: pushes one request ('done', 'timed_out', 'peer_failed', 'queue_closed' or "
            "'refused').")
        .def(
            "quiet",
            [](PyDeviceQueue& q, double timeout) {
                host_only(q, "quiet");
                const std::uint64_t deadline = deadline_after(timeout);
                py::gil_scoped_release release;
                return result_name(dq::quiet(q.queue.view(), deadline));
            },
            py::arg("timeout") = 1.0, "A host queue's producer side: waits until every request pushed completed.");

    m.def(
        "_device_queue_failed",
        [](const std::string& words) { raise_error(make_error_code(errc::device_queue_failed), "async_drive", words); },
        py::arg("words"), "Raises gpuverbs.Error (device_queue_failed) with the proxy's words (async_drive's end).");

    record_fields(m, "DeviceQueueProxyCounters", counters_dict(DeviceQueueProxyCounters{}));
    record_fields(m, "DeviceQueueRailState", rail_dict(DeviceQueueRailState{}));

    const DeviceQueueProxyOptions proxy_defaults;
    const DeviceQueueDriveOptions drive_defaults;
    py::class_<PyDeviceQueueProxy, std::shared_ptr<PyDeviceQueueProxy>>(
        m, "DeviceQueueProxy",
        "The device queue's host proxy: takes the requests kernels push and posts them on queue pairs (a chain per "
        "peer, one doorbell), returns each request's credit once its RDMA operation completed, and fails the queue "
        "(every producer's wait ends with the code) when a peer has no rail left, a request is refused, or the NIC "
        "does not complete a request within request_timeout. Drive it with progress() from a thread, or "
        "gpuverbs.async_drive(proxy) on asyncio. The CQ and the queue pairs are the proxy's alone.")
        .def(py::init([](const std::shared_ptr<PyDeviceQueue>& queue, const py::object& pd, const py::object& cq,
                         std::uint32_t batch, double request_timeout) {
                 if (!queue) throw py::value_error("DeviceQueueProxy: give a DeviceQueue");
                 refuse_polled(cq, "DeviceQueueProxy");
                 queue->check_reader("DeviceQueueProxy");
                 if (queue->reader.taken() != 0) {
                     throw py::value_error("DeviceQueueProxy: take() already read " +
                                           std::to_string(queue->reader.taken()) +
                                           " requests of this queue: a proxy reads a queue from its start");
                 }
                 if (dq::queue_state(queue->queue.proxy_view()) != dq::WaitResult::done) {
                     throw py::value_error("DeviceQueueProxy: the queue has ended (" +
                                           std::string(result_name(dq::queue_state(queue->queue.proxy_view()))) +
                                           "): give a new one");
                 }
                 DeviceQueueProxyOptions options;
                 options.batch = batch;
                 options.request_timeout = checked_milliseconds(request_timeout, "request_timeout");
                 auto self = std::make_shared<PyDeviceQueueProxy>();
                 self->queue = queue;
                 self->held = {pd, cq};
                 std::error_code ec;
                 Diagnostics why;
                 DeviceQueueProxy made =
                     DeviceQueueProxy::create(queue->queue.proxy_view(), pd.cast<const ProtectionDomain&>(),
                                              cq.cast<Cq&>().cq, options, ec, why);
                 check(ec, why, "DeviceQueueProxy");
                 self->proxy.emplace(std::move(made));
                 queue->proxied = true;
                 return self;
             }),
             py::arg("queue"), py::arg("pd"), py::arg("cq"), py::arg("batch") = proxy_defaults.batch,
             py::arg("request_timeout") = seconds_of(proxy_defaults.request_timeout),
             "Reads queue; signals that add land in scratch words registered in pd; cq is the send CQ of every "
             "peer's queue pair (the proxy polls it: no other queue pair or operation may use it).")
        .def(
            "add_device",
            [](PyDeviceQueueProxy& self, const py::object& pd, const py::object& cq) {
                const Busy busy(self);
                std::error_code ec;
                Diagnostics why;
                refuse_polled(cq, "DeviceQueueProxy.add_device");
                self.get().add_device(pd.cast<const ProtectionDomain&>(), cq.cast<Cq&>().cq, ec, why);
                check(ec, why, "DeviceQueueProxy.add_device");
                self.held.push_back(pd);
                self.held.push_back(cq);
            },
            py::arg("pd"), py::arg("cq"), "Another NIC the proxy posts from (a rail on another device).")
        .def(
            "add_window",
            [](PyDeviceQueueProxy& self, std::uint16_t id, const std::shared_ptr<Region>& region) {
                const Busy busy(self);
                if (!region || region->cached) {
                    throw py::value_error(
                        "DeviceQueueProxy.add_window: give a MemoryRegion from "
                        "ProtectionDomain.register (a RegistrationCache's shares its registration)");
                }
                std::error_code ec;
                Diagnostics why;
                self.get().add_window(id, region->own, ec, why);
                check(ec, why, "DeviceQueueProxy.add_window");
                ++region->proxies;
                self.regions.push_back(region);
            },
            py::arg("id"), py::arg("region"),
            "A local window puts read from (offsets from the region's start); once per device with a rail.")
        .def(
            "add_peer",
            [](PyDeviceQueueProxy& self, std::uint16_t peer, const std::shared_ptr<Qp>& qp,
               const std::map<std::uint16_t, RemoteMemory>& windows) {
                add_rail_of(self, peer, qp, windows, &DeviceQueueProxy::add_peer, "DeviceQueueProxy.add_peer");
            },
            py::arg("peer"), py::arg("qp"), py::arg("windows"),
            "A peer, its first rail (qp) and its windows as {id: RemoteMemory}: puts write there, signals land there.")
        .def(
            "add_rail",
            [](PyDeviceQueueProxy& self, std::uint16_t peer, const std::shared_ptr<Qp>& qp,
               const std::map<std::uint16_t, RemoteMemory>& windows) {
                add_rail_of(self, peer, qp, windows, &DeviceQueueProxy::add_rail, "DeviceQueueProxy.add_rail");
            },
            py::arg("peer"), py::arg("qp"), py::arg("windows"),
            "Another rail to peer: it takes the peer's requests over when the rails before it failed.")
        .def(
            "progress",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                DeviceQueueProxy& p = self.get();
                py::gil_scoped_release release;
                return p.progress();
            },
            "One pass, never blocking: reaps completions, returns credits, then takes and posts up to batch "
            "descriptors (how many it took). What goes wrong fails the queue (error, failure); nothing is raised.")
        .def(
            "drive_passes",
            [](PyDeviceQueueProxy& self, std::uint32_t passes) {
                const Busy busy(self);
                DeviceQueueProxy& p = self.get();
                {
                    py::gil_scoped_release release;
                    for (std::uint32_t k = 0; k < passes && p.error() == dq::QueueError::none; ++k) {
                        const std::uint64_t idle = p.counters().idle_passes;
                        (void)p.progress();
                        self.idle_streak = p.counters().idle_passes != idle ? self.idle_streak + 1 : 0;
                    }
                }
                return self.idle_streak;
            },
            py::arg("passes") = drive_defaults.passes,
            "Up to passes progress() calls (fewer once the queue ended); the idle passes in a row so far "
            "(async_drive's step).")
        .def_property_readonly_static(
            "drive_defaults",
            [](const py::object&) {
                const DeviceQueueDriveOptions o;
                py::dict d;
                d["passes"] = o.passes;
                d["idle_passes_before_nap"] = o.idle_passes_before_nap;
                d["nap"] = std::chrono::duration<double>(o.nap).count();
                return d;
            },
            "DeviceQueueDriveOptions' defaults (C++): passes, idle_passes_before_nap, nap (seconds).")
        .def(
            "close",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                self.get().close();
            },
            "Ends the queue: every producer's wait ends queue_closed.")
        .def_property_readonly(
            "counters",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                return counters_dict(self.get().counters());
            },
            "What the proxy did (monotonic counts, DeviceQueueProxyCounters).")
        .def_property_readonly(
            "rails",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                py::list out;
                for (const DeviceQueueRailState& r : self.get().rails()) out.append(rail_dict(r));
                return out;
            },
            "Every rail of every peer: peer, rail, qp_num, active, failed, failure (words).")
        .def_property_readonly(
            "error",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                return error_name(self.get().error());
            },
            "How the queue ended: 'none' while it works, 'peer_failed', 'closed' or 'refused'.")
        .def_property_readonly(
            "failure",
            [](PyDeviceQueueProxy& self) {
                const Busy busy(self);
                return self.get().failure();
            },
            "Why the queue failed, in words (empty while it works).");
}

} // namespace gpuverbs::python
