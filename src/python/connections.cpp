// Connecting from Python: the TCP bootstrap (endpoints and regions over a
// socket, framed records) and rdma_cm in its steps (create the queue pair,
// post receives, then accept or connect with private data). Every blocking
// step releases the GIL; asyncio code runs them with asyncio.to_thread, and
// waits for rdma_cm events on the loop (CmConnection.event_fd).
#include "binding.hpp"

#include <gpuverbs/config.hpp>

namespace gpuverbs::python {

namespace {

using Milliseconds = std::chrono::milliseconds;

/// A timeout in seconds: finite and 0 or more (ValueError otherwise), never "for ever" by accident.
Milliseconds millis(double seconds) {
    return checked_milliseconds(seconds, "timeout");
}

/// A connected TCP socket for the bootstrap, with the io_context its calls run on.
struct Channel {
    std::shared_ptr<boost::asio::io_context> io;
    std::optional<boost::asio::ip::tcp::socket> socket;
    boost::asio::ip::tcp::socket& get() {
        if (!socket || !socket->is_open()) throw py::value_error("the TCP channel is closed");
        return *socket;
    }
};

struct Listener {
    std::shared_ptr<boost::asio::io_context> io = std::make_shared<boost::asio::io_context>();
    std::optional<TcpListener> listener;
};

#if GPUVERBS_HAVE_RDMACM
/// An rdma_cm connection and the queue pair made on it.
struct Cm {
    std::shared_ptr<Context> context; ///< destroyed after the connection (and its queue pair)
    CmConnection conn;
};

CmOptions cm_options(std::uint8_t retry_count, std::uint8_t rnr_retry_count, std::optional<unsigned> remote_access,
                     const char* step) {
    CmOptions o;
    o.retry_count = retry_count;
    o.rnr_retry_count = rnr_retry_count;
    if (remote_access) o.remote_access = remote_access_flags(*remote_access, step);
    return o;
}

py::dict event_dict(const CmEvent& e) {
    py::dict d;
    d["type"] = std::string(to_string(e.type));
    d["native_type"] = e.native_type;
    d["status"] = e.status;
    d["description"] = e.describe();
    return d;
}

py::dict rejection_dict(const CmRejection& r) {
    py::dict d;
    d["reason"] = r.reason;
    d["by_peer"] = r.by_peer;
    d["reason_text"] = r.reason_text;
    d["private_data"] = to_py(r.private_data);
    return d;
}
#endif

} // namespace

void bind_connections(py::module_& m) {
    py::class_<Channel, std::shared_ptr<Channel>>(m, "TcpChannel",
                                                  "A TCP connection for the bootstrap exchange and framed records.")
        .def(
            "exchange",
            [](Channel& c, const Endpoint& endpoint, const std::vector<RemoteMemory>& regions, double timeout) {
                Handshake ours{endpoint, regions};
                auto& socket = c.get();
                Handshake peer;
                {
                    py::gil_scoped_release release;
                    peer = exchange_handshake(socket, ours, millis(timeout));
                }
                return py::make_tuple(peer.endpoint, peer.regions);
            },
            py::arg("endpoint"), py::arg("regions") = std::vector<RemoteMemory>{},
            py::arg("timeout") = seconds_of(default_bootstrap_timeout),
            "Sends our endpoint and regions, receives the peer's: (Endpoint, [RemoteMemory]).")
        .def(
            "send",
            [](Channel& c, const py::bytes& record, double timeout) {
                std::string data = record;
                auto& socket = c.get();
                py::gil_scoped_release release;
                send_record(socket, bytes_of(data), millis(timeout));
            },
            py::arg("record"), py::arg("timeout") = seconds_of(default_bootstrap_timeout), "Sends one framed record.")
        .def(
            "receive",
            [](Channel& c, std::size_t max_size, double timeout) {
                auto& socket = c.get();
                std::vector<std::byte> data;
                {
                    py::gil_scoped_release release;
                    data = receive_record(socket, max_size, millis(timeout));
                }
                return to_py(data);
            },
            py::arg("max_size") = std::size_t{64} << 20, py::arg("timeout") = seconds_of(default_bootstrap_timeout),
            "Receives one framed record (gpuverbs.Error malformed_record when longer than max_size).")
        .def("close", [](Channel& c) {
            if (c.socket) c.socket->close();
        });

    py::class_<Listener, std::shared_ptr<Listener>>(m, "TcpListener", "Listens for bootstrap connections.")
        .def(py::init([](std::uint16_t port, const std::string& address) {
                 auto l = std::make_shared<Listener>();
                 l->listener.emplace(*l->io, port, address);
                 return l;
             }),
             py::arg("port") = 0, py::arg("address") = "0.0.0.0")
        .def_property_readonly("port", [](const Listener& l) { return l.listener->port(); })
        .def(
            "accept",
            [](Listener& l, double timeout) {
                auto c = std::make_shared<Channel>();
                c->io = l.io;
                py::gil_scoped_release release;
                c->socket.emplace(l.listener->accept(millis(timeout)));
                return c;
            },
            py::arg("timeout") = seconds_of(default_bootstrap_timeout),
            "Waits for one connection (gpuverbs.TimeoutError after timeout seconds).");

    m.def(
        "tcp_connect",
        [](const std::string& host, std::uint16_t port, double timeout) {
            auto c = std::make_shared<Channel>();
            c->io = std::make_shared<boost::asio::io_context>();
            py::gil_scoped_release release;
            c->socket.emplace(tcp_connect(*c->io, host, port, millis(timeout)));
            return c;
        },
        py::arg("host"), py::arg("port"), py::arg("timeout") = seconds_of(default_bootstrap_timeout),
        "Connects to a TcpListener: a TcpChannel.");

#if GPUVERBS_HAVE_RDMACM
    m.attr("have_rdma_cm") = true;
    record_fields(m, "CmEvent", event_dict(CmEvent{}));
    record_fields(m, "CmRejection", rejection_dict(CmRejection{}));
    py::class_<Cm, std::shared_ptr<Cm>>(m, "CmConnection",
                                        "An rdma_cm connection: create_qp, post receives, then accept or connect.")
        .def_property_readonly(
            "device",
            [](const std::shared_ptr<Cm>& c) {
                return std::make_shared<Device>(Device::from_native(c->conn.device().native_handle(), false));
            },
            "The device rdma_cm chose (make the PD and CQ on it; the connection must outlive them).")
        .def_property_readonly("peer_address", [](const Cm& c) { return c.conn.peer_address(); })
        .def_property_readonly("peer_port", [](const Cm& c) { return c.conn.peer_port(); })
        .def_property_readonly("local_address", [](const Cm& c) { return c.conn.local_address(); })
        .def_property_readonly("local_port", [](const Cm& c) { return c.conn.local_port(); })
        .def_property_readonly("incoming", [](const Cm& c) { return c.conn.incoming(); })
        .def_property_readonly("connected", [](const Cm& c) { return c.conn.connected(); })
        .def_property_readonly("peer_private_data", [](const Cm& c) { return to_py(c.conn.peer_private_data()); })
        .def(
            "create_qp",
            [](const py::object& self, const ProtectionDomain& pd, const std::shared_ptr<Cq>& cq,
               std::uint32_t max_send_wr, std::uint32_t max_recv_wr, std::uint32_t max_send_sge,
               std::uint32_t max_recv_sge, std::uint32_t max_inline_data) {
                auto& c = self.cast<Cm&>();
                const QueuePairOptions o =
                    qp_options(max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
                auto q = std::make_shared<Qp>();
                (void)c.conn.create_qp(pd, cq->cq, cq->cq, o);
                q->from_connection = [conn = &c.conn]() -> QueuePair* { return *conn ? &conn->qp() : nullptr; };
                q->context = cq->context;
                q->cq = cq;
                q->owner = self;
                c.context = cq->context;
                return q;
            },
            py::arg("pd"), py::arg("cq"), py::kw_only(), py::arg("max_send_wr") = QueuePairOptions{}.max_send_wr,
            py::arg("max_recv_wr") = QueuePairOptions{}.max_recv_wr,
            py::arg("max_send_sge") = QueuePairOptions{}.max_send_sge,
            py::arg("max_recv_sge") = QueuePairOptions{}.max_recv_sge,
            py::arg("max_inline_data") = QueuePairOptions{}.max_inline_data,
            "Step 1: the connection's queue pair (receives may be posted before accept/connect).")
        .def(
            "advertise",
            [](Cm& c, const Region& region) {
                (void)c.conn.advertise(region.mr());
                return region.remote(0, region.length);
            },
            py::arg("region"),
            "The region's RemoteMemory for the peer; accept()/connect() then grant the peer what the region "
            "allows (the union over every region advertised), nothing when none was.")
        .def(
            "accept",
            [](Cm& c, const py::bytes& private_data, double timeout, std::uint8_t retry_count,
               std::uint8_t rnr_retry_count, std::optional<unsigned> remote_access) {
                std::string data = private_data;
                const CmOptions o = cm_options(retry_count, rnr_retry_count, remote_access, "accept");
                py::gil_scoped_release release;
                c.conn.accept(o, bytes_of(data), millis(timeout));
            },
            py::arg("private_data") = py::bytes(), py::arg("timeout") = seconds_of(default_cm_timeout), py::kw_only(),
            py::arg("retry_count") = CmOptions{}.retry_count, py::arg("rnr_retry_count") = CmOptions{}.rnr_retry_count,
            py::arg("remote_access") = py::none(),
            "Step 2, server: accepts with private_data and waits until established (GIL released).")
        .def(
            "connect",
            [](Cm& c, const py::bytes& private_data, double timeout, std::uint8_t retry_count,
               std::uint8_t rnr_retry_count, std::optional<unsigned> remote_access) {
                std::string data = private_data;
                const CmOptions o = cm_options(retry_count, rnr_retry_count, remote_access, "connect");
                py::gil_scoped_release release;
                c.conn.connect(o, bytes_of(data), millis(timeout));
            },
            py::arg("private_data") = py::bytes(), py::arg("timeout") = seconds_of(default_cm_timeout), py::kw_only(),
            py::arg("retry_count") = CmOptions{}.retry_count, py::arg("rnr_retry_count") = CmOptions{}.rnr_retry_count,
            py::arg("remote_access") = py::none(),
            "Step 2, client: connects with private_data and waits until established (GIL released).")
        .def(
            "reject",
            [](Cm& c, const py::bytes& private_data) {
                std::string data = private_data;
                std::move(c.conn).reject(bytes_of(data));
            },
            py::arg("private_data") = py::bytes(), "Server: refuses the request.")
        .def_property_readonly("rejection",
                               [](const Cm& c) -> py::object {
                                   const auto& r = c.conn.rejection();
                                   if (!r) return py::none();
                                   return rejection_dict(*r);
                               })
        .def("disconnect", [](Cm& c) { c.conn.disconnect(); })
        .def("event_fd", [](const Cm& c) { return c.conn.event_fd(); })
        .def(
            "poll_event",
            [](Cm& c) -> py::object {
                std::optional<CmEvent> e = c.conn.poll_event();
                if (!e) return py::none();
                return event_dict(*e);
            },
            "The next rdma_cm event as a dict, or None (never blocks).")
        .def(
            "_wait_event",
            [](Cm& c, double timeout) -> py::object {
                std::optional<CmEvent> e;
                {
                    py::gil_scoped_release release;
                    e = c.conn.wait_event(millis(timeout));
                }
                if (!e) return py::none();
                return event_dict(*e);
            },
            py::arg("timeout"));

    py::class_<CmListener, std::shared_ptr<CmListener>>(m, "CmListener", "Listens for rdma_cm connection requests.")
        .def(py::init([](const std::string& address, std::uint16_t port) {
                 return std::make_shared<CmListener>(address, port);
             }),
             py::arg("address"), py::arg("port") = 0)
        .def_property_readonly("port", &CmListener::port)
        .def(
            "accept",
            [](CmListener& l, double timeout) {
                auto c = std::make_shared<Cm>();
                py::gil_scoped_release release;
                c->conn = l.accept(millis(timeout));
                return c;
            },
            py::arg("timeout") = seconds_of(default_cm_timeout),
            "Waits for one request: a CmConnection to create_qp on, then accept.");

    m.def(
        "cm_resolve",
        [](const std::string& host, std::uint16_t port, double timeout, const std::string& source) {
            auto c = std::make_shared<Cm>();
            py::gil_scoped_release release;
            c->conn = cm_resolve(host, port, millis(timeout), source);
            return c;
        },
        py::arg("host"), py::arg("port"), py::arg("timeout") = seconds_of(default_cm_timeout), py::arg("source") = "",
        "Resolves host's address and route: a CmConnection to create_qp on, then connect.");
#else
    m.attr("have_rdma_cm") = false;
#endif
}

} // namespace gpuverbs::python
