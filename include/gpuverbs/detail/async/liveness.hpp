// Liveness: the asynchronous engine's decisions, with no I/O, about a queue
// pair that has operations outstanding — is it failed, and must gpuverbs end
// its operations itself because the provider will not?
//
// The driver's watch (async_driver.hpp) ticks while operations are
// outstanding; on each tick it looks at every queue pair with operations
// (ibv_query_qp for its state, ibv_query_port for its port) and hands what it
// saw to judge(), which says what to do:
// - a queue pair the provider reports in ERROR (or that two ticks in a row
//   could not query), or whose port was not ACTIVE (or could not be read)
//   on two ticks in a row, or whose send queue made no progress for longer
//   than stall_bound(), is marked failed (and, for the last two, moved to
//   ERROR by the driver, so the provider flushes its requests and nothing
//   more goes on the wire). Progress is a completion, an idle send queue, or
//   the requester sending a packet it had not sent before (sq_psn past the
//   furthest seen: a chain of large requests shows it long before its one
//   signaled completion); a queue pair the previous tick did not look at
//   starts its clock afresh, so an idle period never counts as a stall;
// - once gpuverbs has known it failed for flush_grace, whatever the provider
//   has not completed is completed by gpuverbs (the operations end with the
//   failure's error; their slots lead nowhere from then on).
// So an operation ends, at the latest, tick + (stall bound, or one more tick
// for a port) + tick + flush_grace after its queue pair fails (docs/transfers.md, "Bounds").
// Unit-tested without a device (tests/unit/liveness_test.cpp).
#pragma once

#include "gpuverbs/detail/verbs/qp_health.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

namespace gpuverbs::detail {

using LivenessClock = std::chrono::steady_clock;

/// The transport's own bound on an unacknowledged request: (retry_count + 1)
/// × 4.096 µs × 2^timeout, after which the device fails it with "retry
/// exceeded". Empty for timeout 0 (the specification's "wait forever").
inline std::optional<std::chrono::nanoseconds> transport_retry_bound(std::uint8_t timeout,
                                                                     std::uint8_t retry_count) noexcept {
    if (timeout == 0) return std::nullopt;
    const auto per_try = std::chrono::nanoseconds(std::int64_t{4096} << std::min<std::uint8_t>(timeout, 31));
    return per_try * (std::min<std::uint8_t>(retry_count, 7) + 1);
}

/// How long a send queue with requests outstanding may go without a single
/// completion before gpuverbs declares it stalled: twice the transport's
/// retry bound plus `margin` (a device that is only slow keeps completing
/// chains well inside it). When the oldest request waits for the peer to
/// post a receive and rnr_retry is 7 (the transport retries "for as long as
/// the peer takes"), `receiver_wait` instead (AsyncOptions::receiver_wait):
/// the library's own bound on that wait, never (empty) when it is zero.
/// Never when the transport has no bound (timeout 0).
inline std::optional<std::chrono::nanoseconds> stall_bound(const QpWatch& w, Opcode oldest,
                                                           std::chrono::nanoseconds margin,
                                                           std::chrono::nanoseconds receiver_wait) noexcept {
    const bool needs_receive =
        oldest == Opcode::send || oldest == Opcode::send_with_imm || oldest == Opcode::write_with_imm;
    if (needs_receive && w.rnr_retry >= 7) {
        if (receiver_wait <= std::chrono::nanoseconds::zero()) return std::nullopt;
        return receiver_wait;
    }
    const auto bound = transport_retry_bound(w.timeout, w.retry_count);
    if (!bound) return std::nullopt;
    return *bound * 2 + margin;
}

/// What one tick saw of a queue pair.
struct QpSight {
    bool known_failed = false;   ///< QpHealth::failed()
    bool provider_error = false; ///< ibv_query_qp: ERROR or SQE
    bool query_failed = false;   ///< ibv_query_qp failed (its state is unknown)
    bool port_active = true;     ///< its port is ACTIVE (false when it could not be read)
    /// The previous tick did not look at it (idle, or the watch had stopped):
    /// what it knew of its progress is stale, and the clock starts again now.
    bool first_look = false;
    std::uint64_t send_outstanding = 0;
    std::uint64_t send_retired = 0;
    /// The provider's sq_psn (empty: not reported). Its requester sending new
    /// packets is progress even while no completion shows it (one signaled
    /// completion may end a chain of many large requests).
    std::optional<std::uint32_t> sq_psn;
    /// stall_bound() for its oldest request (empty: stalls are not judged).
    std::optional<std::chrono::nanoseconds> stall_after;
};

/// Sightings needed before a port that is not ACTIVE, or a queue pair that
/// cannot be queried, fails it: a single reading may catch a port in a
/// transition (or a query interrupted), and one tick more costs T.
inline constexpr std::uint8_t looks_to_act = 2;

/// What the driver does about it.
enum class LivenessVerdict : std::uint8_t {
    healthy,            ///< nothing
    provider_error,     ///< mark it failed (QueuePairFailure::Cause::provider_reports_error)
    port_down,          ///< mark it failed and move it to ERROR
    stalled,            ///< mark it failed and move it to ERROR
    wait_for_flush,     ///< failed: the provider still has time to complete what it holds
    complete_by_library ///< failed for flush_grace: gpuverbs completes its operations
};

/// Whether PSN `now` is past `before` (24-bit sequence numbers that wrap).
inline bool psn_after(std::uint32_t now, std::uint32_t before) noexcept {
    const std::uint32_t ahead = (now - before) & 0xffffffU;
    return ahead != 0 && ahead < 0x800000U;
}

/// Judges one queue pair at `now` and updates its watch (progress, when the
/// failure was learned, the sightings of a port down). Pure: the driver performs the verdict.
inline LivenessVerdict judge(QpWatch& w, const QpSight& s, LivenessClock::time_point now,
                             std::chrono::nanoseconds flush_grace) noexcept {
    if (s.known_failed) {
        if (!w.learned_set) {
            w.learned = now;
            w.learned_set = true;
        }
        return now - w.learned >= flush_grace ? LivenessVerdict::complete_by_library : LivenessVerdict::wait_for_flush;
    }
    // Progress: the send queue is idle, finished something since the last
    // look, or its requester sent a packet it had not sent before. A queue
    // pair the last tick did not look at starts afresh: an idle period is not a stall.
    bool moved = s.first_look || s.send_outstanding == 0 || s.send_retired != w.last_retired ||
                 w.last_progress == LivenessClock::time_point{};
    if (s.sq_psn) {
        const bool ahead = w.psn_known && psn_after(*s.sq_psn, w.furthest_psn);
        moved = moved || ahead;
        if (!w.psn_known || s.first_look || ahead) {
            w.furthest_psn = *s.sq_psn;
            w.psn_known = true;
        }
    }
    if (moved) {
        w.last_retired = s.send_retired;
        w.last_progress = now;
    }
    if (s.first_look) w.port_down_looks = w.query_failures = 0;
    w.query_failures = s.query_failed ? static_cast<std::uint8_t>(std::min(w.query_failures + 1, 255)) : 0;
    if (s.provider_error || w.query_failures >= looks_to_act) return LivenessVerdict::provider_error;
    // A port that is down matters to requests on the wire; a queue pair that
    // only waits for receives may see the port come back.
    if (!s.port_active && s.send_outstanding > 0) {
        w.port_down_looks = static_cast<std::uint8_t>(std::min(w.port_down_looks + 1, 255));
        if (w.port_down_looks >= looks_to_act) return LivenessVerdict::port_down;
    } else {
        w.port_down_looks = 0;
    }
    if (s.send_outstanding > 0 && s.stall_after && now - w.last_progress > *s.stall_after) {
        return LivenessVerdict::stalled;
    }
    return LivenessVerdict::healthy;
}

} // namespace gpuverbs::detail
