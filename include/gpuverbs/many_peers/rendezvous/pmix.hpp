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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gpuverbs {

class PmixRendezvous {
public:
    /// Joins the job this process was launched in (PMIx_Init). Throws
    /// gpuverbs::Error: errc::rendezvous_unavailable when no PMIx launcher
    /// started the process, errc::unsupported when gpuverbs has no PMIx.
    PmixRendezvous();
    PmixRendezvous(const PmixRendezvous&) = delete;
    PmixRendezvous& operator=(const PmixRendezvous&) = delete;
    /// PMIx_Finalize.
    ~PmixRendezvous();

    [[nodiscard]] std::uint32_t rank() const noexcept;
    [[nodiscard]] std::uint32_t world_size() const noexcept;
    /// "PMIx namespace '<nspace>'".
    [[nodiscard]] std::string name() const;

    void publish(const std::string& key, std::span<const std::byte> value);
    /// Collective: every rank of the job calls it.
    void fence(std::chrono::milliseconds timeout);
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout);
    /// Nothing to remove in PMIx (the job's data goes with the job).
    void withdraw() {}

    /// Whether this gpuverbs was built with PMIx.
    static bool available() noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace gpuverbs
