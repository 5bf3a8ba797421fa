// The CUDA driver API, loaded at run time (never linked).
//
// Private to the compiled part of gpuverbs: it includes <cuda.h>, which users
// of gpuverbs' headers must not need. Each entry point is fetched with
// cuGetProcAddress at a pinned ABI version and stored with that version's
// exact pointer type (cudaTypedefs.h), so a newer or older driver can never
// hand us a function whose signature differs from the one we call.
#pragma once

#ifdef GPUVERBS_WITH_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

#include "gpuverbs/error.hpp"

#include <string>

namespace gpuverbs::detail::cuda {

#ifdef GPUVERBS_WITH_CUDA

// X(name, abi_version): every driver entry point gpuverbs calls.
#define GPUVERBS_CUDA_DRIVER_FUNCTIONS(X) \
    X(cuInit, 2000)                       \
    X(cuDriverGetVersion, 2020)           \
    X(cuGetErrorName, 6000)               \
    X(cuGetErrorString, 6000)             \
    X(cuDeviceGetCount, 2000)             \
    X(cuDeviceGet, 2000)                  \
    X(cuDeviceGetName, 2000)              \
    X(cuDeviceGetPCIBusId, 4010)          \
    X(cuDeviceTotalMem, 3020)             \
    X(cuDeviceGetAttribute, 2000)

struct DriverApi {
    int driver_version = 0;
#define GPUVERBS_CUDA_MEMBER(name, version) PFN_##name##_v##version name = nullptr;
    GPUVERBS_CUDA_DRIVER_FUNCTIONS(GPUVERBS_CUDA_MEMBER)
#undef GPUVERBS_CUDA_MEMBER
};

#else

struct DriverApi {
    int driver_version = 0;
};

#endif

/// The loaded, initialised driver; or nullptr with `status` failed with
/// errc::built_without_cuda, no_gpu_driver, no_gpu or cuda_error and a
/// sentence a user can act on. Loads and calls cuInit once; thread-safe.
const DriverApi* driver_api(Status& status);

/// "CUDA_ERROR_X (description)" for a CUresult, using the driver when loaded.
std::string describe(int result);

} // namespace gpuverbs::detail::cuda
