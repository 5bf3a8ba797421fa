// The PCIe tree from sysfs: chains, distance classes, ACS, IOMMU groups.
#include "gpuverbs/detail/gpu/pcie_topology.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

namespace gpuverbs::detail {
namespace {

bool is_bdf(const std::string& s) {
    static const std::regex bdf("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]");
    return std::regex_match(s, bdf);
}

bool is_host_bridge(const std::string& s) {
    static const std::regex host("pci[0-9a-f]{4}:[0-9a-f]{2}");
    return std::regex_match(s, host);
}

} // namespace

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    if (!in) return {};
    std::stringstream s;
    s << in.rdbuf();
    std::string t = s.str();
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
    return t;
}

std::optional<PciChain> read_pci_chain(const std::string& sys_root, const std::string& bdf, std::string& why) {
    std::error_code ec;
    fs::path link = fs::path(sys_root) / "bus/pci/devices" / bdf;
    fs::path real = fs::canonical(link, ec);
    if (ec) {
        why = link.string() + " does not exist";
        return std::nullopt;
    }
    PciChain chain;
    chain.bdf = bdf;
    std::vector<std::string> parts;
    for (const auto& p : real) parts.push_back(p.string());
    // The last host bridge in the path starts the PCI hierarchy (VMs nest it under ACPI or VMBus nodes).
    auto host = std::find_if(parts.rbegin(), parts.rend(), is_host_bridge);
    if (host == parts.rend()) {
        why = real.string() + " is not under a PCI host bridge";
        return std::nullopt;
    }
    chain.host_bridge = *host;
    for (auto it = host.base(); it != parts.end(); ++it) {
        if (is_bdf(*it)) chain.bridges.push_back(*it);
    }
    if (chain.bridges.empty() || chain.bridges.back() != bdf) {
        why = real.string() + " does not end in " + bdf;
        return std::nullopt;
    }
    chain.bridges.pop_back(); // the device itself
    std::string numa = read_text((link / "numa_node").string());
    chain.numa_node = numa.empty() ? -1 : std::atoi(numa.c_str());
    return chain;
}

namespace {

std::size_t common_prefix(const PciChain& a, const PciChain& b) {
    std::size_t k = 0;
    while (k < a.bridges.size() && k < b.bridges.size() && a.bridges[k] == b.bridges[k]) ++k;
    return k;
}

} // namespace

PciPath classify_path(const PciChain& a, const PciChain& b) {
    if (a.host_bridge != b.host_bridge) {
        // Unknown NUMA nodes (-1) on both sides: a single-node machine.
        return a.numa_node == b.numa_node ? PciPath::node : PciPath::sys;
    }
    std::size_t k = common_prefix(a, b);
    if (k == 0) return PciPath::phb;
    std::size_t below = std::max(a.bridges.size() - k, b.bridges.size() - k);
    return below <= 1 ? PciPath::pix : PciPath::pxb;
}

std::vector<std::string> bridges_on_path(const PciChain& a, const PciChain& b) {
    std::vector<std::string> out;
    std::size_t k = a.host_bridge == b.host_bridge ? common_prefix(a, b) : 0;
    if (k > 0) out.push_back(a.bridges[k - 1]); // the switch (or port) where the paths meet
    out.insert(out.end(), a.bridges.begin() + static_cast<std::ptrdiff_t>(k), a.bridges.end());
    out.insert(out.end(), b.bridges.begin() + static_cast<std::ptrdiff_t>(k), b.bridges.end());
    return out;
}

AcsState parse_acs(std::span<const std::uint8_t> config) {
    constexpr std::size_t extended = 0x100;
    if (config.size() < extended + 4) {
        return {AcsState::unknown,
                "unknown: only " + std::to_string(config.size()) + " bytes of config space readable (needs root)"};
    }
    auto u32 = [&](std::size_t at) {
        return std::uint32_t(config[at]) | std::uint32_t(config[at + 1]) << 8 | std::uint32_t(config[at + 2]) << 16 |
               std::uint32_t(config[at + 3]) << 24;
    };
    std::size_t at = extended;
    for (int guard = 0; guard < 64 && at >= extended && at + 8 <= config.size(); ++guard) {
        std::uint32_t header = u32(at);
        if (header == 0 || header == 0xffffffffu) break;
        if ((header & 0xffffu) == 0x000d) { // Access Control Services
            unsigned control = unsigned(config[at + 6]) | unsigned(config[at + 7]) << 8;
            static constexpr const char* names[] = {"SrcValid",    "TransBlk",   "ReqRedir",   "CmpltRedir",
                                                    "UpstreamFwd", "EgressCtrl", "DirectTrans"};
            std::string bits;
            for (unsigned i = 0; i < 7; ++i) {
                if (control & (1u << i)) bits += std::string(bits.empty() ? "" : " ") + names[i] + "+";
            }
            // Request/completion redirect and egress control send peer traffic up to the root complex.
            bool redirects = (control & ((1u << 2) | (1u << 3) | (1u << 5))) != 0;
            if (redirects) return {AcsState::redirecting, bits};
            return {AcsState::disabled, bits.empty() ? "ACSCtl all off" : bits};
        }
        at = (header >> 20) & 0xffcu;
        if (at == 0) break;
    }
    return {AcsState::absent, "no ACS capability"};
}

AcsState read_acs(const std::string& sys_root, const std::string& bdf) {
    std::ifstream in(fs::path(sys_root) / "bus/pci/devices" / bdf / "config", std::ios::binary);
    if (!in) return {AcsState::unknown, "unknown: config space not readable"};
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse_acs(bytes);
}

std::optional<bool> parse_relaxed_ordering(std::span<const std::uint8_t> config) {
    constexpr std::size_t capabilities_pointer = 0x34;
    constexpr std::uint8_t pci_express = 0x10;
    if (config.size() < capabilities_pointer + 1) return std::nullopt;
    std::size_t at = config[capabilities_pointer] & 0xfcu;
    for (int guard = 0; guard < 48 && at >= 0x40 && at + 10 <= config.size(); ++guard) {
        if (config[at] == pci_express) {
            const unsigned control = unsigned(config[at + 8]) | unsigned(config[at + 9]) << 8; // Device Control
            return (control & (1u << 4)) != 0; // Enable Relaxed Ordering
        }
        at = config[at + 1] & 0xfcu;
    }
    return std::nullopt;
}

std::optional<bool> read_relaxed_ordering(const std::string& sys_root, const std::string& bdf) {
    std::ifstream in(fs::path(sys_root) / "bus/pci/devices" / bdf / "config", std::ios::binary);
    if (!in) return std::nullopt;
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse_relaxed_ordering(bytes);
}

std::string rdma_driver(const std::string& sys_root, const std::string& name) {
    const fs::path dev = fs::path(sys_root) / "class/infiniband" / name;
    std::error_code ec;
    if (fs::exists(dev / "parent", ec)) { // software devices name the netdev they run on
        if (name.rfind("rxe", 0) == 0) return "rdma_rxe";
        if (name.rfind("siw", 0) == 0) return "siw";
        return "software";
    }
    const fs::path driver = fs::canonical(dev / "device" / "driver", ec);
    return ec ? std::string() : driver.filename().string();
}

std::string iommu_group_type(const std::string& sys_root, const std::string& bdf) {
    fs::path group = fs::path(sys_root) / "bus/pci/devices" / bdf / "iommu_group";
    std::error_code ec;
    if (!fs::exists(group, ec)) return {};
    std::string type = read_text((group / "type").string());
    return type.empty() ? "DMA" : type; // kernels before 5.11 have no type file: translated
}

std::vector<std::string> find_nvidia_gpus(const std::string& sys_root) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fs::path(sys_root) / "bus/pci/devices", ec)) {
        std::string dir = entry.path().string();
        if (read_text(dir + "/vendor") != "0x10de") continue;
        std::string cls = read_text(dir + "/class");
        if (cls.starts_with("0x0300") || cls.starts_with("0x0302")) out.push_back(entry.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::pair<std::string, std::string>> find_rdma_nics(const std::string& sys_root) {
    std::vector<std::pair<std::string, std::string>> out;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fs::path(sys_root) / "class/infiniband", ec)) {
        std::string bdf;
        fs::path device = fs::canonical(entry.path() / "device", ec);
        if (!ec && is_bdf(device.filename().string())) bdf = device.filename().string();
        ec.clear();
        out.emplace_back(entry.path().filename().string(), bdf);
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::uint64_t read_bar1_bytes(const std::string& sys_root, const std::string& bdf) {
    // NVIDIA's BAR1 (the window the NIC reaches GPU memory through) is the
    // second memory BAR: resource line 1 after a 32-bit BAR0, line 2 after a
    // 64-bit one (whose upper half leaves line 1 empty).
    std::ifstream in(fs::path(sys_root) / "bus/pci/devices" / bdf / "resource");
    std::string line;
    int seen = 0;
    for (int i = 0; i < 6 && std::getline(in, line); ++i) {
        unsigned long long start = 0, end = 0;
        std::istringstream s(line);
        s >> std::hex >> start >> end;
        if (end <= start) continue;
        if (++seen == 2) return end - start + 1;
    }
    return 0;
}

} // namespace gpuverbs::detail
