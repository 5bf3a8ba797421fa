// One meaning for every timeout argument: the deadline it gives, saturated so
// that no value means "for ever" or "already past" by accident.
//
// steady_clock counts int64 nanoseconds: now() + milliseconds::max() wraps
// into the past (a call meant to wait for ever would fail at once), and a
// millisecond count cast to int for poll(2) turns 2^31 ms into a negative
// timeout (poll's "wait for ever"). Every deadline gpuverbs takes is made here.
#pragma once

#include <algorithm>
#include <chrono>

namespace gpuverbs::detail {

/// The longest wait a timeout asks for: ten years (longer is ten years).
inline constexpr std::chrono::milliseconds longest_wait = std::chrono::hours(24 * 365 * 10);

/// now + timeout: a negative timeout is now (already past), one longer than
/// longest_wait is longest_wait.
inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::milliseconds timeout,
    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) noexcept {
    return now + std::clamp(timeout, std::chrono::milliseconds::zero(), longest_wait);
}

} // namespace gpuverbs::detail
