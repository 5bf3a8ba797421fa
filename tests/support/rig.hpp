// What the Soft-RoCE rig (tests/softroce/run) tells a test about its devices.
#pragma once

#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace gpuverbs::test {

struct RigDevices {
    std::string rig; ///< host | native | vm
    std::string dev0, dev1;
    std::uint8_t port = 1;
    std::optional<std::uint32_t> gid_index; ///< the RoCE v2 IPv4-mapped GID, if RoCE
    std::string ip0, ip1;
};

inline std::string env_or(const char* name, const char* fallback = "") {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): tests read the environment before starting threads
    const char* v = std::getenv(name);
    return v != nullptr ? v : fallback;
}

/// The rig's devices, or nothing when not run through tests/softroce/run.
inline std::optional<RigDevices> rig_devices() {
    RigDevices r;
    r.dev0 = env_or("GPUVERBS_TEST_DEV0");
    if (r.dev0.empty()) return std::nullopt;
    r.rig = env_or("GPUVERBS_TEST_RIG", "host");
    r.dev1 = env_or("GPUVERBS_TEST_DEV1", r.dev0.c_str());
    r.port = static_cast<std::uint8_t>(std::stoi(env_or("GPUVERBS_TEST_PORT", "1")));
    if (std::string g = env_or("GPUVERBS_TEST_GID_INDEX"); !g.empty()) r.gid_index = std::stoul(g);
    r.ip0 = env_or("GPUVERBS_TEST_IP0");
    r.ip1 = env_or("GPUVERBS_TEST_IP1");
    return r;
}

/// Whether the rig provided devices (integration suites skip without them).
/// `options` as a test's queue pairs get them: with the extended verbs when
/// GPUVERBS_TEST_EXTENDED_VERBS=1: run-in-rig runs the data-path suites a
/// second time with it, so that every request goes through ibv_wr_*.
inline gpuverbs::QueuePairOptions test_qp_options(gpuverbs::QueuePairOptions options = {}) {
    if (env_or("GPUVERBS_TEST_EXTENDED_VERBS") == "1") options.extended_verbs = true;
    return options;
}

inline bool rig_present() {
    return rig_devices().has_value();
}

/// "10.0.0.1" -> {10, 0, 0, 1}
inline std::optional<std::array<std::uint8_t, 4>> parse_ipv4(const std::string& text) {
    std::array<unsigned, 4> p{};
    char tail = 0;
    if (std::sscanf(text.c_str(), "%u.%u.%u.%u%c", &p[0], &p[1], &p[2], &p[3], &tail) != 4) return std::nullopt;
    std::array<std::uint8_t, 4> out{};
    for (int i = 0; i < 4; ++i) {
        if (p[i] > 255) return std::nullopt;
        out[i] = static_cast<std::uint8_t>(p[i]);
    }
    return out;
}

} // namespace gpuverbs::test
