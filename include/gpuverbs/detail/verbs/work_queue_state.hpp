// The bookkeeping of one work queue (a QP's send or receive queue, or an SRQ):
// which slot each posted request occupies, the caller's context and opcode
// for it, and how many requests the hardware has finished with.
//
// Why: ibv_wc carries only a 64-bit wr_id. gpuverbs puts a slot number there
// (and where to find the queue: see WrId), so a completion gives back the
// caller's context and the operation even when it failed (ibv_wc.opcode is
// undefined on errors); and because an unsignaled request is finished once a
// later signaled one on the same queue completes, the slot's sequence number
// tells how many slots are free again. That makes "queue full" a local error
// instead of a failed post, and makes selective signaling safe.
//
// Threads: one thread posts (commit) while another polls (complete).
#pragma once

#include "gpuverbs/verbs/completion.hpp"

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace gpuverbs::detail {

class WorkQueueState {
public:
    /// Room for `capacity` outstanding requests; the ring is the next power of
    /// two, so a slot is found with a mask, not a division.
    explicit WorkQueueState(std::uint32_t capacity)
        : capacity_(capacity == 0 ? 1 : capacity),
          mask_(std::bit_ceil(capacity_) - 1),
          slots_(std::make_unique<Slot[]>(mask_ + 1)) {}

    [[nodiscard]] std::uint32_t capacity() const noexcept { return capacity_; }
    /// Requests posted and not yet known to be finished.
    [[nodiscard]] std::uint64_t outstanding() const noexcept {
        return posted_ - retired_.load(std::memory_order_acquire);
    }
    [[nodiscard]] bool has_room_for(std::uint64_t n) const noexcept { return outstanding() + n <= capacity_; }
    /// Requests known to be finished (completed, or before a completion of the same queue).
    [[nodiscard]] std::uint64_t retired() const noexcept { return retired_.load(std::memory_order_acquire); }

    /// Work completions with each status other than success (the poll counts
    /// them; the success path pays one compare). Statuses past the table count in its last entry.
    static constexpr std::size_t error_slots = 32;
    void count_error(unsigned status) noexcept {
        errors_[status < error_slots ? status : error_slots - 1].fetch_add(1, std::memory_order_relaxed);
    }
    [[nodiscard]] std::uint64_t errors(std::size_t status) const noexcept {
        return errors_[status].load(std::memory_order_relaxed);
    }

    /// The slot the i-th request of the next post goes in; record it, then commit.
    [[nodiscard]] std::uint32_t slot(std::uint32_t i) const noexcept {
        return static_cast<std::uint32_t>(posted_ + i) & mask_;
    }
    void record(std::uint32_t i, std::uint64_t context, Opcode opcode) noexcept {
        slots_[slot(i)] = Slot{context, posted_ + i + 1, opcode};
    }
    /// Records requests first … first + n - 1 of the next post for one owner (a transfer's chain).
    void record_run(std::uint32_t first, std::uint32_t n, std::uint64_t context, Opcode opcode) noexcept {
        const std::uint64_t base = posted_ + first;
        for (std::uint32_t i = 0; i < n; ++i) slots_[(base + i) & mask_] = Slot{context, base + i + 1, opcode};
    }
    /// Slot numbers wrap with this mask (ring size - 1).
    [[nodiscard]] std::uint32_t mask() const noexcept { return mask_; }
    /// The first n recorded requests were accepted by the device.
    void commit(std::uint32_t n) noexcept { posted_ += n; }
    /// Requests committed so far (the sequence number of the last one).
    [[nodiscard]] std::uint64_t posted() const noexcept { return posted_; }
    /// The last n committed requests lead nowhere: a completion of one finds
    /// no context (a chain the provider took only in part, whose owner cannot wait for it).
    void forget_last(std::uint32_t n) noexcept {
        for (std::uint64_t k = posted_ - n; k < posted_; ++k) slots_[static_cast<std::uint32_t>(k) & mask_].context = 0;
    }
    /// Every outstanding request leads nowhere from now on and counts as
    /// finished: gpuverbs completed their owners itself (the queue pair is in
    /// error and the provider did not flush them in time). A completion the
    /// provider delivers later finds no context and retires nothing new.
    /// Only where no other thread polls or posts this queue (the driver's lock).
    void forget_outstanding() noexcept {
        const std::uint64_t done = retired_.load(std::memory_order_acquire);
        for (std::uint64_t k = done; k < posted_; ++k) {
            Slot& s = slots_[static_cast<std::uint32_t>(k) & mask_];
            s.context = 0;
            s.sequence = posted_;
        }
        retired_.store(posted_, std::memory_order_release);
    }
    /// The opcode of the oldest outstanding request (the next to complete); only when outstanding() > 0.
    [[nodiscard]] Opcode oldest_opcode() const noexcept {
        return slots_[static_cast<std::uint32_t>(retired_.load(std::memory_order_acquire)) & mask_].opcode;
    }
    /// Empties the queue's bookkeeping (the QP went back to RESET).
    void reset() noexcept {
        posted_ = 0;
        retired_.store(0, std::memory_order_release);
    }

    struct Finished {
        std::uint64_t context;
        Opcode opcode;
        std::uint64_t sequence; ///< the request's place in the queue's history (1 for the first)
    };
    /// A completion for `slot`: everything up to and including it is finished.
    Finished complete(std::uint32_t slot) noexcept {
        const Slot& s = slots_[slot & mask_];
        // Completions of one queue arrive in order, so the sequence only grows.
        retired_.store(s.sequence, std::memory_order_release);
        return {s.context, s.opcode, s.sequence};
    }

private:
    struct Slot {
        std::uint64_t context = 0;
        std::uint64_t sequence = 0; ///< posted_ after this request
        Opcode opcode = Opcode::unknown;
    };
    std::uint32_t capacity_;
    std::uint32_t mask_;
    std::unique_ptr<Slot[]> slots_;
    std::uint64_t posted_ = 0;
    std::atomic<std::uint64_t> retired_{0};
    std::array<std::atomic<std::uint64_t>, error_slots> errors_{};
};

/// Which queue a completion belongs to.
enum class QueueKind : std::uint8_t { send = 0, receive = 1, shared_receive = 2 };

/// What gpuverbs puts in a work request's wr_id, so that a completion leads
/// straight to its queue's state with no lookup or lock:
///   bits 63-62 the queue kind, 61-48 the QP's registration generation in its
///   CQ, 47-32 the QP's index in its CQ's registry, 31-0 the slot.
/// The generation makes a completion of a destroyed QP unmistakable even
/// after its registry index was given to a new QP.
struct WrId {
    static constexpr std::uint32_t generation_mask = 0x3fff;

    static constexpr std::uint64_t encode(QueueKind kind, std::uint32_t tag, std::uint32_t slot) noexcept {
        return (static_cast<std::uint64_t>(kind) << 62) | (static_cast<std::uint64_t>(tag) << 32) | slot;
    }
    /// The QP's tag in one CQ: its registry index and generation.
    static constexpr std::uint32_t tag(std::uint32_t index, std::uint32_t generation) noexcept {
        return ((generation & generation_mask) << 16) | (index & 0xffff);
    }
    static constexpr QueueKind kind(std::uint64_t wr_id) noexcept { return static_cast<QueueKind>(wr_id >> 62); }
    static constexpr std::uint32_t index(std::uint64_t wr_id) noexcept {
        return static_cast<std::uint32_t>(wr_id >> 32) & 0xffff;
    }
    static constexpr std::uint32_t generation(std::uint64_t wr_id) noexcept {
        return static_cast<std::uint32_t>(wr_id >> 48) & generation_mask;
    }
    static constexpr std::uint32_t slot(std::uint64_t wr_id) noexcept { return static_cast<std::uint32_t>(wr_id); }
};

} // namespace gpuverbs::detail
