// Builds a sysfs/procfs fixture tree from a topology description
// (tests/data/topology/*.topo), so the doctor's topology logic runs on
// machines we do not have. The format, one item per line (# comments):
//
//   host pci0000:00 numa 0                    a root complex and its NUMA node
//   bridge PATH [acs=off|redirect|none|unreadable]
//   gpu PATH [bar1=SIZE]                      an NVIDIA GPU (SIZE like 256M, 128G)
//   nic NAME PATH [driver=D] [ro=on|off]      an RDMA device (mlx5_0) at a PCI function, its
//                                             kernel driver, relaxed ordering in its PCIe Device Control
//   iommu BDF identity|DMA|DMA-FQ             the device's IOMMU group type
//   cmdline TEXT                              /proc/cmdline
//   driver TEXT                               /proc/driver/nvidia/version
//   params TEXT                               /proc/driver/nvidia/params (e.g. RegistryDwords:
//   "PeerMappingOverride=1;") peermem                                   /sys/module/nvidia_peermem/version exists
//
// PATH is the device's path under /sys/devices, e.g.
// pci0000:00/0000:00:01.0/0000:01:00.0; its last part is its BDF.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpuverbs::test {

class SysfsFixture {
public:
    /// Builds the tree described by `topo_file` in a fresh temporary directory.
    explicit SysfsFixture(const std::filesystem::path& topo_file) {
        namespace fs = std::filesystem;
        static int serial = 0;
        root_ = fs::temp_directory_path() /
                ("gpuverbs-fixture-" + std::to_string(::getpid()) + "-" + std::to_string(serial++));
        fs::remove_all(root_);
        fs::create_directories(sys() + "/bus/pci/devices");
        fs::create_directories(proc());
        std::ifstream in(topo_file);
        if (!in) throw std::runtime_error("no fixture " + topo_file.string());
        std::string line;
        int group = 0;
        while (std::getline(in, line)) {
            if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
            std::istringstream words(line);
            std::string kind;
            if (!(words >> kind)) continue;
            if (kind == "host") {
                std::string name, numa_word;
                int numa = -1;
                words >> name >> numa_word >> numa;
                numa_[name] = numa;
            } else if (kind == "bridge") {
                std::string path, option;
                words >> path >> option;
                std::string acs = option.starts_with("acs=") ? option.substr(4) : "off";
                add_device(path, "0x8086", "0x060400", "0x1234");
                write_config(path, acs);
            } else if (kind == "gpu") {
                std::string path, option;
                words >> path >> option;
                std::uint64_t bar1 = std::uint64_t{256} << 30;
                if (option.starts_with("bar1=")) bar1 = parse_size(option.substr(5));
                std::string dir = add_device(path, "0x10de", "0x030200", "0x2330");
                // As on H100/H200: a 64-bit BAR0 (its upper half leaves line 1 empty), then BAR1.
                std::ofstream(dir + "/resource")
                    << "0x0000104002000000 0x0000104002ffffff 0x000000000014220c\n"
                    << "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
                    << "0x0000200000000000 0x" << std::hex << (0x200000000000ull + bar1 - 1) << " 0x000000000014220c\n";
            } else if (kind == "nic") {
                std::string name, path, option;
                words >> name >> path;
                const std::string dir = add_device(path, "0x15b3", "0x020700", "0x101d");
                fs::create_directories(sys() + "/class/infiniband/" + name);
                fs::create_directory_symlink(sys() + "/devices/" + path,
                                             sys() + "/class/infiniband/" + name + "/device");
                while (words >> option) {
                    if (option.starts_with("driver=")) {
                        fs::create_directories(sys() + "/bus/pci/drivers/" + option.substr(7));
                        fs::create_directory_symlink(sys() + "/bus/pci/drivers/" + option.substr(7), dir + "/driver");
                    } else if (option.starts_with("ro=")) {
                        // 256 bytes, as a user reads them: the PCI Express capability at 0x40, Device Control at 0x48.
                        std::vector<unsigned char> config(256, 0);
                        config[0x34] = 0x40;
                        config[0x40] = 0x10;
                        config[0x48] = option == "ro=on" ? 0x10 : 0x00;
                        std::ofstream(dir + "/config", std::ios::binary)
                            .write(reinterpret_cast<const char*>(config.data()),
                                   static_cast<std::streamsize>(config.size()));
                    }
                }
            } else if (kind == "iommu") {
                std::string bdf, type;
                words >> bdf >> type;
                std::string g = sys() + "/kernel/iommu_groups/" + std::to_string(group++);
                fs::create_directories(g);
                std::ofstream(g + "/type") << type << "\n";
                fs::create_directories(sys() + "/class/iommu/dmar0");
                fs::path dev = fs::canonical(sys() + "/bus/pci/devices/" + bdf);
                fs::create_directory_symlink(g, dev / "iommu_group");
            } else if (kind == "cmdline") {
                std::string rest;
                std::getline(words >> std::ws, rest);
                std::ofstream(proc() + "/cmdline") << rest << "\n";
            } else if (kind == "driver") {
                std::string rest;
                std::getline(words >> std::ws, rest);
                fs::create_directories(proc() + "/driver/nvidia");
                std::ofstream(proc() + "/driver/nvidia/version") << rest << "\nGCC version: gcc 12\n";
            } else if (kind == "params") {
                std::string rest;
                std::getline(words >> std::ws, rest);
                fs::create_directories(proc() + "/driver/nvidia");
                std::ofstream(proc() + "/driver/nvidia/params") << "ResmanDebugLevel: 4294967295\n" << rest << "\n";
            } else if (kind == "peermem") {
                fs::create_directories(sys() + "/module/nvidia_peermem");
                std::ofstream(sys() + "/module/nvidia_peermem/version") << "580.159.04\n";
            } else {
                throw std::runtime_error("fixture " + topo_file.string() + ": unknown line '" + line + "'");
            }
        }
    }
    SysfsFixture(const SysfsFixture&) = delete;
    SysfsFixture& operator=(const SysfsFixture&) = delete;
    ~SysfsFixture() {
        std::error_code ec;
        std::filesystem::remove_all(root_, ec);
    }

    [[nodiscard]] std::string sys() const { return (root_ / "sys").string(); }
    [[nodiscard]] std::string proc() const { return (root_ / "proc").string(); }

private:
    static std::uint64_t parse_size(const std::string& s) {
        std::uint64_t n = std::stoull(s);
        switch (s.back()) {
            case 'G': return n << 30;
            case 'M': return n << 20;
            default: return n;
        }
    }

    std::string add_device(const std::string& path, const char* vendor, const char* cls, const char* device) {
        namespace fs = std::filesystem;
        std::string dir = sys() + "/devices/" + path;
        fs::create_directories(dir);
        std::string bdf = fs::path(path).filename().string();
        std::string host = path.substr(0, path.find('/'));
        std::ofstream(dir + "/vendor") << vendor << "\n";
        std::ofstream(dir + "/class") << cls << "\n";
        std::ofstream(dir + "/device") << device << "\n";
        std::ofstream(dir + "/numa_node") << (numa_.count(host) ? numa_[host] : -1) << "\n";
        fs::create_directory_symlink("../../../devices/" + path, sys() + "/bus/pci/devices/" + bdf);
        return dir;
    }

    // Config space: 4096 bytes as root reads it, with an ACS extended
    // capability at 0x100 whose control register holds `acs`'s bits.
    void write_config(const std::string& path, const std::string& acs) const {
        std::vector<unsigned char> config(acs == "unreadable" ? 64 : 4096, 0);
        if (acs == "off" || acs == "redirect") {
            config[0x100] = 0x0d; // ACS, version 1, no next capability
            config[0x102] = 0x01;
            config[0x104] = 0x5f;                            // capabilities: SV TB RR CR UF DT
            config[0x106] = acs == "redirect" ? 0x1d : 0x00; // SrcValid ReqRedir CmpltRedir UpstreamFwd
        }
        std::ofstream(sys() + "/devices/" + path + "/config", std::ios::binary)
            .write(reinterpret_cast<const char*>(config.data()), static_cast<std::streamsize>(config.size()));
    }

    std::filesystem::path root_;
    std::map<std::string, int> numa_;
};

} // namespace gpuverbs::test
