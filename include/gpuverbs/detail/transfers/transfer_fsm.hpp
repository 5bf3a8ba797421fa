// The decisions of a block-list transfer, with no I/O: when a rail's failure
// moves its requests to other rails (and which), when the notification is
// armed and on which rail, when the transfer ends and with what error, and
// what is known of every request at the end.
//
// As Boost.Redis' exec_fsm and the asynchronous layer's AsyncFsm: events go
// in (start, a stream finished, the deadline or a cancellation, the stopped
// streams released, the takeover streams made or not), actions come out
// (make these takeover streams, submit them, stop every running stream, arm
// the notification on rail k, finish); TransferJobBase performs them with the
// queue pairs, its lock and the executors. The machine knows rails by index,
// requests by plan index and streams by the id it gave them: rail k's own
// stream is stream k, takeover streams follow in the order they were made.
// What it knows of the world comes with each event as inputs (Rails: which
// rails are usable now, which reach the notification's region), computed by
// the job before the event; the one question it asks mid-decision, how to
// stripe a range, is a pure function of the plan. A late or doubled event (a stream's second end,
// a release without a pin, an answer nobody asked for, a stop or an abandon
// once finished) is answered `wait` and changes nothing. Unit-tested without a
// device (tests/unit/transfer_fsm_test.cpp). Not thread-safe: the job's mutex guards it.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <vector>

namespace gpuverbs::detail {

/// How a stream's failure bears on the transfer.
enum class StreamFailure : std::uint8_t {
    none,         ///< it finished without error
    path,         ///< its path failed (link, peer, queue pair): another rail may carry its requests
    request,      ///< the requests are wrong (keys, ranges): as wrong on any rail
    notification, ///< it carried the notification and that failed: never posted twice
};

/// Classifies a finished RailStream's error `ec` (its first failed completion's
/// `status`, whether a post was refused, whether it carried the notification).
StreamFailure classify_stream_failure(std::error_code ec, ibv_wc_status status, bool post_refused,
                                      bool notification_failed) noexcept;

/// What the transfer knows of one request at the end (ordered: a later state wins over streams).
enum class RequestState : std::uint8_t {
    not_posted, ///< no stream handed it to the device
    uncertain,  ///< posted, not known to have completed
    landed,     ///< completed without error on some stream
};

class TransferFsm {
public:
    /// Where the transfer is.
    enum class Phase : std::uint8_t {
        idle,      ///< not started: a stop changes nothing
        running,   ///< streams run, no error: a path failure may fail over
        draining,  ///< an error is set; the streams still running finish
        stopping,  ///< the deadline or a cancellation: nothing more is posted, the streams drain
        notifying, ///< every request landed; the notification is in flight and ends the transfer
        finished,  ///< the handler is to be completed (or destroyed): no more events
    };

    /// Why the transfer's error was set, for the words of TransferOptions::failed_blocks.
    enum class Why : std::uint8_t {
        none,                     ///< not set by this event
        stopped,                  ///< the deadline or a cancellation (the reason tells which)
        stream_failed,            ///< the stream's own failure (its blocks, or the notification)
        every_rail_failed,        ///< a path failure with no rail left to take its requests
        no_rail_for_notification, ///< every request landed, no rail that has not failed reaches the notification
        notification_abandoned    ///< every request landed; the peer did not take the notification in time: its
                                  ///< queue pair was failed under it
    };

    /// One stream the machine asked for: rail `rail` runs requests [first, end).
    struct Stream {
        std::uint32_t rail = 0;
        std::uint32_t first = 0;
        std::uint32_t end = 0;
        /// Where its requests stood when it finished ([first, landed_end) landed,
        /// [landed_end, posted_end) uncertain, the rest never posted).
        std::uint32_t landed_end = 0;
        std::uint32_t posted_end = 0;
        bool running = false; ///< submitted (or to be) and not yet finished
    };

    /// What one rail did, as TransferReport::Rail says it.
    struct Rail {
        std::error_code error;        ///< its first failure (empty: it did not fail)
        std::uint32_t taken_over = 0; ///< its requests that other rails posted again
        std::uint32_t took_over = 0;  ///< requests of failed rails it posted
    };

    /// What the machine is told of the rails at an event (the job computes it
    /// from its queue pairs and plan before the event; a test from its model),
    /// and the striping it may ask for.
    class Rails {
    public:
        /// Per rail, non-zero when its queue pair is alive and accepts
        /// asynchronous operations, as seen just before this event (read with failover only).
        std::span<const std::uint8_t> usable;
        /// Per rail, non-zero when it has a key for the remote region the notification goes to.
        std::span<const std::uint8_t> reaches;
        /// Cuts [first, end) into weights.size() contiguous ranges, rail k's
        /// [bounds[k], bounds[k + 1]); a rail of weight 0 gets an empty one (detail::stripe).
        virtual void stripe(std::uint32_t first, std::uint32_t end, std::span<const std::uint64_t> weights,
                            std::span<std::uint32_t> bounds) = 0;

    protected:
        Rails() = default;
        Rails(const Rails&) = default;
        Rails& operator=(const Rails&) = default;
        ~Rails() = default;
    };

    /// What the job is to do after an event.
    struct Action {
        enum class Kind : std::uint8_t {
            wait,         ///< nothing: wait for the next event
            make_streams, ///< make streams()[first_stream, end_stream), then takeover_made()
            submit,       ///< submit the running streams among streams()[first_stream, end_stream)
            stop_streams, ///< the stop was taken (and pins the job open): stop every running stream, then unpin()
            notify,       ///< arm the notification on `rail`'s own stream and submit it
            /// The notification on `rail` is overdue: fail that rail's queue pair (its send queue
            /// waits behind a notification the peer does not take); its stream then ends as any does.
            abandon_notification,
            finish, ///< complete the handler with error() (destroy it instead when destroyed())
        };
        Kind kind = Kind::wait;
        std::uint32_t first_stream = 0;
        std::uint32_t end_stream = 0;
        std::size_t rail = 0;
        /// The finished stream's failure became its rail's outcome (keep its words).
        bool record_failure = false;
        /// The transfer's error was set by this event, for this reason (write the words).
        Why why = Why::none;
    };

    /// A stream finished (its id, where its requests stand, its error and how it bears).
    struct StreamEnd {
        std::uint32_t stream = 0;
        std::uint32_t landed_end = 0;
        std::uint32_t posted_end = 0;
        std::error_code error;                       ///< empty: every request it took landed
        StreamFailure failure = StreamFailure::none; ///< classify_stream_failure()
        bool own_failure = false; ///< a completion of its own failed or its post was refused (not only stopped)
        bool destroyed = false;   ///< completed as its execution context is destroyed
    };

    /// Starts: rail k's own stream runs [bounds[k], bounds[k + 1]) (bounds[0] is 0,
    /// the last is the plan's request count). `failover` applies with several
    /// rails; `notify`: a notification after the last request. Submit the streams returned.
    Action start(std::span<const std::uint32_t> bounds, bool failover, bool notify, Rails& rails);
    /// A stream the machine made finished (the notification's included).
    Action stream_finished(const StreamEnd& end, Rails& rails);
    /// After Action::make_streams: whether every stream could be made (no: none is used).
    Action takeover_made(bool made, Rails& rails);
    /// The deadline (timed_out) or a cancellation (operation_aborted): stop_streams when
    /// taken, wait when it changes nothing (not running, finishing, notifying, destroyed).
    Action stop(std::error_code reason);
    /// The stop's pin is released (every stream it listed was stopped).
    Action unpin(Rails& rails);
    /// The deadline, a cancellation or the notification's own bound while the
    /// notification is in flight: abandon_notification the first time, wait
    /// otherwise (no notification in flight, or abandoned already). When the
    /// notification's stream then fails (its queue pair failed under it), the
    /// transfer's error is `reason` (Why::notification_abandoned); should it
    /// complete after all (it landed before its queue pair failed), the
    /// transfer succeeds: the peer has it.
    Action abandon_notification(std::error_code reason);

    /// Whether stop() would be taken now (the job writes its words before, where they cannot fail half-way).
    [[nodiscard]] bool stoppable() const noexcept {
        return (phase_ == Phase::running || phase_ == Phase::draining) && !destroyed_ && participants_ > 0;
    }
    [[nodiscard]] Phase phase() const noexcept { return phase_; }
    /// The rail whose stream carries the notification (once notifying).
    [[nodiscard]] std::size_t notification_rail() const noexcept { return notify_rail_; }
    /// The first error (empty: none yet, or success once finished).
    [[nodiscard]] std::error_code error() const noexcept { return error_; }
    /// A stream completed as its execution context was destroyed: the handler is destroyed, not called.
    [[nodiscard]] bool destroyed() const noexcept { return destroyed_; }
    [[nodiscard]] std::span<const Stream> streams() const noexcept { return streams_; }
    [[nodiscard]] std::span<const Rail> rails() const noexcept { return rails_; }
    /// Every request's state over every stream that carried it: landed on
    /// any, else uncertain if any posted it, else not posted (`out`: one per request).
    void request_states(std::span<RequestState> out) const noexcept;

private:
    /// How a failed stream's requests were settled.
    enum class Settled : std::uint8_t {
        moved_on,          ///< taken care of: they landed, or other rails took them over
        every_rail_failed, ///< they could have moved, but no rail was left (or the takeover could not be made)
        stream_failed,     ///< they cannot move: the stream's own failure is the transfer's
    };
    /// The rest of a stream's end, once its takeover is decided.
    Action conclude(Settled how, Rails& rails, Action a);
    /// A participant (stream or pin) is done: notify, finish, or wait for the others.
    Action settle(Action a, Rails& rails);

    Phase phase_ = Phase::idle;
    bool failover_ = false;
    bool notify_ = false;
    bool abandoned_ = false;         ///< the notification in flight was abandoned
    std::error_code abandon_reason_; ///< … for this reason
    bool destroyed_ = false;
    std::error_code error_;
    std::size_t participants_ = 0; ///< running streams, plus a stop's pin
    std::size_t notify_rail_ = 0;
    std::vector<Stream> streams_;
    std::vector<Rail> rails_;
    StreamEnd ending_;                   ///< the stream whose failure is being decided
    std::uint32_t proposed_ = 0;         ///< the first stream of a make_streams not yet answered
    bool proposing_ = false;             ///< … while it is not answered
    bool pinned_ = false;                ///< a stop's pin is held
    std::vector<std::uint64_t> weights_; ///< the takeover's weights (scratch)
    std::vector<std::uint32_t> bounds_;  ///< … and its stripes (scratch)
};

} // namespace gpuverbs::detail
