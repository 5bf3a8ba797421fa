// The machinery behind rdma_cm.hpp's Asio forms: the private threads its
// blocking steps run on, the named initiations, the event wait, and the pure
// negotiation of a connection's parameters (unit-tested). Internal.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/connections/rdma_cm_types.hpp"
#include "gpuverbs/error.hpp"

#include "gpuverbs/detail/async/event_wait.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/bind_allocator.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace gpuverbs {

class CmConnection;

namespace detail {
class CmIdCore;
class CmState;

/// The private threads rdma_cm's blocking steps run on for the async_* forms
/// (as Asio's resolver runs getaddrinfo on one of its own); up to 16 steps
/// wait at once.
boost::asio::thread_pool& cm_thread();

/// The cancellation flag of the step running on this thread (nullptr: none):
/// its waits for rdma_cm events look at it every 50 ms and end with
/// operation_aborted once it is set.
void set_cm_step_cancel(const std::atomic<bool>* flag) noexcept;

/// Runs `step` — the error_code form of a step, `Result(std::error_code&)` —
/// on the rdma_cm thread, then completes `handler` with (error_code, result),
/// or (error_code) when Result is void, on its associated executor (else the
/// system executor). The handler's allocator carries the step to the thread;
/// its cancellation slot, when connected, ends the step's waits with
/// operation_aborted (a step already past its last wait completes as it is).
template <class Result, class Handler, class Step>
void run_cm_step(Handler&& handler, Step step) {
    auto executor = boost::asio::get_associated_executor(handler, boost::asio::system_executor());
    auto allocator = boost::asio::get_associated_allocator(handler);
    auto slot = boost::asio::get_associated_cancellation_slot(handler);
    auto cancelled = std::allocate_shared<std::atomic<bool>>(allocator, false);
    if (slot.is_connected()) {
        slot.assign([cancelled](boost::asio::cancellation_type type) {
            if (type != boost::asio::cancellation_type::none) cancelled->store(true);
        });
    }
    auto work = boost::asio::make_work_guard(executor);
    auto run = [h = std::forward<Handler>(handler), work = std::move(work), step = std::move(step), slot,
                cancelled]() mutable {
        async_error_code ec;
        using Stored = std::conditional_t<std::is_void_v<Result>, bool, Result>;
        Stored result{};
        set_cm_step_cancel(cancelled.get());
        try {
            std::error_code failed;
            if constexpr (std::is_void_v<Result>) {
                step(failed);
            } else {
                result = step(failed);
            }
            if (failed) ec = to_asio_error(failed);
        } catch (const std::bad_alloc&) {
            ec = boost::asio::error::no_memory;
        } catch (const std::system_error& e) { // never let one escape into the pool's thread
            ec = to_asio_error(e.code());
        }
        set_cm_step_cancel(nullptr);
        auto ex = work.get_executor();
        // The slot is the handler's: cleared on the handler's executor, before it runs.
        auto finish = [slot](auto h2, auto&&... args) mutable {
            if (slot.is_connected()) slot.clear();
            std::move(h2)(std::forward<decltype(args)>(args)...);
        };
        if constexpr (std::is_void_v<Result>) {
            boost::asio::post(
                ex, [finish = std::move(finish), h = std::move(h), ec]() mutable { finish(std::move(h), ec); });
        } else {
            boost::asio::post(ex,
                              [finish = std::move(finish), h = std::move(h), ec, result = std::move(result)]() mutable {
                                  finish(std::move(h), ec, std::move(result));
                              });
        }
    };
    boost::asio::post(cm_thread(), boost::asio::bind_allocator(allocator, std::move(run)));
}

/// The named initiation of every rdma_cm step's async_* form (async_accept,
/// async_connect, async_establish, CmListener::async_accept,
/// async_cm_resolve): the step has no I/O object, so its executor is the
/// system executor, where a handler without one of its own completes.
template <class Result>
struct InitiateCmStep {
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return boost::asio::system_executor(); }
    template <class Handler, class Step>
    void operator()(Handler&& handler, Step step) const {
        run_cm_step<Result>(std::forward<Handler>(handler), std::move(step));
    }
};

CmConnection cm_resolve_impl(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                             const std::string& source, Status& status);

using CmEventCallback = EventCallback<CmEvent>;
/// Starts the connection's one async wait, its reader watching on `executor` (set at the first wait).
void start_cm_event_wait(const std::shared_ptr<CmState>& state, const boost::asio::any_io_executor& executor,
                         CmEventCallback callback);
void cancel_cm_event_wait(const std::shared_ptr<CmState>& state) noexcept;

/// The named initiation of CmConnection::async_wait_event: the wait's reader
/// runs on the handler's associated executor (there is no other I/O executor).
struct InitiateCmEventWait {
    using executor_type = boost::asio::any_io_executor;
    [[nodiscard]] executor_type get_executor() const noexcept { return boost::asio::system_executor(); }
    template <class Handler>
    void operator()(Handler&& handler, const std::shared_ptr<CmState>& state) const {
        using Executor = decltype(boost::asio::get_associated_executor(handler));
        boost::asio::any_io_executor executor;
        if constexpr (!std::is_same_v<Executor, boost::asio::system_executor>) {
            executor = boost::asio::get_associated_executor(handler);
        }
        auto fallback = executor ? executor : boost::asio::any_io_executor(boost::asio::system_executor());
        start_cm_event_wait(
            state, executor,
            bind_event_handler<CmEvent>(std::forward<Handler>(handler), fallback,
                                        [weak = std::weak_ptr<CmState>(state)] { cancel_cm_event_wait(weak.lock()); }));
    }
};

/// What to accept with, from what the peer asked for, what the device allows
/// and what the user set (pure; unit-tested).
struct CmDeviceLimits {
    std::uint8_t max_responder_resources = 0; ///< ibv_device_attr::max_qp_rd_atom
    std::uint8_t max_initiator_depth = 0;     ///< ibv_device_attr::max_qp_init_rd_atom
};
CmParameters cm_negotiate(const CmOptions& ours, const CmDeviceLimits& device, const CmParameters* peer);
/// Checks `options` and `private_data` before anything is sent ("connect",
/// "accept" or "reject"); fails `status` naming the value and its limit.
bool cm_check_request(std::string_view step, const CmOptions& options, std::size_t private_data,
                      const CmPrivateDataLimits& limits, Status& status);
CmPrivateDataLimits cm_private_data_limits(bool iwarp) noexcept;
} // namespace detail

} // namespace gpuverbs
