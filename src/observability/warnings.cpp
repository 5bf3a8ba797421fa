// The process's warning handler (observability/warnings.hpp).
#include "gpuverbs/observability/warnings.hpp"

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

namespace gpuverbs {

namespace {

std::mutex& handler_mutex() {
    static std::mutex mutex;
    return mutex;
}

WarningHandler& installed() {
    static WarningHandler handler;
    return handler;
}

} // namespace

WarningHandler set_warning_handler(WarningHandler handler) {
    std::lock_guard lock(handler_mutex());
    return std::exchange(installed(), std::move(handler));
}

void detail::warn(std::string_view source, std::string_view text) noexcept {
    try {
        std::lock_guard lock(handler_mutex());
        if (installed()) {
            installed()(Warning{source, text});
            return;
        }
        const std::string line = "gpuverbs: warning: " + std::string(source) + ": " + std::string(text) + "\n";
        (void)std::fputs(line.c_str(), stderr);
    } catch (...) { // a warning never ends the program
    }
}

} // namespace gpuverbs
