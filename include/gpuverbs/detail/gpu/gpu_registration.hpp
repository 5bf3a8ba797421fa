// The machinery behind register_gpu_memory, open to tests: the GPU half of a
// registration can be injected, so that the NIC half runs for real on a
// machine without a GPU (Soft-RoCE), and the pure helpers are unit-tested.
#pragma once

#include "gpuverbs/gpu/gpu_direct.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuverbs::detail {

/// A dma-buf exported for one registration. The caller closes fd.
struct DmabufExport {
    int fd = -1;
    std::uint64_t offset = 0; ///< where the memory's first byte lies in the dma-buf
};

/// The probes' answers and the dma-buf exporter for one registration. The
/// real one asks CUDA and sysfs; tests inject answers. nic_dmabuf left empty
/// is probed for real on the protection domain's device.
struct RegistrationInputs {
    Check gpu_direct_rdma;
    Check memory;
    Check gpu_dmabuf;
    Check peermem;
    std::optional<Check> nic_dmabuf;
    /// Exports the memory as a dma-buf; on failure fails `status` and returns fd -1.
    std::function<DmabufExport(const GpuMemory&, Status&)> export_dmabuf;
};

/// The inputs from this machine's CUDA driver and sysfs.
RegistrationInputs real_inputs(const GpuMemory& memory);

/// The probes with the NIC's answer filled in (probed if not injected).
GpuDirectProbes complete_probes(const ProtectionDomain& pd, const RegistrationInputs& inputs);

/// register_gpu_memory with the given inputs: tries the plan's methods in
/// order; `rejections` receives every method ruled out or failed.
MemoryRegion register_gpu_memory_with(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                      GpuRegistration policy, const RegistrationInputs& inputs,
                                      std::vector<Rejection>& rejections, Status& status);

/// The policy in force: `policy`, or for automatic the environment's choice
/// (`env_value`: GPUVERBS_GPU_REGISTRATION's value, or nullptr when unset).
/// Fails `status` (errc::invalid_argument) for a value it cannot parse.
GpuRegistration effective_policy(GpuRegistration policy, const char* env_value, Status& status);

/// The host-page-aligned range a dma-buf export needs around [address,
/// address + size), and where address lies in it.
struct DmabufRange {
    std::uint64_t start = 0;
    std::uint64_t size = 0;
    std::uint64_t offset = 0;
    friend bool operator==(const DmabufRange&, const DmabufRange&) = default;
};
DmabufRange dmabuf_export_range(std::uint64_t address, std::uint64_t size, std::uint64_t page_size) noexcept;

/// The iova to record for a region: rdma-core's ibv_reg_dmabuf_mr leaves the
/// dma-buf offset in ibv_mr::addr, so a DMA-BUF region reports the GPU
/// address it was registered at instead; other methods report mr_addr.
std::uint64_t registered_iova(Registration method, std::uint64_t gpu_address, std::uint64_t mr_addr) noexcept;

/// (major, minor) of a Linux release string such as "6.1.0-27-amd64".
std::optional<std::pair<int, int>> parse_kernel_release(std::string_view release) noexcept;

/// The reasons a NIC probe's errno means, for `device` (pure).
Check nic_dmabuf_answer(std::string_view device, bool symbol_found, int probe_errno);

} // namespace gpuverbs::detail
