// Mesh: one RC queue pair per peer, agreed through a rendezvous (mesh.hpp).
#include "gpuverbs/many_peers/mesh.hpp"

#include "gpuverbs/detail/deadline.hpp"
#include "gpuverbs/error.hpp"

#include <algorithm>

namespace gpuverbs {

namespace detail {

std::string mesh_peer_problem(const MeshRecord& record, std::uint32_t expected, std::uint32_t me,
                              std::uint32_t world_size) {
    if (record.rank != expected) {
        return "the record is rank " + std::to_string(record.rank) + "'s, not rank " + std::to_string(expected) +
               "'s: two members claim one rank, or the store holds a stale entry";
    }
    if (record.world_size != world_size) {
        return "it was made for a world of " + std::to_string(record.world_size) + " members, ours has " +
               std::to_string(world_size) + ": the two processes are not members of the same job or service";
    }
    if (record.endpoint_for(me) == nullptr) {
        return "it holds no endpoint for rank " + std::to_string(me) + " (" + std::to_string(record.endpoints.size()) +
               " endpoints, for other peers): that peer did not prepare a queue pair for us";
    }
    return {};
}

} // namespace detail

Mesh Mesh::create_impl(std::unique_ptr<detail::AnyRendezvous> rendezvous, const ProtectionDomain& pd,
                       const CompletionQueue& cq, std::vector<RemoteMemory> regions, MeshOptions options,
                       detail::Status& status, std::optional<Access> advertised) {
    if (!options.connect.remote_access) {
        if (!advertised && !regions.empty()) {
            status.fail(errc::invalid_argument, "Mesh",
                        "regions given as RemoteMemory do not say what peers may do with them: pass the "
                        "MemoryRegions themselves (each queue pair then grants what they allow) or set "
                        "MeshOptions::connect.remote_access");
            return Mesh();
        }
        options.connect.remote_access = advertised.value_or(Access::none); // least access
    }
    if (regions.size() > wire::max_regions) {
        status.fail(errc::invalid_argument, "Mesh",
                    std::to_string(regions.size()) + " regions offered; a mesh record carries at most " +
                        std::to_string(wire::max_regions));
        return Mesh();
    }
    if (rendezvous->world_size() > wire::max_world_size || rendezvous->rank() >= rendezvous->world_size()) {
        status.fail(errc::invalid_argument, "Mesh",
                    rendezvous->name() + " gives rank " + std::to_string(rendezvous->rank()) + " of " +
                        std::to_string(rendezvous->world_size()) +
                        "; a mesh needs rank < world size <= " + std::to_string(wire::max_world_size));
        return Mesh();
    }
    Mesh mesh;
    mesh.rendezvous_ = std::move(rendezvous);
    mesh.pd_ = &pd;
    mesh.cq_ = &cq;
    mesh.regions_ = std::move(regions);
    mesh.options_ = std::move(options);
    return mesh;
}

Mesh Mesh::create_impl(std::unique_ptr<detail::AnyRendezvous> rendezvous, const ProtectionDomain& pd,
                       const CompletionQueue& cq,
                       const std::vector<std::reference_wrapper<const MemoryRegion>>& regions, MeshOptions options,
                       detail::Status& status) {
    std::vector<RemoteMemory> remote;
    remote.reserve(regions.size());
    for (const MemoryRegion& mr : regions) {
        if (!mr) {
            status.fail(errc::invalid_argument, "Mesh", "region " + std::to_string(remote.size()) + " is empty");
            return Mesh();
        }
        if (pd && mr.native_handle()->pd != pd.native_handle()) {
            status.fail(errc::invalid_argument, "Mesh",
                        "region " + std::to_string(remote.size()) +
                            " belongs to another protection domain than the mesh's: peers could not use its key");
            return Mesh();
        }
        remote.push_back(mr.remote());
    }
    Access access = Access::none;
    for (const MemoryRegion& mr : regions) access = access | (mr.access() & detail::peer_facing_access);
    return create_impl(std::move(rendezvous), pd, cq, std::move(remote), std::move(options), status, access);
}

void Mesh::check_usable(const char* verb) const {
    if (!rendezvous_) {
        throw Error(errc::invalid_argument, verb, "the Mesh is empty (create() refused it, or it was moved from)");
    }
}

Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;
Mesh::~Mesh() = default;

std::uint32_t Mesh::rank() const noexcept {
    return rendezvous_ ? rendezvous_->rank() : 0;
}
std::uint32_t Mesh::world_size() const noexcept {
    return rendezvous_ ? rendezvous_->world_size() : 0;
}

void Mesh::fail(std::error_code code, std::uint32_t peer, const std::string& what) const {
    throw Error(code, "Mesh",
                "rank " + std::to_string(rank()) + " connecting to peer " + std::to_string(peer) + " through " +
                    rendezvous_->name() + ": " + what);
}

namespace {
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
}
} // namespace

void Mesh::connect_all() {
    check_usable("Mesh::connect_all");
    auto deadline = detail::deadline_after(options_.timeout);
    std::uint32_t me = rank();
    std::uint32_t n = world_size();
    if (n == wire::max_world_size) {
        throw Error(errc::unsupported, "Mesh::connect_all",
                    rendezvous_->name() +
                        " is an open world (members join and leave): connect_all() needs a fixed "
                        "world size; connect() or offer() the peers that are present instead");
    }
    if (!peers_.empty() || !offers_.empty()) {
        throw Error(errc::invalid_argument, "Mesh::connect_all",
                    "rank " + std::to_string(me) + " already has " + std::to_string(peers_.size() + offers_.size()) +
                        " peers connected or offered: connect_all() builds a fresh mesh; connect() the others");
    }
    std::map<std::uint32_t, PreparedQueuePair> prepared;
    MeshRecord ours{me, n, {}, regions_};
    ours.endpoints.reserve(n - 1);
    for (std::uint32_t q = 0; q < n; ++q) {
        if (q == me) continue;
        auto& qp = prepared[q] = PreparedQueuePair(*pd_, *cq_, *cq_, options_.queue_pair);
        ours.endpoints.emplace_back(q, qp.endpoint());
    }
    rendezvous_->publish(options_.name, wire::serialize(ours));
    rendezvous_->fence(left_until(deadline));
    std::vector<std::uint32_t> connected;
    for (auto& [q, qp] : prepared) {
        connect_peer(q, qp, options_.name, left_until(deadline));
        connected.push_back(q);
    }
    // Our QPs are ready to receive; wait until every peer's are too.
    rendezvous_->publish(options_.name + ".ready", ready_word());
    rendezvous_->fence(left_until(deadline));
    for (std::uint32_t q : connected) await_ready(q, options_.name + ".ready", deadline);
}

std::vector<std::byte> Mesh::ready_word() const {
    return {std::byte{'r'}, std::byte{'e'}, std::byte{'d'}, std::byte{'y'}};
}

void Mesh::await_ready(std::uint32_t peer, const std::string& key, std::chrono::steady_clock::time_point deadline) {
    try {
        (void)rendezvous_->lookup(peer, key, left_until(deadline));
    } catch (const Error& e) {
        fail(e.code(), peer, std::string("our side is connected, the peer's did not say it was: ") + e.what());
    }
}

void Mesh::offer(std::span<const std::uint32_t> peers) {
    check_usable("Mesh::connect");
    std::uint32_t me = rank();
    for (std::uint32_t q : peers) {
        if (q == me || q >= world_size()) {
            throw Error(errc::invalid_argument, "Mesh::connect",
                        "rank " + std::to_string(me) + " cannot connect to rank " + std::to_string(q) +
                            (q == me ? " (itself)" : " (the world has " + std::to_string(world_size()) + " ranks)"));
        }
    }
    // Publish every record before anything waits: a peer connecting to us at
    // the same time finds ours whatever the order.
    for (std::uint32_t q : peers) {
        if (peers_.contains(q) || offers_.contains(q)) continue;
        PreparedQueuePair qp(*pd_, *cq_, *cq_, options_.queue_pair);
        MeshRecord record{me, world_size(), {{q, qp.endpoint()}}, regions_};
        try {
            rendezvous_->publish(pair_key(q), wire::serialize(record));
        } catch (const Error& e) {
            fail(e.code(), q, std::string(e.what()));
        }
        offers_.emplace(q, std::move(qp));
    }
}

void Mesh::connect(std::span<const std::uint32_t> peers) {
    auto deadline = detail::deadline_after(options_.timeout);
    offer(peers);
    std::vector<std::uint32_t> connected;
    for (std::uint32_t q : peers) {
        auto it = offers_.find(q);
        if (it == offers_.end()) continue; // connected already (or listed twice)
        connect_peer(q, it->second, pair_key(rank()), left_until(deadline));
        offers_.erase(q);
        connected.push_back(q);
        rendezvous_->publish(options_.name + ".ready." + std::to_string(q), ready_word());
    }
    for (std::uint32_t q : connected) await_ready(q, options_.name + ".ready." + std::to_string(rank()), deadline);
}

Mesh::OfferProgress Mesh::complete_offers() {
    OfferProgress progress;
    for (auto it = offers_.begin(); it != offers_.end();) {
        std::uint32_t q = it->first;
        try {
            connect_peer(q, it->second, pair_key(rank()), std::chrono::milliseconds(0));
        } catch (const Error& e) {
            bool unusable = e.code() == errc::malformed_record || e.code() == errc::unsupported_version;
            if (!unusable) { // not there yet, or the store failed for a moment: look again next time
                ++it;
                continue;
            }
            // The refusal as values: the code and the same words (no exception kept).
            detail::Status status;
            status.fail(e.code(), e.verb(), e.detail());
            Refusal& r = progress.refused.emplace_back();
            r.peer = q;
            r.code = e.code();
            status.report(r.diagnostics);
            it = offers_.erase(it);
            continue;
        }
        it = offers_.erase(it);
        progress.connected.push_back(q);
        try { // for a peer that connects to us with the blocking connect()
            rendezvous_->publish(options_.name + ".ready." + std::to_string(q), ready_word());
        } catch (const Error&) {
            // The store failed for a moment: such a peer's connect() names us when its deadline passes.
        }
    }
    return progress;
}

std::vector<std::uint32_t> Mesh::offered() const {
    std::vector<std::uint32_t> ranks;
    for (const auto& [q, qp] : offers_) ranks.push_back(q);
    return ranks;
}

void Mesh::connect_peer(std::uint32_t peer, PreparedQueuePair& prepared, const std::string& key,
                        std::chrono::milliseconds timeout) {
    std::uint32_t me = rank();
    std::vector<std::byte> bytes;
    try {
        bytes = rendezvous_->lookup(peer, key, timeout);
    } catch (const Error& e) {
        fail(e.code(), peer, std::string(e.what()));
    }
    detail::Status status;
    MeshRecord record = wire::detail::parse_mesh_record(bytes, status);
    if (!status.ok()) fail(status.code, peer, "its record '" + key + "' is unusable: " + status.detail);
    if (std::string problem = detail::mesh_peer_problem(record, peer, me, world_size()); !problem.empty()) {
        fail(errc::malformed_record, peer, "its record '" + key + "' cannot connect us: " + problem);
    }
    std::error_code ec;
    Diagnostics diagnostics;
    QueuePair qp = std::move(prepared).connect(*record.endpoint_for(me), options_.connect, ec, diagnostics);
    if (ec) fail(ec, peer, diagnostics.message());
    rank_of_qp_[qp.qp_num()] = peer;
    peers_[peer] = MeshPeer{peer, std::move(qp), std::move(record.regions)};
}

MeshPeer& Mesh::peer(std::uint32_t rank) {
    if (auto it = peers_.find(rank); it != peers_.end()) return it->second;
    connect(rank);
    return peers_.at(rank);
}

// The error_code and Diagnostics forms: the throwing form's one
// implementation, with what it throws kept (detail::capture).
namespace {
template <class F>
bool caught(detail::Status& status, F&& f) {
    detail::capture(status, [&] { f(); });
    return status.ok();
}
} // namespace

void Mesh::connect_all(std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { return caught(s, [&] { connect_all(); }); });
}
void Mesh::connect_all(std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { return caught(s, [&] { connect_all(); }); });
}
void Mesh::connect(std::span<const std::uint32_t> peers, std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { return caught(s, [&] { connect(peers); }); });
}
void Mesh::connect(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { return caught(s, [&] { connect(peers); }); });
}
void Mesh::offer(std::span<const std::uint32_t> peers, std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { return caught(s, [&] { offer(peers); }); });
}
void Mesh::offer(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { return caught(s, [&] { offer(peers); }); });
}
MeshPeer* Mesh::peer(std::uint32_t rank, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return detail::capture(s, [&] { return &peer(rank); }); });
}
MeshPeer* Mesh::peer(std::uint32_t rank, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return detail::capture(s, [&] { return &peer(rank); }); });
}

MeshPeer* Mesh::find(std::uint32_t rank) noexcept {
    auto it = peers_.find(rank);
    return it == peers_.end() ? nullptr : &it->second;
}

MeshPeer* Mesh::find_by_qp(std::uint32_t qp_num) noexcept {
    auto it = rank_of_qp_.find(qp_num);
    return it == rank_of_qp_.end() ? nullptr : find(it->second);
}

void Mesh::disconnect(std::uint32_t rank) {
    offers_.erase(rank);
    auto it = peers_.find(rank);
    if (it == peers_.end()) return;
    rank_of_qp_.erase(it->second.qp.qp_num());
    peers_.erase(it);
}

std::vector<std::uint32_t> Mesh::peers() const {
    std::vector<std::uint32_t> ranks;
    ranks.reserve(peers_.size());
    for (const auto& [rank, peer] : peers_) ranks.push_back(rank);
    return ranks;
}

} // namespace gpuverbs
