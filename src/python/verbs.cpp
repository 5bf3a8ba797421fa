// Devices, the doctor, protection domains, completion queues, the context
// that runs completions, and queue pairs set up in typed steps
// (PreparedQueuePair -> connect -> QueuePair), as in C++.
#include "binding.hpp"

#include <boost/asio/post.hpp>

namespace gpuverbs::python {

Cq::Cq(const Device& device, int capacity, std::shared_ptr<Context> ctx)
    : context(std::move(ctx)),
      cq(device, capacity, context->io().get_executor(),
         AsyncOptions{.mode = context->polled() ? CompletionMode::polled : CompletionMode::event_driven}) {
    fd = cq.native_handle()->channel->fd;
    if (!context->polled()) context->watch(fd); // a polled CQ's channel is never armed
}

Cq::~Cq() {
    if (!context->polled()) context->unwatch(fd);
    context->wake();
}

QueuePair& Qp::get() const {
    QueuePair* p = from_connection ? from_connection() : qp;
    if (p == nullptr || !*p) throw py::value_error("the QueuePair is closed");
    return *p;
}

Qp::~Qp() {
    // Its operations end with operation_aborted, posted: the loop must look.
    if (context) context->wake();
}

namespace {

// What a struct becomes in Python: every member (record_fields lets the test
// check that), named as in C++; enums by their C++ names (to_string), MTUs in bytes.

py::dict port_dict(const PortAttributes& p) {
    py::dict d;
    d["port"] = p.port;
    d["state"] = std::string(to_string(p.state));
    d["link_layer"] = std::string(to_string(p.link_layer));
    d["active_mtu"] = mtu_bytes(p.active_mtu);
    d["max_mtu"] = mtu_bytes(p.max_mtu);
    d["lid"] = p.lid;
    d["speed_gbps"] = p.speed_gbps;
    d["gid_table_length"] = p.gid_table_length;
    // `native` (the raw ibv_port_attr) stays in C++.
    return d;
}

py::dict device_info_dict(const DeviceInfo& info) {
    py::dict d;
    d["name"] = info.name;
    d["node_guid"] = format_guid(info.node_guid);
    d["node_type"] = std::string(to_string(info.node_type));
    d["transport"] = std::string(to_string(info.transport));
    return d;
}

py::dict gid_dict(const GidEntry& g) {
    py::dict d;
    d["index"] = g.index;
    d["port"] = g.port;
    d["gid"] = g.gid.to_string();
    d["type"] = std::string(to_string(g.type));
    d["netdev_ifindex"] = g.netdev_ifindex;
    return d;
}

/// QueuePair.failure's dict: every member of QueuePairFailure, with the cause
/// as its enumerator's name, `since` on time.monotonic()'s clock, the status
/// as its message and describe()'s words.
py::dict failure_dict(const QueuePairFailure& f) {
    using Cause = QueuePairFailure::Cause;
    const char* cause = "completion_failed";
    switch (f.cause) {
        case Cause::completion_failed: cause = "completion_failed"; break;
        case Cause::moved_to_error: cause = "moved_to_error"; break;
        case Cause::provider_reports_error: cause = "provider_reports_error"; break;
        case Cause::port_down: cause = "port_down"; break;
        case Cause::stalled: cause = "stalled"; break;
        case Cause::notification_not_taken: cause = "notification_not_taken"; break;
    }
    py::dict d;
    d["cause"] = cause;
    d["since"] = monotonic_seconds(f.since);
    d["status"] = f.status ? f.status.message() : std::string();
    d["port"] = f.port;
    d["description"] = f.describe();
    return d;
}

py::dict statistics_dict(const AsyncStatistics& s) {
    py::dict d;
    d["submitted"] = s.submitted;
    d["waited"] = s.waited;
    d["completed"] = s.completed;
    d["aborted"] = s.aborted;
    d["cancelled"] = s.cancelled;
    d["polls"] = s.polls;
    d["empty_polls"] = s.empty_polls;
    d["wakeups"] = s.wakeups;
    d["work_completions"] = s.work_completions;
    d["queue_pairs_failed"] = s.queue_pairs_failed;
    d["completed_by_library"] = s.completed_by_library;
    return d;
}

/// A prepared queue pair and the CQ whose context will run its completions.
struct Prepared {
    std::shared_ptr<Context> context;
    std::shared_ptr<Cq> cq;
    PreparedQueuePair prepared;
};

py::bytes as_bytes(std::span<const std::byte> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
}

std::span<const std::byte> view(const py::bytes& b, std::string_view& keep) {
    keep = b;
    return std::as_bytes(std::span(keep.data(), keep.size()));
}

std::string_view element_name(EventElement e) {
    switch (e) {
        case EventElement::device: return "device";
        case EventElement::port: return "port";
        case EventElement::queue_pair: return "queue_pair";
        case EventElement::shared_receive_queue: return "shared_receive_queue";
        case EventElement::completion_queue: return "completion_queue";
    }
    return "?";
}

py::dict event_dict(const DeviceEvent& e) {
    py::dict d;
    d["type"] = std::string(to_string(e.type));
    d["element"] = std::string(element_name(e.element));
    d["device"] = e.device;
    d["port"] = e.port;
    d["qp_num"] = e.qp_num;
    d["object"] = e.object;
    d["native_type"] = e.native_type;
    d["description"] = e.describe();
    return d;
}

py::object event_dict(const std::optional<DeviceEvent>& e) {
    if (!e) return py::none();
    return event_dict(*e);
}

/// A device's asynchronous events and the device they come from (held).
struct Events {
    std::shared_ptr<Device> device;
    DeviceEvents events;
};

} // namespace

void bind_verbs(py::module_& m) {
    record_fields(m, "PortAttributes", port_dict(PortAttributes{}));
    record_fields(m, "DeviceInfo", device_info_dict(DeviceInfo{}));
    record_fields(m, "GidEntry", gid_dict(GidEntry{}));
    record_fields(m, "QueuePairFailure", failure_dict(QueuePairFailure{}));
    record_fields(m, "DeviceEvent", event_dict(DeviceEvent{}));
    record_fields(m, "AsyncStatistics", statistics_dict(AsyncStatistics{}));

    py::class_<Context, std::shared_ptr<Context>>(
        m, "Context",
        "Runs completions for Python. An asyncio loop drives it through one descriptor (fileno(), done for you by "
        "await); synchronous waits drive it themselves.")
        .def(py::init<bool>(), py::kw_only(), py::arg("polled") = false,
             "polled=True: progress without a loop. Its CQs move only when progress() is called (from the "
             "engine's own step loop); nothing is awaited or woken.")
        .def_property_readonly("polled", &Context::polled)
        .def("fileno", &Context::fileno, "The epoll descriptor that is readable when completions wait.")
        .def("poll", &Context::poll, "Runs the completions that are ready; never blocks. Returns how many ran.")
        .def("progress", &Context::progress,
             "Reaps every CQ of a polled context, posts what waited, runs the liveness watch when due, and runs "
             "what finished; never blocks or sleeps, and makes no system call when nothing is in flight. Call it "
             "from one thread. Returns how many operations finished.")
        .def(
            "run_one",
            [](Context& c, double timeout) {
                py::gil_scoped_release release;
                return c.run_one_for(std::chrono::microseconds(static_cast<std::int64_t>(timeout * 1e6)));
            },
            py::arg("timeout") = 0.1, "Runs at most one completion, waiting up to timeout seconds (GIL released).");

    m.def(
        "devices",
        [] {
            py::list out;
            for (const DeviceInfo& d : Device::list()) out.append(device_info_dict(d));
            return out;
        },
        "The RDMA devices of this machine, as dicts (an empty list when there is none).");

    m.def(
        "_doctor_json",
        [](bool live) {
            DoctorOptions options;
            options.live = live;
            py::gil_scoped_release release;
            return to_json(diagnose(options));
        },
        py::arg("live") = true);

    py::class_<Device, std::shared_ptr<Device>>(m, "Device", "An opened RDMA device.")
        .def_static(
            "open", [](const std::string& name) { return std::make_shared<Device>(Device::open(name)); },
            py::arg("name"), "Opens the device called name (gpuverbs.Error device_not_found with the names there are).")
        .def_static(
            "open_first", [] { return std::make_shared<Device>(Device::open_first()); },
            "Opens the first device (gpuverbs.Error no_rdma_device, saying why, when there is none).")
        .def_property_readonly("name", &Device::name)
        .def(
            "query_port", [](const Device& d, std::uint8_t port) { return port_dict(d.query_port(port)); },
            py::arg("port") = QueuePairOptions{}.port)
        .def(
            "gid_table",
            [](const Device& d, std::uint8_t port) {
                py::list out;
                for (const GidEntry& g : d.gid_table(port)) out.append(gid_dict(g));
                return out;
            },
            py::arg("port") = QueuePairOptions{}.port)
        .def("__repr__", [](const Device& d) { return "<gpuverbs.Device " + d.name() + ">"; });

    py::class_<Events, std::shared_ptr<Events>>(
        m, "DeviceEvents",
        "A device's asynchronous events (link up and down, a queue pair's fatal error, the device's removal), "
        "each a dict: type, element, device, port, qp_num, object, native_type, description.")
        .def(py::init([](const std::shared_ptr<Device>& device) {
                 auto e = std::make_shared<Events>();
                 e->events = DeviceEvents(*device);
                 e->device = device;
                 return e;
             }),
             py::arg("device"))
        .def(
            "poll", [](Events& e) { return event_dict(e.events.poll()); }, "The next event, or None (never blocks).")
        .def(
            "_wait_for",
            [](Events& e, double timeout) {
                std::optional<DeviceEvent> got;
                {
                    py::gil_scoped_release release;
                    got = e.events.wait_for(std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000)));
                }
                return event_dict(got);
            },
            py::arg("timeout"))
        .def(
            "fileno", [](const Events& e) { return e.device->native_handle()->async_fd; },
            "The device's event descriptor (readable when poll() may have an event; a removal is found by "
            "polling, every DeviceEvents.removal_check_interval).")
        .def_property_readonly_static("removal_check_interval", [](const py::object&) {
            return std::chrono::duration<double>(DeviceEvents::removal_check_interval).count();
        });

    py::class_<ProtectionDomain, std::shared_ptr<ProtectionDomain>>(m, "ProtectionDomain",
                                                                    "A protection domain: memory is registered in it.")
        .def(py::init([](const Device& d) { return std::make_shared<ProtectionDomain>(d); }), py::arg("device"))
        .def_property_readonly("device_name", &ProtectionDomain::device_name);

    py::class_<Cq, std::shared_ptr<Cq>>(
        m, "CompletionQueue",
        "A completion queue whose completions run on a Context (event-driven: no CPU while idle).")
        .def(py::init([](const Device& d, int capacity, std::shared_ptr<Context> ctx) {
                 if (capacity <= 0) {
                     throw py::value_error("CompletionQueue: capacity must be positive (got " +
                                           std::to_string(capacity) + ")");
                 }
                 return std::make_shared<Cq>(d, capacity, std::move(ctx));
             }),
             py::arg("device"), py::arg("capacity"), py::arg("context"))
        .def_property_readonly("context", [](const Cq& c) { return c.context; })
        .def_property_readonly("statistics", [](const Cq& c) { return statistics_dict(c.cq.async_statistics()); });
}

void bind_queue_pairs(py::module_& m) {
    // Declared before the methods that take or return one, so that their
    // signatures (help(), the stubs' test) name it gpuverbs._core.QueuePair.
    py::class_<Qp, std::shared_ptr<Qp>> qp(m, "QueuePair", "A connected reliable queue pair: the data path.");

    py::class_<Endpoint>(m, "Endpoint", "What the peer needs to connect to a queue pair (QPN, PSN, LID, GID, MTU).")
        .def_readonly("qp_num", &Endpoint::qp_num)
        .def_readonly("psn", &Endpoint::psn)
        .def_readonly("lid", &Endpoint::lid)
        .def_property_readonly("gid", [](const Endpoint& e) { return e.gid.to_string(); })
        .def_property_readonly(
            "mtu", [](const Endpoint& e) { return mtu_bytes(e.mtu); }, "The port's active MTU, in bytes.")
        .def_property_readonly("link_layer", [](const Endpoint& e) { return std::string(to_string(e.link_layer)); })
        .def(
            "to_bytes", [](const Endpoint& e) { return as_bytes(wire::serialize(e)); },
            "The wire form (Endpoint.from_bytes reads it).")
        .def_static(
            "from_bytes",
            [](const py::bytes& b) {
                std::string_view keep;
                return wire::parse_endpoint(view(b, keep));
            },
            py::arg("data"));

    py::class_<Prepared, std::shared_ptr<Prepared>>(
        m, "PreparedQueuePair",
        "A reliable-connected queue pair, created and waiting for its peer's Endpoint (connect()).")
        .def(py::init([](const ProtectionDomain& pd, const std::shared_ptr<Cq>& cq, std::uint32_t max_send_wr,
                         std::uint32_t max_recv_wr, std::uint32_t max_send_sge, std::uint32_t max_recv_sge,
                         std::uint32_t max_inline_data, std::uint8_t port) {
                 auto p = std::make_shared<Prepared>();
                 p->prepared = PreparedQueuePair(pd, cq->cq, cq->cq, [&] {
                     QueuePairOptions o =
                         qp_options(max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
                     o.port = port;
                     return o;
                 }());
                 p->context = cq->context;
                 p->cq = cq;
                 return p;
             }),
             py::arg("pd"), py::arg("cq"), py::kw_only(), py::arg("max_send_wr") = QueuePairOptions{}.max_send_wr,
             py::arg("max_recv_wr") = QueuePairOptions{}.max_recv_wr,
             py::arg("max_send_sge") = QueuePairOptions{}.max_send_sge,
             py::arg("max_recv_sge") = QueuePairOptions{}.max_recv_sge,
             py::arg("max_inline_data") = QueuePairOptions{}.max_inline_data, py::arg("port") = QueuePairOptions{}.port)
        .def_property_readonly("endpoint", [](const Prepared& p) { return p.prepared.endpoint(); })
        .def(
            "advertise",
            [](Prepared& p, const Region& region) {
                if (!p.prepared) throw py::value_error("advertise: this PreparedQueuePair was already connected");
                (void)p.prepared.advertise(region.mr());
                return region.remote(0, region.length);
            },
            py::arg("region"),
            "The region's RemoteMemory for the peer; connect() then grants the peer what the region allows "
            "(the union over every region advertised). A queue pair that advertised nothing grants nothing.")
        .def_property_readonly(
            "advertised_access",
            [](const Prepared& p) { return static_cast<unsigned>(p.prepared.advertised_access()); },
            "What connect() grants by default (gpuverbs.Access flags).")
        .def(
            "connect",
            [](Prepared& p, const Endpoint& remote, std::uint8_t timeout, std::uint8_t retry_count,
               std::uint8_t rnr_retry_count, std::optional<unsigned> remote_access) {
                if (!p.prepared) throw py::value_error("connect: this PreparedQueuePair was already connected");
                ConnectOptions o;
                o.timeout = timeout;
                o.retry_count = retry_count;
                o.rnr_retry_count = rnr_retry_count;
                if (remote_access) o.remote_access = remote_access_flags(*remote_access, "connect");
                auto q = std::make_shared<Qp>();
                q->owned = std::move(p.prepared).connect(remote, o);
                q->qp = &q->owned;
                q->context = p.context;
                q->cq = p.cq;
                return q;
            },
            py::arg("remote"), py::kw_only(), py::arg("timeout") = ConnectOptions{}.timeout,
            py::arg("retry_count") = ConnectOptions{}.retry_count,
            py::arg("rnr_retry_count") = ConnectOptions{}.rnr_retry_count, py::arg("remote_access") = py::none(),
            "Moves to RTR and RTS towards remote: the connected QueuePair. It grants the peer remote_access "
            "(gpuverbs.Access remote flags), by default what was advertised, else nothing.");

    qp.def_property_readonly("qp_num", [](const Qp& q) { return q.get().qp_num(); })
        .def_property_readonly("remote_endpoint", [](const Qp& q) { return q.get().remote_endpoint(); })
        .def_property_readonly("outstanding_sends", [](const Qp& q) { return q.get().outstanding_sends(); })
        .def_property_readonly("outstanding_receives", [](const Qp& q) { return q.get().outstanding_receives(); })
        .def_property_readonly("state", [](const Qp& q) { return std::string(to_string(q.get().state())); })
        .def_property_readonly(
            "remote_access", [](const Qp& q) { return static_cast<unsigned>(q.get().remote_access()); },
            "What the peer was granted through this queue pair (gpuverbs.Access flags).")
        .def_property_readonly("context", [](const Qp& q) { return q.context; })
        .def_property_readonly(
            "failure",
            [](const Qp& q) -> std::optional<py::dict> {
                const std::optional<QueuePairFailure> f = q.get().failure();
                if (!f) return std::nullopt;
                return failure_dict(*f);
            },
            "None while the queue pair works; once it failed, why and since when: cause "
            "('completion_failed', 'moved_to_error', 'provider_reports_error', 'port_down', 'stalled', "
            "'notification_not_taken'), since "
            "(time.monotonic()), status, port and a description in words.")
        .def(
            "close",
            [](Qp& q) {
                if (q.proxies != 0) {
                    throw py::value_error("QueuePair.close: a DeviceQueueProxy posts on it (a rail of " +
                                          std::to_string(q.proxies) +
                                          " proxy): let the proxy go first (its close() ends the queue)");
                }
                q.owned = QueuePair();
                q.qp = nullptr;
                q.from_connection = nullptr;
                q.owner = py::none();
                q.context->wake();
            },
            "Destroys the queue pair now (idempotent): its outstanding operations end with gpuverbs.Aborted. An "
            "rdma_cm connection's queue pair is only let go: close (or disconnect) the connection to end it.");
    add_operations(qp);
}

} // namespace gpuverbs::python
