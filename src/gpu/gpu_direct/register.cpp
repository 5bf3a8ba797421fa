// register_gpu_memory: gathers the probes' answers, asks the pure plan which
// methods to try, and tries them in order, keeping every reason a method was
// ruled out or failed.
#include "gpu/gpu_direct/probes.hpp"

#include "gpu/cuda/driver_api.hpp"
#include "text.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace gpuverbs {
namespace {

using detail::Status;

std::string describe_gpu_memory(const GpuMemory& m) {
    return std::to_string(m.size) + " bytes of GPU memory at " + detail::hex_address(m.address) + " (GPU " +
           std::to_string(m.gpu) + ")";
}

detail::DmabufExport export_dmabuf(const GpuMemory& memory, Status& status) {
    detail::DmabufExport out;
#if GPUVERBS_HAVE_CUDA
    const detail::cuda::DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr) return out;
    if (cu->cuMemGetHandleForAddressRange == nullptr) {
        status.fail(errc::unsupported, "cuMemGetHandleForAddressRange", "the NVIDIA driver is older than CUDA 11.7");
        return out;
    }
    // The driver exports whole host pages; the registration names the offset.
    auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    detail::DmabufRange range = detail::dmabuf_export_range(memory.address, memory.size, page);
    detail::cuda::PrimaryContext context(*cu, memory.gpu, status);
    if (!context) return out;
    detail::cuda::PrimaryContext::Scope scope(*cu, context.get());
    int fd = -1;
    if (detail::cuda::failed(
            cu->cuMemGetHandleForAddressRange(&fd, range.start, range.size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
            "cuMemGetHandleForAddressRange",
            "cannot export " + std::to_string(range.size) + " bytes at " + detail::hex_address(range.start) +
                " (the host pages around " + describe_gpu_memory(memory) + ") as a dma-buf",
            status)) {
        return out;
    }
    out.fd = fd;
    out.offset = range.offset;
#else
    (void)memory;
    (void)detail::cuda::driver_api(status);
#endif
    return out;
}

// Closes a file descriptor when the scope ends, whatever happens.
struct FdCloser {
    int fd;
    explicit FdCloser(int f) noexcept : fd(f) {}
    FdCloser(const FdCloser&) = delete;
    FdCloser& operator=(const FdCloser&) = delete;
    ~FdCloser() {
        if (fd >= 0) (void)::close(fd);
    }
};

// One attempt with DMA-BUF; an empty region and a rejection when it fails.
MemoryRegion try_dmabuf(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                        const detail::RegistrationInputs& inputs, std::vector<Rejection>& rejections) {
    Status exported;
    detail::DmabufExport dmabuf = inputs.export_dmabuf(memory, exported);
    FdCloser closer(dmabuf.fd);
    if (!exported.ok()) {
        rejections.push_back({Registration::dmabuf, exported.detail});
        return {};
    }
    detail::RegDmabufMr reg = detail::reg_dmabuf_mr_function();
    if (reg == nullptr) {
        rejections.push_back({Registration::dmabuf, "rdma-core on this machine has no ibv_reg_dmabuf_mr"});
        return {};
    }
    errno = 0;
    ibv_mr* mr =
        reg(pd.native_handle(), dmabuf.offset, memory.size, memory.address, dmabuf.fd, static_cast<int>(access));
    int err = errno != 0 ? errno : EINVAL;
    if (mr == nullptr) {
        rejections.push_back({Registration::dmabuf, "ibv_reg_dmabuf_mr on " + pd.device_name() + " failed: " +
                                                        detail::errno_text(err) + detail::reg_mr_hint(err, access)});
        return {};
    }
    return detail::adopt_memory_region(
        pd, mr, memory.pointer(), memory.size,
        detail::registered_iova(Registration::dmabuf, memory.address, reinterpret_cast<std::uintptr_t>(mr->addr)),
        access, Registration::dmabuf);
}

// One attempt with peermem: ibv_reg_mr on the GPU pointer.
MemoryRegion try_peermem(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                         std::vector<Rejection>& rejections) {
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd.native_handle(), memory.pointer(), memory.size, static_cast<int>(access));
    int err = errno != 0 ? errno : EINVAL;
    if (mr == nullptr) {
        std::string hint = err == EFAULT ? "; the kernel could not pin the GPU pages: nvidia_peermem did not accept "
                                           "them (is it loaded for this driver version?)"
                                         : detail::reg_mr_hint(err, access);
        rejections.push_back({Registration::peermem,
                              "ibv_reg_mr on " + pd.device_name() + " failed: " + detail::errno_text(err) + hint});
        return {};
    }
    return detail::adopt_memory_region(
        pd, mr, memory.pointer(), memory.size,
        detail::registered_iova(Registration::peermem, memory.address, reinterpret_cast<std::uintptr_t>(mr->addr)),
        access, Registration::peermem);
}

const char* policy_from_environment() {
    return std::getenv(gpu_registration_env); // NOLINT(concurrency-mt-unsafe): read-only use of the environment
}

} // namespace

namespace detail {

RegistrationInputs real_inputs(const GpuMemory& memory) {
    RegistrationInputs in;
    in.gpu_direct_rdma = probe_gpu_direct_rdma(memory.gpu);
    in.memory = probe_memory(memory);
    in.gpu_dmabuf = probe_gpu_dmabuf(memory.gpu);
    in.peermem = probe_peermem();
    in.export_dmabuf = export_dmabuf;
    return in;
}

GpuDirectProbes complete_probes(const ProtectionDomain& pd, const RegistrationInputs& inputs) {
    GpuDirectProbes p;
    p.gpu_direct_rdma = inputs.gpu_direct_rdma;
    p.memory = inputs.memory;
    p.gpu_dmabuf = inputs.gpu_dmabuf;
    p.peermem = inputs.peermem;
    p.nic_dmabuf = inputs.nic_dmabuf ? *inputs.nic_dmabuf : probe_nic_dmabuf(pd);
    return p;
}

MemoryRegion register_gpu_memory_with(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                      GpuRegistration policy, const RegistrationInputs& inputs,
                                      std::vector<Rejection>& rejections, Status& status) {
    rejections.clear();
    if (!check_registration(pd, describe_gpu_memory(memory), access, "register_gpu_memory", status)) return {};
    if (memory.size == 0 || memory.address == 0) {
        status.fail(errc::invalid_argument, "register_gpu_memory",
                    "cannot register " + describe_gpu_memory(memory) + ": the GpuMemory is empty");
        return {};
    }
    GpuRegistration effective = effective_policy(policy, policy_from_environment(), status);
    if (!status.ok()) return {};
    GpuRegistrationPlan plan = plan_gpu_registration(effective, complete_probes(pd, inputs));
    rejections = plan.rejected;
    for (Registration method : plan.order) {
        MemoryRegion mr = method == Registration::dmabuf ? try_dmabuf(pd, memory, access, inputs, rejections)
                                                         : try_peermem(pd, memory, access, rejections);
        if (mr) return mr;
    }
    // Report in the order the methods are considered: DMA-BUF, then peermem.
    std::stable_sort(rejections.begin(), rejections.end(),
                     [](const Rejection& a, const Rejection& b) { return a.method < b.method; });
    status.fail(errc::gpu_direct_unavailable, "register_gpu_memory",
                "cannot register " + describe_gpu_memory(memory) + " on " + pd.device_name() +
                    " for RDMA: " + describe_rejections(rejections));
    return {};
}

} // namespace detail

MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy) {
    Status status;
    std::vector<Rejection> rejections;
    MemoryRegion mr =
        detail::register_gpu_memory_with(pd, memory, access, policy, detail::real_inputs(memory), rejections, status);
    if (status.code == make_error_code(errc::gpu_direct_unavailable)) {
        throw GpuRegistrationError(status.detail, std::move(rejections));
    }
    status.check();
    return mr;
}

MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy, std::error_code& ec, std::vector<Rejection>* rejections) {
    Diagnostics unused;
    return register_gpu_memory(pd, memory, access, policy, ec, unused, rejections);
}

MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy, std::error_code& ec, Diagnostics& diagnostics,
                                 std::vector<Rejection>* rejections) {
    Status status;
    std::vector<Rejection> reasons;
    MemoryRegion mr =
        detail::register_gpu_memory_with(pd, memory, access, policy, detail::real_inputs(memory), reasons, status);
    ec = status.code;
    status.report(diagnostics);
    if (rejections != nullptr) *rejections = std::move(reasons);
    return mr;
}

GpuRegistrationExplanation explain_gpu_registration(const ProtectionDomain& pd, const GpuMemory& memory,
                                                    GpuRegistration policy) {
    return detail::or_throw([&](Status& status) {
        GpuRegistrationExplanation out;
        GpuRegistration effective = detail::effective_policy(policy, policy_from_environment(), status);
        out.probes = detail::complete_probes(pd, detail::real_inputs(memory));
        out.plan = plan_gpu_registration(effective, out.probes);
        return out;
    });
}

GpuRegistrationExplanation explain_gpu_registration(const GpuMemory& memory, GpuRegistration policy) {
    return detail::or_throw([&](Status& status) {
        GpuRegistrationExplanation out;
        GpuRegistration effective = detail::effective_policy(policy, policy_from_environment(), status);
        detail::RegistrationInputs in = detail::real_inputs(memory);
        out.probes.gpu_direct_rdma = in.gpu_direct_rdma;
        out.probes.memory = in.memory;
        out.probes.gpu_dmabuf = in.gpu_dmabuf;
        out.probes.peermem = in.peermem;
        out.probes.nic_dmabuf = Check::no(
            "the NIC was not probed: no protection domain was given (no RDMA device "
            "opened)");
        out.plan = plan_gpu_registration(effective, out.probes);
        return out;
    });
}

GpuRegistrationExplanation explain_gpu_registration(const ProtectionDomain& pd, int gpu, GpuRegistration policy) {
    GpuMemory capable;
    capable.gpu = gpu;
    capable.gpu_direct_rdma_capable = true; // as GpuBuffer allocates it
    return explain_gpu_registration(pd, capable, policy);
}

} // namespace gpuverbs
