#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/detail/access.hpp"

#include "gpuverbs/detail/async/async_driver.hpp"

#include <fcntl.h>
#include <poll.h>

#include <boost/asio/execution/context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/system_error.hpp>

#include <cerrno>
#include <cstdint>
#include <limits>

namespace gpuverbs {

CompletionChannel CompletionChannel::create_impl(const Device& device, detail::Status& status) {
    if (!device) {
        status.fail(errc::invalid_argument, "ibv_create_comp_channel", "the Device is empty");
        return {};
    }
    errno = 0;
    ibv_comp_channel* channel = ibv_create_comp_channel(device.native_handle());
    if (channel == nullptr) {
        status.fail_errno(errno != 0 ? errno : ENOMEM, "ibv_create_comp_channel",
                          "cannot create a completion channel on " + device.name());
        return {};
    }
    // wait() uses poll(2) with a timeout, so reads must never block.
    (void)::fcntl(channel->fd, F_SETFL, ::fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    CompletionChannel c;
    c.core_ = std::make_shared<detail::ChannelCore>(detail::access::core(device), channel);
    return c;
}

CompletionChannel::CompletionChannel(const Device& device)
    : CompletionChannel(detail::or_throw([&](detail::Status& s) { return create_impl(device, s); })) {}

CompletionChannel CompletionChannel::create(const Device& device, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(device, s); });
}

CompletionQueue CompletionQueue::create_impl(const Device& device, int capacity, const CompletionChannel* channel,
                                             detail::Status& status) {
    if (!device) {
        status.fail(errc::invalid_argument, "ibv_create_cq", "the Device is empty");
        return {};
    }
    if (capacity <= 0) {
        status.fail(errc::invalid_argument, "ibv_create_cq",
                    "a completion queue needs a capacity of at least 1 (got " + std::to_string(capacity) + ")");
        return {};
    }
    if (channel != nullptr && !*channel) {
        status.fail(errc::invalid_argument, "ibv_create_cq", "the CompletionChannel is empty");
        return {};
    }
    errno = 0;
    ibv_cq* cq = ibv_create_cq(device.native_handle(), capacity, nullptr,
                               channel != nullptr ? channel->native_handle() : nullptr, 0);
    if (cq == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        status.fail_errno(err, "ibv_create_cq",
                          "cannot create a completion queue of " + std::to_string(capacity) + " entries on " +
                              device.name() + (err == EINVAL ? " (more than the device's max_cqe?)" : ""));
        return {};
    }
    CompletionQueue q;
    q.core_ = std::make_shared<detail::CqCore>(detail::access::core(device),
                                               channel != nullptr ? detail::access::core(*channel) : nullptr, cq);
    // A channel may serve several CQs: its events name the CQ, whose core acknowledges them.
    cq->cq_context = q.core_.get();
    return q;
}

CompletionQueue::CompletionQueue(const Device& device, int capacity)
    : CompletionQueue(detail::or_throw([&](detail::Status& s) { return create_impl(device, capacity, nullptr, s); })) {}

CompletionQueue::CompletionQueue(const Device& device, int capacity, const CompletionChannel& channel)
    : CompletionQueue(detail::or_throw([&](detail::Status& s) { return create_impl(device, capacity, &channel, s); })) {
}

CompletionQueue CompletionQueue::create(const Device& device, int capacity, const CompletionChannel* channel,
                                        std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(device, capacity, channel, s); });
}

CompletionQueue CompletionQueue::create_impl(const Device& device, int capacity,
                                             const boost::asio::any_io_executor& executor, const AsyncOptions& options,
                                             detail::Status& status) {
    if (!executor) {
        status.fail(errc::invalid_argument, "CompletionQueue", "the executor is empty");
        return {};
    }
    using IoExecutor = boost::asio::io_context::executor_type;
    if (options.mode == CompletionMode::polled && executor.target<IoExecutor>() == nullptr &&
        executor.target<boost::asio::strand<IoExecutor>>() == nullptr) {
        status.fail(errc::invalid_argument, "CompletionQueue",
                    "CompletionMode::polled needs an io_context's executor, or a strand of one "
                    "(gpuverbs::progress(io_context) advances it); this executor is another kind");
        return {};
    }
    CompletionChannel channel = CompletionChannel::create_impl(device, status);
    if (!status.ok()) return {};
    CompletionQueue cq = create_impl(device, capacity, &channel, status);
    if (!status.ok()) return {};
    try { // Asio's reactor refuses the channel's descriptor only when the process is out of descriptors or memory
        auto driver = std::make_shared<detail::AsyncDriver>(executor, *cq.core_, options);
        cq.core_->set_driver(driver);
        auto& context = boost::asio::query(executor, boost::asio::execution::context);
        boost::asio::use_service<detail::AsyncDriverService>(context).add(driver);
    } catch (const boost::system::system_error& e) {
        status.fail(e.code(), "CompletionQueue",
                    "cannot watch the completion channel's descriptor on the executor: " + e.code().message());
        return {};
    }
    return cq;
}

CompletionQueue::CompletionQueue(const Device& device, int capacity, const boost::asio::any_io_executor& executor,
                                 const AsyncOptions& options)
    : CompletionQueue(
          detail::or_throw([&](detail::Status& s) { return create_impl(device, capacity, executor, options, s); })) {}

CompletionQueue CompletionQueue::create(const Device& device, int capacity,
                                        const boost::asio::any_io_executor& executor, const AsyncOptions& options,
                                        std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(device, capacity, executor, options, s); });
}

CompletionQueue CompletionQueue::create(const Device& device, int capacity,
                                        const boost::asio::any_io_executor& executor, const AsyncOptions& options,
                                        std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return create_impl(device, capacity, executor, options, s); });
}

CompletionQueue::executor_type CompletionQueue::get_executor() const noexcept {
    return core_ && core_->driver() != nullptr ? core_->driver()->executor() : executor_type();
}

AsyncStatistics CompletionQueue::async_statistics() const noexcept {
    return core_ && core_->driver() != nullptr ? core_->driver()->statistics() : AsyncStatistics{};
}

void CompletionQueue::release() noexcept {
    if (core_ && core_->driver() != nullptr) core_->driver()->shutdown();
    core_.reset();
}

void CompletionQueue::throw_poll_error(int err) {
    detail::Status status;
    status.fail_errno(err, "ibv_poll_cq", "cannot poll the completion queue");
    status.raise();
}

bool CompletionQueue::wait(std::chrono::milliseconds timeout, std::error_code& ec) noexcept {
    ec.clear();
    ibv_comp_channel* channel = core_ ? core_->channel() : nullptr;
    if (channel == nullptr || timeout.count() < 0) {
        ec = errc::invalid_argument;
        return false;
    }
    // poll(2) takes an int of milliseconds, and a negative one waits for ever:
    // a longer wait is made of slices, each until what is left of the deadline
    // (a signal's EINTR waits on for the rest).
    const std::int64_t slice_max = std::numeric_limits<int>::max();
    const auto start = std::chrono::steady_clock::now();
    pollfd pfd{channel->fd, POLLIN, 0};
    for (;;) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        const std::int64_t left = timeout.count() - std::min<std::int64_t>(waited.count(), timeout.count());
        const int rc = ::poll(&pfd, 1, static_cast<int>(std::min(left, slice_max)));
        if (rc > 0) break;
        if (rc < 0 && errno != EINTR) {
            ec.assign(errno, std::system_category());
            return false;
        }
        if (left == 0) return false; // the deadline passed (or 0: one look)
    }
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(channel, &cq, &context) != 0) {
        // EAGAIN: another waiter took the event first.
        if (errno != EAGAIN) ec.assign(errno, std::system_category());
        return false;
    }
    static_cast<detail::CqCore*>(context)->count_event();
    return cq == core_->cq();
}

bool CompletionQueue::wait(std::chrono::milliseconds timeout) {
    std::error_code ec;
    bool got = wait(timeout, ec);
    if (ec) {
        // An errno from poll or ibv_get_cq_event, or errc::invalid_argument (no channel, a negative timeout).
        if (ec == errc::invalid_argument) {
            throw Error(ec, "CompletionQueue::wait",
                        timeout.count() < 0 ? "the timeout is negative (" + std::to_string(timeout.count()) +
                                                  " ms): pass 0 to look without waiting, or a duration to wait"
                                            : "the queue has no completion channel (make it with one) or is empty");
        }
        const std::string why = ec.category() == std::system_category() ? detail::errno_text(ec.value()) : ec.message();
        throw Error(ec, "ibv_get_cq_event", "cannot wait for a completion event: " + why);
    }
    return got;
}

} // namespace gpuverbs
