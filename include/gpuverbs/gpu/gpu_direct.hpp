// GPUDirect RDMA: registering GPU memory so the NIC reads and writes it
// directly, choosing between the two ways Linux offers, and saying why when
// neither works.
//
//   gpuverbs::GpuBuffer buffer(8 << 20);
//   gpuverbs::MemoryRegion mr = gpuverbs::register_gpu_memory(pd, buffer, gpuverbs::access_all);
//   mr.registration();   // Registration::dmabuf or Registration::peermem
//   qp.post_write(mr.all(), peer_memory);                  // exactly like host memory
//
// The two ways:
// - DMA-BUF: the CUDA driver exports the GPU range as a dma-buf file
//   descriptor (cuMemGetHandleForAddressRange) and the NIC registers the fd
//   (ibv_reg_dmabuf_mr). Needs the NVIDIA open kernel module, CUDA 11.7+,
//   Linux 5.12+, and a NIC driver with dma-buf support.
// - peermem: the nvidia_peermem kernel module lets ibv_reg_mr pin GPU pages
//   behind a plain device pointer.
// Policy automatic tries DMA-BUF where both sides support it, then peermem;
// GPUVERBS_GPU_REGISTRATION=auto|dmabuf|peermem in the environment overrides
// automatic for operators. When nothing works, GpuRegistrationError lists each
// method and why it was rejected; explain_gpu_registration() gives the same
// answers without registering anything.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/gpu/gpu_buffer.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// Which registration methods register_gpu_memory may use.
enum class GpuRegistration {
    automatic, ///< DMA-BUF if both sides support it, else peermem (GPUVERBS_GPU_REGISTRATION may override)
    dmabuf,    ///< DMA-BUF only
    peermem,   ///< nvidia-peermem only
};
/// "auto", "dmabuf" or "peermem".
std::string_view to_string(GpuRegistration policy) noexcept;
/// Parses "auto", "dmabuf" or "peermem" (as GPUVERBS_GPU_REGISTRATION holds them).
std::optional<GpuRegistration> parse_gpu_registration(std::string_view text) noexcept;
/// The environment variable that overrides GpuRegistration::automatic.
inline constexpr const char* gpu_registration_env = "GPUVERBS_GPU_REGISTRATION";

/// One probe's answer: yes, or no with the reason in words a user can act on.
struct Check {
    bool ok = false;
    std::string reason; ///< why not; empty when ok

    static Check yes() { return {true, {}}; }
    static Check no(std::string why) { return {false, std::move(why)}; }
    friend bool operator==(const Check&, const Check&) = default;
};

/// Everything the choice of method depends on, each answered by a probe.
struct GpuDirectProbes {
    Check gpu_direct_rdma; ///< the GPU supports GPUDirect RDMA at all (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
    Check memory;          ///< this memory may be used for it (CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE)
    Check gpu_dmabuf;      ///< the GPU side can export dma-bufs (driver, attribute, kernel >= 5.12)
    Check nic_dmabuf;      ///< the NIC registers dma-bufs (ibv_reg_dmabuf_mr probed with fd -1)
    Check peermem;         ///< nvidia_peermem (or nv_peer_mem) is loaded
};

/// A method that was ruled out or failed, and why.
struct Rejection {
    Registration method = Registration::dmabuf;
    std::string reason;
    friend bool operator==(const Rejection&, const Rejection&) = default;
};

/// The decision: the methods to try, in order, and the ones ruled out.
struct GpuRegistrationPlan {
    GpuRegistration policy = GpuRegistration::automatic; ///< the policy in force (after the environment)
    std::vector<Registration> order;
    std::vector<Rejection> rejected;
};

/// The pure decision: which methods `policy` allows and `probes` support.
/// DMA-BUF comes before peermem; a method the policy excludes is rejected as
/// "not tried". No I/O: unit-tested for every combination.
GpuRegistrationPlan plan_gpu_registration(GpuRegistration policy, const GpuDirectProbes& probes);

/// "DMA-BUF: <reason>; peermem: <reason>" for a list of rejections.
std::string describe_rejections(const std::vector<Rejection>& rejected);

/// Thrown by register_gpu_memory when no method works (code():
/// errc::gpu_direct_unavailable); rejections() are the reasons as data.
class GpuRegistrationError : public Error {
public:
    GpuRegistrationError(std::string_view detail, std::vector<Rejection> rejections);
    [[nodiscard]] const std::vector<Rejection>& rejections() const noexcept { return rejections_; }

private:
    std::vector<Rejection> rejections_;
};

/// Registers GPU memory for RDMA on `pd`'s device, by DMA-BUF or peermem as
/// `policy` and the probes allow. The MemoryRegion records the method
/// (registration()) and its iova() is the GPU address, which work requests
/// and RemoteMemory use as for host memory. The memory must outlive the region.
/// Throws GpuRegistrationError when no method works, gpuverbs::Error for bad
/// arguments (empty pd, remote access without local_write).
MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy = GpuRegistration::automatic);
/// The error_code form: an empty MemoryRegion on failure; when `rejections`
/// is given it receives the reasons.
MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy, std::error_code& ec,
                                 std::vector<Rejection>* rejections = nullptr);
/// … with the explanation GpuRegistrationError or Error would carry kept in
/// `diagnostics` (each method and why it was rejected, in one message).
MemoryRegion register_gpu_memory(const ProtectionDomain& pd, const GpuMemory& memory, Access access,
                                 GpuRegistration policy, std::error_code& ec, Diagnostics& diagnostics,
                                 std::vector<Rejection>* rejections = nullptr);

/// What register_gpu_memory would decide, without registering: every probe's
/// answer and the plan. The probes' answers are cached (per device, per GPU,
/// per process), so this is cheap after the first call.
struct GpuRegistrationExplanation {
    GpuDirectProbes probes;
    GpuRegistrationPlan plan;
};
GpuRegistrationExplanation explain_gpu_registration(const ProtectionDomain& pd, const GpuMemory& memory,
                                                    GpuRegistration policy = GpuRegistration::automatic);
/// The GPU side alone, where there is no protection domain (a GPU machine
/// without an RDMA device, or before one is opened): every probe but the NIC's
/// is real; `nic_dmabuf` says the NIC was not probed, so a plan that needs it
/// rejects DMA-BUF with those words.
GpuRegistrationExplanation explain_gpu_registration(const GpuMemory& memory,
                                                    GpuRegistration policy = GpuRegistration::automatic);
/// The same for memory GPU `gpu` would allocate as a GpuBuffer (GPUDirect
/// RDMA capable): whether this GPU and `pd`'s NIC can work together at all.
GpuRegistrationExplanation explain_gpu_registration(const ProtectionDomain& pd, int gpu,
                                                    GpuRegistration policy = GpuRegistration::automatic);

// --- The probes, one by one (also used by gpuverbs-doctor) ------------------

/// Whether `pd`'s device registers dma-bufs: ibv_reg_dmabuf_mr (looked up as
/// IBVERBS_1.12, so older rdma-core still loads gpuverbs) called with fd -1;
/// EBADF means supported, EOPNOTSUPP/EPROTONOSUPPORT not. Cached per device.
Check probe_nic_dmabuf(const ProtectionDomain& pd);
/// Whether GPU `gpu` supports GPUDirect RDMA at all.
Check probe_gpu_direct_rdma(int gpu);
/// Whether GPU `gpu` can export dma-bufs: CUDA driver 11.7+,
/// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, Linux 5.12+. Cached per GPU.
Check probe_gpu_dmabuf(int gpu);
/// Whether nvidia_peermem (or the older nv_peer_mem) is loaded, from sysfs
/// under `sys_root` ("/sys" normally; a fixture tree in tests). Not cached.
Check probe_peermem(std::string_view sys_root = "/sys");

/// The CUDA attributes that matter for GPUDirect RDMA on one GPU.
struct GpuDirectAttributes {
    bool gpu_direct_rdma = false; ///< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
    bool dma_buf = false;         ///< CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
    bool vmm_gpu_direct = false;  ///< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    int flush_writes_options = 0; ///< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS (bit 0: host flush)
    int writes_ordering = 0;      ///< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING (0 none, 100 owner, 200 all)
    // What a device queue needs (device_queue/path.hpp):
    bool can_map_host_memory = false; ///< CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
    bool unified_addressing = false;  ///< CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
    bool host_native_atomics = false; ///< CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED (Grace: yes; PCIe x86: no)
};
/// Reads them for GPU `gpu` (throws gpuverbs::Error without a driver or GPU).
GpuDirectAttributes gpu_direct_attributes(int gpu);
GpuDirectAttributes gpu_direct_attributes(int gpu, std::error_code& ec);

/// Making RDMA-written data visible to the GPU. After a completion says the
/// NIC wrote into GPU memory, work the CPU launches afterwards sees the data
/// on GPUs whose CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING reaches
/// the owner (Hopper and newer report owner); elsewhere call this first. It
/// blocks until earlier RDMA writes to GPU `gpu` are visible to its context
/// (cuFlushGPUDirectRDMAWrites), and is a no-op where ordering already holds.
/// Fails with errc::unsupported where the GPU offers no flush.
void flush_gpu_direct_rdma_writes(int gpu);
void flush_gpu_direct_rdma_writes(int gpu, std::error_code& ec);
void flush_gpu_direct_rdma_writes(int gpu, std::error_code& ec, Diagnostics& diagnostics);

/// Whether GPU `gpu` orders RDMA writes for its own context without a flush.
bool gpu_orders_rdma_writes(int gpu);

} // namespace gpuverbs
