#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/detail/access.hpp"
#include "gpuverbs/detail/verbs/device_core.hpp"

#include <cerrno>

namespace gpuverbs {

ProtectionDomain ProtectionDomain::create_impl(const Device& device, detail::Status& status) {
    if (!device) {
        status.fail(errc::invalid_argument, "ibv_alloc_pd", "the Device is empty");
        return {};
    }
    errno = 0;
    ibv_pd* pd = ibv_alloc_pd(device.native_handle());
    if (pd == nullptr) {
        status.fail_errno(errno != 0 ? errno : ENOMEM, "ibv_alloc_pd",
                          "cannot allocate a protection domain on " + device.name());
        return {};
    }
    return ProtectionDomain(std::make_shared<detail::PdCore>(detail::access::core(device), pd));
}

ProtectionDomain::ProtectionDomain(const Device& device)
    : ProtectionDomain(detail::or_throw([&](detail::Status& s) { return create_impl(device, s); })) {}

ProtectionDomain ProtectionDomain::create(const Device& device, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(device, s); });
}

const std::string& ProtectionDomain::device_name() const noexcept {
    static const std::string empty;
    return core_ ? core_->device()->name() : empty;
}

} // namespace gpuverbs
