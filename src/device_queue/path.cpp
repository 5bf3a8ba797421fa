// choose_device_queue_path (include/gpuverbs/device_queue/path.hpp): pure, no I/O.
#include "gpuverbs/device_queue/path.hpp"

#include <vector>

namespace gpuverbs {

namespace {

Check all_of(const std::vector<const Check*>& checks) {
    std::string reasons;
    for (const Check* c : checks) {
        if (!c->ok) reasons += (reasons.empty() ? "" : "; ") + c->reason;
    }
    return reasons.empty() ? Check::yes() : Check::no(reasons);
}

} // namespace

std::string_view to_string(DeviceQueuePath path) noexcept {
    switch (path) {
        case DeviceQueuePath::proxy: return "proxy";
        case DeviceQueuePath::gpu_direct: return "gpu-direct";
        case DeviceQueuePath::none: return "none";
    }
    return "?";
}

DeviceQueuePathChoice choose_device_queue_path(const DeviceQueuePathFacts& f) {
    DeviceQueuePathChoice c;
    c.proxy = all_of({&f.host_mapped_memory, &f.nic});
    const Check mlx5 = f.nic_driver == "mlx5_core"
                           ? Check::yes()
                           : Check::no("the NIC's driver is " + (f.nic_driver.empty() ? "unknown" : f.nic_driver) +
                                       ": IBGDA writes mlx5 work requests, so it needs an mlx5 NIC (ConnectX)");
    c.gpu_direct = f.nic.ok ? all_of({&mlx5, &f.gpu_memory_reachable, &f.doorbell_mappable}) : f.nic;
    if (c.gpu_direct.ok && f.gpu_direct_backend) {
        c.path = DeviceQueuePath::gpu_direct;
        c.why = "GPU-direct: the GPU and the NIC allow IBGDA";
    } else if (c.proxy.ok) {
        c.path = DeviceQueuePath::proxy;
        c.why = c.gpu_direct.ok ? "the proxy: IBGDA is possible on this GPU and NIC, but gpuverbs has no GPU-direct "
                                  "backend yet (docs/gpu-initiated.md plans it)"
                                : "the proxy: IBGDA is not possible here (" + c.gpu_direct.reason + ")";
    } else {
        c.path = DeviceQueuePath::none;
        c.why = "no path: the proxy cannot work here (" + c.proxy.reason + ")";
    }
    return c;
}

} // namespace gpuverbs
