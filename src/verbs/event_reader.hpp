// The reader behind every gpuverbs event stream: a non-blocking descriptor that
// becomes readable when an event is queued (a device's async_fd, an rdma_cm
// event channel), read synchronously (poll, wait_for) or by one async wait at a
// time on a strand of the user's executor, with an optional tick for what no
// descriptor reports (a removed Soft-RoCE device). DeviceEvents and CmConnection
// derive from it and say only how to read one event (read()) and whether more
// can come (exhausted()).
#pragma once

#include "gpuverbs/detail/async/event_wait.hpp"
#include "gpuverbs/error.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace gpuverbs::detail {

template <class Event>
class EventReader : public std::enable_shared_from_this<EventReader<Event>> {
public:
    using Callback = EventCallback<Event>;

    EventReader(const EventReader&) = delete;
    EventReader& operator=(const EventReader&) = delete;
    virtual ~EventReader() = default;

    /// The next event if one is pending; nothing when none (or after close()).
    virtual std::optional<Event> read(Status& status) = 0;

    [[nodiscard]] const boost::asio::any_io_executor& executor() const noexcept { return executor_; }
    [[nodiscard]] bool watching() const noexcept { return strand_.has_value(); }

    /// Lets async waits run on `executor`: a duplicate of the descriptor is
    /// watched there, so closing it leaves the owner's descriptor open.
    void watch(const boost::asio::any_io_executor& executor, Status& status) {
        executor_ = executor;
        strand_ = boost::asio::make_strand(executor);
        const int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) {
            status.fail_errno(errno, "fcntl", "cannot duplicate the event descriptor of " + what_);
            return;
        }
        descriptor_.emplace(*strand_);
        boost::system::error_code ec;
        descriptor_->assign(copy, ec); // NOLINT(bugprone-unused-return-value): ec carries the result
        if (ec) {
            ::close(copy);
            descriptor_.reset();
            strand_.reset();
            status.fail(std::error_code(ec.value(), std::system_category()), "epoll_ctl",
                        "cannot watch the event descriptor of " + what_ + ": " + ec.message());
            return;
        }
        if (tick_.count() > 0) timer_.emplace(*strand_);
    }

    /// No more events: reads find nothing, a pending or later wait ends with operation_aborted.
    void close() noexcept { closed_.store(true); }
    [[nodiscard]] bool closed() const noexcept { return closed_.load(); }

    /// Waits up to `timeout` for the next event; nothing when none came.
    std::optional<Event> wait_for(std::chrono::milliseconds timeout, Status& status) {
        // Clamped: now() + milliseconds::max() would overflow.
        timeout = std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365)));
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            std::optional<Event> event = read(status);
            if (event || !status.ok()) return event;
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0 || closed()) return std::nullopt;
            pollfd p{fd_, POLLIN, 0};
            const auto slice =
                tick_.count() > 0 ? std::min(left, tick_) : std::min(left, std::chrono::milliseconds(1000));
            if (exhausted()) {
                // Nothing more will come; sleep out the wait without spinning on a dead descriptor.
                (void)::poll(nullptr, 0, static_cast<int>(slice.count()));
            } else if (::poll(&p, 1, static_cast<int>(slice.count())) < 0 && errno != EINTR) {
                status.fail_errno(errno, "poll", "cannot wait for the events of " + what_);
                return std::nullopt;
            }
        }
    }

    // --- asynchronous waits: everything below runs on the strand -------------

    /// Starts the one async wait; `handler` runs once (posted by the callback).
    void start(Callback handler) {
        if (!strand_) {
            handler(boost::system::error_code(make_error_code(errc::no_executor)), Event{});
            return;
        }
        boost::asio::dispatch(*strand_, [self = this->shared_from_this(), h = std::move(handler)]() mutable {
            if (self->handler_) {
                h(boost::asio::error::already_started, Event{});
                return;
            }
            self->handler_ = std::move(h);
            self->cancelled_ = false;
            // Never complete inside the initiating call: the first look happens after a post.
            boost::asio::post(*self->strand_, [self] { self->step(); });
        });
    }

    /// Ends a pending async wait with operation_aborted.
    void cancel() noexcept {
        if (!strand_) return;
        try {
            // Weak: a pending wait keeps the reader alive by itself; an idle one must not be
            // kept (with its descriptor open) until the io_context runs again.
            boost::asio::dispatch(*strand_, [weak = this->weak_from_this()] {
                auto self = weak.lock();
                if (!self) return;
                self->cancelled_ = true;
                if (self->descriptor_) self->descriptor_->cancel();
                if (self->timer_) self->timer_->cancel();
            });
        } catch (...) {
            // No memory to queue the cancellation: the next step of the wait sees this and aborts.
            closed_.store(true);
        }
    }

protected:
    /// `fd`: non-blocking, readable when an event is queued (owned by the
    /// derived class); `tick`: how often a wait calls read() without one (0: never).
    EventReader(int fd, std::chrono::milliseconds tick, std::string what)
        : fd_(fd), tick_(tick), what_(std::move(what)) {}

    /// Whether nothing more can come from the descriptor (waits then only tick).
    [[nodiscard]] virtual bool exhausted() const noexcept = 0;

private:
    void finish(boost::system::error_code ec, Event event = {}) {
        Callback h = std::move(handler_);
        handler_ = {};
        // On the strand, after a wait: the callback posts to the handler's executor.
        h(ec, std::move(event));
    }

    void step() {
        if (!handler_) return;
        if (cancelled_ || closed()) {
            finish(boost::asio::error::operation_aborted);
            return;
        }
        Status status;
        std::optional<Event> event = read(status);
        if (!status.ok()) {
            finish(boost::system::error_code(status.code));
            return;
        }
        if (event) {
            finish({}, std::move(*event));
            return;
        }
        try {
            arm();
        } catch (...) { // no memory to wait: the wait ends, it does not hang
            finish(boost::asio::error::no_memory);
        }
    }

    /// Waits for the descriptor, or the next tick, whichever is first.
    void arm() {
        const unsigned round = ++round_;
        const bool only_ticks = exhausted();
        if (timer_ && (tick_.count() > 0 || only_ticks)) {
            timer_->expires_after(tick_.count() > 0 ? tick_ : std::chrono::milliseconds(1000));
            timer_->async_wait([self = this->shared_from_this(), round, only_ticks](boost::system::error_code ec) {
                if (self->round_ != round) return;
                if (only_ticks) {
                    self->step(); // the only wait outstanding: fired or cancelled, step() decides
                    return;
                }
                if (ec) return;
                self->descriptor_->cancel();
            });
        }
        if (only_ticks && timer_) return;
        descriptor_->async_wait(boost::asio::posix::descriptor_base::wait_read,
                                [self = this->shared_from_this()](boost::system::error_code ec) {
                                    if (self->timer_) self->timer_->cancel();
                                    if (ec && ec != boost::asio::error::operation_aborted) {
                                        self->finish(ec);
                                    } else {
                                        // A tick, a readable descriptor, or a cancel (step() sees cancelled_).
                                        self->step();
                                    }
                                });
    }

    int fd_;
    std::chrono::milliseconds tick_;
    std::string what_;
    boost::asio::any_io_executor executor_;
    std::optional<boost::asio::strand<boost::asio::any_io_executor>> strand_;
    std::optional<boost::asio::posix::stream_descriptor> descriptor_;
    std::optional<boost::asio::steady_timer> timer_;
    std::atomic<bool> closed_{false};
    // Strand-only state of the one async wait.
    Callback handler_;
    bool cancelled_ = false;
    unsigned round_ = 0;
};

} // namespace gpuverbs::detail
