// What a block-list transfer is given besides its plan (its rails and
// options) and what it hands its handler when it ends (TransferResult, with
// its TransferReport). No Asio here.
#pragma once

#include "gpuverbs/verbs/memory_region.hpp"

#include "gpuverbs/detail/transfers/key_map.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpuverbs {

class QueuePair;

/// One rail of a transfer: a queue pair on one device, and — when that
/// device is not the one the plan's keys come from — the keys of the same
/// memory on this rail (registrations of the same addresses on each device).
///
///   TransferRail rail{&qp1};
///   rail.local(pool_mr0, pool_mr1).remote(peer_pool0, peer_pool1);
struct TransferRail {
    QueuePair* qp = nullptr;
    std::vector<detail::KeyMap> local_keys;  ///< plan lkey → this rail's lkey (empty: the same)
    std::vector<detail::KeyMap> remote_keys; ///< plan rkey → this rail's rkey (empty: the same)

    /// The local region the plan names, and the same memory registered on this rail's device.
    TransferRail& local(const MemoryRegion& in_plan, const MemoryRegion& on_rail) {
        local_keys.push_back({in_plan.lkey(), on_rail.lkey()});
        return *this;
    }
    /// The remote region the plan names, and the same memory as the peer registered it on this rail.
    TransferRail& remote(const RemoteMemory& in_plan, const RemoteMemory& on_rail) {
        remote_keys.push_back({in_plan.rkey, on_rail.rkey});
        return *this;
    }
};

/// Where a block stands when a transfer has ended (TransferReport).
enum class BlockState : std::uint8_t {
    landed,     ///< every request that carries it completed without error
    not_posted, ///< none of its requests was handed to the device: nothing of it moved
    uncertain,  ///< some of it was posted and not known to have completed: it may or may
                ///< not have landed, in part (a write: the peer must not trust those bytes;
                ///< a read: nor may we). Moving it again is safe: writes and reads of the
                ///< same ranges are idempotent.
};

/// What a transfer knows of its blocks when it ends — after a failure, an
/// abort, or success (then every block landed): TransferResult::report.
/// Its per-request and per-block parts are built only when
/// TransferOptions::report_blocks asks for them.
struct TransferReport {
    /// Per request of the plan (plan.requests()).
    std::vector<BlockState> requests;
    /// Per remote block of the plan, in the order the list gave them: landed
    /// only when every request that carries part of it landed; not_posted
    /// only when none was posted; otherwise uncertain.
    std::vector<BlockState> remote_blocks;
    /// Remote blocks in each state.
    std::size_t landed = 0;
    std::size_t not_posted = 0;
    std::size_t uncertain = 0;

    /// What one rail did.
    struct Rail {
        std::uint64_t bytes = 0; ///< of requests that completed on it
        /// Why it failed (empty: it did not). With failover the transfer may
        /// still have succeeded: its unfinished requests moved to other rails.
        std::error_code error;
        std::string failure; ///< … in words: which blocks, the status
        /// … as one word, for labels and alerts: "port_down", "stalled",
        /// "notification_not_taken", "queue_pair_error" (gpuverbs found its
        /// queue pair failed: the words say how), "aborted" (destroyed),
        /// "completion" (a request's completion failed: the words have its status).
        std::string cause;
        std::uint32_t taken_over = 0; ///< its requests that other rails posted again
        std::uint32_t took_over = 0;  ///< requests of failed rails it posted
        /// From the transfer's start until its last request finished (zero: it had none).
        std::chrono::nanoseconds busy{};
    };
    /// Per rail, in the order given. With several rails, always (the
    /// transfer keeps them anyway); with one, when report_blocks asked.
    std::vector<Rail> rails;
};

/// What a transfer learned, handed to its handler:
/// void(async_error_code, TransferResult).
///
///   gpuverbs::async_transfer(qp, plan, {.notify = id}, [](auto ec, gpuverbs::TransferResult r) {
///       if (ec) std::fprintf(stderr, "%s: %s\n", ec.message().c_str(), r.failed_blocks.c_str());
///   });
struct TransferResult {
    /// Of the requests that completed without error: the plan's bytes on success.
    std::size_t bytes = 0;
    /// On failure, in words: plan.blocks_of() of the first request that
    /// failed (and its rail, with several), or why the transfer stopped or
    /// was refused. Empty on success.
    std::string failed_blocks;
    /// Which blocks landed, which never moved, which may or may not have
    /// landed (requests, remote_blocks and their counts: only when
    /// TransferOptions::report_blocks asked; otherwise empty), and what each
    /// rail did (rails: always with several rails, see TransferReport::rails).
    TransferReport report;

    /// 0.1's handlers received the bytes alone (`[](auto ec, std::size_t
    /// bytes)`, `std::size_t n = co_await async_transfer(…)`): they still
    /// compile, through this. Not marked deprecated: with GCC 12 the warning
    /// would land in gpuverbs' rail_group.hpp (a RailGroup's transfer calls
    /// the handler), say nothing for a callback (Asio's headers call it),
    /// and reach the caller's line only under co_await. It goes in 0.3:
    /// read `.bytes`.
    // NOLINTNEXTLINE(google-explicit-constructor,hicpp-explicit-conversions): 0.1's handlers convert implicitly
    operator std::size_t() const noexcept { return bytes; }
};

namespace detail {

/// A 0.1 output member of TransferOptions (rail_bytes, failed_blocks,
/// report), kept for one release. Setting or reading it is deprecated; it
/// is not itself marked [[deprecated]], because GCC 12 then warns wherever
/// a TransferOptions is made (`{.notify = id}` included), not only where the
/// member is used. The job reads `value`.
template <class T>
struct DeprecatedOutput;
/// What a DeprecatedOutput<T> is set from: what converts to T, not another DeprecatedOutput (copied as usual).
template <class U, class T>
concept deprecated_output_source =
    std::convertible_to<U, T> && !std::same_as<std::remove_cvref_t<U>, DeprecatedOutput<T>>;

template <class T>
struct DeprecatedOutput {
    T value{};

    DeprecatedOutput() = default;
    // Implicit, as 0.1's members were: `{.report = &r}`, `options.report = &r`, `if (options.report)`.
    // The forwarding constructor hides no copy: deprecated_output_source leaves DeprecatedOutput out.
    // NOLINTBEGIN(google-explicit-constructor,hicpp-explicit-conversions,bugprone-forwarding-reference-overload)
    template <deprecated_output_source<T> U>
    [[deprecated("use the TransferResult the handler receives (0.3 drops this)")]] DeprecatedOutput(U&& v)
        : value(std::forward<U>(v)) {}
    template <deprecated_output_source<T> U>
    [[deprecated("use the TransferResult the handler receives (0.3 drops this)")]] DeprecatedOutput& operator=(U&& v) {
        value = std::forward<U>(v);
        return *this;
    }
    [[deprecated("use the TransferResult the handler receives (0.3 drops this)")]] operator T() const noexcept {
        return value;
    }
    // NOLINTEND(google-explicit-constructor,hicpp-explicit-conversions,bugprone-forwarding-reference-overload)
};

} // namespace detail

/// How async_transfer posts, finishes and reports: inputs only (what the
/// transfer learned is the handler's TransferResult). (Every member has a
/// default initializer: GCC 12's -Wextra warns about designated initializers
/// that leave out a member without one.)
struct TransferOptions {
    /// Requests per doorbell (one ibv_post_send of a linked chain), 1 to 64;
    /// only the last of each chain is signaled, so the CQ sees one completion
    /// per chain. Chains are posted while the send queue has room for one.
    std::uint32_t doorbell_batch = 32;
    /// Deprecated (0.1; goes in 0.3): TransferResult::report.rails[k].bytes.
    /// Receives the bytes each rail moved (one entry per rail; may be empty).
    detail::DeprecatedOutput<std::span<std::uint64_t>> rail_bytes{};
    /// After the last block, a zero-byte write with this immediate (a
    /// transfer id) consumes one receive at the peer. It is posted (on the
    /// first rail that has not failed) only once every request has completed
    /// without error: after a write, when the peer's receive completes every
    /// block has landed, and a peer never hears of a transfer that did not
    /// land; after a read, the peer learns the reader is done with its
    /// blocks (e.g. releases a lease: leases.hpp).
    std::optional<std::uint32_t> notify{};
    /// With notify: up to 64 bytes (a request id) that the notification
    /// carries, copied when the transfer starts. The notification is then a
    /// send with immediate `notify` carrying them inline (every rail's queue
    /// pair needs max_inline_data of at least this many bytes), consuming a
    /// receive of at least that size at the peer — a NotificationInbox
    /// (notifications.hpp) posts them. Same rule: posted only once every
    /// request completed, so after a read the owner learns the reader is done.
    std::span<const std::byte> notify_message{};
    /// Fill TransferResult::report's per-request and per-block states (and
    /// its rails with one rail too). Off, they stay empty and the transfer
    /// spends nothing on them (two vectors and a pass over the plan); the
    /// bytes, the failure in words and, with several rails, each rail's
    /// bytes and failure come all the same.
    bool report_blocks = false;
    /// Deprecated (0.1; goes in 0.3): TransferResult::failed_blocks.
    /// Receives plan.blocks_of() for the first request that failed (and the rail, with several).
    detail::DeprecatedOutput<std::string*> failed_blocks{};
    /// Deprecated (0.1; goes in 0.3): TransferResult::report, with report_blocks.
    /// Receives, before the handler runs, the same report (setting it asks for it).
    detail::DeprecatedOutput<TransferReport*> report{};
    /// When the transfer must end. One already passed when the transfer
    /// starts refuses it (std::errc::timed_out, nothing posted). At the deadline it posts nothing more and
    /// completes with std::errc::timed_out as soon as the device has finished
    /// with every request it took (at once when nothing is in flight; a
    /// request in flight ends with its completion, or with the queue pair's
    /// transport error after retry_count x timeout when the peer is gone). A
    /// deadline (or a cancellation) that comes while the notification is in
    /// flight abandons it: every block has landed, but the peer has not taken
    /// the notification (it posted no receive), so gpuverbs moves the
    /// notification's queue pair to error (its send queue cannot move past
    /// the notification anyway) and the transfer ends with timed_out
    /// (operation_aborted) within AsyncOptions::flush_grace plus a tick.
    std::optional<std::chrono::steady_clock::time_point> deadline{};
    /// With notify: how long the peer may take to accept the notification
    /// (post a receive) once it is posted, whatever rnr_retry_count says (7
    /// retries for ever). Past it the notification is abandoned as at the
    /// deadline (std::errc::timed_out, the words name notification_timeout).
    /// 0: no bound of its own (only the deadline's and the transport's).
    std::chrono::milliseconds notification_timeout{5000};
    /// With several rails: when a rail fails as a path fails (retry or RNR
    /// retry exceeded, a local QP or fatal error such as a link that is down,
    /// a flush, its queue pair destroyed or refusing posts), its requests
    /// not known to have landed are posted again on the rails that have not
    /// failed, striped by bytes, and the transfer succeeds if they land
    /// (writes and reads of the same ranges are idempotent). An error of the
    /// request itself (a remote access or protection error) fails the
    /// transfer as before. TransferReport::rails says which rail failed and
    /// why. The notification is never posted twice: if it fails, the transfer does.
    bool failover = true;
    /// With several rails: stripe by these weights (one per rail, e.g. each
    /// rail's measured bytes per second; a rail of weight 0 gets no share
    /// but may still take over a failed rail's requests). Empty: equal bytes.
    /// RailGroup fills it from its rails' health.
    std::span<const std::uint64_t> rail_weights{};
};

} // namespace gpuverbs
