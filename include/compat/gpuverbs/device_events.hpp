// gpuverbs 0.1's path of <gpuverbs/verbs/device_events.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/device_events.hpp> is deprecated: include <gpuverbs/verbs/device_events.hpp>"
#endif
#include <gpuverbs/verbs/device_events.hpp>
