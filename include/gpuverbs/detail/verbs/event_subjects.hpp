// Which gpuverbs object a device event names. The kernel's asynchronous
// events carry the raw ibv_qp / ibv_srq / ibv_cq; every object gpuverbs makes
// gets a process-unique id and is entered here under its raw handle, so an
// event is reported as "QueuePair 12", never as a pointer the user could not
// safely use. Ids are never reused: an event that outlives its object can not
// be mistaken for a newer object at the same address.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace gpuverbs::detail {

/// A new id, unique for the life of the process (never 0).
inline std::uint64_t next_object_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

/// One device's objects by raw handle. Entered after creation, removed after
/// destruction: the kernel holds a destroy until the events naming the object
/// that were read are acknowledged, and those are looked up first.
class EventSubjects {
public:
    /// Enters `native` under `id`. Without memory for the entry, events about
    /// the object report id 0 (unknown) instead of failing the creation.
    void add(const void* native, std::uint64_t id) noexcept {
        try {
            std::lock_guard lock(mutex_);
            ids_[native] = id;
        } catch (...) { // NOLINT(bugprone-empty-catch): std::bad_alloc degrades to "unknown object"
        }
    }
    /// Removes `native`'s entry if it is still `id`'s: after a destroy the
    /// allocator may hand the same address to a new object, entered meanwhile.
    void remove(const void* native, std::uint64_t id) noexcept {
        std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): an owned mutex
        if (auto it = ids_.find(native); it != ids_.end() && it->second == id) ids_.erase(it);
    }
    /// The id entered for `native`; 0 when it is not a gpuverbs object.
    [[nodiscard]] std::uint64_t find(const void* native) const noexcept {
        std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): an owned mutex
        auto it = ids_.find(native);
        return it == ids_.end() ? 0 : it->second;
    }

private:
    mutable std::mutex mutex_;
    std::unordered_map<const void*, std::uint64_t> ids_;
};

} // namespace gpuverbs::detail
