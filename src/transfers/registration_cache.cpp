// RegistrationCache::get for GPU memory (registration_cache.hpp): the buffer
// id the driver gives each allocation keeps a reused address from being
// served a freed buffer's registration.
#include "gpuverbs/transfers/registration_cache.hpp"

#include <string>
#include <vector>

namespace gpuverbs {

namespace {

/// The words of a failed error_code form, into `status`.
void keep(detail::Status& status, std::error_code ec, const Diagnostics& words) {
    status.fail(ec, words.verb(), words.detail());
}

} // namespace

std::shared_ptr<const MemoryRegion> RegistrationCache::host_impl(std::span<std::byte> memory, Access access,
                                                                 detail::Status& status) {
    auto begin = reinterpret_cast<std::uint64_t>(memory.data());
    auto end = begin + memory.size();
    if (auto hit = index_.find(begin, end, access)) return *hit;
    auto miss = index_.plan_miss(begin, end, access);
    // The union starts at or before `memory`, inside mapped memory the cache registered before.
    auto* start = reinterpret_cast<std::byte*>(miss.begin); // NOLINT(performance-no-int-to-ptr)
    std::error_code ec;
    Diagnostics words;
    MemoryRegion mr =
        MemoryRegion::create(*pd_, start, static_cast<std::size_t>(miss.end - miss.begin), miss.access, ec, words);
    return adopt(miss, std::move(mr), ec, words, status);
}

std::shared_ptr<const MemoryRegion> RegistrationCache::gpu_impl(const GpuMemory& memory, Access access,
                                                                GpuRegistration method, detail::Status& status,
                                                                std::vector<Rejection>* rejections) {
    // Asked now, not taken from `memory`: the caller's description may predate a free and a new allocation.
    std::error_code ec;
    const GpuMemory now = GpuMemory::from_address(memory.address, memory.size, ec);
    if (ec) {
        status.fail(ec, "RegistrationCache::get",
                    "cannot describe the GPU memory at " + std::to_string(memory.address) + ": " + ec.message());
        return nullptr;
    }
    const std::uint64_t begin = now.address;
    const std::uint64_t end = begin + now.size;
    // A driver that cannot say (id 0): the allocation's base stands in (it
    // cannot tell a reused address, documented) and keeps GPU and host entries apart.
    const std::uint64_t owner = now.buffer_id != 0 ? now.buffer_id : now.allocation_base | (std::uint64_t{1} << 63);
    if (auto hit = index_.find(begin, end, access, owner)) return *hit;
    auto miss = index_.plan_miss(begin, end, access, owner);
    // Never a registration past the allocation (a merge with entries of an allocation that is gone).
    if (miss.begin < now.allocation_base || miss.end > now.allocation_base + now.allocation_size) {
        miss.begin = begin;
        miss.end = end;
        miss.access = access;
    }
    // The union of this buffer's cached ranges lies inside its one allocation.
    GpuMemory whole = now;
    whole.address = miss.begin;
    whole.size = static_cast<std::size_t>(miss.end - miss.begin);
    Diagnostics words;
    MemoryRegion mr = register_gpu_memory(*pd_, whole, miss.access, method, ec, words, rejections);
    return adopt(miss, std::move(mr), ec, words, status);
}

std::shared_ptr<const MemoryRegion> RegistrationCache::adopt(const Index::Miss& miss, MemoryRegion mr,
                                                             const std::error_code& ec, const Diagnostics& words,
                                                             detail::Status& status) {
    if (ec) {
        keep(status, ec, words);
        return nullptr;
    }
    auto shared = std::make_shared<const MemoryRegion>(std::move(mr));
    index_.insert(miss, shared);
    return shared;
}

std::shared_ptr<const MemoryRegion> RegistrationCache::get(std::span<std::byte> memory, Access access) {
    return detail::or_throw([&](detail::Status& s) { return host_impl(memory, access, s); });
}
std::shared_ptr<const MemoryRegion> RegistrationCache::get(std::span<std::byte> memory, Access access,
                                                           std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return host_impl(memory, access, s); });
}
std::shared_ptr<const MemoryRegion> RegistrationCache::get(std::span<std::byte> memory, Access access,
                                                           std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return host_impl(memory, access, s); });
}

std::shared_ptr<const MemoryRegion> RegistrationCache::get(const GpuMemory& memory, Access access,
                                                           GpuRegistration method) {
    // As register_gpu_memory: when no method works, the reasons as data.
    detail::Status status;
    std::vector<Rejection> rejections;
    auto mr = gpu_impl(memory, access, method, status, &rejections);
    if (status.code == make_error_code(errc::gpu_direct_unavailable)) {
        throw GpuRegistrationError(status.detail, std::move(rejections));
    }
    status.check();
    return mr;
}
std::shared_ptr<const MemoryRegion> RegistrationCache::get(const GpuMemory& memory, Access access,
                                                           GpuRegistration method, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return gpu_impl(memory, access, method, s); });
}
std::shared_ptr<const MemoryRegion> RegistrationCache::get(const GpuMemory& memory, Access access,
                                                           GpuRegistration method, std::error_code& ec,
                                                           Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return gpu_impl(memory, access, method, s); });
}

} // namespace gpuverbs
