// Whether GPU tests can run here, decided once, with the reason when not.
#pragma once

#include "gpuverbs/gpu/gpu.hpp"

#include <string>

namespace gpuverbs::test {

/// Empty when a GPU is usable; else why not (the library's own words).
inline const std::string& gpu_skip_reason() {
    static const std::string reason = [] {
        try {
            (void)gpuverbs::list_gpus();
            return std::string();
        } catch (const gpuverbs::Error& e) {
            return std::string(e.what());
        }
    }();
    return reason;
}

inline bool gpu_available() {
    return gpu_skip_reason().empty();
}

inline std::string first_gpu_name() {
    auto gpus = gpuverbs::list_gpus();
    return gpus.front().name + " (" + gpus.front().pci_bus_id + ")";
}

} // namespace gpuverbs::test
