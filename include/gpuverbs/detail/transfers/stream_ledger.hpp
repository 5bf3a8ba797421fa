// The accounting of one rail of a transfer, with no I/O: which of its
// requests went out in which chain, which completed, where a failure struck,
// and so where each request stands at the end — landed, uncertain (posted,
// not known to have completed) or never posted. RailStream
// (transfer_stream.hpp) builds the work requests and posts them; this ledger
// decides what the completions mean. The notification is its own phase: once
// armed, the next chain is the notification alone, and its failure leaves
// every request landed.
//
// Completions of one send queue come in order, and each chain's last request
// is signaled, so a chain's signaled completion covers its requests; a failed
// completion (signaled or not, or a flush) names the first request that did
// not complete. Unit-tested without a device under random postings,
// failures, refusals, stops and abandons (tests/unit/stream_ledger_test.cpp),
// and held to it by scripts/mutate.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <system_error>

namespace gpuverbs::detail {

class StreamLedger {
public:
    /// Requests [first, end) of a plan of `plan_size`, in chains of at most
    /// `chain`, with at most `ring` chains in flight at once (at least one).
    void start(std::uint32_t first, std::uint32_t end, std::uint32_t chain, std::uint32_t ring,
               std::uint32_t plan_size);

    // Posting.
    /// Work requests the next chain needs; 0 when nothing is left to post
    /// (done, failed or stopped). The notification, when armed, needs one.
    [[nodiscard]] std::uint32_t needs() const noexcept {
        if (failed() || stopped_) return 0;
        if (notify_) return 1;
        return std::min(chain_, end_ - next_);
    }
    /// Whether another chain may go out (the ring of chains in flight has room).
    [[nodiscard]] bool ring_has_room() const noexcept { return in_flight_ < ring_size_; }
    /// Whether the next chain is the notification.
    [[nodiscard]] bool notification_next() const noexcept { return notify_; }
    /// The plan's index of the next request to post.
    [[nodiscard]] std::uint32_t next() const noexcept { return next_; }
    /// The next chain (needs() work requests, sequences from `first_sequence`) went out.
    void posted(std::uint64_t first_sequence) noexcept;
    /// The provider refused the next chain after taking its first `taken`
    /// requests (unsignaled: they went out with no completion of their own).
    void refused(std::error_code ec, std::uint32_t taken) noexcept;
    /// … and one signaled request right after them (sequence `first_sequence`
    /// + `taken`) closes those `taken`: their completion, or their failure, comes by it.
    void closed(std::uint64_t first_sequence, std::uint32_t taken) noexcept;

    // Completing.
    /// The completion of the request at `sequence` with `status`.
    void completed(ibv_wc_status status, std::uint64_t sequence) noexcept;
    /// Its queue pair failed and the provider will not complete what it holds:
    /// what is in flight ends now as not known to have landed, the rail failed with `ec`.
    void abandon(std::error_code ec) noexcept;
    /// Post nothing more (a deadline, a cancellation); what is in flight drains.
    void stop() noexcept { stopped_ = true; }
    /// The next chain is the notification (every request of the plan landed).
    void arm_notification() noexcept { notify_ = true; }

    // Where it stands.
    [[nodiscard]] bool stopped() const noexcept { return stopped_; }
    [[nodiscard]] bool in_flight() const noexcept { return in_flight_ > 0; }
    /// Nothing in flight and nothing more to post (done, failed or stopped).
    [[nodiscard]] bool finished() const noexcept { return in_flight_ == 0 && (next_ == end_ || failed() || stopped_); }
    [[nodiscard]] bool failed() const noexcept { return wc_error_ != IBV_WC_SUCCESS || post_error_; }
    /// The refusal's error, else why it was abandoned, else the first failed completion's status.
    [[nodiscard]] std::error_code error() const noexcept;
    [[nodiscard]] ibv_wc_status wc_status() const noexcept { return wc_error_; }
    [[nodiscard]] bool post_refused() const noexcept { return static_cast<bool>(post_error_); }
    [[nodiscard]] bool abandoned() const noexcept { return static_cast<bool>(abandon_error_); }
    /// It carried the notification and that failed.
    [[nodiscard]] bool notification_failed() const noexcept { return failed() && failed_request_ >= plan_size_; }
    /// The plan's request that failed first (the plan's size for the notification).
    [[nodiscard]] std::uint32_t failed_request() const noexcept { return failed_request_; }
    [[nodiscard]] std::uint32_t first() const noexcept { return first_; }
    [[nodiscard]] std::uint32_t end() const noexcept { return end_; }
    /// [first, landed_end()) completed without error; [landed_end(),
    /// posted_end()) went to the device and are not known to have completed;
    /// [posted_end(), end) never went out. Final once finished().
    [[nodiscard]] std::uint32_t landed_end() const noexcept;
    [[nodiscard]] std::uint32_t posted_end() const noexcept;

private:
    struct Chain {
        std::uint64_t first_sequence; ///< the sequence of its first request
        std::uint64_t last_sequence;  ///< … of its last (signaled) one
        std::uint32_t first_request;
        std::uint32_t count; ///< requests of the plan it lands (0: the notification, or a closed refusal)
    };
    void push(const Chain& c) noexcept;

    std::uint32_t first_ = 0;
    std::uint32_t next_ = 0;
    std::uint32_t end_ = 0;
    std::uint32_t chain_ = 1;
    std::uint32_t plan_size_ = 0;
    bool stopped_ = false;
    bool notify_ = false;              ///< the notification is armed: the next chain
    bool notification_posted_ = false; ///< … and went out
    std::unique_ptr<Chain[]> ring_;    ///< chains in flight, oldest first
    std::uint32_t ring_size_ = 0;
    std::uint32_t ring_head_ = 0;
    std::uint32_t in_flight_ = 0;
    std::uint32_t done_until_ = 0; ///< every request before it completed without error
    ibv_wc_status wc_error_ = IBV_WC_SUCCESS;
    std::error_code post_error_;
    std::error_code abandon_error_;
    std::uint32_t failed_request_ = 0;
};

} // namespace gpuverbs::detail
