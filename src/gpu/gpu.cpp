#include "gpuverbs/gpu/gpu.hpp"

#include "gpu/cuda/driver_api.hpp"

#include <cctype>

namespace gpuverbs {
namespace {

class CudaCategory final : public std::error_category {
public:
    const char* name() const noexcept override { return "cuda"; }
    std::string message(int value) const override { return detail::cuda::describe(value); }
};

#if GPUVERBS_HAVE_CUDA

using detail::cuda::failed;

std::vector<GpuInfo> list_impl(detail::Status& status) {
    std::vector<GpuInfo> out;
    const detail::cuda::DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr) return out;
    int count = 0;
    if (failed(cu->cuDeviceGetCount(&count), "cuDeviceGetCount", "cannot count GPUs", status)) return out;
    if (count == 0) {
        status.fail(errc::no_gpu, "cuDeviceGetCount",
                    "the NVIDIA driver is loaded but sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES");
        return out;
    }
    for (int i = 0; i < count; ++i) {
        GpuInfo g;
        g.ordinal = i;
        CUdevice dev = 0;
        std::string which = "GPU " + std::to_string(i);
        if (failed(cu->cuDeviceGet(&dev, i), "cuDeviceGet", "cannot open " + which, status)) return out;
        char name[256] = {};
        if (failed(cu->cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName", which, status)) return out;
        g.name = name;
        char bus[32] = {};
        if (failed(cu->cuDeviceGetPCIBusId(bus, sizeof bus, dev), "cuDeviceGetPCIBusId", which, status)) return out;
        // CUDA prints "0000:00:06.0" in upper case; sysfs and lspci use lower case.
        for (char* c = bus; *c != '\0'; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
        g.pci_bus_id = bus;
        std::size_t bytes = 0;
        if (failed(cu->cuDeviceTotalMem(&bytes, dev), "cuDeviceTotalMem", which, status)) return out;
        g.total_memory = bytes;
        if (failed(cu->cuDeviceGetAttribute(&g.compute_capability_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                            dev),
                   "cuDeviceGetAttribute", which, status) ||
            failed(cu->cuDeviceGetAttribute(&g.compute_capability_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                            dev),
                   "cuDeviceGetAttribute", which, status)) {
            return out;
        }
        out.push_back(std::move(g));
    }
    return out;
}

#else

std::vector<GpuInfo> list_impl(detail::Status& status) {
    (void)detail::cuda::driver_api(status);
    return {};
}

#endif

int driver_version_impl(detail::Status& status) {
    const detail::cuda::DriverApi* cu = detail::cuda::driver_api(status);
    return cu != nullptr ? cu->driver_version : 0;
}

} // namespace

const std::error_category& cuda_category() noexcept {
    static const CudaCategory category;
    return category;
}

bool built_with_cuda() noexcept {
#if GPUVERBS_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int cuda_driver_version() {
    return detail::or_throw([](detail::Status& status) { return driver_version_impl(status); });
}

int cuda_driver_version(std::error_code& ec) {
    return detail::or_code(ec, [](detail::Status& status) { return driver_version_impl(status); });
}

std::vector<GpuInfo> list_gpus() {
    return detail::or_throw([&](detail::Status& status) { return list_impl(status); });
}

std::vector<GpuInfo> list_gpus(std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& status) { return list_impl(status); });
}

} // namespace gpuverbs
