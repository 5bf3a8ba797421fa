// Numbers a peer must not guess (lease ids, packet sequence numbers), from the
// system's random source (getrandom(2)), private to src/.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <random>

namespace gpuverbs::detail {

/// 64 bits from getrandom(2) (std::random_device only where the kernel
/// refuses it: a seccomp filter, a kernel before 3.17).
inline std::uint64_t system_random() {
    std::uint64_t value = 0;
    auto* at = reinterpret_cast<unsigned char*>(&value);
    std::size_t have = 0;
    while (have < sizeof value) {
        const ssize_t n = ::getrandom(at + have, sizeof value - have, 0);
        if (n > 0) {
            have += static_cast<std::size_t>(n);
        } else if (n < 0 && errno != EINTR) {
            std::random_device device;
            return (std::uint64_t{device()} << 32) | device();
        }
    }
    return value;
}

} // namespace gpuverbs::detail
