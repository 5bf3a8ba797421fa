#include "gpuverbs/memory_region.hpp"

#include <cerrno>
#include <cstdio>

namespace gpuverbs {
namespace {

std::string describe_range(const void* address, std::size_t length) {
    char text[64];
    std::snprintf(text, sizeof text, "%zu bytes at %p", length, address);
    return text;
}

// Why ibv_reg_mr failed, in terms of what the caller passed.
std::string reg_mr_hint(int err, Access access) {
    switch (err) {
        case EFAULT: return "; the range is not mapped memory of this process";
        case EINVAL:
            if ((has(access, Access::remote_write) || has(access, Access::remote_atomic)) &&
                !has(access, Access::local_write)) {
                return "; remote_write and remote_atomic need local_write too";
            }
            return "";
        case ENOMEM:
        case EAGAIN:
            return "; the locked-memory limit may be too low (ulimit -l; RLIMIT_MEMLOCK) or the device is out of "
                   "memory-region resources";
        case EPERM: return "; not permitted (RLIMIT_MEMLOCK or device permissions)";
        default: return "";
    }
}

} // namespace

MemoryRegion MemoryRegion::create_impl(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                                       detail::Status& status) {
    if (!pd) {
        status.fail(errc::invalid_argument, "ibv_reg_mr", "the ProtectionDomain is empty");
        return {};
    }
    if ((has(access, Access::remote_write) || has(access, Access::remote_atomic)) &&
        !has(access, Access::local_write)) {
        // The verbs API says EINVAL for this; say exactly why before asking it.
        status.fail(errc::invalid_argument, "ibv_reg_mr",
                    "cannot register " + describe_range(address, length) + " on " + pd.device_name() +
                        ": remote_write and remote_atomic access need local_write too");
        return {};
    }
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd.native_handle(), address, length, static_cast<int>(access));
    if (mr == nullptr) {
        int err = errno != 0 ? errno : EINVAL;
        status.fail_errno(err, "ibv_reg_mr",
                          "cannot register " + describe_range(address, length) + " on " + pd.device_name() +
                              reg_mr_hint(err, access));
        return {};
    }
    MemoryRegion region;
    region.core_ = std::make_shared<detail::MrCore>(pd.core(), mr);
    region.address_ = address;
    region.length_ = length;
    region.iova_ = reinterpret_cast<std::uintptr_t>(address);
    region.lkey_ = mr->lkey;
    region.rkey_ = mr->rkey;
    region.access_ = access;
    return region;
}

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, void* address, std::size_t length, Access access)
    : MemoryRegion(detail::or_throw([&](detail::Status& s) { return create_impl(pd, address, length, access, s); })) {}

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, Access access)
    : MemoryRegion(pd, memory.data(), memory.size(), access) {}

MemoryRegion MemoryRegion::create(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                                  std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(pd, address, length, access, s); });
}

} // namespace gpuverbs
