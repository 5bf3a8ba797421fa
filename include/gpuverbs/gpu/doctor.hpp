// The GPUDirect RDMA readiness checklist, run for you: driver and kernel
// module, GPU attributes, peermem, rdma-core, RDMA ports and GIDs, the real
// DMA-BUF probe, memlock limit, IOMMU, and for every GPU-NIC pair the PCIe
// distance and ACS on the bridges between them. Then, per GPU, which NIC and
// which registration method register_gpu_memory would use, and the matching
// NCCL settings. The gpuverbs-doctor command prints it (or --json).
//
//   gpuverbs::DoctorReport report = gpuverbs::diagnose();
//   for (const auto& c : report.checks)
//       if (c.status == gpuverbs::CheckStatus::fail) std::puts(c.advice.c_str());
#pragma once

#include "gpuverbs/gpu/gpu_direct.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuverbs {

/// PCIe distance between a GPU and a NIC, nearest first (nvidia-smi topo -m).
enum class PciPath { pix, pxb, phb, node, sys };
/// "PIX", "PXB", "PHB", "NODE" or "SYS".
std::string_view to_string(PciPath path) noexcept;

/// A check's verdict, best first: the worst one decides the exit status.
enum class CheckStatus { ok, not_applicable, unknown, warn, fail };
/// "ok", "n/a", "unknown", "warn" or "fail".
std::string_view to_string(CheckStatus status) noexcept;

/// One item of the checklist.
struct DoctorCheck {
    std::string id; ///< stable identifier, e.g. "pcie-acs" (see docs/doctor.md)
    std::string
        subject; ///< what it is about: "system", "GPU 0000:03:00.0", "mlx5_0 port 1", "GPU 0000:03:00.0 - mlx5_0"
    CheckStatus status = CheckStatus::unknown;
    std::string found;  ///< what was found, in words
    std::string advice; ///< what to do (empty when ok)
    std::string doc;    ///< where docs/troubleshooting.md explains it, e.g. "troubleshooting.md#doctor-pcie-acs"
};

/// One GPU and one NIC, and the PCIe between them.
struct GpuNicPath {
    std::string gpu;                  ///< PCI BDF
    std::string nic;                  ///< RDMA device name
    std::optional<PciPath> path;      ///< empty when either has no PCIe location (e.g. Soft-RoCE)
    std::vector<std::string> bridges; ///< bridges peer-to-peer traffic crosses
};

/// The verdict for one GPU.
struct GpuConclusion {
    std::string gpu;                    ///< PCI BDF
    std::string nic;                    ///< the nearest RDMA device ("" when none)
    std::optional<PciPath> path;        ///< and how far it is
    std::optional<Registration> method; ///< what register_gpu_memory would use; empty when nothing works
    std::vector<Rejection> rejected;    ///< the methods ruled out, and why
    std::string nccl_ib_hca;            ///< NCCL_IB_HCA for this GPU's traffic
    std::string nccl_net_gdr_level;     ///< NCCL_NET_GDR_LEVEL that lets NCCL use GPUDirect on this path
    std::string device_queue;           ///< how kernels' requests would reach the NIC: "proxy", "gpu-direct", "none"
    std::string device_queue_why;       ///< why (choose_device_queue_path), naming the other path's reasons
};

struct DoctorReport {
    std::vector<DoctorCheck> checks;
    std::vector<GpuNicPath> paths;
    std::vector<GpuConclusion> conclusions;
    [[nodiscard]] CheckStatus worst() const noexcept;
};

/// Where the doctor reads the system from: the real one by default, fixture
/// trees in tests.
struct DoctorOptions {
    std::string sys_root = "/sys";
    std::string proc_root = "/proc";
    /// Query RDMA devices through libibverbs and GPUs through libcuda (off:
    /// only the sysfs/procfs roots are read, for fixture trees).
    bool live = true;
    /// Overrides uname's release (fixtures).
    std::string kernel_release;
};

/// Runs every check. Never throws for what it finds; each problem is a check.
DoctorReport diagnose(const DoctorOptions& options = {});

/// One RDMA device as seen from one GPU, and why it ranks where it does.
struct NicCandidate {
    std::string nic;             ///< RDMA device name
    std::optional<PciPath> path; ///< empty when the device has no PCIe location (Soft-RoCE, siw)
    std::string why;             ///< e.g. "mlx5_0: PIX, behind the same PCIe switch as the GPU"
};

/// The RDMA devices for a GPU's traffic, nearest first: same PCIe switch
/// (PIX), then several bridges (PXB), the CPU's host bridge (PHB), another
/// host bridge of the NUMA node (NODE), and across the CPU interconnect (SYS)
/// only when nothing nearer exists; devices without a PCIe location last;
/// equally near devices by name. The doctor's conclusions use the same order.
struct NicChoice {
    std::string gpu;                  ///< PCI BDF
    std::vector<NicCandidate> ranked; ///< nearest first; empty when there is no RDMA device
    std::string why;                  ///< the choice in one sentence, naming the farther ones
    /// The nearest device ("" when there is none).
    [[nodiscard]] std::string nearest() const { return ranked.empty() ? std::string() : ranked.front().nic; }
    /// Up to `count` devices as rails: the nearest class first, a farther
    /// class only when the nearer ones are used up, and software devices
    /// (no PCIe location) only when there is no hardware one.
    [[nodiscard]] std::vector<std::string> rails(std::size_t count) const;
};

/// Ranks the RDMA devices for the GPU at PCI address `gpu_bdf` ("0000:3b:00.0")
/// from sysfs (options.sys_root). Throws gpuverbs::Error (errc::invalid_argument)
/// when no such PCI device exists.
NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options = {});
/// The same without throwing: an empty NicChoice with `ec` (and the words) set.
NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options, std::error_code& ec);
NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options, std::error_code& ec,
                     Diagnostics& diagnostics);

namespace detail {
/// The pure ranking behind choose_nic and the doctor: `paths` are one GPU's
/// pairs; `used` (optional) counts GPUs already given each device, a tie-break
/// between equally near ones (as NCCL spreads GPUs over rails).
NicChoice rank_nics(const std::string& gpu, std::vector<GpuNicPath> paths,
                    const std::vector<std::pair<std::string, int>>& used = {});
} // namespace detail

/// The report as text for a person: one line per check, advice indented under
/// it, then the conclusions; ANSI colour when `colour`.
std::string format_report(const DoctorReport& report, bool colour = false);
/// The report as JSON (schema "gpuverbs-doctor/1", see docs/doctor.md).
std::string to_json(const DoctorReport& report);

} // namespace gpuverbs
