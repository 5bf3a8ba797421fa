// What kv_layout.cpp, kv_pool_record.cpp and kv_pool.cpp share.
#pragma once

#include "gpuverbs/verbs/memory_region.hpp"

#include <span>
#include <string>

namespace gpuverbs::detail {

/// Empty when no two tensors share a byte; otherwise which two, in words.
/// (Planning by id checks ids, not addresses: it relies on this.) Remote
/// tensors overlap only under one rkey (`by_key`).
std::string tensors_overlap(std::span<const RemoteMemory> tensors, bool by_key);

} // namespace gpuverbs::detail
