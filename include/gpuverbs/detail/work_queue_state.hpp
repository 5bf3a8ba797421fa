// The bookkeeping of one work queue (a QP's send or receive queue, or an SRQ):
// which slot each posted request occupies, the caller's context and opcode
// for it, and how many requests the hardware has finished with.
//
// Why: ibv_wc carries only a 64-bit wr_id. gpuverbs puts a slot number there,
// so a completion gives back the caller's context and the operation even when
// it failed (ibv_wc.opcode is undefined on errors); and because an unsignaled
// request is finished once a later signaled one on the same queue completes,
// the slot's sequence number tells how many slots are free again. That makes
// "queue full" a local error instead of a failed post, and makes selective
// signaling safe.
//
// Threads: one thread posts (commit) while another polls (complete).
#pragma once

#include "gpuverbs/completion.hpp"

#include <atomic>
#include <cstdint>
#include <vector>

namespace gpuverbs::detail {

class WorkQueueState {
public:
    explicit WorkQueueState(std::uint32_t capacity) : slots_(capacity == 0 ? 1 : capacity) {}

    [[nodiscard]] std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(slots_.size()); }
    /// Requests posted and not yet known to be finished.
    [[nodiscard]] std::uint64_t outstanding() const noexcept {
        return posted_ - retired_.load(std::memory_order_acquire);
    }
    [[nodiscard]] bool has_room_for(std::uint64_t n) const noexcept { return outstanding() + n <= capacity(); }

    /// The slot the i-th request of the next post goes in; record it, then commit.
    [[nodiscard]] std::uint32_t slot(std::uint32_t i) const noexcept {
        return static_cast<std::uint32_t>((posted_ + i) % slots_.size());
    }
    void record(std::uint32_t i, std::uint64_t context, Opcode opcode) noexcept {
        slots_[slot(i)] = Slot{context, posted_ + i + 1, opcode};
    }
    /// The first n recorded requests were accepted by the device.
    void commit(std::uint32_t n) noexcept { posted_ += n; }
    /// Empties the queue's bookkeeping (the QP went back to RESET).
    void reset() noexcept {
        posted_ = 0;
        retired_.store(0, std::memory_order_release);
    }

    struct Finished {
        std::uint64_t context;
        Opcode opcode;
    };
    /// A completion for `slot`: everything up to and including it is finished.
    Finished complete(std::uint32_t slot) noexcept {
        const Slot& s = slots_[slot % slots_.size()];
        // Completions of one queue arrive in order, so the sequence only grows.
        retired_.store(s.sequence, std::memory_order_release);
        return {s.context, s.opcode};
    }

private:
    struct Slot {
        std::uint64_t context = 0;
        std::uint64_t sequence = 0; ///< posted_ after this request
        Opcode opcode = Opcode::unknown;
    };
    std::vector<Slot> slots_;
    std::uint64_t posted_ = 0;
    std::atomic<std::uint64_t> retired_{0};
};

/// What a completion's wr_id says: which queue of the QP and which slot.
enum class QueueKind : std::uint8_t { send = 0, receive = 1, shared_receive = 2 };

constexpr std::uint64_t encode_wr_id(QueueKind kind, std::uint32_t slot) noexcept {
    return (static_cast<std::uint64_t>(kind) << 62) | slot;
}
constexpr QueueKind wr_id_kind(std::uint64_t wr_id) noexcept {
    return static_cast<QueueKind>(wr_id >> 62);
}
constexpr std::uint32_t wr_id_slot(std::uint64_t wr_id) noexcept {
    return static_cast<std::uint32_t>(wr_id);
}

} // namespace gpuverbs::detail
