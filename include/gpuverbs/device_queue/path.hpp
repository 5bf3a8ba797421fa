// How a device queue's requests reach the NIC on a given GPU and NIC, and
// why: through the host proxy (proxy.hpp; any verbs NIC), or GPU-direct
// (IBGDA: GPU threads write mlx5 work requests and ring the NIC's doorbell —
// planned in docs/gpu-initiated.md, not built). The doctor answers the facts
// from the machine (gpuverbs-doctor's device-queue checks); tests inject them.
//
//   DeviceQueuePathChoice c = choose_device_queue_path(facts);
//   if (c.path == DeviceQueuePath::none) std::puts(c.why.c_str());
#pragma once

#include "gpuverbs/gpu/gpu_direct.hpp"

#include <string>
#include <string_view>

namespace gpuverbs {

/// What the choice depends on, each answered by a probe or injected.
struct DeviceQueuePathFacts {
    /// The GPU maps pinned host memory into its address space (CUDA's
    /// CAN_MAP_HOST_MEMORY and unified addressing): the ring lives there.
    Check host_mapped_memory;
    /// An RDMA device near the GPU (the doctor's choice of NIC).
    Check nic;
    /// Its kernel driver: "mlx5_core", "rdma_rxe", "siw", "efa", "irdma", …
    std::string nic_driver;
    /// The NIC can register this GPU's memory (register_gpu_memory's plan
    /// has a method): IBGDA's queues and buffers live in GPU memory.
    Check gpu_memory_reachable;
    /// The NIC's doorbell page can be mapped into the GPU: the NVIDIA driver
    /// loaded with PeerMappingOverride=1 (what NVSHMEM's IBGDA needs).
    Check doorbell_mappable;
    /// gpuverbs was built with a GPU-direct backend (none exists yet).
    bool gpu_direct_backend = false;
};

enum class DeviceQueuePath {
    proxy,      ///< a host thread (or executor) drains the ring and posts verbs
    gpu_direct, ///< GPU threads post to the NIC themselves (IBGDA)
    none,       ///< neither works here
};
/// "proxy", "gpu-direct" or "none".
std::string_view to_string(DeviceQueuePath path) noexcept;

struct DeviceQueuePathChoice {
    DeviceQueuePath path = DeviceQueuePath::none;
    Check proxy;      ///< whether the proxy path works here, or every reason not
    Check gpu_direct; ///< whether the hardware allows IBGDA, or every reason not
    std::string why;  ///< the choice in one sentence, with the other path's reasons
};

/// GPU-direct where the hardware allows it and a backend is built, else the
/// proxy where it works, else none; `why` says which and why not the other.
DeviceQueuePathChoice choose_device_queue_path(const DeviceQueuePathFacts& facts);

} // namespace gpuverbs
