#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/detail/access.hpp"

#include <cerrno>
#include <cstdio>

namespace gpuverbs {
namespace {

std::string describe_range(const void* address, std::size_t length) {
    char text[64];
    std::snprintf(text, sizeof text, "%zu bytes at %p", length, address);
    return text;
}

} // namespace

namespace detail {

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

bool check_registration(const ProtectionDomain& pd, std::string_view what, Access access, std::string_view verb,
                        Status& status) {
    if (!pd) {
        status.fail(errc::invalid_argument, verb,
                    "cannot register " + std::string(what) + ": the ProtectionDomain is empty");
        return false;
    }
    if ((has(access, Access::remote_write) || has(access, Access::remote_atomic)) &&
        !has(access, Access::local_write)) {
        // The verbs API says EINVAL for this; say exactly why before asking it.
        status.fail(errc::invalid_argument, verb,
                    "cannot register " + std::string(what) + " on " + pd.device_name() +
                        ": remote_write and remote_atomic access need local_write too");
        return false;
    }
    return true;
}

} // namespace detail

MemoryRegion MemoryRegion::create_impl(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                                       detail::Status& status) {
    if (!detail::check_registration(pd, describe_range(address, length), access, "ibv_reg_mr", status)) return {};
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd.native_handle(), address, length, static_cast<int>(access));
    if (mr == nullptr) {
        int err = errno != 0 ? errno : EINVAL;
        status.fail_errno(err, "ibv_reg_mr",
                          "cannot register " + describe_range(address, length) + " on " + pd.device_name() +
                              detail::reg_mr_hint(err, access));
        return {};
    }
    return detail::adopt_memory_region(pd, mr, address, length, reinterpret_cast<std::uintptr_t>(address), access,
                                       Registration::host);
}

std::string_view to_string(Registration registration) noexcept {
    switch (registration) {
        case Registration::host: return "host";
        case Registration::dmabuf: return "DMA-BUF";
        case Registration::peermem: return "peermem";
    }
    return "?";
}

MemoryRegion detail::adopt_memory_region(const ProtectionDomain& pd, ibv_mr* mr, void* address, std::size_t length,
                                         std::uint64_t iova, Access access, Registration registration) {
    MemoryRegion region;
    region.core_ = std::make_shared<detail::MrCore>(detail::access::core(pd), mr);
    region.address_ = address;
    region.length_ = length;
    region.iova_ = iova;
    region.lkey_ = mr->lkey;
    region.rkey_ = mr->rkey;
    region.access_ = access;
    region.registration_ = registration;
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

MemoryRegion MemoryRegion::create(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                                  std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return create_impl(pd, address, length, access, s); });
}

} // namespace gpuverbs
