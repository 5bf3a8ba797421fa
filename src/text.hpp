// Small text helpers shared by the compiled part of gpuverbs (private to src/).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpuverbs::detail {

/// "0x7f3a00000000": a device or host address as users see it in messages.
inline std::string hex_address(std::uint64_t address) {
    char text[24];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
    return text;
}

} // namespace gpuverbs::detail
