// The one asynchronous-wait machinery behind every event stream of gpuverbs:
// a device's events (DeviceEvents::async_wait) and a connection's events
// (CmConnection::async_wait_event). The reader itself (a descriptor and a timer
// on a strand) is src/verbs/event_reader.hpp; this is the part the public
// headers need: the type-erased completion and the initiation that binds a
// handler to its executor and cancellation slot.
#pragma once

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/system/error_code.hpp>

#include <memory>
#include <utility>

namespace gpuverbs::detail {

/// A move-only, type-erased completion of one wait for an `Event` (what
/// std::move_only_function will be): called at most once.
template <class Event>
class EventCallback {
public:
    EventCallback() noexcept = default;
    template <class F>
    explicit EventCallback(F f) : impl_(std::make_unique<Impl<F>>(std::move(f))) {}
    explicit operator bool() const noexcept { return impl_ != nullptr; }
    void operator()(boost::system::error_code ec, Event event) {
        auto impl = std::move(impl_);
        impl->call(ec, std::move(event));
    }

private:
    struct Base {
        Base() = default;
        Base(const Base&) = delete;
        Base& operator=(const Base&) = delete;
        virtual ~Base() = default;
        virtual void call(boost::system::error_code ec, Event event) = 0;
    };
    template <class F>
    struct Impl final : Base {
        explicit Impl(F fn) : f(std::move(fn)) {}
        void call(boost::system::error_code ec, Event event) override { f(ec, std::move(event)); }
        F f;
    };
    std::unique_ptr<Base> impl_;
};

/// Wraps an async_wait's `handler` for a reader: the handler runs once, posted
/// to its associated executor (`fallback` when it has none), which is kept busy
/// until then; a cancellation slot's emission calls `cancel()`.
template <class Event, class Handler, class Executor, class Cancel>
EventCallback<Event> bind_event_handler(Handler&& handler, const Executor& fallback, Cancel cancel) {
    auto work = boost::asio::prefer(boost::asio::get_associated_executor(handler, fallback),
                                    boost::asio::execution::outstanding_work.tracked);
    auto slot = boost::asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected()) slot.assign([cancel](boost::asio::cancellation_type) mutable { cancel(); });
    return EventCallback<Event>([h = std::forward<Handler>(handler), work = std::move(work), slot](
                                    boost::system::error_code ec, Event event) mutable {
        if (slot.is_connected()) slot.clear();
        boost::asio::post(work,
                          [h = std::move(h), ec, e = std::move(event)]() mutable { std::move(h)(ec, std::move(e)); });
    });
}

} // namespace gpuverbs::detail
