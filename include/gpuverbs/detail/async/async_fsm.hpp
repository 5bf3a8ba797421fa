// The bookkeeping of asynchronous operations, with no I/O: which operations
// are posted and waiting for their completion, which wait for room in their
// work queue (in order, per queue), which may be posted now that slots freed,
// which to abort when a queue pair or the completion queue goes away, and
// which waiting operation a cancellation may still take back.
//
// As Boost.Redis' exec_fsm and Boost.MySQL's sans-io algorithms: events go in
// (submit, posted, finished, slots freed, cancel, queue pair released,
// shutdown), decisions come out (post it / let it wait / abort it, the next
// operation to post, the operations to abort); the AsyncDriver performs them
// with the verbs, the lock and the executor. Unit-tested without a device
// (tests/unit/async_fsm_test.cpp). Not thread-safe: the driver's mutex guards it.
#pragma once

#include "gpuverbs/detail/verbs/queue_cores.hpp"

#include <cstddef>
#include <cstdint>

namespace gpuverbs::detail {

/// Where an operation is in the machine.
enum class OpState : std::uint8_t {
    fresh,   ///< not yet submitted
    waiting, ///< in the waiting FIFO, not posted
    posted,  ///< posted; waiting for its completion
    done,    ///< finished, aborted or cancelled: owned by whoever completes it
};

/// The part of an operation the machine handles: its links and its queue.
struct AsyncOpLinks {
    AsyncOpLinks* prev = nullptr;
    AsyncOpLinks* next = nullptr;
    AsyncWorkQueue* queue = nullptr; ///< the work queue it is posted to (ordering, back-pressure)
    const void* owner = nullptr;     ///< the queue pair it belongs to (abort on release)
    OpState state = OpState::fresh;
};

/// An intrusive doubly linked list of operations (no allocation).
class OpList {
public:
    [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
    [[nodiscard]] AsyncOpLinks* front() const noexcept { return head_; }
    void push_back(AsyncOpLinks* op) noexcept {
        op->prev = tail_;
        op->next = nullptr;
        (tail_ != nullptr ? tail_->next : head_) = op;
        tail_ = op;
    }
    void erase(AsyncOpLinks* op) noexcept {
        (op->prev != nullptr ? op->prev->next : head_) = op->next;
        (op->next != nullptr ? op->next->prev : tail_) = op->prev;
        op->prev = op->next = nullptr;
    }
    /// Removes and returns the first operation (nullptr when empty).
    AsyncOpLinks* pop_front() noexcept {
        AsyncOpLinks* op = head_;
        if (op != nullptr) erase(op);
        return op;
    }

private:
    AsyncOpLinks* head_ = nullptr;
    AsyncOpLinks* tail_ = nullptr;
};

/// What the machine has seen, for tests and for CompletionQueue::async_statistics().
struct AsyncCounters {
    std::uint64_t submitted = 0; ///< operations submitted
    std::uint64_t waited = 0;    ///< … of which waited for room before being posted
    std::uint64_t posted = 0;    ///< operations posted to the device
    std::uint64_t finished = 0;  ///< completions delivered
    std::uint64_t aborted = 0;   ///< operations aborted (queue pair or CQ destroyed, post refused)
    std::uint64_t cancelled = 0; ///< waiting operations taken back by a cancellation
};

class AsyncFsm {
public:
    /// What to do with a submitted operation.
    enum class Submit : std::uint8_t {
        post, ///< post it now, then call posted() (or finished() if the post fails)
        wait, ///< it waits (room, or order behind earlier waiting operations of its queue)
        abort ///< the machine is shut down: complete it with operation_aborted
    };

    /// A new operation. `has_room`: its work queue has a free slot now.
    Submit submit(AsyncOpLinks* op, bool has_room) noexcept {
        ++counters_.submitted;
        if (closed_) {
            op->state = OpState::done;
            ++counters_.aborted;
            return Submit::abort;
        }
        // Behind earlier waiting operations of the same queue, or for room.
        if (op->queue->waiting > 0 || !has_room) {
            op->state = OpState::waiting;
            waiting_.push_back(op);
            ++waiting_count_;
            ++op->queue->waiting;
            ++counters_.waited;
            return Submit::wait;
        }
        return Submit::post;
    }

    /// The driver posted `op` (after Submit::post or next_ready()).
    void posted(AsyncOpLinks* op) noexcept {
        op->state = OpState::posted;
        live_.push_back(op);
        ++live_count_;
        ++counters_.posted;
    }
    /// Posting `op` failed: it is done (the driver completes it with the error).
    void post_failed(AsyncOpLinks* op) noexcept {
        op->state = OpState::done;
        ++counters_.aborted;
    }
    /// A posted operation that posts in parts (a transfer's rail) has nothing
    /// in flight and more to post, but no room: it waits again, at the back.
    void wait_again(AsyncOpLinks* op) noexcept {
        live_.erase(op);
        --live_count_;
        op->state = OpState::waiting;
        waiting_.push_back(op);
        ++waiting_count_;
        ++op->queue->waiting;
    }
    /// `op`'s completion arrived. False when the machine no longer holds it
    /// (aborted or cancelled already): then the completion is ignored.
    bool finished(AsyncOpLinks* op) noexcept {
        if (op->state != OpState::posted) return false;
        live_.erase(op);
        --live_count_;
        op->state = OpState::done;
        ++counters_.finished;
        return true;
    }

    /// After slots freed, a pass over the waiting operations: begin_pass(),
    /// then next_ready() until it returns nullptr. Each call returns the next
    /// waiting operation whose queue has room (`has_room(op)`), taken out of
    /// the FIFO; the driver posts it and calls posted() or post_failed().
    /// Operations of one queue leave in submission order: once one must keep
    /// waiting, the later ones of its queue are skipped for the rest of the
    /// pass. One pass visits each waiting operation once.
    void begin_pass() noexcept {
        ++pass_;
        cursor_ = waiting_.front();
    }
    template <class HasRoom>
    AsyncOpLinks* next_ready(HasRoom&& has_room) noexcept {
        while (cursor_ != nullptr) {
            AsyncOpLinks* op = cursor_;
            cursor_ = op->next;
            if (op->queue->blocked_pass == pass_) continue;
            if (has_room(op)) {
                take_waiting(op);
                return op;
            }
            op->queue->blocked_pass = pass_;
        }
        return nullptr;
    }

    /// A cancellation for `op`: true when it was still waiting (never posted)
    /// and is now taken out — complete it with operation_aborted. A posted
    /// operation cannot be recalled from the device: false, nothing changes.
    bool cancel(AsyncOpLinks* op) noexcept {
        if (op->state != OpState::waiting) return false;
        take_waiting(op);
        op->state = OpState::done;
        ++counters_.cancelled;
        return true;
    }

    /// A queue pair (`owner`) is being destroyed: its operations, posted or
    /// waiting, in submission order per list — complete each with operation_aborted.
    OpList release(const void* owner) noexcept {
        OpList out;
        for (OpList* list : {&live_, &waiting_}) {
            AsyncOpLinks* op = list->front();
            while (op != nullptr) {
                AsyncOpLinks* next = op->next;
                if (op->owner == owner) {
                    if (op->state == OpState::waiting) {
                        take_waiting(op);
                    } else {
                        live_.erase(op);
                        --live_count_;
                    }
                    op->state = OpState::done;
                    ++counters_.aborted;
                    out.push_back(op);
                }
                op = next;
            }
        }
        return out;
    }

    /// The completion queue is being destroyed: every operation — abort each.
    /// Later submissions are aborted at once.
    OpList shutdown() noexcept {
        closed_ = true;
        OpList out;
        while (AsyncOpLinks* op = live_.pop_front()) {
            op->state = OpState::done;
            ++counters_.aborted;
            out.push_back(op);
        }
        while (AsyncOpLinks* op = waiting_.front()) {
            take_waiting(op);
            op->state = OpState::done;
            ++counters_.aborted;
            out.push_back(op);
        }
        live_count_ = 0;
        return out;
    }

    [[nodiscard]] bool closed() const noexcept { return closed_; }
    /// The posted operations, and those waiting, oldest first (the liveness watch walks them).
    [[nodiscard]] AsyncOpLinks* first_posted() const noexcept { return live_.front(); }
    [[nodiscard]] AsyncOpLinks* first_waiting() const noexcept { return waiting_.front(); }
    /// Operations submitted and not yet done.
    [[nodiscard]] std::size_t outstanding() const noexcept { return live_count_ + waiting_count_; }
    [[nodiscard]] std::size_t waiting_count() const noexcept { return waiting_count_; }
    [[nodiscard]] const AsyncCounters& counters() const noexcept { return counters_; }

private:
    void take_waiting(AsyncOpLinks* op) noexcept {
        if (cursor_ == op) cursor_ = op->next;
        waiting_.erase(op);
        --waiting_count_;
        --op->queue->waiting;
    }

    OpList live_;    // posted, waiting for their completion
    OpList waiting_; // waiting for room in their queue, in submission order
    std::size_t live_count_ = 0;
    std::size_t waiting_count_ = 0;
    bool closed_ = false;
    std::uint64_t pass_ = 0;
    AsyncOpLinks* cursor_ = nullptr; ///< next_ready's place in the current pass
    AsyncCounters counters_;
};

} // namespace gpuverbs::detail
