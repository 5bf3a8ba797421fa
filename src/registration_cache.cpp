// RegistrationCache::get for GPU memory (registration_cache.hpp): the buffer
// id the driver gives each allocation keeps a reused address from being
// served a freed buffer's registration.
#include "gpuverbs/transfers/registration_cache.hpp"

namespace gpuverbs {

std::shared_ptr<const MemoryRegion> RegistrationCache::get(const GpuMemory& memory, Access access,
                                                           GpuRegistration method) {
    // Asked now, not taken from `memory`: the caller's description may predate a free and a new allocation.
    const GpuMemory now = GpuMemory::from_address(memory.address, memory.size);
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
    auto mr = std::make_shared<const MemoryRegion>(register_gpu_memory(*pd_, whole, miss.access, method));
    index_.insert(miss, mr);
    return mr;
}

} // namespace gpuverbs
