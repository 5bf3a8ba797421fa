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
// Each in three forms, as every fallible gpuverbs call: throwing, (…, ec) and
// (…, ec, diagnostics); the last is the one a backend writes (the concept).
//
// Backends: PmixRendezvous (rendezvous/pmix.hpp), MpiRendezvous
// (rendezvous/mpi.hpp, header-only), RedisRendezvous (rendezvous/redis.hpp);
// SignedRendezvous (rendezvous/signed.hpp) signs and checks any of them.
// Mesh (mesh.hpp) builds the queue pairs between members on top of any of them.
#pragma once

#include "gpuverbs/error.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace gpuverbs {

/// A member of a group of processes that can publish and look up bytes by
/// (rank, key). The operations report failures as error_code forms: the code
/// in `ec` (cleared on success) and the words in `diagnostics` (naming the
/// rendezvous and the peer): errc::rendezvous_unavailable (the launcher or
/// store failed or refused us), errc::peer_missing (not published before the
/// deadline), errc::unsupported (the backend cannot do it, e.g. lookup
/// between fences with MPI), errc::invalid_argument (a key or rank outside
/// the world), errc::malformed_record (bytes that are not a record). Mesh
/// calls only these forms, so its own error_code forms throw nothing.
/// A rendezvous of your own derives from RendezvousForms (below) to get the
/// throwing and error_code-only forms, and fills `diagnostics` with
/// Diagnostics::set.
template <class R>
concept Rendezvous = requires(R& r, const R& cr, std::uint32_t peer, const std::string& key,
                              std::span<const std::byte> value, std::chrono::milliseconds timeout, std::error_code& ec,
                              Diagnostics& diagnostics) {
    /// This process's rank: 0 <= rank() < world_size().
    { cr.rank() } -> std::same_as<std::uint32_t>;
    /// Ranks are below this; for an open world (services joining and leaving), wire::max_world_size.
    { cr.world_size() } -> std::same_as<std::uint32_t>;
    /// Words naming the rendezvous for messages, e.g. "PMIx namespace 'prterun-x-1'" (never a secret).
    { cr.name() } -> std::convertible_to<std::string>;
    r.publish(key, value, ec, diagnostics);
    r.fence(timeout, ec, diagnostics);
    { r.lookup(peer, key, timeout, ec, diagnostics) } -> std::same_as<std::vector<std::byte>>;
    r.withdraw(ec, diagnostics);
};

/// The throwing and error_code-only forms of the four operations, written
/// once from a rendezvous's (…, error_code&, Diagnostics&) forms. A backend
/// derives from RendezvousForms<Itself> and names the base's forms beside its
/// own (`using RendezvousForms<Itself>::publish;` and so on).
template <class Self>
class RendezvousForms {
public:
    /// Makes `value` readable by every member as (my rank, key).
    void publish(const std::string& key, std::span<const std::byte> value) {
        throwing("publish", [&](std::error_code& ec, Diagnostics& d) { self().publish(key, value, ec, d); });
    }
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec) {
        Diagnostics unused;
        self().publish(key, value, ec, unused);
    }
    /// Collective: every member's earlier publications become visible.
    void fence(std::chrono::milliseconds timeout) {
        throwing("fence", [&](std::error_code& ec, Diagnostics& d) { self().fence(timeout, ec, d); });
    }
    void fence(std::chrono::milliseconds timeout, std::error_code& ec) {
        Diagnostics unused;
        self().fence(timeout, ec, unused);
    }
    /// The peer's bytes under `key`, waiting up to `timeout` for them.
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout) {
        std::vector<std::byte> bytes;
        throwing("lookup",
                 [&](std::error_code& ec, Diagnostics& d) { bytes = self().lookup(peer, key, timeout, ec, d); });
        return bytes;
    }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  std::error_code& ec) {
        Diagnostics unused;
        return self().lookup(peer, key, timeout, ec, unused);
    }
    /// Removes what this member published (a clean leave).
    void withdraw() {
        throwing("withdraw", [&](std::error_code& ec, Diagnostics& d) { self().withdraw(ec, d); });
    }
    void withdraw(std::error_code& ec) {
        Diagnostics unused;
        self().withdraw(ec, unused);
    }

protected:
    RendezvousForms() = default;

private:
    Self& self() { return static_cast<Self&>(*this); }
    /// Throws gpuverbs::Error with the words the error_code form gave.
    template <class F>
    static void throwing(const char* operation, F&& f) {
        std::error_code ec;
        Diagnostics diagnostics;
        f(ec, diagnostics);
        if (!ec) return;
        detail::Status status;
        status.adopt(ec, diagnostics, operation);
        status.raise();
    }
};

namespace detail {

/// A Rendezvous behind virtual calls, so that Mesh is compiled once; its
/// operations keep the rendezvous's code and words in a Status.
class AnyRendezvous {
public:
    AnyRendezvous() = default;
    AnyRendezvous(const AnyRendezvous&) = delete;
    AnyRendezvous& operator=(const AnyRendezvous&) = delete;
    virtual ~AnyRendezvous() = default;
    [[nodiscard]] virtual std::uint32_t rank() const = 0;
    [[nodiscard]] virtual std::uint32_t world_size() const = 0;
    [[nodiscard]] virtual std::string name() const = 0;
    virtual void publish(const std::string& key, std::span<const std::byte> value, Status& status) = 0;
    virtual void fence(std::chrono::milliseconds timeout, Status& status) = 0;
    virtual std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                          Status& status) = 0;
    virtual void withdraw(Status& status) = 0;
};

template <Rendezvous R>
class RendezvousRef final : public AnyRendezvous {
public:
    explicit RendezvousRef(R& r) : r_(&r) {}
    [[nodiscard]] std::uint32_t rank() const override { return r_->rank(); }
    [[nodiscard]] std::uint32_t world_size() const override { return r_->world_size(); }
    [[nodiscard]] std::string name() const override { return r_->name(); }
    void publish(const std::string& key, std::span<const std::byte> value, Status& status) override {
        std::error_code ec;
        Diagnostics diagnostics;
        r_->publish(key, value, ec, diagnostics);
        status.adopt(ec, diagnostics, "publish");
    }
    void fence(std::chrono::milliseconds timeout, Status& status) override {
        std::error_code ec;
        Diagnostics diagnostics;
        r_->fence(timeout, ec, diagnostics);
        status.adopt(ec, diagnostics, "fence");
    }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  Status& status) override {
        std::error_code ec;
        Diagnostics diagnostics;
        std::vector<std::byte> bytes = r_->lookup(peer, key, timeout, ec, diagnostics);
        status.adopt(ec, diagnostics, "lookup");
        return bytes;
    }
    void withdraw(Status& status) override {
        std::error_code ec;
        Diagnostics diagnostics;
        r_->withdraw(ec, diagnostics);
        status.adopt(ec, diagnostics, "withdraw");
    }

private:
    R* r_;
};

template <Rendezvous R>
std::unique_ptr<AnyRendezvous> erase_rendezvous(R& r) {
    return std::make_unique<RendezvousRef<R>>(r);
}

} // namespace detail
} // namespace gpuverbs
