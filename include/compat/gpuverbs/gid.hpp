// gpuverbs 0.1's path of <gpuverbs/verbs/gid.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/gid.hpp> is deprecated: include <gpuverbs/verbs/gid.hpp>"
#endif
#include <gpuverbs/verbs/gid.hpp>
