// Many peers from Python: the rendezvous (Redis for services, PMIx for jobs
// a launcher started) and the Mesh that connects a queue pair to each peer
// through it. A rendezvous is also a small key-value exchange of its own
// (publish, fence, lookup): what a connector uses to hand a KvPool's
// describe() bytes to its peers. Every call that waits releases the GIL.
#include "binding.hpp"

#include <gpuverbs/many_peers/mesh.hpp>
#include <gpuverbs/many_peers/rendezvous/pmix.hpp>
#include <gpuverbs/many_peers/rendezvous/redis.hpp>

#include <optional>
#include <string>
#include <variant>

namespace gpuverbs::python {

namespace {

/// The key-value calls every rendezvous has, bound once for each class.
template <class R>
void add_exchange(py::class_<R, std::shared_ptr<R>>& cls) {
    cls.def_property_readonly("rank", &R::rank)
        .def_property_readonly("world_size", &R::world_size)
        .def_property_readonly("name", &R::name, "Words naming the rendezvous (never a secret).")
        .def(
            "publish",
            [](R& r, const std::string& key, const py::bytes& value) {
                const std::string v = value;
                py::gil_scoped_release release;
                r.publish(key, bytes_of(v));
            },
            py::arg("key"), py::arg("value"), "Publishes value under key for every peer (GIL released).")
        .def(
            "fence",
            [](R& r, double timeout) {
                const auto t = checked_milliseconds(timeout, "fence: timeout");
                py::gil_scoped_release release;
                r.fence(t);
            },
            py::arg("timeout") = seconds_of(MeshOptions{}.timeout),
            "Waits until what every member published before its fence is visible (GIL released).")
        .def(
            "lookup",
            [](R& r, std::uint32_t peer, const std::string& key, double timeout) {
                const auto t = checked_milliseconds(timeout, "lookup: timeout");
                std::vector<std::byte> value;
                {
                    py::gil_scoped_release release;
                    value = r.lookup(peer, key, t);
                }
                return to_py(value);
            },
            py::arg("peer"), py::arg("key"), py::arg("timeout") = seconds_of(MeshOptions{}.timeout),
            "What peer published under key, waiting up to timeout seconds for it (GIL released).")
        .def(
            "withdraw", [](R& r) { r.withdraw(); }, "Removes what this member published.")
        .def_static("available", &R::available,
                    "Whether this gpuverbs was built with it (otherwise creating one raises Errc.unsupported).");
}

/// A mesh over a Python rendezvous, holding what it must outlive.
struct PyMesh {
    std::variant<std::shared_ptr<RedisRendezvous>, std::shared_ptr<PmixRendezvous>> rendezvous;
    std::shared_ptr<ProtectionDomain> pd;
    std::shared_ptr<Cq> cq;
    std::vector<std::shared_ptr<Region>> regions;
    std::optional<Mesh> mesh; ///< declared last: destroyed first (set once made)
};

/// A connected peer: its rank, its queue pair (looked up in the mesh on each
/// use, so it reads as closed once disconnected) and the memory it offers.
struct PyMeshPeer {
    std::uint32_t rank = 0;
    std::shared_ptr<Qp> qp;
    std::vector<RemoteMemory> regions;
};

PyMeshPeer peer_of(const std::shared_ptr<PyMesh>& m, MeshPeer& p) {
    auto q = std::make_shared<Qp>();
    q->from_connection = [mesh = m.get(), rank = p.rank, number = p.qp.qp_num()]() -> QueuePair* {
        MeshPeer* now = mesh->mesh->find(rank);
        // A peer disconnected and connected again has another queue pair: this one is closed.
        return now != nullptr && now->qp && now->qp.qp_num() == number ? &now->qp : nullptr;
    };
    q->context = m->cq->context;
    q->cq = m->cq;
    q->owner = py::cast(m);
    return PyMeshPeer{p.rank, std::move(q), p.regions};
}

std::vector<std::uint32_t> ranks(const py::object& peers) {
    if (py::isinstance<py::int_>(peers)) return {peers.cast<std::uint32_t>()};
    return peers.cast<std::vector<std::uint32_t>>();
}

template <class R>
Mesh make_mesh(R& rendezvous, const ProtectionDomain& pd, const Cq& cq, std::vector<RemoteMemory> remote,
               MeshOptions options) {
    return Mesh(rendezvous, pd, cq.cq, std::move(remote), std::move(options));
}

} // namespace

void bind_mesh(py::module_& m) {
    py::class_<RedisRendezvous, std::shared_ptr<RedisRendezvous>> redis(
        m, "RedisRendezvous",
        "Joins a service through a Redis store: a rank of its own (fresh unless given), kept alive by a "
        "background refresh; it leaves when closed or when its process stops (after ttl).");
    redis
        .def(py::init([](const std::string& host, std::uint16_t port, const std::string& service,
                         std::optional<std::uint32_t> rank, std::optional<std::uint32_t> world_size, double ttl,
                         double poll_interval, double command_timeout, const std::string& user,
                         std::optional<std::string> password_env) {
                 RedisOptions o;
                 o.host = host;
                 o.port = port;
                 o.service = service;
                 o.rank = rank;
                 o.world_size = world_size;
                 o.ttl = checked_milliseconds(ttl, "RedisRendezvous: ttl");
                 o.poll_interval = checked_milliseconds(poll_interval, "RedisRendezvous: poll_interval");
                 o.command_timeout = checked_milliseconds(command_timeout, "RedisRendezvous: command_timeout");
                 o.user = user;
                 if (password_env) o.password = RedisOptions::secret_from_environment(password_env->c_str());
                 py::gil_scoped_release release;
                 return std::make_shared<RedisRendezvous>(std::move(o));
             }),
             py::arg("host") = RedisOptions{}.host, py::arg("port") = RedisOptions{}.port, py::kw_only(),
             py::arg("service") = RedisOptions{}.service, py::arg("rank") = py::none(),
             py::arg("world_size") = py::none(), py::arg("ttl") = seconds_of(RedisOptions{}.ttl),
             py::arg("poll_interval") = seconds_of(RedisOptions{}.poll_interval),
             py::arg("command_timeout") = seconds_of(RedisOptions{}.command_timeout),
             py::arg("user") = RedisOptions{}.user, py::arg("password_env") = py::none(),
             "password_env names the environment variable holding the password (never passed as a string, "
             "so it is never in a traceback).")
        .def(
            "members",
            [](RedisRendezvous& r) {
                py::gil_scoped_release release;
                return r.members();
            },
            "The ranks of the service's live members, ascending.")
        .def_property_readonly(
            "leave_bound",
            [](const RedisRendezvous& r) { return std::chrono::duration<double>(r.leave_bound()).count(); },
            "Seconds within which peers see a member gone that stopped without withdrawing.");
    add_exchange(redis);

    py::class_<PmixRendezvous, std::shared_ptr<PmixRendezvous>> pmix(
        m, "PmixRendezvous", "Joins the job a PMIx launcher (mpirun, prterun, srun) started this process in.");
    pmix.def(py::init([] {
        py::gil_scoped_release release;
        return std::make_shared<PmixRendezvous>();
    }));
    add_exchange(pmix);

    py::class_<PyMeshPeer>(m, "MeshPeer", "A connected peer: its rank, queue pair and the memory it offers us.")
        .def_property_readonly("rank", [](const PyMeshPeer& p) { return p.rank; })
        .def_property_readonly("qp", [](const PyMeshPeer& p) { return p.qp; })
        .def_property_readonly("regions", [](const PyMeshPeer& p) { return p.regions; });

    py::class_<PyMesh, std::shared_ptr<PyMesh>>(
        m, "Mesh",
        "A queue pair to every peer of a rendezvous, each granting what the regions allow, connected all at "
        "once (connect_all), on demand (peer) or without waiting (offer, complete_offers).")
        .def(py::init([](const py::object& rendezvous, const std::shared_ptr<ProtectionDomain>& pd,
                         const std::shared_ptr<Cq>& cq, std::vector<std::shared_ptr<Region>> regions,
                         const std::string& name, double timeout, std::optional<unsigned> remote_access,
                         std::uint32_t max_send_wr, std::uint32_t max_recv_wr, std::uint32_t max_send_sge,
                         std::uint32_t max_recv_sge, std::uint32_t max_inline_data, std::uint8_t retry_count,
                         std::uint8_t rnr_retry_count) {
                 MeshOptions o;
                 o.name = name;
                 o.timeout = checked_milliseconds(timeout, "Mesh: timeout");
                 o.queue_pair = qp_options(max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
                 o.connect.retry_count = retry_count;
                 o.connect.rnr_retry_count = rnr_retry_count;
                 // Each region as its object's bytes (a cached registration may cover more), and by
                 // default the grant its registrations allow.
                 std::vector<RemoteMemory> remote;
                 Access allowed = Access::none;
                 for (std::size_t i = 0; i < regions.size(); ++i) {
                     const Region& r = *regions[i];
                     if (!r.mr()) throw py::value_error("Mesh: regions[" + std::to_string(i) + "] is closed");
                     if (r.mr().native_handle()->pd != pd->native_handle()) {
                         throw py::value_error("Mesh: regions[" + std::to_string(i) +
                                               "] is registered in another protection domain than the mesh's pd");
                     }
                     remote.push_back(r.remote(0, r.length));
                     allowed = allowed | (r.mr().access() & detail::peer_facing_access);
                 }
                 o.connect.remote_access = remote_access ? remote_access_flags(*remote_access, "Mesh") : allowed;
                 auto mesh = std::make_shared<PyMesh>();
                 mesh->pd = pd;
                 mesh->cq = cq;
                 mesh->regions = std::move(regions);
                 if (py::isinstance<RedisRendezvous>(rendezvous)) {
                     auto r = rendezvous.cast<std::shared_ptr<RedisRendezvous>>();
                     mesh->mesh = make_mesh(*r, *pd, *cq, std::move(remote), std::move(o));
                     mesh->rendezvous = std::move(r);
                 } else if (py::isinstance<PmixRendezvous>(rendezvous)) {
                     auto r = rendezvous.cast<std::shared_ptr<PmixRendezvous>>();
                     mesh->mesh = make_mesh(*r, *pd, *cq, std::move(remote), std::move(o));
                     mesh->rendezvous = std::move(r);
                 } else {
                     throw py::type_error(
                         "Mesh: rendezvous must be a gpuverbs.RedisRendezvous or "
                         "gpuverbs.PmixRendezvous, not " +
                         std::string(py::str(py::type::of(rendezvous).attr("__name__"))));
                 }
                 return mesh;
             }),
             py::arg("rendezvous"), py::arg("pd"), py::arg("cq"), py::arg("regions") = std::vector<py::object>(),
             py::kw_only(), py::arg("name") = MeshOptions{}.name,
             py::arg("timeout") = seconds_of(MeshOptions{}.timeout), py::arg("remote_access") = py::none(),
             py::arg("max_send_wr") = MeshOptions{}.queue_pair.max_send_wr,
             py::arg("max_recv_wr") = MeshOptions{}.queue_pair.max_recv_wr,
             py::arg("max_send_sge") = MeshOptions{}.queue_pair.max_send_sge,
             py::arg("max_recv_sge") = MeshOptions{}.queue_pair.max_recv_sge,
             py::arg("max_inline_data") = MeshOptions{}.queue_pair.max_inline_data,
             py::arg("retry_count") = MeshOptions{}.connect.retry_count,
             py::arg("rnr_retry_count") = MeshOptions{}.connect.rnr_retry_count,
             "regions: what every peer may reach (each peer's MeshPeer.regions is the list it offered). "
             "remote_access: what the queue pairs grant (gpuverbs.Access remote flags); by default what the "
             "regions' registrations allow. timeout: seconds for one connect_all, connect or peer call.")
        .def_property_readonly("rank", [](const PyMesh& m) { return m.mesh->rank(); })
        .def_property_readonly("world_size", [](const PyMesh& m) { return m.mesh->world_size(); })
        .def_property_readonly(
            "peers", [](const PyMesh& m) { return m.mesh->peers(); }, "The connected peers' ranks, ascending.")
        .def_property_readonly(
            "offered", [](const PyMesh& m) { return m.mesh->offered(); },
            "The peers offered and not connected yet, ascending.")
        .def(
            "connect_all",
            [](PyMesh& m) {
                py::gil_scoped_release release;
                m.mesh->connect_all();
            },
            "Connects every peer of a fixed world (GIL released; collective: every member calls it).")
        .def(
            "connect",
            [](PyMesh& m, const py::object& peers) {
                const std::vector<std::uint32_t> r = ranks(peers);
                py::gil_scoped_release release;
                m.mesh->connect(r);
            },
            py::arg("peers"), "Connects these peers (a rank or a list), each of which connects us (GIL released).")
        .def(
            "offer",
            [](PyMesh& m, const py::object& peers) {
                const std::vector<std::uint32_t> r = ranks(peers);
                py::gil_scoped_release release;
                m.mesh->offer(r);
            },
            py::arg("peers"), "Publishes our side to these peers without waiting for theirs (complete_offers).")
        .def(
            "complete_offers",
            [](PyMesh& m) {
                Mesh::OfferProgress progress;
                {
                    py::gil_scoped_release release;
                    progress = m.mesh->complete_offers();
                }
                py::list refused;
                for (const Mesh::Refusal& r : progress.refused) {
                    refused.append(py::make_tuple(r.peer, r.code.message(), r.diagnostics.message()));
                }
                py::dict d;
                d["connected"] = progress.connected;
                d["refused"] = refused;
                return d;
            },
            "Connects the offered peers whose side has appeared: {'connected': [ranks], 'refused': "
            "[(rank, error, words)]}.")
        .def(
            "peer",
            [](const std::shared_ptr<PyMesh>& m, std::uint32_t rank) {
                MeshPeer* p = nullptr;
                {
                    py::gil_scoped_release release;
                    p = &m->mesh->peer(rank);
                }
                return peer_of(m, *p);
            },
            py::arg("rank"), "The peer, connecting it first if needed (GIL released while it waits).")
        .def(
            "find",
            [](const std::shared_ptr<PyMesh>& m, std::uint32_t rank) -> std::optional<PyMeshPeer> {
                MeshPeer* p = m->mesh->find(rank);
                if (p == nullptr) return std::nullopt;
                return peer_of(m, *p);
            },
            py::arg("rank"), "The peer if connected, else None (never connects).")
        .def(
            "disconnect",
            [](PyMesh& m, std::uint32_t rank) {
                m.mesh->disconnect(rank);
                m.cq->context->wake(); // its operations end aborted, posted: the loop must look
            },
            py::arg("rank"),
            "Forgets a peer: its queue pair is destroyed (its QueuePair reads as closed); it may connect again.");
}

} // namespace gpuverbs::python
