// diagnose(): the checklist. System-wide checks, then each GPU, each RDMA
// device and port, each GPU's nearest NIC, and the conclusions.
#include "gpuverbs/detail/gpu/gpu_registration.hpp"
#include "gpuverbs/detail/gpu/pcie_topology.hpp"
#include "gpuverbs/detail/verbs/rdma_presence.hpp"
#include "gpuverbs/device_queue/path.hpp"
#include "gpuverbs/verbs/device.hpp"

#include "gpu/gpu_direct/probes.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <tuple>

namespace gpuverbs {
namespace {

using detail::read_text;

std::string troubleshooting(const std::string& id) {
    return "troubleshooting.md#doctor-" + id;
}

std::string mib(std::uint64_t bytes) {
    if (bytes >= (std::uint64_t{1} << 30) && bytes % (std::uint64_t{1} << 30) == 0) {
        return std::to_string(bytes >> 30) + " GiB";
    }
    return std::to_string(bytes >> 20) + " MiB";
}

struct Builder {
    DoctorReport report;
    void add(std::string id, std::string subject, CheckStatus status, std::string found, std::string advice = {}) {
        std::string doc = status == CheckStatus::ok || status == CheckStatus::not_applicable ? "" : troubleshooting(id);
        report.checks.push_back(
            {std::move(id), std::move(subject), status, std::move(found), std::move(advice), std::move(doc)});
    }
};

// A GPU as sysfs and (when live) CUDA see it.
struct GpuFacts {
    std::string bdf;
    std::optional<GpuInfo> cuda; // empty when CUDA does not see it (no driver, fixtures)
    std::optional<detail::PciChain> chain;
    std::string subject() const { return "GPU " + bdf; }
};

// An RDMA device as sysfs (and when live, libibverbs) sees it.
struct NicFacts {
    std::string name;
    std::string bdf; // "" for software devices
    std::optional<detail::PciChain> chain;
    std::optional<Check> dmabuf; // the live probe's answer
};

// --- system -------------------------------------------------------------------

void check_driver(Builder& b, const DoctorOptions& o, bool any_gpu) {
    std::string version = read_text(o.proc_root + "/driver/nvidia/version");
    if (version.empty()) {
        if (!any_gpu) {
            b.add("nvidia-driver", "system", CheckStatus::not_applicable, "no NVIDIA GPU on this machine");
        } else {
            b.add("nvidia-driver", "system", CheckStatus::fail,
                  "NVIDIA GPUs are present but the NVIDIA kernel driver is not loaded (no " + o.proc_root +
                      "/driver/nvidia/version)",
                  "install the NVIDIA driver (the open kernel module, R515 or newer, for DMA-BUF) and load it");
        }
        return;
    }
    std::string first = version.substr(0, version.find('\n'));
    std::smatch m;
    std::string number = std::regex_search(first, m, std::regex("([0-9]+\\.[0-9]+(\\.[0-9]+)?)")) ? m[1].str() : "?";
    bool open = first.find("Open Kernel Module") != std::string::npos;
    std::string found = "NVIDIA driver " + number + ", " + (open ? "open kernel module" : "proprietary kernel module");
    if (o.live) {
        std::error_code ec;
        int cuda = cuda_driver_version(ec);
        if (!ec) found += ", CUDA " + std::to_string(cuda / 1000) + "." + std::to_string(cuda % 1000 / 10);
    }
    if (open) {
        b.add("nvidia-driver", "system", CheckStatus::ok, found);
    } else {
        b.add("nvidia-driver", "system", CheckStatus::warn, found,
              "DMA-BUF needs the open kernel module (R515+); with the proprietary one only nvidia-peermem works");
    }
}

void check_kernel(Builder& b, const DoctorOptions& o) {
    std::string release = o.kernel_release;
    if (release.empty()) {
        utsname u{};
        if (::uname(&u) == 0) release = u.release;
    }
    auto version = detail::parse_kernel_release(release);
    if (!version) {
        b.add("kernel-dmabuf", "system", CheckStatus::unknown, "cannot read the kernel release '" + release + "'");
    } else if (*version < std::pair{5, 12}) {
        b.add("kernel-dmabuf", "system", CheckStatus::warn, "Linux " + release + " (DMA-BUF registration needs 5.12)",
              "update the kernel to 5.12 or newer for DMA-BUF, or use nvidia-peermem");
    } else {
        b.add("kernel-dmabuf", "system", CheckStatus::ok, "Linux " + release + " (5.12 or newer: DMA-BUF capable)");
    }
}

void check_peermem(Builder& b, const DoctorOptions& o, bool any_gpu) {
    Check p = probe_peermem(o.sys_root);
    if (p.ok) {
        b.add("peermem", "system", CheckStatus::ok, "nvidia_peermem (or nv_peer_mem) is loaded");
    } else if (!any_gpu) {
        b.add("peermem", "system", CheckStatus::not_applicable, "no NVIDIA GPU on this machine");
    } else {
        b.add("peermem", "system", CheckStatus::warn, p.reason,
              "needed only where DMA-BUF does not work: `modprobe nvidia-peermem`");
    }
}

void check_rdma_core(Builder& b, const DoctorOptions& o) {
    if (!o.live) {
        b.add("rdma-core", "system", CheckStatus::unknown, "not probed (fixture run)");
        return;
    }
    std::string found = "libibverbs";
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&ibv_get_device_list), &info) != 0 && info.dli_fname != nullptr) {
        std::error_code ec;
        auto real = std::filesystem::canonical(info.dli_fname, ec);
        std::smatch m;
        std::string name = ec ? std::string(info.dli_fname) : real.filename().string();
        found = name;
        // libibverbs.so.1.14.44.0: the third number is the rdma-core release.
        if (std::regex_search(name, m, std::regex("\\.so\\.1\\.[0-9]+\\.([0-9]+)"))) {
            found = "rdma-core " + m[1].str() + " (" + name + ")";
        }
    }
    if (detail::reg_dmabuf_mr_function() == nullptr) {
        b.add("rdma-core", "system", CheckStatus::warn, found + " without ibv_reg_dmabuf_mr",
              "update rdma-core to 34 or newer for DMA-BUF");
    } else {
        b.add("rdma-core", "system", CheckStatus::ok, found + ", ibv_reg_dmabuf_mr present");
    }
}

void check_memlock(Builder& b, const DoctorOptions& o) {
    if (!o.live) {
        b.add("memlock", "system", CheckStatus::unknown, "not probed (fixture run)");
        return;
    }
    rlimit limit{};
    if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
        b.add("memlock", "system", CheckStatus::unknown, "getrlimit(RLIMIT_MEMLOCK) failed");
    } else if (limit.rlim_cur == RLIM_INFINITY) {
        b.add("memlock", "system", CheckStatus::ok, "RLIMIT_MEMLOCK unlimited");
    } else {
        b.add("memlock", "system", CheckStatus::warn,
              "RLIMIT_MEMLOCK is " + mib(limit.rlim_cur) + ": registering more host memory than that fails",
              "raise it: `ulimit -l unlimited`, LimitMEMLOCK=infinity (systemd), or --ulimit memlock=-1 (docker)");
    }
}

void check_iommu(Builder& b, const DoctorOptions& o, const std::vector<GpuFacts>& gpus,
                 const std::vector<NicFacts>& nics) {
    std::string cmdline = read_text(o.proc_root + "/cmdline");
    std::vector<std::string> translated, passthrough;
    auto look = [&](const std::string& name, const std::string& bdf) {
        if (bdf.empty()) return;
        std::string type = detail::iommu_group_type(o.sys_root, bdf);
        if (type == "identity") passthrough.push_back(name);
        if (type.starts_with("DMA")) translated.push_back(name + " (" + type + ")");
    };
    for (const auto& g : gpus) look(g.subject(), g.bdf);
    for (const auto& n : nics) look(n.name, n.bdf);
    std::string on_cmdline;
    for (const char* key : {"iommu=", "intel_iommu=", "amd_iommu=", "iommu.passthrough="}) {
        for (std::size_t at = cmdline.find(key); at != std::string::npos; at = cmdline.find(key, at + 1)) {
            if (at != 0 && cmdline[at - 1] != ' ') continue;
            on_cmdline += (on_cmdline.empty() ? "" : " ") + cmdline.substr(at, cmdline.find(' ', at) - at);
        }
    }
    std::string cmd =
        on_cmdline.empty() ? "no IOMMU options on the kernel command line" : "kernel command line: " + on_cmdline;
    if (!translated.empty()) {
        std::string list;
        for (const auto& t : translated) list += (list.empty() ? "" : ", ") + t;
        b.add(
            "iommu", "system", CheckStatus::warn, "the IOMMU translates DMA for " + list + "; " + cmd,
            "peer-to-peer DMA through a translating IOMMU fails or is slow: boot with iommu=pt (Intel: intel_iommu=on "
            "iommu=pt)");
    } else if (!passthrough.empty()) {
        b.add("iommu", "system", CheckStatus::ok, "IOMMU in passthrough for the GPUs and NICs; " + cmd);
    } else {
        std::error_code ec;
        bool any = !std::filesystem::is_empty(o.sys_root + "/class/iommu", ec) && !ec;
        b.add("iommu", "system", CheckStatus::ok,
              std::string(any ? "an IOMMU is present but groups none of the GPUs or NICs" : "no IOMMU is active") +
                  "; " + cmd);
    }
}

// --- GPUs ---------------------------------------------------------------------

void check_gpu(Builder& b, const DoctorOptions& o, const GpuFacts& g, const std::string& cuda_problem) {
    std::string numa = g.chain ? std::to_string(g.chain->numa_node) : "?";
    if (g.cuda) {
        b.add("gpu", g.subject(), CheckStatus::ok,
              g.cuda->name + ", CUDA device " + std::to_string(g.cuda->ordinal) + ", compute " +
                  std::to_string(g.cuda->compute_capability_major) + "." +
                  std::to_string(g.cuda->compute_capability_minor) + ", " + mib(g.cuda->total_memory) + ", NUMA node " +
                  numa);
    } else {
        std::string device = read_text(o.sys_root + "/bus/pci/devices/" + g.bdf + "/device");
        b.add("gpu", g.subject(), o.live ? CheckStatus::fail : CheckStatus::unknown,
              "NVIDIA GPU (PCI device " + device + "), NUMA node " + numa + "; CUDA does not see it: " + cuda_problem,
              o.live ? "check nvidia-smi, the driver installation and CUDA_VISIBLE_DEVICES" : "");
    }
    std::uint64_t bar1 = detail::read_bar1_bytes(o.sys_root, g.bdf);
    if (bar1 == 0) {
        b.add("gpu-bar1", g.subject(), CheckStatus::unknown, "BAR1 size not readable from sysfs");
    } else if (g.cuda && bar1 < g.cuda->total_memory) {
        b.add("gpu-bar1", g.subject(), CheckStatus::warn,
              "BAR1 is " + mib(bar1) + ", smaller than the GPU's " + mib(g.cuda->total_memory) +
                  ": at most that much GPU memory can be registered for RDMA at once",
              "enable large BAR / Resizable BAR in the BIOS, or register less and stage");
    } else {
        b.add("gpu-bar1", g.subject(), CheckStatus::ok, "BAR1 is " + mib(bar1));
    }
    if (!g.cuda) {
        b.add("gpu-attributes", g.subject(), CheckStatus::unknown, "CUDA attributes not read: " + cuda_problem);
        return;
    }
    std::error_code ec;
    GpuDirectAttributes a = gpu_direct_attributes(g.cuda->ordinal, ec);
    if (ec) {
        b.add("gpu-attributes", g.subject(), CheckStatus::unknown, "cannot read CUDA attributes: " + ec.message());
        return;
    }
    if (a.gpu_direct_rdma) {
        b.add("gpu-direct-rdma", g.subject(), CheckStatus::ok, "GPUDirect RDMA supported");
    } else {
        b.add("gpu-direct-rdma", g.subject(), CheckStatus::fail,
              "GPUDirect RDMA not supported (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0)",
              "this GPU cannot be reached by a NIC: stage transfers through host memory");
    }
    Check dmabuf = probe_gpu_dmabuf(g.cuda->ordinal);
    if (dmabuf.ok) {
        b.add("gpu-dmabuf", g.subject(), CheckStatus::ok, "can export dma-bufs (driver, attribute and kernel)");
    } else {
        b.add("gpu-dmabuf", g.subject(), CheckStatus::warn, dmabuf.reason,
              "DMA-BUF is out; nvidia-peermem still works");
    }
    b.add("gpu-vmm-rdma", g.subject(), a.vmm_gpu_direct ? CheckStatus::ok : CheckStatus::warn,
          a.vmm_gpu_direct ? "VMM (cuMemCreate) memory can be used for GPUDirect RDMA"
                           : "VMM memory cannot be used for GPUDirect RDMA",
          a.vmm_gpu_direct ? "" : "allocate RDMA buffers with cuMemAlloc (GpuAllocation::device)");
    bool host_flush = (a.flush_writes_options & 1) != 0;
    std::string ordering = a.writes_ordering >= 200 ? "all devices" : a.writes_ordering >= 100 ? "the owner" : "none";
    std::string found = "RDMA writes ordered for " + ordering + " (" + std::to_string(a.writes_ordering) +
                        "), host flush " + (host_flush ? "available" : "not available");
    if (a.writes_ordering >= 100) {
        b.add("gpu-write-ordering", g.subject(), CheckStatus::ok, found + ": no flush needed");
    } else if (host_flush) {
        b.add("gpu-write-ordering", g.subject(), CheckStatus::ok,
              found + ": call flush_gpu_direct_rdma_writes before GPU work reads RDMA-written data");
    } else {
        b.add("gpu-write-ordering", g.subject(), CheckStatus::warn, found,
              "order consumers yourself: a loopback RDMA read after the data, or a flag polled by a kernel");
    }
}

// --- RDMA devices -------------------------------------------------------------

void check_nics(Builder& b, const DoctorOptions& o, std::vector<NicFacts>& nics) {
    if (nics.empty()) {
        b.add("rdma-devices", "system", CheckStatus::fail,
              detail::explain_no_rdma_devices(o.sys_root + "/class/infiniband"),
              "GPUDirect RDMA needs an RDMA NIC (InfiniBand or RoCE) with its driver loaded");
        return;
    }
    std::string names;
    for (const auto& n : nics)
        names += (names.empty() ? "" : ", ") + n.name + (n.bdf.empty() ? " (software)" : " (" + n.bdf + ")");
    b.add("rdma-devices", "system", CheckStatus::ok, names);
    for (const auto& n : nics) {
        if (n.bdf.empty()) continue; // software: no PCIe function of its own
        const std::optional<bool> relaxed = detail::read_relaxed_ordering(o.sys_root, n.bdf);
        if (!relaxed) {
            b.add("nic-relaxed-ordering", n.name, CheckStatus::unknown,
                  "the PCI Express capability of " + n.bdf + " is not readable (needs root)");
        } else {
            b.add("nic-relaxed-ordering", n.name, CheckStatus::ok,
                  *relaxed ? "relaxed ordering is enabled on " + n.bdf +
                                 ": regions registered with Access::relaxed_ordering may see a put's signal land "
                                 "before its bytes (gpuverbs never sets it on its own: keep it off for a device "
                                 "queue's windows)"
                           : "relaxed ordering is disabled on " + n.bdf + ": the NIC's writes reach memory in order");
        }
    }
    if (!o.live) return;
    for (auto& n : nics) {
        std::error_code ec;
        Device dev = Device::open(n.name, ec);
        if (ec) {
            b.add("rdma-device-open", n.name, CheckStatus::fail, "cannot open: " + ec.message(),
                  "check /dev/infiniband permissions and that a libibverbs provider supports it");
            continue;
        }
        DeviceAttributes attr = dev.query(ec);
        for (std::uint8_t port = 1; !ec && port <= attr.port_count; ++port) {
            std::string subject = n.name + " port " + std::to_string(port);
            PortAttributes p = dev.query_port(port, ec);
            if (ec) break;
            std::string link = std::string(to_string(p.link_layer)) + ", " + std::to_string(int(p.speed_gbps)) +
                               " Gb/s, active MTU " + std::to_string(mtu_bytes(p.active_mtu)) + " (max " +
                               std::to_string(mtu_bytes(p.max_mtu)) + ")";
            if (p.state == PortState::active) {
                b.add("port-state", subject, CheckStatus::ok, "ACTIVE, " + link);
            } else {
                b.add("port-state", subject, CheckStatus::fail, std::string(to_string(p.state)) + ", " + link,
                      "bring the link up: cable, switch port, `ip link set <netdev> up` for RoCE");
                continue;
            }
            if (p.link_layer == LinkLayer::infiniband) {
                if (p.lid == 0) {
                    b.add("port-gid", subject, CheckStatus::fail, "LID 0: no subnet manager has configured the port",
                          "run a subnet manager (opensm) on the fabric");
                } else {
                    b.add("port-gid", subject, CheckStatus::ok, "LID " + std::to_string(p.lid));
                }
                continue;
            }
            std::error_code gid_ec;
            try {
                GidEntry g = dev.select_gid(port);
                b.add("port-gid", subject, CheckStatus::ok,
                      "GID[" + std::to_string(g.index) + "] " + g.gid.to_string() + " " +
                          std::string(to_string(g.type)) + " would be used");
            } catch (const Error& e) {
                b.add("port-gid", subject, CheckStatus::fail, e.what(),
                      "give the port's network interface an IP address so a RoCE v2 GID appears");
            }
        }
        ProtectionDomain pd = ProtectionDomain::create(dev, ec);
        if (ec) {
            n.dmabuf = Check::no("cannot allocate a protection domain on " + n.name + ": " + ec.message());
        } else {
            n.dmabuf = probe_nic_dmabuf(pd);
        }
        if (n.dmabuf->ok) {
            b.add("nic-dmabuf", n.name, CheckStatus::ok, "registers dma-buf memory regions (probe answered EBADF)");
        } else {
            b.add("nic-dmabuf", n.name, CheckStatus::warn, n.dmabuf->reason,
                  "DMA-BUF is out on this NIC; nvidia-peermem still works");
        }
    }
}

// --- GPU and NIC together -------------------------------------------------------

void check_path(Builder& b, const DoctorOptions& o, const GpuFacts& g, const NicFacts& n, const GpuNicPath& p) {
    std::string subject = g.subject() + " - " + n.name;
    if (!p.path) {
        b.add("pcie-path", subject, CheckStatus::not_applicable,
              n.bdf.empty() ? n.name + " is a software device with no PCIe location (e.g. Soft-RoCE)"
                            : "the PCIe location of one of them is unknown");
        return;
    }
    std::string cls(to_string(*p.path));
    switch (*p.path) {
        case PciPath::pix:
        case PciPath::pxb:
            b.add("pcie-path", subject, CheckStatus::ok, cls + ": peer-to-peer stays below the CPU");
            break;
        case PciPath::phb:
            b.add("pcie-path", subject, CheckStatus::warn,
                  cls +
                      ": traffic goes through the CPU's host bridge; slower, and NCCL does not use GPUDirect here by "
                      "default",
                  "put the NIC under the GPU's PCIe switch if the platform allows; NCCL: NCCL_NET_GDR_LEVEL=PHB");
            break;
        case PciPath::node:
        case PciPath::sys:
            b.add("pcie-path", subject, *p.path == PciPath::sys ? CheckStatus::fail : CheckStatus::warn,
                  cls + (*p.path == PciPath::sys ? ": the NIC is on another CPU socket than the GPU"
                                                 : ": between host bridges of one NUMA node"),
                  "use a NIC attached to the GPU's own socket or switch (see the best NIC per GPU)");
            break;
    }
    if (p.bridges.empty()) {
        b.add("pcie-acs", subject, CheckStatus::not_applicable, "no PCIe bridge between them");
        return;
    }
    std::string redirecting, unknown, fine;
    for (const auto& bridge : p.bridges) {
        detail::AcsState acs = detail::read_acs(o.sys_root, bridge);
        std::string item = bridge + " " + acs.detail;
        if (acs.kind == detail::AcsState::redirecting) redirecting += (redirecting.empty() ? "" : ", ") + item;
        if (acs.kind == detail::AcsState::unknown) unknown += (unknown.empty() ? "" : ", ") + bridge;
        if (acs.kind == detail::AcsState::disabled || acs.kind == detail::AcsState::absent) {
            fine += (fine.empty() ? "" : ", ") + item;
        }
    }
    if (!redirecting.empty()) {
        b.add("pcie-acs", subject, CheckStatus::fail,
              "ACS redirects peer-to-peer traffic to the root complex on " + redirecting,
              "disable ACS on these bridges (BIOS: ACS/IOMMU settings; or `setpci -s <bridge> ECAP_ACS+6.w=0000` "
              "at boot)");
    } else if (!unknown.empty()) {
        b.add("pcie-acs", subject, CheckStatus::unknown,
              "unknown, needs root: config space of " + unknown + " is not readable",
              "run gpuverbs-doctor as root to read ACS");
    } else {
        b.add("pcie-acs", subject, CheckStatus::ok, "no ACS redirection on " + fine);
    }
}

// --- the device queue (device_queue/path.hpp) ---------------------------------------

/// Whether the NVIDIA driver lets a NIC's doorbell be mapped into the GPU
/// (PeerMappingOverride=1 in its RegistryDwords), as IBGDA needs.
Check probe_peer_mapping_override(const DoctorOptions& o) {
    const std::string params = read_text(o.proc_root + "/driver/nvidia/params");
    if (params.empty()) {
        return Check::no("the NVIDIA driver's parameters (" + o.proc_root +
                         "/driver/nvidia/params) cannot be read (is the NVIDIA driver loaded?)");
    }
    if (params.find("PeerMappingOverride=1") != std::string::npos) return Check::yes();
    return Check::no(
        "the NVIDIA driver was loaded without PeerMappingOverride=1 (NVreg_RegistryDwords), so a NIC's "
        "doorbell cannot be mapped into the GPU");
}

/// The device queue's checks for GPU `g` and its nearest NIC `n` (none: no
/// NIC), given what registration found; fills the conclusion's path.
void check_device_queue(Builder& b, const DoctorOptions& o, const GpuFacts& g, const NicFacts* n,
                        const GpuRegistrationPlan& plan, const std::string& cuda_problem, GpuConclusion& c) {
    DeviceQueuePathFacts f;
    if (!g.cuda) {
        f.host_mapped_memory = Check::no("CUDA does not see the GPU: " + cuda_problem);
    } else {
        std::error_code ec;
        const GpuDirectAttributes a = gpu_direct_attributes(g.cuda->ordinal, ec);
        if (ec) {
            f.host_mapped_memory = Check::no("the GPU's CUDA attributes cannot be read: " + ec.message());
        } else {
            f.host_mapped_memory =
                a.can_map_host_memory && a.unified_addressing
                    ? Check::yes()
                    : Check::no(std::string("the GPU cannot map pinned host memory, where the ring lives "
                                            "(CAN_MAP_HOST_MEMORY ") +
                                (a.can_map_host_memory ? "1" : "0") + ", UNIFIED_ADDRESSING " +
                                (a.unified_addressing ? "1" : "0") + ")");
            b.add("device-queue-atomics", g.subject(), CheckStatus::ok,
                  std::string("host-native atomics ") + (a.host_native_atomics ? "yes" : "no") +
                      ": not needed, the ring's reservation counter is in GPU memory and the GPU only loads and "
                      "stores host memory");
        }
    }
    f.nic = n != nullptr ? Check::yes() : Check::no("there is no RDMA device");
    f.nic_driver = n != nullptr ? detail::rdma_driver(o.sys_root, n->name) : std::string();
    f.gpu_memory_reachable =
        plan.order.empty()
            ? Check::no("the NIC cannot register this GPU's memory (" + describe_rejections(plan.rejected) + ")")
            : Check::yes();
    f.doorbell_mappable = probe_peer_mapping_override(o);
    const DeviceQueuePathChoice choice = choose_device_queue_path(f);
    c.device_queue = std::string(to_string(choice.path));
    c.device_queue_why = choice.why;
    if (choice.path == DeviceQueuePath::none) {
        b.add("device-queue", g.subject(), CheckStatus::warn, "kernels cannot start transfers here: " + choice.why,
              "GPU-initiated transfers (DeviceQueueProxy) need the GPU to map pinned host memory and an RDMA "
              "device; host-initiated transfers are unaffected");
    } else {
        b.add("device-queue", g.subject(), CheckStatus::ok,
              "kernels' requests would go through " + choice.why +
                  (n != nullptr ? " (" + n->name + (f.nic_driver.empty() ? "" : ", " + f.nic_driver) + ")" : ""));
    }
    b.add("device-queue-gpu-direct", g.subject(), choice.gpu_direct.ok ? CheckStatus::ok : CheckStatus::not_applicable,
          choice.gpu_direct.ok ? "IBGDA would be possible with this GPU and NIC (gpuverbs has no GPU-direct backend "
                                 "yet: the proxy is used)"
                               : "IBGDA is not possible: " + choice.gpu_direct.reason);
}

std::string nic_list(const std::vector<GpuConclusion>& c) {
    std::vector<std::string> seen;
    for (const auto& x : c) {
        if (!x.nic.empty() && std::find(seen.begin(), seen.end(), x.nic) == seen.end()) seen.push_back(x.nic);
    }
    std::string out;
    for (const auto& s : seen) out += (out.empty() ? "" : ",") + s;
    return out;
}

} // namespace

std::string_view to_string(PciPath path) noexcept {
    switch (path) {
        case PciPath::pix: return "PIX";
        case PciPath::pxb: return "PXB";
        case PciPath::phb: return "PHB";
        case PciPath::node: return "NODE";
        case PciPath::sys: return "SYS";
    }
    return "?";
}

std::string_view to_string(CheckStatus status) noexcept {
    switch (status) {
        case CheckStatus::ok: return "ok";
        case CheckStatus::not_applicable: return "n/a";
        case CheckStatus::unknown: return "unknown";
        case CheckStatus::warn: return "warn";
        case CheckStatus::fail: return "fail";
    }
    return "?";
}

CheckStatus DoctorReport::worst() const noexcept {
    CheckStatus w = CheckStatus::ok;
    for (const auto& c : checks) w = std::max(w, c.status);
    return w;
}

DoctorReport diagnose(const DoctorOptions& o) {
    Builder b;
    // What is there: GPUs and NICs from sysfs, merged with CUDA's view.
    std::vector<GpuFacts> gpus;
    // Why CUDA does not describe a GPU sysfs shows: not asked, no driver, or hidden from CUDA.
    std::string cuda_problem =
        o.live ? "the driver does not list it (hidden by CUDA_VISIBLE_DEVICES?)" : "not queried (fixture run)";
    bool cuda_failed = false;
    std::vector<GpuInfo> cuda_gpus;
    if (o.live) {
        try {
            cuda_gpus = list_gpus(); // the throwing form: its message says why
        } catch (const Error& e) {
            cuda_problem = e.what();
            cuda_failed = true;
        }
    }
    for (const auto& bdf : detail::find_nvidia_gpus(o.sys_root)) {
        GpuFacts g;
        g.bdf = bdf;
        for (const auto& c : cuda_gpus) {
            if (c.pci_bus_id == bdf) g.cuda = c;
        }
        std::string why;
        g.chain = detail::read_pci_chain(o.sys_root, bdf, why);
        gpus.push_back(std::move(g));
    }
    std::vector<NicFacts> nics;
    for (const auto& [name, bdf] : detail::find_rdma_nics(o.sys_root)) {
        NicFacts n;
        n.name = name;
        n.bdf = bdf;
        std::string why;
        if (!bdf.empty()) n.chain = detail::read_pci_chain(o.sys_root, bdf, why);
        nics.push_back(std::move(n));
    }

    check_driver(b, o, !gpus.empty());
    check_kernel(b, o);
    check_peermem(b, o, !gpus.empty());
    check_rdma_core(b, o);
    check_memlock(b, o);
    check_iommu(b, o, gpus, nics);
    if (gpus.empty()) {
        std::string found = "no NVIDIA GPU in " + o.sys_root + "/bus/pci/devices";
        if (cuda_failed) {
            found += " (" + cuda_problem + ")";
        }
        b.add("gpus", "system", CheckStatus::fail, found, "GPUDirect RDMA needs an NVIDIA data-center GPU");
    }
    for (const auto& g : gpus) check_gpu(b, o, g, cuda_problem);
    check_nics(b, o, nics);

    // Every GPU-NIC pair, then each GPU's nearest NIC and the verdict.
    std::map<std::string, int> used; // GPUs already given each NIC
    for (const auto& g : gpus) {
        std::vector<GpuNicPath> mine;
        std::optional<std::size_t> best; // nearest by PCIe class; a NIC without a location only if none has one
        for (std::size_t i = 0; i < nics.size(); ++i) {
            GpuNicPath p{g.bdf, nics[i].name, std::nullopt, {}};
            if (g.chain && nics[i].chain) {
                p.path = detail::classify_path(*g.chain, *nics[i].chain);
                p.bridges = detail::bridges_on_path(*g.chain, *nics[i].chain);
            }
            mine.push_back(std::move(p));
        }
        // Nearer wins; between equally near NICs, the one fewer GPUs use (as NCCL spreads rails): choose_nic's order.
        const NicChoice choice =
            detail::rank_nics(g.bdf, mine, std::vector<std::pair<std::string, int>>(used.begin(), used.end()));
        for (std::size_t i = 0; i < nics.size(); ++i) {
            if (!choice.ranked.empty() && nics[i].name == choice.nearest()) best = i;
        }
        GpuConclusion c;
        c.gpu = g.bdf;
        if (best) {
            const NicFacts& n = nics[*best];
            const GpuNicPath& p = mine[*best];
            check_path(b, o, g, n, p);
            c.nic = n.name;
            ++used[n.name];
            c.path = p.path;
            c.nccl_ib_hca = n.name;
            if (p.path) c.nccl_net_gdr_level = std::string(to_string(*p.path));
        }
        b.report.paths.insert(b.report.paths.end(), mine.begin(), mine.end());
        GpuDirectProbes probes;
        if (g.cuda) {
            probes.gpu_direct_rdma = probe_gpu_direct_rdma(g.cuda->ordinal);
            probes.gpu_dmabuf = probe_gpu_dmabuf(g.cuda->ordinal);
        } else {
            probes.gpu_direct_rdma = Check::no("CUDA does not see this GPU: " + cuda_problem);
            probes.gpu_dmabuf = probes.gpu_direct_rdma;
        }
        probes.memory = Check::yes(); // GpuBuffer memory
        probes.peermem = probe_peermem(o.sys_root);
        if (!best) {
            probes.nic_dmabuf = Check::no("no RDMA device");
        } else if (nics[*best].dmabuf) {
            probes.nic_dmabuf = *nics[*best].dmabuf;
        } else {
            probes.nic_dmabuf = Check::no("the NIC " + nics[*best].name + " was not probed");
        }
        GpuRegistrationPlan plan = plan_gpu_registration(GpuRegistration::automatic, probes);
        if (best && !plan.order.empty()) {
            c.method = plan.order.front();
            b.add("registration", g.subject(), CheckStatus::ok,
                  "register_gpu_memory would use " + std::string(to_string(*c.method)) + " with " + c.nic);
        } else {
            b.add("registration", g.subject(), CheckStatus::fail,
                  "no registration method works: " + describe_rejections(plan.rejected),
                  "fix the first reason of the method you want (DMA-BUF preferred)");
        }
        c.rejected = plan.rejected;
        check_device_queue(b, o, g, best ? &nics[*best] : nullptr, plan, cuda_problem, c);
        b.report.conclusions.push_back(std::move(c));
    }
    if (!b.report.conclusions.empty()) {
        std::string hca = nic_list(b.report.conclusions);
        PciPath worst = PciPath::pix;
        bool any = false;
        for (const auto& c : b.report.conclusions) {
            if (c.path) {
                worst = std::max(worst, *c.path);
                any = true;
            }
        }
        if (!hca.empty()) {
            std::string found = "NCCL_IB_HCA=" + hca;
            if (any) {
                found += worst > PciPath::pxb ? " NCCL_NET_GDR_LEVEL=" + std::string(to_string(worst))
                                              : " (NCCL_NET_GDR_LEVEL default PXB suffices)";
            }
            b.add("nccl", "system", CheckStatus::ok, found);
        }
    }
    return b.report;
}

} // namespace gpuverbs
