// gpuverbs 0.1's path of <gpuverbs/transfers/registration_cache.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning \
    "<gpuverbs/registration_cache.hpp> is deprecated: include <gpuverbs/transfers/registration_cache.hpp>"
#endif
#include <gpuverbs/transfers/registration_cache.hpp>
