// choose_nic: the RDMA devices for a GPU, nearest first, from the PCIe tree
// the doctor reads (doctor.hpp).
#include "gpuverbs/detail/gpu/pcie_topology.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/gpu/doctor.hpp"

#include <algorithm>
#include <filesystem>
#include <tuple>

namespace gpuverbs {

namespace {

const char* meaning(const std::optional<PciPath>& path) {
    if (!path) return "a software device such as Soft-RoCE: its distance is unknown";
    switch (*path) {
        case PciPath::pix: return "behind the same PCIe switch as the GPU";
        case PciPath::pxb: return "across several PCIe bridges, not through the CPU";
        case PciPath::phb: return "through the CPU's PCIe host bridge";
        case PciPath::node: return "between two host bridges of one NUMA node";
        case PciPath::sys: return "across the CPU interconnect, on another NUMA node";
    }
    return "";
}

std::string class_of(const std::optional<PciPath>& path) {
    return path ? std::string(to_string(*path)) : std::string("no PCIe location");
}

} // namespace

namespace detail {

NicChoice rank_nics(const std::string& gpu, std::vector<GpuNicPath> paths,
                    const std::vector<std::pair<std::string, int>>& used) {
    auto uses = [&](const std::string& nic) {
        for (const auto& [name, n] : used) {
            if (name == nic) return n;
        }
        return 0;
    };
    // Nearer first; a device without a location after every located one; then fewer GPUs; then the name.
    std::stable_sort(paths.begin(), paths.end(), [&](const GpuNicPath& a, const GpuNicPath& b) {
        auto key = [&](const GpuNicPath& p) {
            return std::tuple(p.path ? static_cast<int>(*p.path) : 99, uses(p.nic), p.nic);
        };
        return key(a) < key(b);
    });
    NicChoice c;
    c.gpu = gpu;
    for (const GpuNicPath& p : paths) {
        c.ranked.push_back({p.nic, p.path, p.nic + ": " + class_of(p.path) + ", " + meaning(p.path)});
    }
    if (c.ranked.empty()) {
        c.why = "no RDMA device: GPU " + gpu + " has no NIC to use";
        return c;
    }
    const NicCandidate& best = c.ranked.front();
    c.why = best.nic + " is nearest to GPU " + gpu + ": " + class_of(best.path) + ", " + meaning(best.path);
    std::string same, farther;
    for (std::size_t i = 1; i < c.ranked.size(); ++i) {
        const NicCandidate& n = c.ranked[i];
        std::string& list = n.path == best.path ? same : farther;
        list += (list.empty() ? "" : ", ") + n.nic + " " + class_of(n.path);
    }
    if (!same.empty()) c.why += "; as near: " + same;
    if (!farther.empty()) c.why += "; farther: " + farther;
    return c;
}

} // namespace detail

std::vector<std::string> NicChoice::rails(std::size_t count) const {
    // Software devices (no PCIe location) only when there is no hardware one.
    const bool hardware = !ranked.empty() && ranked.front().path.has_value();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < ranked.size() && out.size() < count; ++i) {
        if (hardware && !ranked[i].path) break;
        out.push_back(ranked[i].nic);
    }
    return out;
}

namespace {
NicChoice choose_nic_impl(const std::string& gpu_bdf, const DoctorOptions& options, detail::Status& status) {
    std::string why;
    const auto gpu = detail::read_pci_chain(options.sys_root, gpu_bdf, why);
    if (!gpu) {
        status.fail(make_error_code(errc::invalid_argument), "choose_nic",
                    "no PCI device " + gpu_bdf + " under " + options.sys_root + "/bus/pci/devices (" + why + ")");
        return {};
    }
    std::vector<GpuNicPath> paths;
    for (const auto& [name, bdf] : detail::find_rdma_nics(options.sys_root)) {
        GpuNicPath p{gpu_bdf, name, std::nullopt, {}};
        std::string nic_why;
        if (!bdf.empty()) {
            if (auto nic = detail::read_pci_chain(options.sys_root, bdf, nic_why)) {
                p.path = detail::classify_path(*gpu, *nic);
                p.bridges = detail::bridges_on_path(*gpu, *nic);
            }
        }
        paths.push_back(std::move(p));
    }
    return detail::rank_nics(gpu_bdf, std::move(paths));
}
} // namespace

NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options) {
    return detail::or_throw([&](detail::Status& s) { return choose_nic_impl(gpu_bdf, options, s); });
}

NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return choose_nic_impl(gpu_bdf, options, s); });
}

NicChoice choose_nic(const std::string& gpu_bdf, const DoctorOptions& options, std::error_code& ec,
                     Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return choose_nic_impl(gpu_bdf, options, s); });
}

} // namespace gpuverbs
