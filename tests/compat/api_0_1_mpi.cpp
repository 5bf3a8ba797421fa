// 0.1's MpiRendezvous at its 0.1 path, as examples/05_mesh_allgather.cpp used
// it: the part of 0.1's documented API that needs MPI's headers, compiled and
// checked as api_0_1.cpp is (tests/compat/expect-deprecations) where the build
// has MPI.
#include <gpuverbs/gpuverbs.hpp>
#include <gpuverbs/rendezvous/mpi.hpp> // expect-deprecated

#include <mpi.h>

namespace compat_0_1 {

void mpi_allgather(gpuverbs::ProtectionDomain& pd, gpuverbs::CompletionQueue& cq, gpuverbs::MemoryRegion& mr) {
    gpuverbs::MpiRendezvous mpi(MPI_COMM_WORLD);
    gpuverbs::Mesh mesh(mpi, pd, cq, {mr.remote()});
    mesh.connect_all();
    gpuverbs::MeshPeer& peer = mesh.peer((mpi.rank() + 1) % mpi.world_size());
    peer.qp.post_write(mr.slice(0, 64), peer.regions[0], std::uint64_t{64} * mpi.rank());
}

} // namespace compat_0_1
