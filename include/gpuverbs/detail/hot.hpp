// GPUVERBS_HOT: forces the data path's small functions inline, so a request
// built from constants (the usual default options) folds into the few stores
// it needs instead of being built in memory and read back. Internal: the
// data-path headers use it; it is not part of the API.
#pragma once

#if defined(__GNUC__)
#define GPUVERBS_HOT [[gnu::always_inline]] inline
#else
#define GPUVERBS_HOT inline
#endif
