// Warnings: what a user should know that is not an error. A setting that
// works but leaves a door open (a Redis store without a password, reachable
// from the network) is reported once, in words, through one handler for the
// whole process: by default one line on standard error, "gpuverbs: warning:
// <source>: <text>"; a service routes them to its own log:
//
//   gpuverbs::set_warning_handler([](const gpuverbs::Warning& w) {
//       log.warn("{}: {}", w.source, w.text);
//   });
#pragma once

#include <functional>
#include <string_view>

namespace gpuverbs {

struct Warning {
    std::string_view source; ///< what speaks: "RedisRendezvous"
    std::string_view text;   ///< what is wrong and what to do
};
using WarningHandler = std::function<void(const Warning&)>;

/// Replaces the process's warning handler and returns the previous one; an
/// empty handler restores the default (standard error). Thread-safe. The
/// handler runs on the thread that warns, one warning at a time (under the
/// lock this function takes too: a handler must not call it), and must not
/// throw (an exception is swallowed).
WarningHandler set_warning_handler(WarningHandler handler);

namespace detail {
/// Hands a warning to the process's handler.
void warn(std::string_view source, std::string_view text) noexcept;
} // namespace detail

} // namespace gpuverbs
