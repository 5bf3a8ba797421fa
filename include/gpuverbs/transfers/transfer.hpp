// Block-list transfers: move many scattered blocks in one operation — the
// KV-cache hand-off of disaggregated inference (a request's blocks in one
// paged pool land in another pool's, differently scattered blocks).
//
//   std::vector<gpuverbs::LocalBuffer> mine = {pool.slice(7 * B, B), pool.slice(2 * B, B)};
//   std::vector<gpuverbs::RemoteBlock> theirs = {{peer_pool, 40 * B, B}, {peer_pool, 41 * B, B}};
//   auto plan = gpuverbs::TransferPlan(gpuverbs::TransferDirection::write, mine, theirs, qp.capabilities());
//   gpuverbs::async_transfer(qp, plan, {.notify = request_id, .failed_blocks = &why}, [](auto ec, std::size_t bytes)
//   {});
//   // the peer: a receive completes with immediate == request_id once every block has landed
//
// The two lists describe the same bytes in order, cut differently: any
// lengths on either side. TransferPlan checks them (no zero-length block,
// every block inside its region, equal totals, no two blocks writing the same
// bytes), coalesces neighbours (contiguous blocks of one region become one
// request) and cuts the result into work requests that respect the queue
// pair's scatter/gather limit and the message size. Errors name the block.
#pragma once

#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include "gpuverbs/detail/async/async_op.hpp"
#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/transfers/plan_array.hpp"
#include "gpuverbs/detail/transfers/transfer_fsm.hpp"
#include "gpuverbs/detail/transfers/transfer_stream.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/recycling_allocator.hpp>
#include <boost/asio/system_executor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpuverbs {

enum class TransferDirection : std::uint8_t {
    write, ///< local blocks → remote blocks (RDMA write)
    read,  ///< remote blocks → local blocks (RDMA read)
};

/// What bounds one work request of a transfer.
struct TransferLimits {
    /// Local pieces one request may gather or scatter (the QP's max_send_sge).
    std::uint32_t max_sge = 1;
    /// The largest message (RoCE and InfiniBand allow 2^31 bytes).
    std::uint64_t max_message = std::uint64_t{1} << 31;
};

class TransferPlan;
namespace detail {
/// How a plan is made: the one-pass planner for paired lists where it
/// applies (the default), or always the general walk (tests compare the two).
enum class Planner : std::uint8_t { best, general };
TransferPlan make_transfer_plan(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, Status& status,
                                Planner planner = Planner::best);
} // namespace detail

/// A checked, coalesced, chunked transfer: the work requests to post.
class TransferPlan {
public:
    /// One work request: a contiguous remote range and its local pieces.
    struct Request {
        RemoteMemory remote;           ///< the exact remote range (address, length, rkey)
        std::uint32_t first_piece = 0; ///< into pieces()
        std::uint32_t piece_count = 0;
        std::uint32_t first_local = 0;  ///< the local block where it starts (for messages)
        std::uint32_t first_remote = 0; ///< the remote block where it starts
        std::uint32_t last_remote = 0;  ///< the remote block where it ends
    };

    /// An empty plan (nothing to move).
    TransferPlan() = default;
    /// Checks and plans; throws gpuverbs::Error (errc::invalid_argument) naming the block.
    TransferPlan(TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
                 const TransferLimits& limits = {});
    /// … limits from a queue pair's capabilities (max_send_sge).
    TransferPlan(TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
                 const QueuePairCapabilities& caps)
        : TransferPlan(direction, local, remote, TransferLimits{caps.max_send_sge}) {}
    /// The error_code form: an empty plan on failure.
    static TransferPlan create(TransferDirection direction, std::span<const LocalBuffer> local,
                               std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec);
    /// … with the words the exception would carry kept in `diagnostics`.
    static TransferPlan create(TransferDirection direction, std::span<const LocalBuffer> local,
                               std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec,
                               Diagnostics& diagnostics);

    [[nodiscard]] TransferDirection direction() const noexcept { return direction_; }
    [[nodiscard]] std::span<const Request> requests() const noexcept { return requests_.span(); }
    [[nodiscard]] std::span<const LocalBuffer> pieces() const noexcept { return pieces_.span(); }
    /// The pieces as the device reads them (one ibv_sge each, the plan's keys).
    [[nodiscard]] std::span<const ibv_sge> native_pieces() const noexcept { return sges_.span(); }
    [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
    [[nodiscard]] std::size_t local_blocks() const noexcept { return local_blocks_; }
    [[nodiscard]] std::size_t remote_blocks() const noexcept { return remote_blocks_; }
    /// The work request for request `i` (refers to this plan: keep it alive until posted).
    [[nodiscard]] WorkRequest work_request(std::size_t i) const noexcept;
    /// "remote block 17" or "remote blocks 17 to 19 (local block 4 onwards)", for request `i`.
    [[nodiscard]] std::string blocks_of(std::size_t i) const;

private:
    friend TransferPlan detail::make_transfer_plan(TransferDirection, std::span<const LocalBuffer>,
                                                   std::span<const RemoteBlock>, const TransferLimits&, detail::Status&,
                                                   detail::Planner);
    TransferDirection direction_ = TransferDirection::write;
    detail::PlanArray<Request> requests_;
    detail::PlanArray<LocalBuffer> pieces_;
    detail::PlanArray<ibv_sge> sges_;
    std::uint64_t bytes_ = 0;
    std::size_t local_blocks_ = 0;
    std::size_t remote_blocks_ = 0;
};

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

namespace detail {

/// Fills report.remote_blocks and the counts from report.requests (one state
/// per request of `plan`): a block is landed when every request carrying
/// part of it landed, not_posted when none was posted, else uncertain.
void summarize_blocks(const TransferPlan& plan, TransferReport& report);

/// A plan cut into contiguous ranges of requests, one per rail.
struct Stripes {
    std::vector<std::uint32_t> bounds; ///< rail k runs requests [bounds[k], bounds[k + 1])
    std::vector<std::uint64_t> bytes;  ///< … and moves this many bytes
};
/// Splits the plan's requests into `rails` contiguous ranges of about equal
/// bytes: rail k ends at the first request boundary at or past k+1 shares of
/// the total (a request is never split: bound one with TransferLimits::max_message);
/// at most one boundary per request, so empty rails come only at the end.
Stripes stripe(const TransferPlan& plan, std::size_t rails);
/// Splits requests [first, end) of the plan into weights.size() contiguous
/// ranges whose bytes are about proportional to the weights, by the same
/// rule; a rail of weight 0 gets an empty range (all 0: equal shares).
Stripes stripe(const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
               std::span<const std::uint64_t> weights);

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

    /// Sets up one stream per rail; false (and `ec`, `why`) when a rail cannot run.
    bool setup(std::span<const BoundRail> rails, const TransferPlan& plan, const TransferOptions& options,
               std::error_code& ec, std::string& why);
    /// Starts the deadline's timer when there is one, then submits every
    /// rail that has requests (after setup succeeded). Throws (std::bad_alloc)
    /// only before anything is submitted: then the job may be discarded.
    void start();

    /// Stops the transfer (a cancellation: operation_aborted; the deadline:
    /// timed_out): nothing more is posted, waiting rails are taken back,
    /// posted ones drain; the handler runs once the device is done with
    /// every request. Nothing happens once it is finishing or notifying.
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
    std::uint64_t bytes_ = 0;

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
    Holds usable_;                                   ///< per rail: locked when the machine asked if it is usable
    Stripes stripes_;                                ///< the last takeover's striping (its bytes per rail)
    std::vector<TransferReport::Rail> outcomes_;     ///< per rail: bytes, busy, the failure in words
    std::vector<std::unique_ptr<RailStream>> extra_; ///< streams that took over a failed rail's requests
    std::optional<std::chrono::steady_clock::time_point> deadline_at_;
    boost::asio::any_io_executor executor_; ///< the first rail's CQ's: where the deadline's timer runs
    std::shared_ptr<Deadline> deadline_;
    std::optional<std::uint32_t> notify_;
    std::string* failed_blocks_ = nullptr;
    std::span<std::uint64_t> rail_bytes_;
    TransferReport* report_ = nullptr;

    /// Fills report_ from the machine once every stream has finished.
    void fill_report() const;
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

    /// Completes the handler with `ec` without starting anything (posted, never inline).
    void refuse(std::error_code ec) {
        error_ = ec;
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
        const auto bytes = static_cast<std::size_t>(self->bytes_);
        Allocator allocator(boost::asio::get_associated_allocator(handler, boost::asio::recycling_allocator<void>()));
        Traits::destroy(allocator, self);
        Traits::deallocate(allocator, self, 1);
        if (destroy) return;
        auto executor = work.get_executor();
        work.reset();
        boost::asio::post(executor, boost::asio::append(std::move(handler), ec, bytes));
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
            ready = job->setup(rails, *plan, options, ec, why);
        } catch (...) {
            Job::discard(job);
            throw;
        }
        if (!ready) {
            if (options.failed_blocks != nullptr) *options.failed_blocks = why;
            return job->refuse(ec);
        }
        try {
            job->bind_cancellation();
            job->start(); // throws only before anything is submitted
        } catch (...) {
            Job::discard(job);
            throw;
        }
    }
};

} // namespace detail

/// Moves `plan` over one or several rails (asynchronously: every rail's CQ
/// must be bound to an executor) and completes once:
/// void(async_error_code, std::size_t bytes). Requests are striped
/// over the rails by bytes (contiguous ranges), each rail posted in chains of
/// options.doorbell_batch with the last signaled, refilled from its own
/// completions. The error is the first that happened (a device status;
/// operation_aborted when a queue pair or CQ was destroyed; errc::invalid_argument
/// for an empty plan, no rail, or a key a rail cannot
/// translate; errc::no_executor). `plan`, its memory and the options'
/// outputs must live until completion; the rails' queue pairs are held
/// weakly from when the operation is made (a deferred transfer launched after
/// one was destroyed completes with operation_aborted; one destroyed while it
/// runs aborts it). The job is allocated with the handler's associated
/// allocator. options.deadline bounds it (std::errc::timed_out). Cancellation
/// (the handler's cancellation slot, any type): nothing more is posted,
/// waiting rails are taken back, and the handler runs with
/// operation_aborted once the device is done with every request it took —
/// never while a posted request may still touch the memory; options.report
/// then says which blocks landed. When the execution
/// context of one rail is destroyed with the transfer running, the handler
/// is destroyed without being called (Asio's rule), whatever the other rails do.
template <boost::asio::completion_token_for<void(async_error_code, std::size_t)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(std::span<const TransferRail> rails, const TransferPlan& plan, const TransferOptions& options,
                    Token&& token = Token()) {
    boost::asio::any_io_executor executor;
    if (!rails.empty() && rails.front().qp != nullptr) executor = rails.front().qp->get_executor();
    return boost::asio::async_initiate<Token, void(async_error_code, std::size_t)>(
        detail::InitiateTransfer{detail::bind_rails(rails), &plan, options, executor}, token);
}

/// … on one queue pair.
template <boost::asio::completion_token_for<void(async_error_code, std::size_t)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, const TransferOptions& options, Token&& token = Token()) {
    const TransferRail rail{&qp, {}, {}};
    return async_transfer(std::span<const TransferRail>(&rail, 1), plan, options, std::forward<Token>(token));
}

/// … on one queue pair, without options.
template <boost::asio::completion_token_for<void(async_error_code, std::size_t)> Token =
              default_token_t<boost::asio::any_io_executor>>
auto async_transfer(QueuePair& qp, const TransferPlan& plan, Token&& token = Token()) {
    return async_transfer(qp, plan, TransferOptions{}, std::forward<Token>(token));
}

} // namespace gpuverbs
