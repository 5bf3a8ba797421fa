// The engine behind gpuverbs' asynchronous operations: one AsyncDriver per
// completion queue bound to an executor. It keeps only what needs I/O — the
// completion channel's file descriptor, the lock, the polling, and the
// dispatch of handlers — and leaves every bookkeeping decision to the pure
// AsyncFsm (async_fsm.hpp).
//
// The guarantees:
// - posting never races polling, and a completion can never reach an
//   operation that was already aborted or freed: both run under one lock,
//   and destroying a QueuePair aborts its operations and destroys the QP
//   under it (its later completions then find no QP in the CQ's registry);
// - destroying the CompletionQueue aborts everything still outstanding;
// - handlers never run under the lock; a handler whose executor is the CQ's
//   runs directly from the completion processing (already on that executor),
//   any other is posted to its own executor; aborts are always posted, and
//   every operation (a transfer's rail included) is completed after the lock
//   is released, so no library code runs under it;
// - nothing waits forever for a provider: while operations are outstanding a
//   watch looks at their queue pairs every AsyncOptions::liveness_tick and
//   ends what the provider will not (liveness.hpp);
// - if the execution context is destroyed with operations outstanding, the
//   service below destroys them without invoking them (Asio's rule).
// The lock is a spin lock: on the per-operation path its critical sections are
// a few verbs calls, and a std::mutex costs several times more per operation.
// Rarer paths hold it longer (destroying a QP, starting a wait on the fd).
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/detail/async/async_fsm.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <infiniband/verbs.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gpuverbs::detail {

/// A test-and-test-and-set lock that yields when it cannot get in quickly.
class SpinMutex {
public:
    /// `off`: the engine runs on one thread (AsyncOptions::single_threaded), lock and unlock do nothing.
    explicit SpinMutex(bool off = false) noexcept : off_(off) {}
    void lock() noexcept {
        if (off_) return;
        for (int tries = 0; locked_.exchange(true, std::memory_order_acquire); ++tries) {
            while (locked_.load(std::memory_order_relaxed)) {
                if (++tries > 64) std::this_thread::yield();
            }
        }
    }
    void unlock() noexcept {
        if (!off_) locked_.store(false, std::memory_order_release);
    }

private:
    std::atomic<bool> locked_{false};
    bool off_;
};

struct AsyncOpBase;

/// What a completion did to its operation, as an Asio reactor operation's
/// perform() says whether it is done.
enum class Completed : std::uint8_t {
    still_posted, ///< it has more in flight (or its completions lead nowhere any more): nothing to do
    wait_again,   ///< nothing in flight, and no room for its next part: it waits in order like a new operation
    finished,     ///< its handler is due
};

/// What an operation does, chosen when it is made (Asio's reactor_op idiom):
/// the driver calls through these and never branches on the kind of
/// operation, nor knows the kinds there are (a single send or receive here;
/// a transfer's rail, posted in parts, elsewhere). All run under the driver's lock.
struct OpBehaviour {
    /// Whether its work queue has room for what it posts next.
    bool (*has_room)(const AsyncOpBase& op) noexcept;
    /// Posts it (or its next part); an error means it is finished with that error.
    std::error_code (*post)(AsyncOpBase& op) noexcept;
    /// A completion of one of its requests (`sequence`: the request's place in
    /// its queue): records it, posts its next part if it has one and room.
    Completed (*completed)(AsyncOpBase& op, const ibv_wc& wc, std::uint64_t sequence) noexcept;
    /// Its queue pair failed and the provider did not complete what it holds
    /// within the flush grace: gpuverbs ends it with `ec` (liveness.hpp).
    void (*abandon)(AsyncOpBase& op, std::error_code ec) noexcept;
    /// AsyncDriver::stop: post nothing more (null: an operation posted in one piece).
    void (*stop)(AsyncOpBase& op) noexcept;
};
/// The behaviours of a single asynchronous send-side operation and receive.
extern const OpBehaviour send_behaviour;
extern const OpBehaviour receive_behaviour;

class AsyncDriver : public std::enable_shared_from_this<AsyncDriver> {
    friend class AsyncDriverService;

public:
    /// `cq` owns this driver; the driver refers to it only while not shut down.
    AsyncDriver(const boost::asio::any_io_executor& executor, CqCore& cq, const AsyncOptions& options);
    AsyncDriver(const AsyncDriver&) = delete;
    AsyncDriver& operator=(const AsyncDriver&) = delete;
    ~AsyncDriver();

    [[nodiscard]] const boost::asio::any_io_executor& executor() const noexcept { return executor_; }

    /// Takes a lowered operation (any thread): posted at once, or waiting in
    /// order while its work queue is full. A refusal is posted to its handler.
    void submit(AsyncOpBase* op) noexcept; // NOLINT(bugprone-exception-escape): see async_driver.cpp
    /// A cancellation for `op` (from its cancellation slot).
    void cancel(AsyncOpBase* op) noexcept;
    /// Stops an operation posted in parts (a transfer's rail), from any
    /// thread: it posts nothing more (OpBehaviour::stop); waiting, it is taken
    /// back and completed with operation_aborted at once (inline: the caller
    /// holds it open); posted, it finishes when what it has in flight
    /// completes (or its queue pair fails: liveness.hpp). Not yet submitted,
    /// its submission finishes it.
    void stop(AsyncOpBase& op) noexcept;
    /// The user dropped a QueuePair: abort its operations, destroy it (any thread).
    void release_qp(std::shared_ptr<QpCore> qp) noexcept;
    /// CompletionMode::polled: reaps the CQ, posts what waits, runs the
    /// watch when due and the handlers of what finished; returns how many
    /// operations finished. Nothing outstanding: returns at once (no verbs call).
    std::size_t progress() noexcept;
    [[nodiscard]] bool polled() const noexcept { return options_.mode == CompletionMode::polled; }
    /// Marks the queue pair of `op` failed for `cause` and moves it to ERROR,
    /// if `op` is still posted (any thread): its requests are flushed, or
    /// ended by the watch after the flush grace. False (nothing done) once
    /// `op` completed. A transfer abandons its notification so.
    bool fail_queue_pair_of(const AsyncOpBase& op, QueuePairFailure::Cause cause) noexcept;
    /// Whether `qp` has asynchronous operations waiting or posted (any thread).
    [[nodiscard]] bool has_operations(const QpCore& qp) noexcept;
    /// The user dropped the CompletionQueue: abort everything (any thread).
    void shutdown() noexcept;
    /// Destroys every operation without invoking it (the execution context is going away).
    void destroy_all() noexcept;
    /// Closes the driver and hands back every operation, to be destroyed
    /// (destroy()) after the lock is released: a handler's destructor may drop
    /// the last QueuePair or CompletionQueue, which takes the lock again.
    [[nodiscard]] OpList close_all() noexcept;
    static void destroy(OpList& ops) noexcept;

    [[nodiscard]] AsyncStatistics statistics() noexcept;

private:
    /// A completion of `op`'s: what its behaviour says it did, then waiting again or finished into `done`.
    void completed(AsyncOpBase& op, const ibv_wc& wc, std::uint64_t sequence, OpList& done) noexcept;
    /// Posts waiting operations that have room now; failures go to `done`.
    void post_ready(OpList& done) noexcept;
    /// Polls until the CQ is empty; completed operations go to `done`. Returns how many completions.
    std::size_t drain(OpList& done) noexcept;
    /// Requests the CQ's next completion event, unless it is armed and no
    /// event was taken since (a completion will raise one already).
    void arm() noexcept {
        if (armed_) return;
        (void)ibv_req_notify_cq(cq_->cq(), 0);
        armed_ = true;
    }
    /// Arms the CQ, polls once more (a completion that came before arming raises no event), waits on the fd.
    void arm_and_wait(OpList& done);
    void start_spinning();
    void on_readable(const boost::system::error_code& ec);
    void spin();
    void stop_waiting_if_idle() noexcept;
    /// Liveness (liveness.hpp): starts the watch's timer unless it runs.
    void start_watch();
    void on_watch(const boost::system::error_code& ec);
    /// One look at every queue pair with operations; those failed for the
    /// flush grace have their operations ended into `done`.
    void watch(OpList& done) noexcept;
    /// Looks at one queue pair (once per tick); true when gpuverbs must end its operations now.
    bool examine(QpCore& qp, std::chrono::steady_clock::time_point now, bool first_look) noexcept;
    /// Whether `qp`'s port is ACTIVE (read once per tick per port).
    bool port_active(QpCore& qp) noexcept;
    /// Ends every operation of `qp` with its failure's error (the provider did not).
    void complete_by_library(QpCore& qp, OpList& done) noexcept;
    /// Runs the handlers of `done` (outside the lock): directly where they may, else posted.
    static void deliver(OpList& done) noexcept;
    /// Posts operation_aborted to each operation of `ops`.
    static void abort(OpList& ops) noexcept;

    boost::asio::any_io_executor executor_;
    SpinMutex mutex_;
    CqCore* cq_; // not owned (the CQ owns us); never used once closed
    std::shared_ptr<ChannelCore> channel_;
    boost::asio::posix::stream_descriptor descriptor_;
    AsyncOptions options_;
    AsyncFsm fsm_;
    bool waiting_ = false;
    bool armed_ = false; ///< the CQ is armed and no event was taken since
    bool spinning_ = false;
    bool closed_ = false;
    bool spin_deadline_set_ = false;
    std::chrono::steady_clock::time_point spin_deadline_;
    std::uint64_t polls_ = 0;
    std::uint64_t empty_polls_ = 0;
    std::uint64_t wakeups_ = 0;
    std::uint64_t work_completions_ = 0;
    // Liveness.
    boost::asio::steady_timer watch_timer_;
    bool watching_ = false;
    std::chrono::steady_clock::time_point watch_due_; ///< polled mode: the watch's next look
    std::uint64_t tick_ = 0;
    /// Ports read this tick: (context, port) and whether ACTIVE. A few entries; more are read again.
    struct PortSeen {
        ibv_context* context = nullptr;
        std::uint8_t port = 0;
        bool active = true;
    };
    std::array<PortSeen, 8> ports_seen_{};
    std::size_t ports_seen_count_ = 0;
    std::uint64_t declared_failed_ = 0;      ///< queue pairs the watch declared failed (port down, stall, error state)
    std::uint64_t completed_by_library_ = 0; ///< operations the watch ended itself
};

/// Keeps track of every driver of an execution context so that, when the
/// context is destroyed, operations that never ran are destroyed, not leaked.
class AsyncDriverService : public boost::asio::execution_context::service {
public:
    using key_type = AsyncDriverService;
    // Asio's service identity idiom; id's constructor does nothing (it is just not marked noexcept).
    static inline boost::asio::execution_context::id id; // NOLINT(cert-err58-cpp)

    explicit AsyncDriverService(boost::asio::execution_context& context)
        : boost::asio::execution_context::service(context) {}
    void add(const std::shared_ptr<AsyncDriver>& driver);
    void shutdown() override;
    /// gpuverbs::progress: every polled driver of the context, once.
    std::size_t progress() noexcept;

private:
    std::mutex mutex_;
    std::vector<std::weak_ptr<AsyncDriver>> drivers_;
    std::vector<std::weak_ptr<AsyncDriver>> polled_; ///< the CompletionMode::polled ones, in creation order
};

} // namespace gpuverbs::detail
