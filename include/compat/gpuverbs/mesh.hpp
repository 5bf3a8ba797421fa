// gpuverbs 0.1's path of <gpuverbs/many_peers/mesh.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/mesh.hpp> is deprecated: include <gpuverbs/many_peers/mesh.hpp>"
#endif
#include <gpuverbs/many_peers/mesh.hpp>
