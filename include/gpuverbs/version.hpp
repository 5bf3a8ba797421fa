// The gpuverbs version, for code that must work across releases.
#pragma once

#define GPUVERBS_VERSION_MAJOR 0
#define GPUVERBS_VERSION_MINOR 1
#define GPUVERBS_VERSION_PATCH 0

namespace gpuverbs {
/// "major.minor.patch"
inline constexpr const char* version_string = "0.1.0";
} // namespace gpuverbs
