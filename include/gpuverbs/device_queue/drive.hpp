// The device queue's proxy driven by an Asio executor instead of a thread of
// its own: a handler runs up to `passes` progress() calls, then posts itself
// again, so other work on the executor runs between; after
// `idle_passes_before_nap` passes in a row that found nothing, it waits `nap`
// on a timer, so an idle queue costs little. It ends when the queue ends:
// with no error once closed, errc::device_queue_failed once failed (the words
// in proxy.failure()), operation_aborted when cancelled — and a cancelled
// drive closes the queue, so that no producer waits on a queue nobody
// drives.
//
//   gpuverbs::async_drive(proxy, io.get_executor(), {}, [](auto ec) { ... });
//
// The proxy must outlive the operation, and nothing else may call its
// members meanwhile (the executor's handlers are its one thread: use a strand
// on a pool of threads).
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/device_queue/proxy.hpp"
#include "gpuverbs/error.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

namespace gpuverbs {

struct DeviceQueueDriveOptions {
    /// progress() calls per handler before the executor runs others.
    std::uint32_t passes = 64;
    /// Idle passes in a row before the drive naps (0: never naps).
    std::uint32_t idle_passes_before_nap = 1024;
    /// How long a nap lasts: the latency an idle queue adds to its next request.
    std::chrono::microseconds nap{50};
};

namespace detail {

struct DriveOp {
    DeviceQueueProxy* proxy;
    std::unique_ptr<boost::asio::steady_timer> timer;
    DeviceQueueDriveOptions options;
    std::uint64_t idle_streak = 0;

    template <class Self>
    void operator()(Self& self, async_error_code = {}) {
        if (self.get_cancellation_state().cancelled() != boost::asio::cancellation_type::none) {
            proxy->close();
            self.complete(boost::asio::error::operation_aborted);
            return;
        }
        for (std::uint32_t k = 0; k < options.passes && proxy->error() == device_queue::QueueError::none; ++k) {
            const std::uint64_t idle = proxy->counters().idle_passes;
            proxy->progress();
            idle_streak = proxy->counters().idle_passes != idle ? idle_streak + 1 : 0;
        }
        if (proxy->error() != device_queue::QueueError::none) {
            self.complete(proxy->error() == device_queue::QueueError::closed
                              ? async_error_code{}
                              : to_asio_error(make_error_code(errc::device_queue_failed)));
            return;
        }
        if (options.idle_passes_before_nap != 0 && idle_streak >= options.idle_passes_before_nap) {
            timer->expires_after(options.nap);
            timer->async_wait(std::move(self));
        } else {
            boost::asio::post(timer->get_executor(), std::move(self));
        }
    }
};

} // namespace detail

/// Drives `proxy` on `executor` until its queue ends: void(async_error_code).
template <
    boost::asio::completion_token_for<void(async_error_code)> Token = default_token_t<boost::asio::any_io_executor>>
auto async_drive(DeviceQueueProxy& proxy, const boost::asio::any_io_executor& executor,
                 const DeviceQueueDriveOptions& options = {}, Token&& token = Token()) {
    auto timer = std::make_unique<boost::asio::steady_timer>(executor);
    auto& io_object = *timer;
    return boost::asio::async_compose<Token, void(async_error_code)>(detail::DriveOp{&proxy, std::move(timer), options},
                                                                     token, io_object);
}

} // namespace gpuverbs
