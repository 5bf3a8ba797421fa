// gpuverbs 0.1's path of <gpuverbs/connections/tcp_bootstrap.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/tcp_bootstrap.hpp> is deprecated: include <gpuverbs/connections/tcp_bootstrap.hpp>"
#endif
#include <gpuverbs/connections/tcp_bootstrap.hpp>
