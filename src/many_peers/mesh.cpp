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

bool Mesh::usable(const char* verb, detail::Status& status) const {
    if (!rendezvous_) {
        status.fail(errc::invalid_argument, verb, "the Mesh is empty (create() refused it, or it was moved from)");
        return false;
    }
    return true;
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

void Mesh::fail(detail::Status& status, std::error_code code, std::uint32_t peer, const std::string& what) const {
    status.fail(code, "Mesh",
                "rank " + std::to_string(rank()) + " connecting to peer " + std::to_string(peer) + " through " +
                    rendezvous_->name() + ": " + what);
}

namespace {
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
}
/// "VERB: DETAIL" of a failed step, for the words of the Mesh error that wraps it.
std::string words_of(const detail::Status& status) {
    return status.verb + ": " + status.detail;
}
} // namespace

// Every form of each call runs its one implementation: the throwing form
// raises the Status it leaves, the error_code forms keep its code and words.
void Mesh::connect_all() {
    detail::or_throw([&](detail::Status& s) { connect_all_impl(s); });
}
void Mesh::connect_all(std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { connect_all_impl(s); });
}
void Mesh::connect_all(std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { connect_all_impl(s); });
}
void Mesh::connect(std::span<const std::uint32_t> peers) {
    detail::or_throw([&](detail::Status& s) { connect_impl(peers, s); });
}
void Mesh::connect(std::span<const std::uint32_t> peers, std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { connect_impl(peers, s); });
}
void Mesh::connect(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { connect_impl(peers, s); });
}
void Mesh::offer(std::span<const std::uint32_t> peers) {
    detail::or_throw([&](detail::Status& s) { offer_impl(peers, s); });
}
void Mesh::offer(std::span<const std::uint32_t> peers, std::error_code& ec) {
    detail::or_code(ec, [&](detail::Status& s) { offer_impl(peers, s); });
}
void Mesh::offer(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](detail::Status& s) { offer_impl(peers, s); });
}
MeshPeer& Mesh::peer(std::uint32_t rank) {
    return *detail::or_throw([&](detail::Status& s) { return peer_impl(rank, s); });
}
MeshPeer* Mesh::peer(std::uint32_t rank, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return peer_impl(rank, s); });
}
MeshPeer* Mesh::peer(std::uint32_t rank, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return peer_impl(rank, s); });
}

void Mesh::connect_all_impl(detail::Status& status) {
    if (!usable("Mesh::connect_all", status)) return;
    auto deadline = detail::deadline_after(options_.timeout);
    std::uint32_t me = rank();
    std::uint32_t n = world_size();
    if (n == wire::max_world_size) {
        status.fail(errc::unsupported, "Mesh::connect_all",
                    rendezvous_->name() +
                        " is an open world (members join and leave): connect_all() needs a fixed "
                        "world size; connect() or offer() the peers that are present instead");
        return;
    }
    if (!peers_.empty() || !offers_.empty()) {
        status.fail(errc::invalid_argument, "Mesh::connect_all",
                    "rank " + std::to_string(me) + " already has " + std::to_string(peers_.size() + offers_.size()) +
                        " peers connected or offered: connect_all() builds a fresh mesh; connect() the others");
        return;
    }
    std::map<std::uint32_t, PreparedQueuePair> prepared;
    MeshRecord ours{me, n, {}, regions_};
    ours.endpoints.reserve(n - 1);
    for (std::uint32_t q = 0; q < n; ++q) {
        if (q == me) continue;
        std::error_code ec;
        Diagnostics words;
        auto& qp = prepared[q] = PreparedQueuePair::create(*pd_, *cq_, *cq_, options_.queue_pair, ec, words);
        if (ec) return fail(status, ec, q, words.message());
        ours.endpoints.emplace_back(q, qp.endpoint());
    }
    rendezvous_->publish(options_.name, wire::serialize(ours), status);
    if (status.ok()) rendezvous_->fence(left_until(deadline), status);
    if (!status.ok()) return;
    std::vector<std::uint32_t> connected;
    for (auto& [q, qp] : prepared) {
        if (!connect_peer(q, qp, options_.name, left_until(deadline), status)) return;
        connected.push_back(q);
    }
    // Our QPs are ready to receive; wait until every peer's are too.
    rendezvous_->publish(options_.name + ".ready", ready_word(), status);
    if (status.ok()) rendezvous_->fence(left_until(deadline), status);
    if (!status.ok()) return;
    for (std::uint32_t q : connected) {
        if (!await_ready(q, options_.name + ".ready", deadline, status)) return;
    }
}

std::vector<std::byte> Mesh::ready_word() const {
    return {std::byte{'r'}, std::byte{'e'}, std::byte{'d'}, std::byte{'y'}};
}

bool Mesh::await_ready(std::uint32_t peer, const std::string& key, std::chrono::steady_clock::time_point deadline,
                       detail::Status& status) {
    detail::Status looked;
    (void)rendezvous_->lookup(peer, key, left_until(deadline), looked);
    if (looked.ok()) return true;
    fail(status, looked.code, peer, "our side is connected, the peer's did not say it was: " + words_of(looked));
    return false;
}

void Mesh::offer_impl(std::span<const std::uint32_t> peers, detail::Status& status) {
    if (!usable("Mesh::connect", status)) return;
    std::uint32_t me = rank();
    for (std::uint32_t q : peers) {
        if (q == me || q >= world_size()) {
            status.fail(errc::invalid_argument, "Mesh::connect",
                        "rank " + std::to_string(me) + " cannot connect to rank " + std::to_string(q) +
                            (q == me ? " (itself)" : " (the world has " + std::to_string(world_size()) + " ranks)"));
            return;
        }
    }
    // Publish every record before anything waits: a peer connecting to us at
    // the same time finds ours whatever the order.
    for (std::uint32_t q : peers) {
        if (peers_.contains(q) || offers_.contains(q)) continue;
        std::error_code ec;
        Diagnostics words;
        PreparedQueuePair qp = PreparedQueuePair::create(*pd_, *cq_, *cq_, options_.queue_pair, ec, words);
        if (ec) return fail(status, ec, q, words.message());
        MeshRecord record{me, world_size(), {{q, qp.endpoint()}}, regions_};
        detail::Status published;
        rendezvous_->publish(pair_key(q), wire::serialize(record), published);
        if (!published.ok()) return fail(status, published.code, q, words_of(published));
        offers_.emplace(q, std::move(qp));
    }
}

void Mesh::connect_impl(std::span<const std::uint32_t> peers, detail::Status& status) {
    auto deadline = detail::deadline_after(options_.timeout);
    offer_impl(peers, status);
    if (!status.ok()) return;
    std::vector<std::uint32_t> connected;
    for (std::uint32_t q : peers) {
        auto it = offers_.find(q);
        if (it == offers_.end()) continue; // connected already (or listed twice)
        if (!connect_peer(q, it->second, pair_key(rank()), left_until(deadline), status)) return;
        offers_.erase(q);
        connected.push_back(q);
        rendezvous_->publish(options_.name + ".ready." + std::to_string(q), ready_word(), status);
        if (!status.ok()) return;
    }
    for (std::uint32_t q : connected) {
        if (!await_ready(q, options_.name + ".ready." + std::to_string(rank()), deadline, status)) return;
    }
}

Mesh::OfferProgress Mesh::complete_offers() {
    OfferProgress progress;
    for (auto it = offers_.begin(); it != offers_.end();) {
        std::uint32_t q = it->first;
        detail::Status status;
        if (!connect_peer(q, it->second, pair_key(rank()), std::chrono::milliseconds(0), status)) {
            bool unusable = status.code == errc::malformed_record || status.code == errc::unsupported_version;
            if (!unusable) { // not there yet, or the store failed for a moment: look again next time
                ++it;
                continue;
            }
            // The refusal as values: the code and the same words.
            Refusal& r = progress.refused.emplace_back();
            r.peer = q;
            r.code = status.code;
            status.report(r.diagnostics);
            it = offers_.erase(it);
            continue;
        }
        it = offers_.erase(it);
        progress.connected.push_back(q);
        // For a peer that connects to us with the blocking connect(). If the
        // store failed for a moment, such a peer's connect() names us when its
        // deadline passes.
        detail::Status ignored;
        rendezvous_->publish(options_.name + ".ready." + std::to_string(q), ready_word(), ignored);
    }
    return progress;
}

std::vector<std::uint32_t> Mesh::offered() const {
    std::vector<std::uint32_t> ranks;
    for (const auto& [q, qp] : offers_) ranks.push_back(q);
    return ranks;
}

bool Mesh::connect_peer(std::uint32_t peer, PreparedQueuePair& prepared, const std::string& key,
                        std::chrono::milliseconds timeout, detail::Status& status) {
    std::uint32_t me = rank();
    detail::Status looked;
    std::vector<std::byte> bytes = rendezvous_->lookup(peer, key, timeout, looked);
    if (!looked.ok()) {
        fail(status, looked.code, peer, words_of(looked));
        return false;
    }
    detail::Status parsed;
    MeshRecord record = wire::detail::parse_mesh_record(bytes, parsed);
    if (!parsed.ok()) {
        fail(status, parsed.code, peer, "its record '" + key + "' is unusable: " + parsed.detail);
        return false;
    }
    if (std::string problem = detail::mesh_peer_problem(record, peer, me, world_size()); !problem.empty()) {
        fail(status, errc::malformed_record, peer, "its record '" + key + "' cannot connect us: " + problem);
        return false;
    }
    std::error_code ec;
    Diagnostics diagnostics;
    QueuePair qp = std::move(prepared).connect(*record.endpoint_for(me), options_.connect, ec, diagnostics);
    if (ec) {
        fail(status, ec, peer, diagnostics.message());
        return false;
    }
    rank_of_qp_[qp.qp_num()] = peer;
    peers_[peer] = MeshPeer{peer, std::move(qp), std::move(record.regions)};
    return true;
}

MeshPeer* Mesh::peer_impl(std::uint32_t rank, detail::Status& status) {
    if (auto it = peers_.find(rank); it != peers_.end()) return &it->second;
    connect_impl(std::span<const std::uint32_t>(&rank, 1), status);
    if (!status.ok()) return nullptr;
    return &peers_.at(rank);
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
