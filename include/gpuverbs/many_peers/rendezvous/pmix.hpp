// The rendezvous of a job: PMIx, which mpirun (Open MPI), srun --mpi=pmix
// (Slurm) and prterun start every process with. No MPI call is needed.
//
//   gpuverbs::PmixRendezvous job;      // rank and size from the launcher
//   gpuverbs::Mesh mesh(job, pd, cq, {mr.remote()});
//   mesh.connect_all();
//
// publish is PMIx_Put + PMIx_Commit, fence PMIx_Fence (collecting data),
// lookup PMIx_Get (which waits for a key a peer has not committed yet, up to
// the timeout). gpuverbs built without libpmix-dev keeps this class; its
// constructor then fails with errc::unsupported saying so.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/many_peers/rendezvous.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

class PmixRendezvous : public RendezvousForms<PmixRendezvous> {
public:
    using RendezvousForms::fence;
    using RendezvousForms::lookup;
    using RendezvousForms::publish;
    using RendezvousForms::withdraw;

    /// Joins the job this process was launched in (PMIx_Init). Throws
    /// gpuverbs::Error: errc::rendezvous_unavailable when no PMIx launcher
    /// started the process, errc::unsupported when gpuverbs has no PMIx.
    PmixRendezvous();
    /// The same without throwing: on failure `ec` is set and the member
    /// returned has not joined (explicit operator bool is false; its
    /// operations fail with errc::rendezvous_unavailable). Not movable, it is
    /// returned in place: `PmixRendezvous job = PmixRendezvous::create(ec);`.
    static PmixRendezvous create(std::error_code& ec) { return PmixRendezvous(detail::Outcome{&ec, nullptr}); }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static PmixRendezvous create(std::error_code& ec, Diagnostics& diagnostics) {
        return PmixRendezvous(detail::Outcome{&ec, &diagnostics});
    }
    PmixRendezvous(const PmixRendezvous&) = delete;
    PmixRendezvous& operator=(const PmixRendezvous&) = delete;
    /// PMIx_Finalize.
    ~PmixRendezvous();

    [[nodiscard]] std::uint32_t rank() const noexcept;
    [[nodiscard]] std::uint32_t world_size() const noexcept;
    /// "PMIx namespace '<nspace>'".
    [[nodiscard]] std::string name() const;

    /// PMIx_Put and PMIx_Commit. Each operation also has the throwing and
    /// (…, ec) forms (RendezvousForms).
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec,
                 Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { publish_impl(key, value, s); });
    }
    /// Collective: every rank of the job calls it.
    void fence(std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { fence_impl(timeout, s); });
    }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return lookup_impl(peer, key, timeout, s); });
    }
    /// Nothing to remove in PMIx (the job's data goes with the job).
    void withdraw(std::error_code& ec, Diagnostics& diagnostics) {
        ec.clear();
        diagnostics.clear();
    }

    /// Whether this gpuverbs was built with PMIx.
    static bool available() noexcept;
    /// False for a member create() could not join.
    explicit operator bool() const noexcept { return impl_ != nullptr; }

private:
    explicit PmixRendezvous(detail::Outcome outcome);
    struct Impl;
    /// The job's state, or null with errc::rendezvous_unavailable naming `verb` when create() could not join.
    [[nodiscard]] const Impl* joined(const char* verb, detail::Status& status) const;
    void publish_impl(const std::string& key, std::span<const std::byte> value, detail::Status& status);
    void fence_impl(std::chrono::milliseconds timeout, detail::Status& status);
    std::vector<std::byte> lookup_impl(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                       detail::Status& status);
    std::unique_ptr<Impl> impl_;
};

} // namespace gpuverbs
