// gpuverbs 0.1's path of <gpuverbs/connections/rdma_cm.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/rdma_cm.hpp> is deprecated: include <gpuverbs/connections/rdma_cm.hpp>"
#endif
#include <gpuverbs/connections/rdma_cm.hpp>
