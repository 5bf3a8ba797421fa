// Queue pairs between many processes: every member of a rendezvous connects
// one RC QueuePair to each peer it needs, and learns the memory each peer
// offers.
//
//   gpuverbs::PmixRendezvous job;                        // started by mpirun / srun
//   gpuverbs::MemoryRegion mr(pd, buffer, Access::local_write | Access::remote_write);
//   gpuverbs::Mesh mesh(job, pd, cq, {mr});  // peers may do to mr what it allows
//   mesh.connect_all();                                  // collective: a full mesh
//   mesh.peer(3).qp.post_write(mr.slice(...), mesh.peer(3).regions[0].slice(...));
//
// Each pair agrees on one QP pair by construction: p's QP for q connects to
// q's QP for p, whatever the order in which members arrive; nobody waits for
// an answer before publishing, so no order deadlocks.
//
//   connect_all()   full mesh, collective: prepare a QP per peer, publish ONE
//                   MeshRecord (all endpoints and our regions) under "<name>",
//                   fence, read each peer's record once: O(N) per member.
//   connect(peers)  lazy: for each peer asked for, prepare a QP, publish a
//                   record addressed to it under "<name>.to.<peer>", read the
//                   peer's "<name>.to.<me>". The peer must connect() to us too
//                   (as in MPI's point-to-point both sides act); peer(r)
//                   connects on first use. Needs a rendezvous that can look up
//                   between fences (PMIx, Redis; not MPI).
//
// What it costs per connected peer: one RC QP (its send and receive queues in
// the driver's memory), queue_pair.max_send_wr + max_recv_wr possible entries
// in the shared CompletionQueue, one 48-byte entry in our record. A full mesh
// of N members holds N-1 QPs per process: docs/many-peers.md has the numbers
// and when to prefer the lazy mode.
#pragma once

#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/many_peers/rendezvous.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpuverbs {

struct MeshOptions {
    /// Capacities of each peer's queue pair.
    QueuePairOptions queue_pair;
    /// How each queue pair connects (timeouts, retries, remote access).
    ConnectOptions connect;
    /// The deadline of one connect_all() or connect() call, lookups included.
    std::chrono::milliseconds timeout{30000};
    /// Prefix of the keys this mesh publishes: two meshes on one rendezvous need different names.
    std::string name = "gpuverbs.mesh";
};

/// A connected peer: its queue pair and the memory it offers us.
struct MeshPeer {
    std::uint32_t rank = 0;
    QueuePair qp;
    std::vector<RemoteMemory> regions;
};

class Mesh {
public:
    /// A mesh member with `rendezvous` (which must outlive the mesh), the
    /// protection domain and completion queue its queue pairs use (which must
    /// outlive it too), and the regions every peer may access: each peer's
    /// queue pair grants the remote access those regions allow (their union),
    /// unless options.connect.remote_access says otherwise.
    ///
    /// Throws gpuverbs::Error (errc::invalid_argument): an empty region, one
    /// of another protection domain, more regions than a record carries, or a
    /// rendezvous whose rank is not below its world size.
    template <Rendezvous R>
    Mesh(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq,
         const std::vector<std::reference_wrapper<const MemoryRegion>>& regions, MeshOptions options = {})
        : Mesh(detail::or_throw([&](detail::Status& s) {
              return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, regions, std::move(options), s);
          })) {}
    /// … with the regions as their peers see them. A RemoteMemory does not
    /// say what its region allows, so with regions given,
    /// options.connect.remote_access must say what the queue pairs grant
    /// (errc::invalid_argument otherwise); with none, they grant nothing.
    template <Rendezvous R>
    Mesh(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq, std::vector<RemoteMemory> regions,
         MeshOptions options = {})
        : Mesh(detail::or_throw([&](detail::Status& s) {
              return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, std::move(regions), std::move(options),
                                 s);
          })) {}
    /// The constructors without throwing: on failure `ec` is set and the mesh
    /// returned is empty (explicit operator bool is false; connecting throws).
    template <Rendezvous R>
    static Mesh create(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq,
                       const std::vector<std::reference_wrapper<const MemoryRegion>>& regions, MeshOptions options,
                       std::error_code& ec) {
        return detail::or_code(ec, [&](detail::Status& s) {
            return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, regions, std::move(options), s);
        });
    }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    template <Rendezvous R>
    static Mesh create(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq,
                       const std::vector<std::reference_wrapper<const MemoryRegion>>& regions, MeshOptions options,
                       std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
            return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, regions, std::move(options), s);
        });
    }
    template <Rendezvous R>
    static Mesh create(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq,
                       std::vector<RemoteMemory> regions, MeshOptions options, std::error_code& ec) {
        return detail::or_code(ec, [&](detail::Status& s) {
            return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, std::move(regions), std::move(options), s);
        });
    }
    template <Rendezvous R>
    static Mesh create(R& rendezvous, const ProtectionDomain& pd, const CompletionQueue& cq,
                       std::vector<RemoteMemory> regions, MeshOptions options, std::error_code& ec,
                       Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
            return create_impl(detail::erase_rendezvous(rendezvous), pd, cq, std::move(regions), std::move(options), s);
        });
    }
    Mesh(Mesh&&) noexcept;
    Mesh& operator=(Mesh&&) noexcept;
    Mesh(const Mesh&) = delete;
    Mesh& operator=(const Mesh&) = delete;
    ~Mesh();

    /// False for a mesh create() refused (or one moved from).
    explicit operator bool() const noexcept { return rendezvous_ != nullptr; }
    /// 0 for an empty mesh.
    [[nodiscard]] std::uint32_t rank() const noexcept;
    [[nodiscard]] std::uint32_t world_size() const noexcept;

    /// A full mesh: every member calls it; afterwards peer(q) is connected for
    /// every q != rank(), and so is q's side (each member publishes that it
    /// is ready and waits for the others' word), so traffic can start at once. Needs a fixed world (not an open Redis
    /// service) and no peer connected yet. On failure (gpuverbs::Error naming the peer and what was wrong) the peers
    /// connected so far stay connected.
    void connect_all();
    /// The same without throwing: `ec` (and `diagnostics`' words) say what the
    /// throwing form would have thrown; the mesh stays as that form leaves it.
    void connect_all(std::error_code& ec);
    void connect_all(std::error_code& ec, Diagnostics& diagnostics);
    /// Lazy: connects to each of `peers` not connected yet (the peers must
    /// connect to us too, in any order); returns once both sides of every
    /// pair are connected. On failure the peers connected so
    /// far stay connected and the others can be asked again.
    void connect(std::span<const std::uint32_t> peers);
    void connect(std::span<const std::uint32_t> peers, std::error_code& ec);
    void connect(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics);
    void connect(std::uint32_t peer) { connect(std::span<const std::uint32_t>(&peer, 1)); }
    void connect(std::uint32_t peer, std::error_code& ec) { connect(std::span<const std::uint32_t>(&peer, 1), ec); }
    void connect(std::uint32_t peer, std::error_code& ec, Diagnostics& diagnostics) {
        connect(std::span<const std::uint32_t>(&peer, 1), ec, diagnostics);
    }

    /// Lazy, without waiting (services whose members come and go): prepares
    /// a queue pair for each of `peers` not connected or offered yet and
    /// publishes its record. complete_offers() connects them as the peers'
    /// records appear; no member ever blocks on another, so no order of
    /// arrivals deadlocks.
    void offer(std::span<const std::uint32_t> peers);
    void offer(std::span<const std::uint32_t> peers, std::error_code& ec);
    void offer(std::span<const std::uint32_t> peers, std::error_code& ec, Diagnostics& diagnostics);
    void offer(std::uint32_t peer) { offer(std::span<const std::uint32_t>(&peer, 1)); }
    void offer(std::uint32_t peer, std::error_code& ec) { offer(std::span<const std::uint32_t>(&peer, 1), ec); }
    void offer(std::uint32_t peer, std::error_code& ec, Diagnostics& diagnostics) {
        offer(std::span<const std::uint32_t>(&peer, 1), ec, diagnostics);
    }
    /// A peer whose record could not connect us, and why.
    struct Refusal {
        std::uint32_t peer = 0;
        std::error_code code;    ///< errc::malformed_record or errc::unsupported_version
        Diagnostics diagnostics; ///< the words: which peer, what was wrong
    };
    /// What one complete_offers() did.
    struct OfferProgress {
        /// Connected by this call, ascending.
        std::vector<std::uint32_t> connected;
        /// Peers whose record could not connect us (malformed, another
        /// version, another rank or world, no endpoint for us): their offer
        /// is dropped; the error names the peer and what was wrong.
        std::vector<Refusal> refused;
    };
    /// Connects the offered peers whose records have appeared (one look each,
    /// through lookup with a zero timeout; PMIx rounds that up to its one-second
    /// unit, so with PMIx each missing peer may cost a second). A peer not
    /// there yet, or a store that failed for a moment, stays offered. The
    /// peer's side may still be connecting when this returns: exchange a
    /// first message (or a write with immediate the peer waits for) before
    /// relying on it.
    OfferProgress complete_offers();
    /// The peers offered and not connected yet, ascending.
    [[nodiscard]] std::vector<std::uint32_t> offered() const;

    /// The peer, connecting it first if needed (lazy; blocks up to options.timeout).
    MeshPeer& peer(std::uint32_t rank);
    /// The same without throwing: nullptr, with `ec` (and the words) set, when it cannot connect.
    [[nodiscard]] MeshPeer* peer(std::uint32_t rank, std::error_code& ec);
    [[nodiscard]] MeshPeer* peer(std::uint32_t rank, std::error_code& ec, Diagnostics& diagnostics);
    /// The peer if connected, else nullptr (never connects).
    [[nodiscard]] MeshPeer* find(std::uint32_t rank) noexcept;
    /// The peer whose queue pair has this number (to route a Completion), else nullptr.
    [[nodiscard]] MeshPeer* find_by_qp(std::uint32_t qp_num) noexcept;
    /// Forgets a peer (e.g. one that left): its queue pair (or its offer) is
    /// destroyed; a later connect() or offer() may connect it again.
    void disconnect(std::uint32_t rank);
    /// The connected peers' ranks, ascending.
    [[nodiscard]] std::vector<std::uint32_t> peers() const;

private:
    Mesh() = default;
    static Mesh create_impl(std::unique_ptr<detail::AnyRendezvous> rendezvous, const ProtectionDomain& pd,
                            const CompletionQueue& cq,
                            const std::vector<std::reference_wrapper<const MemoryRegion>>& regions, MeshOptions options,
                            detail::Status& status);
    static Mesh create_impl(std::unique_ptr<detail::AnyRendezvous> rendezvous, const ProtectionDomain& pd,
                            const CompletionQueue& cq, std::vector<RemoteMemory> regions, MeshOptions options,
                            detail::Status& status, std::optional<Access> advertised = std::nullopt);
    /// False, with errc::invalid_argument naming `verb`, for an empty mesh.
    bool usable(const char* verb, detail::Status& status) const;
    // Each public call's one implementation; its three forms run it.
    void connect_all_impl(detail::Status& status);
    void connect_impl(std::span<const std::uint32_t> peers, detail::Status& status);
    void offer_impl(std::span<const std::uint32_t> peers, detail::Status& status);
    MeshPeer* peer_impl(std::uint32_t rank, detail::Status& status);

    /// Reads `peer`'s record under `key` and connects `prepared` to it; false
    /// (the reason in `status`, naming the peer) when it could not.
    bool connect_peer(std::uint32_t peer, PreparedQueuePair& prepared, const std::string& key,
                      std::chrono::milliseconds timeout, detail::Status& status);
    [[nodiscard]] std::string pair_key(std::uint32_t to) const { return options_.name + ".to." + std::to_string(to); }
    [[nodiscard]] std::vector<std::byte> ready_word() const;
    bool await_ready(std::uint32_t peer, const std::string& key, std::chrono::steady_clock::time_point deadline,
                     detail::Status& status);
    /// Fails `status` with `code`, naming this rank, the peer and the rendezvous.
    void fail(detail::Status& status, std::error_code code, std::uint32_t peer, const std::string& what) const;

    std::unique_ptr<detail::AnyRendezvous> rendezvous_;
    const ProtectionDomain* pd_ = nullptr;
    const CompletionQueue* cq_ = nullptr;
    std::vector<RemoteMemory> regions_;
    MeshOptions options_;
    std::map<std::uint32_t, MeshPeer> peers_;
    std::map<std::uint32_t, PreparedQueuePair> offers_;
    std::unordered_map<std::uint32_t, std::uint32_t> rank_of_qp_;
};

namespace detail {
/// Why a peer's record cannot connect us, or empty: it must come from
/// `expected` (the rank we looked up), belong to the same world, and hold an
/// endpoint addressed to `me`. Pure: unit-tested without a device.
std::string mesh_peer_problem(const MeshRecord& record, std::uint32_t expected, std::uint32_t me,
                              std::uint32_t world_size);
} // namespace detail

} // namespace gpuverbs
