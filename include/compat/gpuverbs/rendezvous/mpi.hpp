// gpuverbs 0.1's path of <gpuverbs/many_peers/rendezvous/mpi.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/rendezvous/mpi.hpp> is deprecated: include <gpuverbs/many_peers/rendezvous/mpi.hpp>"
#endif
#include <gpuverbs/many_peers/rendezvous/mpi.hpp>
