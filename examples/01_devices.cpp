// 01_devices: what this machine offers for GPUDirect RDMA.
//
// Lists every RDMA device with its ports and GID table, marks the GID a
// connection would use, then lists the GPUs the CUDA driver sees (or says why
// there are none). Run it in the Soft-RoCE rig: tests/softroce/run build/ci/examples/01_devices
#include "command_line.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <cstdio>

static int main_body(int argc, char** argv) {
    // 0. No arguments; --help says so (CLI11, as in every example).
    tools::CommandLine cli("01_devices", "What this machine offers for GPUDirect RDMA.", 2);
    cli.usage({{"", "list RDMA devices, their ports and GID tables, then the GPUs"}});
    if (auto status = cli.parse(argc, argv)) return *status;

    // 1. RDMA devices. list() is empty (not an error) on a machine without RDMA.
    std::vector<gpuverbs::DeviceInfo> devices = gpuverbs::Device::list();
    if (devices.empty()) {
        // Opening any device explains why there are none, in words to act on.
        try {
            (void)gpuverbs::Device::open_first();
        } catch (const gpuverbs::Error& e) {
            std::printf("RDMA devices: none (%s)\n", e.what());
        }
    }
    for (const gpuverbs::DeviceInfo& info : devices) {
        std::printf("RDMA device %s  GUID %s  %s, %s transport\n", info.name.c_str(),
                    gpuverbs::format_guid(info.node_guid).c_str(), std::string(to_string(info.node_type)).c_str(),
                    std::string(to_string(info.transport)).c_str());
        try {
            // 2. Open it; the Device closes itself when it goes out of scope.
            gpuverbs::Device dev = gpuverbs::Device::open(info.name);
            gpuverbs::DeviceAttributes attr = dev.query();
            for (std::uint8_t port = 1; port <= attr.port_count; ++port) {
                // 3. Each port: state, link, MTU, speed.
                gpuverbs::PortAttributes p = dev.query_port(port);
                std::printf("  port %u: %s, %s, active MTU %u, %.1f Gb/s\n", unsigned(port),
                            std::string(to_string(p.state)).c_str(), std::string(to_string(p.link_layer)).c_str(),
                            gpuverbs::mtu_bytes(p.active_mtu), p.speed_gbps);
                // 4. The GID table, and the entry select_gid() picks for connections.
                std::error_code ec;
                gpuverbs::GidEntry chosen = dev.select_gid(port, {}, ec);
                for (const gpuverbs::GidEntry& g : dev.gid_table(port)) {
                    std::printf("    GID[%u] %-28s %s%s\n", g.index, g.gid.to_string().c_str(),
                                std::string(to_string(g.type)).c_str(),
                                !ec && g.index == chosen.index ? "   <- chosen" : "");
                }
                if (ec) std::printf("    no GID to connect with: %s\n", ec.message().c_str());
            }
        } catch (const gpuverbs::Error& e) {
            std::printf("  cannot inspect %s: %s\n", info.name.c_str(), e.what());
        }
    }

    // 5. GPUs. libcuda is loaded only now, so this program runs without a driver.
    try {
        for (const gpuverbs::GpuInfo& g : gpuverbs::list_gpus()) {
            std::printf("GPU %d: %s  PCI %s  %.1f GiB  compute %d.%d\n", g.ordinal, g.name.c_str(),
                        g.pci_bus_id.c_str(), double(g.total_memory) / (1ull << 30), g.compute_capability_major,
                        g.compute_capability_minor);
        }
    } catch (const gpuverbs::Error& e) {
        std::printf("no GPU: %s\n", e.what());
    }
    return 0;
}

int main(int argc, char** argv) {
    return tools::run_main("01_devices", 1, [&] { return main_body(argc, argv); });
}
