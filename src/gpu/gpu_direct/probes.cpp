// The probes behind register_gpu_memory: what the NIC, the GPU and the
// kernel support, each asked of the real system and cached where it cannot
// change while the process runs.
#include "gpu/gpu_direct/probes.hpp"

#include "gpu/cuda/driver_api.hpp"
#include "text.hpp"

#include <dlfcn.h>
#include <sys/utsname.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

namespace gpuverbs {
namespace {

using detail::Status;

std::mutex cache_mutex;
std::map<std::string, Check, std::less<>> nic_cache; // by RDMA device name
std::map<int, Check> gpu_dmabuf_cache;               // by CUDA ordinal

// Returns the cached answer for `key`, computing it once with `probe`.
template <class Map, class Key, class Probe>
Check cached(Map& map, const Key& key, Probe&& probe) {
    {
        std::lock_guard lock(cache_mutex);
        if (auto it = map.find(key); it != map.end()) return it->second;
    }
    Check answer = probe(); // outside the lock: probes call into drivers
    std::lock_guard lock(cache_mutex);
    return map.emplace(key, std::move(answer)).first->second;
}

[[maybe_unused]] std::string cuda_version_text(int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

#if GPUVERBS_HAVE_CUDA

using detail::cuda::DriverApi;

// The driver, and GPU `gpu` as a CUdevice; or a Check saying why not.
struct GpuHandle {
    const DriverApi* cu = nullptr;
    CUdevice device = 0;
    std::string name; // "GPU 0 (NVIDIA H200)"
    Check problem;
};

GpuHandle open_gpu(int gpu) {
    GpuHandle h;
    Status status;
    h.cu = detail::cuda::driver_api(status);
    if (h.cu == nullptr) {
        h.problem = Check::no(status.detail);
        return h;
    }
    int count = 0;
    (void)h.cu->cuDeviceGetCount(&count);
    if (gpu < 0 || gpu >= count || h.cu->cuDeviceGet(&h.device, gpu) != CUDA_SUCCESS) {
        h.cu = nullptr;
        h.problem =
            Check::no("there is no GPU " + std::to_string(gpu) + " (the driver sees " + std::to_string(count) + ")");
        return h;
    }
    char name[256] = {};
    (void)h.cu->cuDeviceGetName(name, sizeof name, h.device);
    h.name = "GPU " + std::to_string(gpu) + " (" + name + ")";
    h.problem = Check::yes();
    return h;
}

int attribute(const GpuHandle& h, CUdevice_attribute a) {
    int value = 0;
    return h.cu->cuDeviceGetAttribute(&value, a, h.device) == CUDA_SUCCESS ? value : 0;
}

#endif

// Why GPU probes say no in a build without CUDA (the loader's own sentence).
[[maybe_unused]] Check without_cuda() {
    Status status;
    (void)detail::cuda::driver_api(status);
    return Check::no(status.detail);
}

[[maybe_unused]] Check kernel_supports_dmabuf() {
    utsname u{};
    if (::uname(&u) != 0) return Check::yes(); // cannot tell; let registration decide
    auto version = detail::parse_kernel_release(u.release);
    if (version && *version < std::pair{5, 12}) {
        return Check::no("Linux " + std::string(u.release) +
                         " is older than 5.12, the first kernel that registers dma-bufs for RDMA: update the kernel");
    }
    return Check::yes();
}

} // namespace

namespace detail {

RegDmabufMr reg_dmabuf_mr_function() noexcept {
    static const RegDmabufMr function = [] {
        // Looked up by version so gpuverbs still loads against rdma-core < 34.
        void* ibverbs = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
        void* symbol = ::dlvsym(ibverbs != nullptr ? ibverbs : RTLD_DEFAULT, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
        if (ibverbs != nullptr) ::dlclose(ibverbs); // drops the NOLOAD reference only
        return reinterpret_cast<RegDmabufMr>(symbol);
    }();
    return function;
}

} // namespace detail

Check probe_nic_dmabuf(const ProtectionDomain& pd) {
    if (!pd) return Check::no("no RDMA device (the ProtectionDomain is empty)");
    return cached(nic_cache, pd.device_name(), [&] {
        detail::RegDmabufMr reg = detail::reg_dmabuf_mr_function();
        if (reg == nullptr) return detail::nic_dmabuf_answer(pd.device_name(), false, 0);
        errno = 0;
        // fd -1 is never a dma-buf: a device that takes dma-bufs looks at it
        // and says EBADF; one that does not says EOPNOTSUPP first.
        ibv_mr* mr = reg(pd.native_handle(), 0, 0, 0, -1, 0);
        int err = errno;
        if (mr != nullptr) {
            (void)ibv_dereg_mr(mr);
            err = 0;
        }
        return detail::nic_dmabuf_answer(pd.device_name(), true, err);
    });
}

Check probe_gpu_direct_rdma(int gpu) {
#if GPUVERBS_HAVE_CUDA
    GpuHandle h = open_gpu(gpu);
    if (h.cu == nullptr) return h.problem;
    if (attribute(h, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) == 0) {
        return Check::no(h.name +
                         " does not support GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0; "
                         "GeForce GPUs lack it): stage transfers through host memory");
    }
    return Check::yes();
#else
    (void)gpu;
    return without_cuda();
#endif
}

Check probe_gpu_dmabuf(int gpu) {
    return cached(gpu_dmabuf_cache, gpu, [&] {
#if GPUVERBS_HAVE_CUDA
        GpuHandle h = open_gpu(gpu);
        if (h.cu == nullptr) return h.problem;
        if (h.cu->driver_version < 11070 || h.cu->cuMemGetHandleForAddressRange == nullptr) {
            return Check::no("the NVIDIA driver supports CUDA " + cuda_version_text(h.cu->driver_version) +
                             "; exporting GPU memory as a dma-buf needs CUDA 11.7 or newer: update the driver");
        }
        if (attribute(h, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) == 0) {
            return Check::no(h.name +
                             " cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0): this needs the "
                             "NVIDIA open kernel module, R515 or newer (/proc/driver/nvidia/version says \"Open "
                             "Kernel Module\")");
        }
        return kernel_supports_dmabuf();
#else
        (void)gpu;
        return without_cuda();
#endif
    });
}

Check probe_peermem(std::string_view sys_root) {
    // What NCCL and UCX look for: the peer-memory client's version file.
    static constexpr const char* files[] = {
        "module/nvidia_peermem/version",
        "module/nv_peer_mem/version",
        "kernel/mm/memory_peers/nv_mem/version",
        "kernel/mm/memory_peers/nv_mem_nc/version",
    };
    std::filesystem::path root(sys_root);
    for (const char* f : files) {
        std::error_code ec;
        if (std::filesystem::exists(root / f, ec)) return Check::yes();
    }
    return Check::no("nvidia_peermem is not loaded (no " + (root / "module/nvidia_peermem").string() + ", " +
                     (root / "module/nv_peer_mem").string() + " or " +
                     (root / "kernel/mm/memory_peers/nv_mem").string() +
                     "): load it with `modprobe nvidia-peermem` (it comes with the NVIDIA driver)");
}

Check probe_memory(const GpuMemory& memory) {
    if (memory.gpu_direct_rdma_capable) return Check::yes();
    return Check::no("the memory at " + detail::hex_address(memory.address) + " on GPU " + std::to_string(memory.gpu) +
                     " was allocated without GPUDirect RDMA capability (a cuMemCreate allocation needs "
                     "allocFlags.gpuDirectRDMACapable=1): allocate it with that flag, or use GpuBuffer");
}

namespace {

GpuDirectAttributes attributes_impl(int gpu, Status& status) {
    GpuDirectAttributes a;
#if GPUVERBS_HAVE_CUDA
    GpuHandle h = open_gpu(gpu);
    if (h.cu == nullptr) {
        Status driver;
        if (detail::cuda::driver_api(driver) == nullptr) {
            status = driver;
        } else {
            status.fail(errc::invalid_argument, "cuDeviceGet", h.problem.reason);
        }
        return a;
    }
    a.gpu_direct_rdma = attribute(h, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0;
    a.dma_buf = attribute(h, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0;
    a.vmm_gpu_direct = attribute(h, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) != 0;
    a.flush_writes_options = attribute(h, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
    a.writes_ordering = attribute(h, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
    a.can_map_host_memory = attribute(h, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) != 0;
    a.unified_addressing = attribute(h, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) != 0;
    a.host_native_atomics = attribute(h, CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED) != 0;
#else
    (void)gpu;
    (void)detail::cuda::driver_api(status);
#endif
    return a;
}

} // namespace

GpuDirectAttributes gpu_direct_attributes(int gpu) {
    return detail::or_throw([&](Status& s) { return attributes_impl(gpu, s); });
}

GpuDirectAttributes gpu_direct_attributes(int gpu, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return attributes_impl(gpu, s); });
}

namespace {
constexpr int ordered_for_owner = 100; // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER
} // namespace

bool gpu_orders_rdma_writes(int gpu) {
    return gpu_direct_attributes(gpu).writes_ordering >= ordered_for_owner;
}

namespace {
bool flush_impl(int gpu, Status& status) {
    GpuDirectAttributes a = attributes_impl(gpu, status); // no driver, no such GPU: said here
    const bool host_flush = (a.flush_writes_options & 1) != 0;
    if (status.ok() && !host_flush && a.writes_ordering < ordered_for_owner) {
        status.fail(errc::unsupported, "cuFlushGPUDirectRDMAWrites",
                    "GPU " + std::to_string(gpu) +
                        " offers no host-side flush of RDMA writes (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_"
                        "FLUSH_WRITES_OPTIONS lacks the host bit): have a GPU kernel read a flag written last, or "
                        "issue a loopback RDMA read before launching work that reads the data");
    }
#if GPUVERBS_HAVE_CUDA
    if (status.ok() && host_flush) {
        const detail::cuda::DriverApi* cu = detail::cuda::driver_api(status);
        detail::cuda::PrimaryContext context(*cu, gpu, status);
        if (context) {
            detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
            (void)detail::cuda::failed(
                cu->cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                               CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER),
                "cuFlushGPUDirectRDMAWrites", "cannot flush RDMA writes to GPU " + std::to_string(gpu), status);
        }
    }
#endif
    return status.ok();
}
} // namespace

void flush_gpu_direct_rdma_writes(int gpu) {
    detail::or_throw([&](Status& s) { return flush_impl(gpu, s); });
}

void flush_gpu_direct_rdma_writes(int gpu, std::error_code& ec) {
    detail::or_code(ec, [&](Status& s) { return flush_impl(gpu, s); });
}

void flush_gpu_direct_rdma_writes(int gpu, std::error_code& ec, Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](Status& s) { return flush_impl(gpu, s); });
}

} // namespace gpuverbs
