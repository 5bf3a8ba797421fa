// Private to src/gpu_direct: the probes' shared pieces.
#pragma once

#include "gpuverbs/detail/gpu/gpu_registration.hpp"

#include <infiniband/verbs.h>

namespace gpuverbs {

/// Whether this memory may be used for GPUDirect RDMA (its capability flag).
Check probe_memory(const GpuMemory& memory);

namespace detail {

/// ibv_reg_dmabuf_mr, looked up at run time; nullptr on rdma-core < 34.
using RegDmabufMr = ibv_mr* (*)(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                                int access);
RegDmabufMr reg_dmabuf_mr_function() noexcept;

} // namespace detail
} // namespace gpuverbs
