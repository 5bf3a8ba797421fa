#include "gpuverbs/detail/verbs/rdma_presence.hpp"

#include <filesystem>
#include <system_error>

namespace gpuverbs::detail {

std::string explain_no_rdma_devices(const std::string& class_infiniband) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string create_rxe = "create a Soft-RoCE device: rdma link add rxe0 type rxe netdev <interface>";
    if (!fs::is_directory(class_infiniband, ec)) {
        return "no RDMA device on this machine: the kernel has no RDMA support loaded (" + class_infiniband +
               " does not exist). Load the NIC's RDMA driver (e.g. mlx5_ib), or " + create_rxe;
    }
    std::string names;
    for (const auto& entry : fs::directory_iterator(class_infiniband, ec)) {
        if (!names.empty()) names += ", ";
        names += entry.path().filename().string();
    }
    if (names.empty()) {
        return "no RDMA device on this machine: the kernel supports RDMA but has no RDMA device (" + class_infiniband +
               " is empty). Load the NIC's RDMA driver (e.g. mlx5_ib), or " + create_rxe;
    }
    return "no RDMA device usable from user space: the kernel has " + names + " in " + class_infiniband +
           " but no libibverbs provider claimed them. Install the providers (Debian: ibverbs-providers) and "
           "check that ib_uverbs is loaded and /dev/infiniband/uverbs* exist";
}

} // namespace gpuverbs::detail
