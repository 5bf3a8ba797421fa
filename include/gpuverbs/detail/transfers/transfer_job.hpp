// The engine behind async_transfer (transfer.hpp): striping a plan over
// rails, the job that owns one transfer's rail streams and its deadline, and
// the named initiation. Its decisions are TransferFsm's (transfer_fsm.hpp);
// the job performs them. Internal: included by transfer.hpp only.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/transfers/transfer_options.hpp"
#include "gpuverbs/transfers/transfer_plan.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include "gpuverbs/detail/async/async_op.hpp"
#include "gpuverbs/detail/transfers/stripes.hpp"
#include "gpuverbs/detail/transfers/transfer_fsm.hpp"
#include "gpuverbs/detail/transfers/transfer_stream.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/recycling_allocator.hpp>
#include <boost/asio/system_executor.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs::detail {

/// A rail as a transfer holds it from when the operation is made: its queue
/// pair weakly (a QueuePair destroyed before a deferred transfer is launched
/// makes it complete with operation_aborted, never a dangling pointer).
struct BoundRail {
    std::weak_ptr<QpCore> qp;
    bool given = false; ///< the TransferRail named a queue pair (not null, not empty)
    std::vector<KeyMap> local_keys;
    std::vector<KeyMap> remote_keys;
};
/// The rails of `rails`, bound as above.
std::vector<BoundRail> bind_rails(std::span<const TransferRail> rails);
/// Their queue pairs, locked for the set-up (an empty pointer for one that is gone).
struct LockedRail {
    std::shared_ptr<QpCore> qp;
    const BoundRail* rail = nullptr;
};

/// What a transfer shares between its rails: the I/O layer of a transfer.
/// Its decisions (failover, the notification, the end and its error, the
/// report) are TransferFsm's; the job feeds it every event under its lock and
/// performs what it returns with the queue pairs, the drivers and the
/// deadline's timer, then completes the handler once (typed part: TransferJob).
class TransferJobBase {
public:
    TransferJobBase(const TransferJobBase&) = delete;
    TransferJobBase& operator=(const TransferJobBase&) = delete;

    /// Sets up one stream per rail; false (and `ec`, `why`) when a rail cannot
    /// run. `every_rail`: the result's report has its rails even with one
    /// rail and without report_blocks (a RailGroup learns from them).
    bool setup(std::span<const BoundRail> rails, const TransferPlan& plan, const TransferOptions& options,
               bool every_rail, std::error_code& ec, std::string& why);
    /// Starts the deadline's timer when there is one, then submits every
    /// rail that has requests (after setup succeeded). Throws (std::bad_alloc)
    /// only before anything is submitted: then the job may be discarded.
    void start();

    /// Stops the transfer (a cancellation: operation_aborted; the deadline:
    /// timed_out): nothing more is posted, waiting rails are taken back,
    /// posted ones drain; the handler runs once the device is done with
    /// every request. Notifying (every block landed), the notification is
    /// abandoned: its queue pair is failed and moved to error, and the
    /// transfer ends with `reason` once its stream ends (at the latest the
    /// watch's flush grace later). Nothing happens once it is finishing.
    void stop(std::error_code reason) noexcept; // NOLINT(bugprone-exception-escape): only std::bad_alloc
    /// stop() in two steps, for a caller that must hold the job open under
    /// its own lock (the deadline's timer): pin() under that lock, true
    /// when the job is now held open and stopping; then stop_pinned().
    bool pin(std::error_code reason);
    void stop_pinned() noexcept; // NOLINT(bugprone-exception-escape): only std::bad_alloc

protected:
    using Finish = void (*)(TransferJobBase*, bool destroy);
    explicit TransferJobBase(Finish finish) noexcept : finish_(finish) {}
    ~TransferJobBase() = default;

    std::error_code error_;
    TransferResult result_; ///< what the handler receives: bytes, the failure in words, the report

    /// The words of a refusal (a rail that cannot run: setup's `why`), as a failure's.
    void refused(std::string why);

private:
    struct Deadline; // its timer and a link back here (transfer.cpp)
    class Probe;     // the machine's questions, answered from the queue pairs and the plan (transfer.cpp)
    using Holds = std::vector<std::shared_ptr<QpCore>>; ///< queue pairs kept alive until their streams are submitted

    // Only std::bad_alloc (the words of an error, the handler's post): termination rather than a lost handler.
    // NOLINTNEXTLINE(bugprone-exception-escape)
    static void rail_done(AsyncOpBase* op, AsyncOpBase::How how, std::error_code ec) noexcept;
    void finished_one(RailStream& rail, AsyncOpBase::How how, std::error_code ec);
    /// Under the lock: makes the takeover streams the machine asked for (Action::make_streams);
    /// false, and none kept, when one cannot be made (a key its rail cannot translate).
    bool make_takeover(const TransferFsm::Action& action, Holds& hold);
    /// Under the lock: writes the words of the transfer's error, set for `why` (`text`: the stream's own).
    void explain(TransferFsm::Why why, std::string text);
    /// Performs the machine's action: submits, arms the notification or
    /// finishes (after releasing the lock), or
    /// waits. Returns with the lock released, and lets go of the queue pairs
    /// the machine looked at only then.
    void perform(std::unique_lock<std::mutex>& lock, const TransferFsm::Action& action);
    /// Starts `d`'s timer for `at`: when it passes, the transfer stops as at its deadline (pin).
    static void arm(const std::shared_ptr<Deadline>& d, std::chrono::steady_clock::time_point at);
    /// Under the lock, notifying: the machine's abandon_notification, the
    /// words for when the notification then fails, and the notification's
    /// queue pair failed (through its driver, while the notification is posted).
    void abandon_notification(std::error_code reason);
    /// The stream the machine calls `id`: rail id's own, then those that took over.
    [[nodiscard]] RailStream& stream(std::uint32_t id) const noexcept;
    [[nodiscard]] std::uint32_t stream_id(const RailStream& s) const noexcept;
    /// Submits `s` to its driver (never called under a driver's lock).
    static void submit_stream(RailStream* s);

    Finish finish_;
    std::mutex mutex_;
    TransferFsm fsm_;
    const TransferPlan* plan_ = nullptr;
    std::unique_ptr<RailStream[]> rails_;
    std::size_t rail_count_ = 0;
    std::chrono::steady_clock::time_point started_at_; ///< for TransferReport::Rail::busy
    // Failover (with several rails).
    bool failover_ = false;
    std::uint32_t chain_ = 32;
    std::vector<BoundRail> bound_;                   ///< the rails as given, to take over
    Holds usable_;                                   ///< per rail: locked for the event being decided
    std::vector<std::uint8_t> usable_now_;           ///< … and whether it is usable (the machine's input)
    std::vector<std::uint8_t> reaches_;              ///< per rail: has a key for the notification's region
    Stripes stripes_;                                ///< the last takeover's striping (its bytes per rail)
    std::vector<TransferReport::Rail> outcomes_;     ///< per rail: bytes, busy, the failure in words
    std::vector<std::unique_ptr<RailStream>> extra_; ///< streams that took over a failed rail's requests
    std::optional<std::chrono::steady_clock::time_point> deadline_at_;
    boost::asio::any_io_executor executor_; ///< the first rail's CQ's: where the deadline's timer runs
    std::shared_ptr<Deadline> deadline_;
    /// TransferOptions::notification_timeout, and its timer once the notification is posted (when it
    /// ends before the deadline).
    std::chrono::milliseconds notification_timeout_{};
    std::shared_ptr<Deadline> notification_timer_;
    std::string abandon_words_; ///< the transfer's words if the abandoned notification fails
    std::optional<std::uint32_t> notify_;
    std::array<std::byte, 64> notify_message_{}; ///< TransferOptions::notify_message, copied
    std::uint32_t notify_message_size_ = 0;
    bool report_blocks_ = false; ///< TransferOptions::report_blocks (or its deprecated report)
    // TransferOptions' deprecated outputs (0.1), filled as 0.1 filled them until 0.3.
    std::string* old_failed_blocks_ = nullptr;
    std::span<std::uint64_t> rail_bytes_;
    TransferReport* old_report_ = nullptr;

    /// Fills the result's report from the machine once every stream has
    /// finished: its rails when the job kept them, the blocks when asked.
    void fill_report();
    /// Copies the result into TransferOptions' deprecated outputs that were given.
    void fill_old_outputs() const;
};

template <class Handler>
class TransferJob final : public TransferJobBase {
public:
    using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
    using Allocator = typename std::allocator_traits<boost::asio::associated_allocator_t<
        Handler, boost::asio::recycling_allocator<void>>>::template rebind_alloc<TransferJob>;
    using Traits = std::allocator_traits<Allocator>;

    /// A job in memory from the handler's associated allocator (Asio's
    /// recycling allocator when it has none), freed before the handler runs.
    static TransferJob* create(Handler h, const boost::asio::any_io_executor& fallback) {
        Allocator allocator(boost::asio::get_associated_allocator(h, boost::asio::recycling_allocator<void>()));
        TransferJob* job = Traits::allocate(allocator, 1);
        try {
            Traits::construct(allocator, job, std::move(h), fallback);
        } catch (...) {
            Traits::deallocate(allocator, job, 1);
            throw;
        }
        return job;
    }
    /// Frees a job that never started (a throwing set-up), without its handler.
    static void discard(TransferJob* job) noexcept {
        if (job->slot_.is_connected()) job->slot_.clear();
        Allocator allocator(
            boost::asio::get_associated_allocator(job->handler_, boost::asio::recycling_allocator<void>()));
        Traits::destroy(allocator, job);
        Traits::deallocate(allocator, job, 1);
    }

    TransferJob(Handler h, const boost::asio::any_io_executor& fallback)
        : TransferJobBase(&TransferJob::finish),
          handler_(std::move(h)),
          work_(boost::asio::get_associated_executor(handler_, fallback)) {}

    /// Completes the handler with `ec`, and `why` in words, without starting anything (posted, never inline).
    void refuse(std::error_code ec, std::string why) {
        error_ = ec;
        refused(std::move(why));
        finish(this, false);
    }
    /// Connects the handler's cancellation slot (any type but none stops the transfer).
    void bind_cancellation() {
        slot_ = boost::asio::get_associated_cancellation_slot(handler_);
        if (slot_.is_connected()) slot_.template emplace<Canceller>(this);
    }

private:
    struct Canceller {
        explicit Canceller(TransferJobBase* j) noexcept : job(j) {}
        TransferJobBase* job;
        // NOLINTNEXTLINE(bugprone-exception-escape): stop() throws only std::bad_alloc
        void operator()(boost::asio::cancellation_type type) const noexcept {
            if (type != boost::asio::cancellation_type::none) job->stop(aborted_error());
        }
    };

    // Only std::bad_alloc from asio::post can escape: termination rather than a lost handler.
    // NOLINTNEXTLINE(bugprone-exception-escape)
    static void finish(TransferJobBase* base, bool destroy) noexcept {
        auto* self = static_cast<TransferJob*>(base);
        if (self->slot_.is_connected()) self->slot_.clear();
        Handler handler(std::move(self->handler_));
        boost::asio::executor_work_guard<Executor> work(std::move(self->work_));
        const async_error_code ec = to_asio_error(self->error_);
        TransferResult result = std::move(self->result_);
        Allocator allocator(boost::asio::get_associated_allocator(handler, boost::asio::recycling_allocator<void>()));
        Traits::destroy(allocator, self);
        Traits::deallocate(allocator, self, 1);
        if (destroy) return;
        // Posted before the work is let go (the guard's destructor, after it): the
        // post counts as work first. Let go before it, an io_context with no other
        // work would count 0 and stop — a refusal completed inside async_transfer,
        // outside any handler, then left io.run() returning at once, its handler
        // never run.
        boost::asio::post(work.get_executor(), boost::asio::append(std::move(handler), ec, std::move(result)));
    }

    Handler handler_;
    boost::asio::executor_work_guard<Executor> work_;
    boost::asio::associated_cancellation_slot_t<Handler> slot_;
};

/// The named initiation of async_transfer: the rails are bound when the
/// operation is made; its executor is the first rail's CQ's, where a handler
/// without one of its own completes.
struct InitiateTransfer {
    std::vector<BoundRail> rails;
    const TransferPlan* plan;
    TransferOptions options;
    boost::asio::any_io_executor executor;
    bool every_rail = false; ///< the report's rails even with one rail (a RailGroup's transfer)

    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return executor; }

    template <class Handler>
    void operator()(Handler&& handler) const {
        using Job = TransferJob<std::decay_t<Handler>>;
        // Without an executor the refusal still completes, on the system executor.
        const boost::asio::any_io_executor fallback =
            executor ? executor : boost::asio::any_io_executor(boost::asio::system_executor());
        Job* job = Job::create(std::forward<Handler>(handler), fallback);
        std::error_code ec;
        std::string why;
        bool ready = false;
        try {
            ready = job->setup(rails, *plan, options, every_rail, ec, why);
        } catch (...) {
            Job::discard(job);
            throw;
        }
        if (!ready) return job->refuse(ec, std::move(why));
        try {
            job->bind_cancellation();
            job->start(); // throws only before anything is submitted
        } catch (...) {
            Job::discard(job);
            throw;
        }
    }
};

} // namespace gpuverbs::detail
