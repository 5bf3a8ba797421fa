// gpuverbs 0.1's path of <gpuverbs/data_path/data_path.hpp>: kept for one release so that
// programs written against 0.1 still compile (with this warning). See compat/README.md.
#pragma once
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "<gpuverbs/data_path.hpp> is deprecated: include <gpuverbs/data_path/data_path.hpp>"
#endif
#include <gpuverbs/data_path/data_path.hpp>
