// gpuverbs.DeviceQueue: a device queue's memory (device_queue/queue.hpp) for a
// kernel started from Python (CuPy, Numba, PyTorch extensions), and its
// reader's side. Its `view` is the four kernel arguments
// gpuverbs::device::queue_view() takes; device_queue_include_dir() (the
// package) is where the kernel's #include <gpuverbs/device_queue/device.cuh>
// is found. The host proxy is C++ only for now (docs/python.md says why).
#include "binding.hpp"

#include <optional>

namespace gpuverbs::python {

namespace dq = device_queue;

namespace {

/// A queue and the reader of its descriptors (one reader per queue).
struct PyDeviceQueue {
    DeviceQueue queue;
    dq::RingReader reader;
    explicit PyDeviceQueue(DeviceQueue q) : queue(std::move(q)), reader(queue.proxy_view()) {}
};

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
}

} // namespace gpuverbs::python
