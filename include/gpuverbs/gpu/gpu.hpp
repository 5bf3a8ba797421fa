// GPUs as the CUDA driver sees them.
//
// gpuverbs never links libcuda: it loads libcuda.so.1 on first use, so every
// program starts on a machine without an NVIDIA driver, and only GPU calls
// fail there, with errc::no_gpu_driver and the loader's reason.
#pragma once

#include "gpuverbs/error.hpp"

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// One GPU visible to the CUDA driver.
struct GpuInfo {
    int ordinal = 0;                ///< CUDA device ordinal
    std::string name;               ///< e.g. "NVIDIA H100 80GB HBM3"
    std::string pci_bus_id;         ///< "domain:bus:device.function", lower case, e.g. "0000:00:06.0"
    std::uint64_t total_memory = 0; ///< bytes
    int compute_capability_major = 0;
    int compute_capability_minor = 0;
};

/// Whether this build of gpuverbs has CUDA support compiled in.
bool built_with_cuda() noexcept;

/// The CUDA driver's version (e.g. 13000 for 13.0), loading the driver if needed.
int cuda_driver_version();
int cuda_driver_version(std::error_code& ec);

/// The GPUs the driver sees. Fails with errc::built_without_cuda,
/// errc::no_gpu_driver (with the loader's reason), errc::no_gpu or a CUresult
/// in cuda_category().
std::vector<GpuInfo> list_gpus();
std::vector<GpuInfo> list_gpus(std::error_code& ec);

/// The CUDA driver's error category: value is a CUresult, message its name and
/// description from the driver ("CUDA_ERROR_NO_DEVICE: no CUDA-capable device
/// is detected").
const std::error_category& cuda_category() noexcept;

} // namespace gpuverbs
