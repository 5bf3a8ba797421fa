// How gpuverbs' own code reaches the shared core behind a public object
// (Device, ProtectionDomain, CompletionQueue, …) without a public accessor:
// each public class befriends detail::access, and the library's sources write
// detail::access::core(pd). Users never need it.
#pragma once

namespace gpuverbs::detail {

struct access {
    /// The object's shared core (a std::shared_ptr to a detail:: type; empty for an empty object).
    template <class Object>
    static const auto& core(const Object& object) noexcept {
        return object.core_;
    }
};

} // namespace gpuverbs::detail
