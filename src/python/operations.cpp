// The data path from Python: every operation is the C++ async_* form with a
// handler that finishes an Operation, which Python awaits (an asyncio future
// completed on the loop's thread) or waits for (the GIL released).
#include "binding.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>

namespace gpuverbs::python {

// The Python objects it holds are released under the GIL (the last reference
// may go on a thread that runs completions without it).
Operation::~Operation() {
    if (!future_ && !loop_ && regions.empty() && !plan) return;
    try {
        py::gil_scoped_acquire gil;
        regions.clear();
        plan.reset();
        future_ = py::object();
        loop_ = py::object();
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor never throws; only at interpreter exit
    }
}

py::object Operation::value() {
    switch (kind_) {
        case Kind::bytes:
        case Kind::transfer: return py::int_(bytes);
        case Kind::old_value: return py::int_(old_value);
        case Kind::received: return py::cast(received);
        case Kind::none: break;
    }
    return py::none();
}

py::object Operation::error() {
    py::object e = make_error(static_cast<std::error_code>(ec_), verb_, detail);
    if (kind_ == Kind::transfer) e.attr("report") = py::cast(report);
    return e;
}

py::object Operation::result() {
    if (!done_) throw py::value_error("result: the operation has not completed (await it, or wait())");
    if (ec_) {
        py::object e = error();
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
        throw py::error_already_set();
    }
    return value();
}

void Operation::set_future(py::object future) {
    if (context_->polled()) {
        throw py::value_error(
            "this operation's Context is polled: nothing wakes an asyncio loop for it. Call op.poll() or "
            "context.progress() from your own loop (or make the CompletionQueue on a Context() that is not polled "
            "to await)");
    }
    if (future_ && !future_.attr("done")().cast<bool>()) {
        throw py::value_error(
            "this operation is already awaited by another task: await it in one task (share "
            "that task, or asyncio.shield it)");
    }
    loop_ = future.attr("get_loop")();
    future_ = std::move(future);
    if (!done_ && !counted_awaited) {
        counted_awaited = true;
        context_->awaited(+1); // the loop wakes for the library's timers until it finishes
    }
    if (done_) deliver();
}

namespace {

/// asyncio's running loop on this thread (None outside one): the C function, looked up once.
py::object running_loop() {
    // Never destroyed: a static py::object would be released after the interpreter is gone.
    static const auto* get = new py::object(py::module_::import("asyncio.events").attr("_get_running_loop"));
    return (*get)();
}

} // namespace

void Operation::deliver() {
    py::object future = std::move(future_);
    py::object loop = std::move(loop_);
    future_ = py::object();
    loop_ = py::object();
    if (!future) return;
    py::object outcome = ec_ ? error() : value();
    const char* how = ec_ ? "set_exception" : "set_result";
    if (running_loop().is(loop)) {
        if (!future.attr("done")().cast<bool>()) future.attr(how)(outcome);
        return;
    }
    // Completed on another thread (a wait() there ran this handler): the
    // future is the loop's, so the loop sets it, if it is still waiting.
    py::object settle = py::cpp_function([future, how = std::string(how)](const py::object& result) {
        if (!future.attr("done")().cast<bool>()) future.attr(how.c_str())(result);
    });
    loop.attr("call_soon_threadsafe")(settle, outcome);
}

void Operation::cancel() {
    if (!done_) {
        signal_.emit(boost::asio::cancellation_type::terminal);
        context_->wake(); // a taken-back operation's handler is posted: the loop must look
    }
}

bool Operation::wait(double timeout) {
    using Clock = std::chrono::steady_clock;
    const bool forever = timeout < 0;
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(forever ? 0.0 : timeout));
    while (!done_) {
        auto slice = std::chrono::microseconds(100000);
        if (!forever) {
            auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - Clock::now());
            if (left.count() <= 0) return false;
            slice = std::min(slice, left);
        }
        {
            py::gil_scoped_release release;
            context_->run_one_for(slice);
        }
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    return true;
}

void Operation::finish(const boost::system::error_code& ec) {
    done_ = true;
    ec_ = ec;
    regions.clear();
    if (counted_awaited) {
        counted_awaited = false;
        context_->awaited(-1);
    }
    if (future_) deliver();
}

void Operation::finish_noexcept(const boost::system::error_code& ec) noexcept {
    try {
        py::gil_scoped_acquire gil;
        try {
            finish(ec);
        } catch (py::error_already_set& e) {
            // A loop closed under a waiting task, a KeyboardInterrupt: reported, never thrown into Asio.
            e.discard_as_unraisable("gpuverbs: completing an operation");
        }
    } catch (...) { // NOLINT(bugprone-empty-catch): the operation is done; nothing can be told
        done_ = true;
    }
}

namespace {

using boost::asio::bind_cancellation_slot;

/// The handler of every operation: stores the result and finishes, under the GIL.
struct Finish {
    std::shared_ptr<Operation> op;
    void operator()(const boost::system::error_code& ec, std::size_t n) const noexcept {
        op->bytes = n;
        op->old_value = n;
        op->finish_noexcept(ec);
    }
    void operator()(const boost::system::error_code& ec, Received r) const noexcept {
        op->received = r;
        op->finish_noexcept(ec);
    }
};

std::uint64_t non_negative(std::int64_t v, const char* name) {
    if (v < 0) throw py::value_error(std::string(name) + " must not be negative (got " + std::to_string(v) + ")");
    return static_cast<std::uint64_t>(v);
}

std::uint32_t immediate_value(std::int64_t v) {
    if (v < 0 || v > 0xffffffffLL) {
        throw py::value_error("immediate must be a 32-bit unsigned value (got " + std::to_string(v) + ")");
    }
    return static_cast<std::uint32_t>(v);
}

/// Starts one operation: `start(queue_pair, buffer, handler)` calls the C++ async_* form.
template <class Start>
std::shared_ptr<Operation> start(const Qp& q, Operation::Kind kind, const char* verb, const py::handle& local,
                                 const char* local_name, Start&& begin) {
    QueuePair& qp = q.get();
    Slice s = to_slice(local, local_name);
    auto op = std::make_shared<Operation>(q.context, kind, verb);
    const LocalBuffer buffer = s.buffer();
    op->regions.push_back(std::move(s.region));
    begin(qp, buffer, bind_cancellation_slot(op->slot(), Finish{op}));
    return op;
}

} // namespace

void add_operations(py::class_<Qp, std::shared_ptr<Qp>>& cls) {
    cls.def(
           "write",
           [](const Qp& q, const py::handle& local, const RemoteMemory& remote, std::int64_t remote_offset) {
               const std::uint64_t at = non_negative(remote_offset, "remote_offset");
               return start(q, Operation::Kind::bytes, "async_write", local, "local",
                            [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_write(b, remote, at, h); });
           },
           py::arg("local"), py::arg("remote"), py::arg("remote_offset") = 0,
           "RDMA-writes local (a MemoryRegion or LocalBuffer) to remote at remote_offset. Await it, or wait(): the "
           "bytes written.")
        .def(
            "write_with_imm",
            [](const Qp& q, const py::handle& local, const RemoteMemory& remote, std::int64_t remote_offset,
               std::int64_t immediate) {
                const std::uint64_t at = non_negative(remote_offset, "remote_offset");
                const std::uint32_t imm = immediate_value(immediate);
                return start(q, Operation::Kind::bytes, "async_write_with_imm", local, "local",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) {
                                 qp.async_write_with_imm(b, remote, at, imm, h);
                             });
            },
            py::arg("local"), py::arg("remote"), py::arg("remote_offset"), py::arg("immediate"),
            "RDMA-writes, then consumes one receive at the peer, which gets immediate.")
        .def(
            "read",
            [](const Qp& q, const py::handle& local, const RemoteMemory& remote, std::int64_t remote_offset) {
                const std::uint64_t at = non_negative(remote_offset, "remote_offset");
                return start(q, Operation::Kind::bytes, "async_read", local, "local",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_read(b, remote, at, h); });
            },
            py::arg("local"), py::arg("remote"), py::arg("remote_offset") = 0,
            "RDMA-reads remote at remote_offset into local: the bytes read.")
        .def(
            "send",
            [](const Qp& q, const py::handle& local) {
                return start(q, Operation::Kind::bytes, "async_send", local, "local",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_send(b, h); });
            },
            py::arg("local"), "Sends local to the peer's next receive: the bytes sent.")
        .def(
            "send_with_imm",
            [](const Qp& q, const py::handle& local, std::int64_t immediate) {
                const std::uint32_t imm = immediate_value(immediate);
                return start(q, Operation::Kind::bytes, "async_send_with_imm", local, "local",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_send_with_imm(b, imm, h); });
            },
            py::arg("local"), py::arg("immediate"))
        .def(
            "receive",
            [](const Qp& q, const py::handle& local) {
                return start(q, Operation::Kind::received, "async_receive", local, "local",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_receive(b, h); });
            },
            py::arg("local"),
            "Posts a receive into local: a Received (bytes, immediate) once a send or a write with immediate "
            "consumes it.")
        .def(
            "fetch_add",
            [](const Qp& q, const py::handle& result, const RemoteMemory& remote, std::int64_t remote_offset,
               std::uint64_t add) {
                const std::uint64_t at = non_negative(remote_offset, "remote_offset");
                return start(
                    q, Operation::Kind::old_value, "async_fetch_add", result, "result",
                    [&](QueuePair& qp, const LocalBuffer& b, auto h) { qp.async_fetch_add(b, remote, at, add, h); });
            },
            py::arg("result"), py::arg("remote"), py::arg("remote_offset"), py::arg("add"),
            "Atomically adds add to the 8 bytes at remote_offset: their old value (also written to result).")
        .def(
            "compare_swap",
            [](const Qp& q, const py::handle& result, const RemoteMemory& remote, std::int64_t remote_offset,
               std::uint64_t compare, std::uint64_t swap) {
                const std::uint64_t at = non_negative(remote_offset, "remote_offset");
                return start(q, Operation::Kind::old_value, "async_compare_swap", result, "result",
                             [&](QueuePair& qp, const LocalBuffer& b, auto h) {
                                 qp.async_compare_swap(b, remote, at, compare, swap, h);
                             });
            },
            py::arg("result"), py::arg("remote"), py::arg("remote_offset"), py::arg("compare"), py::arg("swap"),
            "Atomically swaps the 8 bytes at remote_offset for swap if they equal compare: their old value.");
}

void bind_operations(py::module_& m) {
    py::class_<Received>(m, "Received", "What a receive got: bytes, and the sender's immediate (or None).")
        .def_readonly("bytes", &Received::bytes)
        .def_readonly("immediate", &Received::immediate)
        .def("__repr__", [](const Received& r) {
            return "Received(bytes=" + std::to_string(r.bytes) +
                   ", immediate=" + (r.immediate ? std::to_string(*r.immediate) : std::string("None")) + ")";
        });

    py::class_<Operation, std::shared_ptr<Operation>>(
        m, "Operation",
        "One asynchronous operation. Await it on the running asyncio loop, or wait() for it. Cancelling the "
        "awaiting task cancels it by the C++ rules: one not yet posted ends with gpuverbs.Aborted; one posted "
        "completes (the NIC cannot be recalled) and its memory stays held until then.")
        .def_property_readonly("done", &Operation::done)
        .def(
            "poll",
            [](Operation& op) {
                if (!op.done()) (void)op.context()->poll();
                return op.done();
            },
            "Runs the context's ready completions once (progress() on a polled context), never blocking: "
            "whether the operation is done.")
        .def_property_readonly("context", &Operation::context)
        .def("result", &Operation::result, "The result; raises the operation's gpuverbs.Error. Only once done.")
        .def(
            "wait",
            [](Operation& op, std::optional<double> timeout) {
                // None waits for the operation (it ends within the library's bounds); a number is checked.
                const double seconds =
                    timeout ? std::chrono::duration<double>(checked_milliseconds(*timeout, "timeout")).count() : -1.0;
                if (!op.wait(seconds)) {
                    raise_error(std::make_error_code(std::errc::timed_out), "Operation.wait",
                                "the operation did not complete within the timeout; it is still in flight");
                }
                return op.result();
            },
            py::arg("timeout") = py::none(),
            "Blocks (the GIL released) until done, running the context's completions: the result.")
        .def("cancel", &Operation::cancel, "Asks the operation to stop (see the class's rules).")
        .def("_set_future", &Operation::set_future, py::arg("future"));
    // Operation.report: bind_transfers adds it, after TransferReport.
}

} // namespace gpuverbs::python
