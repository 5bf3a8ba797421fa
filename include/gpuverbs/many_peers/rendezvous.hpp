// How many processes find each other: a rendezvous is the service a job or a
// service already runs (PMIx under mpirun or srun, MPI, a Redis store) seen
// through four small operations. The values are gpuverbs' versioned records
// (wire.hpp); a rendezvous only moves bytes under (rank, key).
//
//   publish(key, bytes)          make bytes readable by every member as (my rank, key)
//   fence(timeout)               collective: every member's earlier publications visible
//   lookup(peer, key, timeout)   the peer's bytes under key, waiting until they appear
//   withdraw()                   remove what I published (a clean leave)
//
// Backends: PmixRendezvous (rendezvous/pmix.hpp), MpiRendezvous
// (rendezvous/mpi.hpp, header-only), RedisRendezvous (rendezvous/redis.hpp);
// SignedRendezvous (rendezvous/signed.hpp) signs and checks any of them.
// Mesh (mesh.hpp) builds the queue pairs between members on top of any of them.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gpuverbs {

/// A member of a group of processes that can publish and look up bytes by
/// (rank, key). Every operation throws gpuverbs::Error naming the rendezvous
/// and the peer: errc::rendezvous_unavailable (the launcher or store failed
/// or refused us), errc::peer_missing (not published before the deadline),
/// errc::unsupported (the backend cannot do it, e.g. lookup between fences
/// with MPI), std::errc::invalid_argument (a key or rank outside the world).
template <class R>
concept Rendezvous = requires(R& r, const R& cr, std::uint32_t peer, const std::string& key,
                              std::span<const std::byte> value, std::chrono::milliseconds timeout) {
    /// This process's rank: 0 <= rank() < world_size().
    { cr.rank() } -> std::same_as<std::uint32_t>;
    /// Ranks are below this; for an open world (services joining and leaving), wire::max_world_size.
    { cr.world_size() } -> std::same_as<std::uint32_t>;
    /// Words naming the rendezvous for messages, e.g. "PMIx namespace 'prterun-x-1'" (never a secret).
    { cr.name() } -> std::convertible_to<std::string>;
    r.publish(key, value);
    r.fence(timeout);
    { r.lookup(peer, key, timeout) } -> std::same_as<std::vector<std::byte>>;
    r.withdraw();
};

namespace detail {

/// A Rendezvous behind virtual calls, so that Mesh is compiled once.
class AnyRendezvous {
public:
    AnyRendezvous() = default;
    AnyRendezvous(const AnyRendezvous&) = delete;
    AnyRendezvous& operator=(const AnyRendezvous&) = delete;
    virtual ~AnyRendezvous() = default;
    [[nodiscard]] virtual std::uint32_t rank() const = 0;
    [[nodiscard]] virtual std::uint32_t world_size() const = 0;
    [[nodiscard]] virtual std::string name() const = 0;
    virtual void publish(const std::string& key, std::span<const std::byte> value) = 0;
    virtual void fence(std::chrono::milliseconds timeout) = 0;
    virtual std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
    virtual void withdraw() = 0;
};

template <Rendezvous R>
class RendezvousRef final : public AnyRendezvous {
public:
    explicit RendezvousRef(R& r) : r_(&r) {}
    [[nodiscard]] std::uint32_t rank() const override { return r_->rank(); }
    [[nodiscard]] std::uint32_t world_size() const override { return r_->world_size(); }
    [[nodiscard]] std::string name() const override { return r_->name(); }
    void publish(const std::string& key, std::span<const std::byte> value) override { r_->publish(key, value); }
    void fence(std::chrono::milliseconds timeout) override { r_->fence(timeout); }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key,
                                  std::chrono::milliseconds timeout) override {
        return r_->lookup(peer, key, timeout);
    }
    void withdraw() override { r_->withdraw(); }

private:
    R* r_;
};

template <Rendezvous R>
std::unique_ptr<AnyRendezvous> erase_rendezvous(R& r) {
    return std::make_unique<RendezvousRef<R>>(r);
}

} // namespace detail
} // namespace gpuverbs
