// gpuverbs 0.1's path of <gpuverbs/verbs/queue_pair.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/queue_pair.hpp> is deprecated: include <gpuverbs/verbs/queue_pair.hpp>"
#endif
#include <gpuverbs/verbs/queue_pair.hpp>
