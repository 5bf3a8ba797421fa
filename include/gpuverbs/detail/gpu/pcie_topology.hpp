// Where GPUs and NICs sit in the PCIe tree, read from sysfs under a root that
// tests point at fixture trees (tests/data/topology). Pure classification and
// config-space parsing are separate from the reading, and tested on their own.
#pragma once

#include "gpuverbs/gpu/doctor.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpuverbs::detail {

/// A PCI device's place in the tree.
struct PciChain {
    std::string bdf;                  ///< "0000:03:00.0"
    std::string host_bridge;          ///< "pci0000:00": the root complex it hangs off
    std::vector<std::string> bridges; ///< from the root port down to the device's parent, as BDFs
    int numa_node = -1;               ///< -1 when the platform does not say
};

/// Reads `bdf`'s chain from <sys_root>/bus/pci/devices/<bdf> (a link into
/// <sys_root>/devices/...). Empty with `why` set when the device is not there.
std::optional<PciChain> read_pci_chain(const std::string& sys_root, const std::string& bdf, std::string& why);

/// The PCIe distance class between two devices, as nvidia-smi topo and NCCL
/// name them: PIX (one switch between them), PXB (several bridges, not the
/// host bridge), PHB (through the host bridge), NODE (between host bridges of
/// one NUMA node), SYS (across NUMA nodes).
PciPath classify_path(const PciChain& a, const PciChain& b);

/// The bridges peer-to-peer traffic between a and b crosses (ACS on any of
/// them can redirect it to the root complex).
std::vector<std::string> bridges_on_path(const PciChain& a, const PciChain& b);

/// ACS on one bridge, read from its config space.
struct AcsState {
    enum Kind { absent, disabled, redirecting, unknown } kind = unknown;
    std::string detail; ///< e.g. "ReqRedir+ CmpltRedir+", or why unknown
};
/// Parses PCIe config space (4096 bytes when read as root, 64 or 256 otherwise).
AcsState parse_acs(std::span<const std::uint8_t> config);
/// Reads <sys_root>/bus/pci/devices/<bdf>/config and parses it.
AcsState read_acs(const std::string& sys_root, const std::string& bdf);
/// Whether the function may send relaxed-ordering TLPs (the PCI Express
/// capability's Device Control, bit 4), from its config space; empty when the
/// capability is not in what was readable.
std::optional<bool> parse_relaxed_ordering(std::span<const std::uint8_t> config);
std::optional<bool> read_relaxed_ordering(const std::string& sys_root, const std::string& bdf);
/// The kernel driver of RDMA device `name` ("mlx5_core", "rdma_rxe", "siw"…;
/// "" when sysfs does not say).
std::string rdma_driver(const std::string& sys_root, const std::string& name);

/// The IOMMU's handling of one device's DMA: "identity" (passthrough),
/// "DMA"/"DMA-FQ" (translated), or empty when the device has no IOMMU group.
std::string iommu_group_type(const std::string& sys_root, const std::string& bdf);

/// PCI devices that are NVIDIA GPUs (vendor 0x10de, class 0x0300xx/0x0302xx), by BDF.
std::vector<std::string> find_nvidia_gpus(const std::string& sys_root);
/// RDMA devices in <sys_root>/class/infiniband and their PCI BDF ("" for
/// software devices such as rxe, which have none).
std::vector<std::pair<std::string, std::string>> find_rdma_nics(const std::string& sys_root);

/// BAR1 size of a PCI device from its sysfs resource file (0 when unknown).
std::uint64_t read_bar1_bytes(const std::string& sys_root, const std::string& bdf);

/// Reads a small text file, trimmed; empty when missing.
std::string read_text(const std::string& path);

} // namespace gpuverbs::detail
