// The CUDA driver API, loaded at run time (never linked).
//
// Private to the compiled part of gpuverbs: it includes <cuda.h>, which users
// of gpuverbs' headers must not need. Each entry point is fetched with
// cuGetProcAddress at a pinned ABI version and stored with that version's
// exact pointer type (cudaTypedefs.h), so a newer or older driver can never
// hand us a function whose signature differs from the one we call.
#pragma once

#include "gpuverbs/config.hpp"

#if GPUVERBS_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

#include "gpuverbs/error.hpp"

#include <string>
#include <utility>

namespace gpuverbs::detail::cuda {

#if GPUVERBS_HAVE_CUDA

// X(name, abi_version): every driver entry point gpuverbs calls.
#define GPUVERBS_CUDA_DRIVER_FUNCTIONS(X)   \
    X(cuInit, 2000)                         \
    X(cuDriverGetVersion, 2020)             \
    X(cuGetErrorName, 6000)                 \
    X(cuGetErrorString, 6000)               \
    X(cuDeviceGetCount, 2000)               \
    X(cuDeviceGet, 2000)                    \
    X(cuDeviceGetName, 2000)                \
    X(cuDeviceGetPCIBusId, 4010)            \
    X(cuDeviceTotalMem, 3020)               \
    X(cuDeviceGetAttribute, 2000)           \
    X(cuDevicePrimaryCtxRetain, 7000)       \
    X(cuDevicePrimaryCtxRelease, 11000)     \
    X(cuCtxPushCurrent, 4000)               \
    X(cuCtxPopCurrent, 4000)                \
    X(cuCtxSynchronize, 2000)               \
    X(cuMemAlloc, 3020)                     \
    X(cuMemFree, 3020)                      \
    X(cuMemGetAddressRange, 3020)           \
    X(cuMemcpyHtoD, 3020)                   \
    X(cuMemcpyDtoH, 3020)                   \
    X(cuMemsetD8, 3020)                     \
    X(cuPointerGetAttribute, 4000)          \
    X(cuPointerSetAttribute, 6000)          \
    X(cuMemGetAllocationGranularity, 10020) \
    X(cuMemCreate, 10020)                   \
    X(cuMemRelease, 10020)                  \
    X(cuMemAddressReserve, 10020)           \
    X(cuMemAddressFree, 10020)              \
    X(cuMemMap, 10020)                      \
    X(cuMemUnmap, 10020)                    \
    X(cuMemSetAccess, 10020)                \
    X(cuMemRetainAllocationHandle, 11000)   \
    X(cuFlushGPUDirectRDMAWrites, 11030)    \
    X(cuMemHostAlloc, 2020)                 \
    X(cuMemFreeHost, 2000)                  \
    X(cuMemHostGetDevicePointer, 3020)      \
    X(cuStreamCreate, 2000)                 \
    X(cuStreamDestroy, 4000)                \
    X(cuStreamSynchronize, 2000)            \
    X(cuEventCreate, 2000)                  \
    X(cuEventDestroy, 4000)                 \
    X(cuEventRecord, 2000)                  \
    X(cuEventSynchronize, 2000)             \
    X(cuMemcpyDtoHAsync, 3020)              \
    X(cuMemcpyHtoDAsync, 3020)              \
    X(cuStreamQuery, 2000)

// Entry points newer than the oldest driver gpuverbs supports (CUDA 11.3):
// null when the driver lacks them, and the feature that needs them says so.
#define GPUVERBS_CUDA_OPTIONAL_FUNCTIONS(X) X(cuMemGetHandleForAddressRange, 11070)

struct DriverApi {
    int driver_version = 0;
#define GPUVERBS_CUDA_MEMBER(name, version) PFN_##name##_v##version name = nullptr;
    GPUVERBS_CUDA_DRIVER_FUNCTIONS(GPUVERBS_CUDA_MEMBER)
    GPUVERBS_CUDA_OPTIONAL_FUNCTIONS(GPUVERBS_CUDA_MEMBER)
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

#if GPUVERBS_HAVE_CUDA

/// Fails `status` with `verb`, `what` and the driver's words for `r`
/// (category cuda_category()); true if `r` is an error.
bool failed(CUresult r, const char* verb, const std::string& what, Status& status);

/// The primary context of one GPU (the one the CUDA runtime uses), retained
/// for the object's life and made current on this thread by Scope.
class PrimaryContext {
public:
    PrimaryContext() noexcept = default;
    /// Retains GPU `ordinal`'s primary context; empty with `status` failed on error.
    PrimaryContext(const DriverApi& cu, int ordinal, Status& status);
    PrimaryContext(PrimaryContext&& other) noexcept { swap(other); }
    PrimaryContext& operator=(PrimaryContext&& other) noexcept {
        PrimaryContext(std::move(other)).swap(*this);
        return *this;
    }
    PrimaryContext(const PrimaryContext&) = delete;
    PrimaryContext& operator=(const PrimaryContext&) = delete;
    ~PrimaryContext();

    explicit operator bool() const noexcept { return context_ != nullptr; }
    [[nodiscard]] CUcontext get() const noexcept { return context_; }
    [[nodiscard]] CUdevice device() const noexcept { return device_; }
    /// Gives up the retained context to the caller, who must call
    /// cuDevicePrimaryCtxRelease(device()) when done with it.
    CUcontext release() noexcept { return std::exchange(context_, nullptr); }

    /// Makes the context current on this thread until the Scope ends.
    class Scope {
    public:
        Scope(const DriverApi& cu, CUcontext context) noexcept
            : cu_(cu), pushed_(cu.cuCtxPushCurrent(context) == CUDA_SUCCESS) {}
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
        ~Scope() {
            CUcontext popped = nullptr;
            if (pushed_) (void)cu_.cuCtxPopCurrent(&popped);
        }
        [[nodiscard]] bool ok() const noexcept { return pushed_; }

    private:
        const DriverApi& cu_;
        bool pushed_;
    };

private:
    void swap(PrimaryContext& other) noexcept {
        std::swap(cu_, other.cu_);
        std::swap(context_, other.context_);
        std::swap(device_, other.device_);
    }
    const DriverApi* cu_ = nullptr;
    CUcontext context_ = nullptr;
    CUdevice device_ = 0;
};

#endif

} // namespace gpuverbs::detail::cuda
