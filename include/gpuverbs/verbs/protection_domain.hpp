// ProtectionDomain: the scope in which memory regions and queue pairs can see
// each other (ibv_pd).
//
//   gpuverbs::ProtectionDomain pd(device);
//
// Thread safety: safe to use from several threads; moving is not.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/device.hpp"

#include <infiniband/verbs.h>

#include <memory>
#include <system_error>

namespace gpuverbs::detail {
struct access; // detail/access.hpp: how the library reaches an object's core
class DeviceCore;
} // namespace gpuverbs::detail

namespace gpuverbs {

namespace detail {

/// The allocated ibv_pd; keeps its device open.
class PdCore {
public:
    PdCore(std::shared_ptr<DeviceCore> device, ibv_pd* pd) noexcept : device_(std::move(device)), pd_(pd) {}
    PdCore(const PdCore&) = delete;
    PdCore& operator=(const PdCore&) = delete;
    ~PdCore() { (void)ibv_dealloc_pd(pd_); }

    [[nodiscard]] ibv_pd* pd() const noexcept { return pd_; }
    [[nodiscard]] const std::shared_ptr<DeviceCore>& device() const noexcept { return device_; }

private:
    std::shared_ptr<DeviceCore> device_;
    ibv_pd* pd_;
};

} // namespace detail

/// A protection domain. Move-only; memory regions and queue pairs made in it
/// keep it alive, so it can be destroyed before them.
class ProtectionDomain {
public:
    ProtectionDomain() noexcept = default;
    /// Allocates a protection domain on `device` (throws gpuverbs::Error).
    explicit ProtectionDomain(const Device& device);
    /// The error_code form: an empty ProtectionDomain on failure.
    static ProtectionDomain create(const Device& device, std::error_code& ec);

    ProtectionDomain(ProtectionDomain&&) noexcept = default;
    ProtectionDomain& operator=(ProtectionDomain&&) noexcept = default;
    ProtectionDomain(const ProtectionDomain&) = delete;
    ProtectionDomain& operator=(const ProtectionDomain&) = delete;
    ~ProtectionDomain() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    [[nodiscard]] ibv_pd* native_handle() const noexcept { return core_ ? core_->pd() : nullptr; }
    /// The device's name, e.g. "rxe0" ("" when empty).
    [[nodiscard]] const std::string& device_name() const noexcept;

private:
    friend struct detail::access;
    static ProtectionDomain create_impl(const Device& device, detail::Status& status);
    explicit ProtectionDomain(std::shared_ptr<detail::PdCore> core) noexcept : core_(std::move(core)) {}
    std::shared_ptr<detail::PdCore> core_;
};

} // namespace gpuverbs
