// The engine of block-list transfers: one operation per rail that posts a
// plan's requests in linked chains (one doorbell each, only the last request
// of a chain signaled) while its send queue has room, refills from its own
// completions, and finishes when every request it posted has completed.
//
// The AsyncDriver runs it like any operation (one lock, one FSM): submitted,
// waiting for room, posted, aborted with its queue pair; what differs is that
// it is posted in parts and finishes on its last completion, not its first.
// Every request's slot leads back to it (so an error on an unsignaled request
// names its block), which is safe because completions of one send queue come
// in order and each chain ends with a signaled request: the stream is alive
// until the completion of its last chain, success or flush. What the
// completions mean (landed, uncertain, never posted) is its StreamLedger's
// (stream_ledger.hpp, tested without a device); this class does the I/O.
#pragma once

#include "gpuverbs/detail/async/async_op.hpp"
#include "gpuverbs/detail/transfers/key_map.hpp"
#include "gpuverbs/detail/transfers/stream_ledger.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

namespace gpuverbs {
class TransferPlan;
}

namespace gpuverbs::detail {

class TransferJobBase;

/// Requests one chain may hold at most (one ibv_post_send).
inline constexpr std::uint32_t max_transfer_chain = 64;

/// One rail of a transfer: the requests [first, end) of a plan on one queue pair.
class RailStream final : public AsyncOpBase {
public:
    RailStream() = default;
    RailStream(const RailStream&) = delete;
    RailStream& operator=(const RailStream&) = delete;
    ~RailStream() = default;

    /// Prepares the rail (allocates its chain ring and, when its device's
    /// keys differ from the plan's, its own scatter/gather list). Errors name
    /// the key the rail cannot translate. Not yet submitted.
    std::error_code setup(QpCore& core, const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
                          std::uint64_t bytes, std::span<const KeyMap> local_keys, std::span<const KeyMap> remote_keys,
                          std::uint32_t chain, std::string& why);
    /// Turns the rail into one signaled zero-byte write-with-immediate to the
    /// plan's last remote byte (the transfer's notification), to submit again;
    /// with a `message` (the job's, alive until the job ends), a send with
    /// immediate carrying it inline.
    void arm_notification(std::uint32_t immediate, std::span<const std::byte> message) noexcept;

    // What the driver asks (under its lock).
    /// Slots the next chain needs; 0 when nothing is left to post.
    [[nodiscard]] std::uint32_t needs() const noexcept { return ledger_.needs(); }
    /// Posts chains while the send queue has room for them.
    void post_some() noexcept;
    /// A completion of one of its requests (`sequence`: its place in the queue).
    void completed(const ibv_wc& wc, std::uint64_t sequence) noexcept { ledger_.completed(wc.status, sequence); }
    /// Nothing in flight and nothing more to post (after an error or a stop: nothing in flight).
    [[nodiscard]] bool finished() const noexcept { return ledger_.finished(); }
    /// Its queue pair failed and the provider did not complete what it
    /// holds (liveness.hpp): what is in flight ends now, as not known to have
    /// landed, and the rail has failed with `ec` (errc::port_down,
    /// queue_pair_stalled or queue_pair_in_error: its path's failure).
    void abandon(std::error_code ec) noexcept { ledger_.abandon(ec); }
    /// Posts nothing more (a deadline passed, or the transfer was cancelled);
    /// what is in flight drains. Under the driver's lock.
    void stop() noexcept { ledger_.stop(); }
    [[nodiscard]] bool stopped() const noexcept { return ledger_.stopped(); }
    [[nodiscard]] bool in_flight() const noexcept { return ledger_.in_flight(); }

    // What the transfer reads once the rail has finished (StreamLedger's).
    [[nodiscard]] bool failed() const noexcept { return ledger_.failed(); }
    [[nodiscard]] std::error_code error() const noexcept { return ledger_.error(); }
    /// The first failed completion's status (IBV_WC_SUCCESS: none; IBV_WC_WR_FLUSH_ERR when gpuverbs ended it).
    [[nodiscard]] ibv_wc_status wc_status() const noexcept { return ledger_.wc_status(); }
    /// The provider refused a post (error() is its errno), or gpuverbs did (its queue pair is in error).
    [[nodiscard]] bool post_refused() const noexcept { return ledger_.post_refused(); }
    /// gpuverbs ended it (abandon()): its queue pair failed as a path fails.
    [[nodiscard]] bool abandoned() const noexcept { return ledger_.abandoned(); }
    /// Whether it carried the notification and that failed.
    [[nodiscard]] bool notification_failed() const noexcept { return ledger_.notification_failed(); }
    /// Whether this rail has a key for the plan's remote key `plan_rkey`.
    [[nodiscard]] bool reaches_remote(std::uint32_t plan_rkey) const noexcept;
    /// The plan's request that failed first (requests().size() for the notification).
    [[nodiscard]] std::uint32_t failed_request() const noexcept { return ledger_.failed_request(); }
    /// Bytes of its requests that completed (since the notification was armed, if it was).
    [[nodiscard]] std::uint64_t bytes() const noexcept;
    [[nodiscard]] std::uint32_t first() const noexcept { return ledger_.first(); }
    [[nodiscard]] std::uint32_t end() const noexcept { return ledger_.end(); }
    /// Where its requests stand once it has finished: [first, landed_end())
    /// completed without error; [landed_end(), posted_end()) were handed to
    /// the device and are not known to have completed (they may or may not
    /// have landed); [posted_end(), end) were never posted.
    [[nodiscard]] std::uint32_t landed_end() const noexcept { return ledger_.landed_end(); }
    [[nodiscard]] std::uint32_t posted_end() const noexcept { return ledger_.posted_end(); }

    /// Back to a fresh operation, for the notification's submission.
    void reset_for_resubmit() noexcept;

    TransferJobBase* job = nullptr; ///< the transfer it is a rail of
    std::size_t index = 0;          ///< which rail

private:
    /// This rail's rkey for a plan's rkey (every key was checked in setup).
    [[nodiscard]] std::uint32_t rkey_of(std::uint32_t plan_key) const noexcept {
        if (remote_keys_.empty()) return plan_key;
        if (remote_keys_.front().plan_key == plan_key) return remote_keys_.front().rail_key;
        return rkey_slow(plan_key);
    }
    [[nodiscard]] std::uint32_t rkey_slow(std::uint32_t plan_key) const noexcept;

    const TransferPlan* plan_ = nullptr;
    const ibv_sge* sges_ = nullptr;       ///< the plan's pieces as this rail's device sees them
    std::unique_ptr<ibv_sge[]> own_sges_; ///< … when its keys differ from the plan's
    std::uint32_t sge_offset_ = 0;        ///< the plan's piece number of sges_[0]
    std::vector<KeyMap> remote_keys_;
    ibv_wr_opcode opcode_ = IBV_WR_RDMA_WRITE;
    StreamLedger ledger_; ///< what went out, what completed, where each request stands
    // The notification's payload, when armed.
    std::uint32_t immediate_ = 0;
    std::span<const std::byte> message_;
    ibv_sge message_sge_{};         ///< the message's one piece, alive while its request is posted
    std::uint64_t total_bytes_ = 0; ///< of requests [first, end)
    std::uint64_t counted_ = 0;     ///< bytes already reported (before the notification)
};

} // namespace gpuverbs::detail
