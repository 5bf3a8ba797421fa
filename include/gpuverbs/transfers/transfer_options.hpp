// What a block-list transfer is given besides its plan (its rails and
// options) and what it reports when it ends (TransferReport). No Asio here.
#pragma once

#include "gpuverbs/verbs/memory_region.hpp"

#include "gpuverbs/detail/transfers/key_map.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
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
/// abort, or success (then every block landed). Filled before the handler
/// runs, when TransferOptions::report points here.
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
        std::string failure;          ///< … in words: which blocks, the status
        std::uint32_t taken_over = 0; ///< its requests that other rails posted again
        std::uint32_t took_over = 0;  ///< requests of failed rails it posted
        /// From the transfer's start until its last request finished (zero: it had none).
        std::chrono::nanoseconds busy{};
    };
    /// Per rail, in the order given.
    std::vector<Rail> rails;
};

/// How async_transfer posts, finishes and reports. (Every member has a
/// default initializer: GCC 12's -Wextra warns about designated initializers
/// that leave out a member without one.)
struct TransferOptions {
    /// Requests per doorbell (one ibv_post_send of a linked chain), 1 to 64;
    /// only the last of each chain is signaled, so the CQ sees one completion
    /// per chain. Chains are posted while the send queue has room for one.
    std::uint32_t doorbell_batch = 32;
    /// Receives the bytes each rail moved (one entry per rail; may be empty).
    std::span<std::uint64_t> rail_bytes{};
    /// After the last block, a zero-byte write with this immediate (a
    /// transfer id) consumes one receive at the peer. It is posted (on the
    /// first rail that has not failed) only once every request has completed
    /// without error: after a write, when the peer's receive completes every
    /// block has landed, and a peer never hears of a transfer that did not
    /// land; after a read, the peer learns the reader is done with its
    /// blocks (e.g. releases a lease: leases.hpp).
    std::optional<std::uint32_t> notify{};
    /// Receives plan.blocks_of() for the first request that failed (and the rail, with several).
    std::string* failed_blocks = nullptr;
    /// Receives, before the handler runs, which blocks landed, which never
    /// moved and which may or may not have landed (TransferReport).
    TransferReport* report = nullptr;
    /// When the transfer must end. At the deadline it posts nothing more and
    /// completes with std::errc::timed_out as soon as the device has finished
    /// with every request it took (at once when nothing is in flight; a
    /// request in flight ends with its completion, or with the queue pair's
    /// transport error after retry_count x timeout when the peer is gone). A
    /// transfer whose notification was posted ends as that notification does.
    std::optional<std::chrono::steady_clock::time_point> deadline{};
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
