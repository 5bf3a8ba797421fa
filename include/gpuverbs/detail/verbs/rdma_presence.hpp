// Why a machine has no usable RDMA device, read from sysfs.
#pragma once

#include <string>

namespace gpuverbs::detail {

/// A sentence explaining why ibv_get_device_list found nothing, with what to
/// do, from the state of `class_infiniband` (normally /sys/class/infiniband):
/// missing (no RDMA in the kernel), empty (RDMA support, no device), or
/// populated (devices no libibverbs provider claimed). A parameter so tests
/// can point it at fixture trees.
std::string explain_no_rdma_devices(const std::string& class_infiniband = "/sys/class/infiniband");

} // namespace gpuverbs::detail
