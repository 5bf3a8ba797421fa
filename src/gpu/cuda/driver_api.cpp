#include "gpu/cuda/driver_api.hpp"

#include "gpuverbs/gpu/gpu.hpp"

#include <dlfcn.h>

namespace gpuverbs::detail::cuda {
namespace {

struct Loaded {
    DriverApi api;
    Status status;
};

#if GPUVERBS_HAVE_CUDA

std::string version_text(int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Drivers older than 12.0 only have the first cuGetProcAddress.
using LegacyGetProcAddress = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t);

Loaded load() {
    Loaded out;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        // Runs once, inside the function-local static initialiser; glibc keeps dlerror per thread.
        const char* err = ::dlerror(); // NOLINT(concurrency-mt-unsafe)
        out.status.fail(errc::no_gpu_driver, "dlopen(libcuda.so.1)",
                        std::string("no NVIDIA GPU driver: libcuda.so.1 could not be loaded (") +
                            (err != nullptr ? err : "unknown reason") +
                            "); install the NVIDIA driver, or add its directory to LD_LIBRARY_PATH");
        return out;
    }
    // The library stays loaded for the life of the process: driver state and
    // the function pointers below must never dangle.
    auto get_version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(::dlsym(lib, "cuDriverGetVersion"));
    if (get_version == nullptr || get_version(&out.api.driver_version) != CUDA_SUCCESS) {
        out.status.fail(errc::no_gpu_driver, "cuDriverGetVersion",
                        "libcuda.so.1 was loaded but does not answer cuDriverGetVersion; the NVIDIA driver "
                        "installation looks broken");
        return out;
    }
    auto get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(::dlsym(lib, "cuGetProcAddress_v2"));
    auto get_proc_legacy = reinterpret_cast<LegacyGetProcAddress>(::dlsym(lib, "cuGetProcAddress"));
    if (get_proc == nullptr && get_proc_legacy == nullptr) {
        out.status.fail(errc::no_gpu_driver, "cuGetProcAddress",
                        "the NVIDIA driver supports CUDA " + version_text(out.api.driver_version) +
                            ", which is too old: gpuverbs needs a driver for CUDA 11.3 or newer");
        return out;
    }
    auto fetch = [&](const char* name, void** slot, int version) {
        CUresult r;
        if (get_proc != nullptr) {
            CUdriverProcAddressQueryResult found{};
            r = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
            if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) r = CUDA_ERROR_NOT_FOUND;
        } else {
            r = get_proc_legacy(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT);
        }
        if (r != CUDA_SUCCESS || *slot == nullptr) {
            *slot = nullptr;
            out.status.fail(errc::no_gpu_driver, "cuGetProcAddress",
                            std::string("the NVIDIA driver (CUDA ") + version_text(out.api.driver_version) +
                                ") has no " + name + "; update the driver");
            return false;
        }
        return true;
    };
#define GPUVERBS_CUDA_FETCH(name, version) \
    if (!fetch(#name, reinterpret_cast<void**>(&out.api.name), version)) return out;
    GPUVERBS_CUDA_DRIVER_FUNCTIONS(GPUVERBS_CUDA_FETCH)
#undef GPUVERBS_CUDA_FETCH
    // Optional entry points: a failed lookup leaves the pointer null and the
    // driver usable.
#define GPUVERBS_CUDA_FETCH_OPTIONAL(name, version)                        \
    if (!fetch(#name, reinterpret_cast<void**>(&out.api.name), version)) { \
        out.status = Status{};                                             \
    }
    GPUVERBS_CUDA_OPTIONAL_FUNCTIONS(GPUVERBS_CUDA_FETCH_OPTIONAL)
#undef GPUVERBS_CUDA_FETCH_OPTIONAL

    if (CUresult r = out.api.cuInit(0); r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_NO_DEVICE) {
            out.status.fail(errc::no_gpu, "cuInit",
                            "the NVIDIA driver is installed but sees no GPU (CUDA_ERROR_NO_DEVICE); check "
                            "nvidia-smi and CUDA_VISIBLE_DEVICES");
        } else {
            const char* name = nullptr;
            const char* text = nullptr;
            out.api.cuGetErrorName(r, &name);
            out.api.cuGetErrorString(r, &text);
            out.status.fail(errc::no_gpu_driver, "cuInit",
                            std::string("the NVIDIA driver failed to initialise: ") + (name ? name : "?") + " (" +
                                (text ? text : "?") + ")");
        }
    }
    return out;
}

#else

Loaded load() {
    Loaded out;
    out.status.fail(errc::built_without_cuda, "gpuverbs",
                    "built without CUDA: the CUDA toolkit was not found when gpuverbs was configured, so it "
                    "cannot use GPUs; reconfigure with the toolkit installed (CUDAToolkit_ROOT=/usr/local/cuda)");
    return out;
}

#endif

const Loaded& loaded() {
    static const Loaded instance = load();
    return instance;
}

} // namespace

const DriverApi* driver_api(Status& status) {
    const Loaded& l = loaded();
    if (!l.status.ok()) {
        status = l.status;
        return nullptr;
    }
    return &l.api;
}

#if GPUVERBS_HAVE_CUDA

bool failed(CUresult r, const char* verb, const std::string& what, Status& status) {
    if (r == CUDA_SUCCESS) return false;
    status.fail({static_cast<int>(r), cuda_category()}, verb, what + ": " + describe(r));
    return true;
}

PrimaryContext::PrimaryContext(const DriverApi& cu, int ordinal, Status& status) {
    CUdevice device = 0;
    std::string which = "GPU " + std::to_string(ordinal);
    if (failed(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet", "cannot open " + which, status)) return;
    CUcontext context = nullptr;
    if (failed(cu.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain",
               "cannot start a CUDA context on " + which, status)) {
        return;
    }
    cu_ = &cu;
    context_ = context;
    device_ = device;
}

PrimaryContext::~PrimaryContext() {
    // At process exit the driver may already be shut down; nothing to do then.
    if (context_ != nullptr) (void)cu_->cuDevicePrimaryCtxRelease(device_);
}

#endif

std::string describe(int result) {
#if GPUVERBS_HAVE_CUDA
    const Loaded& l = loaded();
    if (l.status.ok()) {
        const char* name = nullptr;
        const char* text = nullptr;
        auto r = static_cast<CUresult>(result);
        if (l.api.cuGetErrorName(r, &name) == CUDA_SUCCESS && l.api.cuGetErrorString(r, &text) == CUDA_SUCCESS) {
            return std::string(name) + " (" + text + ")";
        }
    }
#endif
    return "CUresult " + std::to_string(result);
}

} // namespace gpuverbs::detail::cuda
