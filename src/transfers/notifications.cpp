// NotificationInbox (transfers/notifications.hpp): a ring of 64-byte
// receives on one queue pair, each copied out and posted again as it
// completes, and the unread ones kept for poll() and async_wait.
#include "gpuverbs/transfers/notifications.hpp"

#include "gpuverbs/async.hpp"
#include "gpuverbs/detail/access.hpp"
#include "gpuverbs/detail/async/async_op.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace gpuverbs {

struct NotificationInbox::State {
    std::mutex mutex;
    /// Held weakly: a queue pair destroyed under the inbox ends its receives
    /// (operation_aborted) and is never reached. Reset when the inbox closes.
    std::weak_ptr<detail::QpCore> qp;
    bool closed = false;
    std::uint32_t qp_num = 0;
    std::vector<std::byte> memory; ///< slots x slot_bytes
    MemoryRegion region;
    std::deque<Notification> unread;
    std::vector<std::uint32_t> parked; ///< slots not posted again while unread was full
    detail::EventCallback<Notification> waiter;
    std::error_code error;
    Statistics statistics;

    /// Posts slot `k`'s receive (under the lock); false when the queue pair refused it.
    bool post(std::uint32_t k, const std::shared_ptr<State>& self) const;
    /// The oldest unread (one there, under the lock), its slots posted again if parked.
    Notification take(const std::shared_ptr<State>& self);
    /// A receive of slot `k` completed.
    static void received(const std::shared_ptr<State>& self, std::uint32_t k, async_error_code ec, Received r);
};

bool NotificationInbox::State::post(std::uint32_t k, const std::shared_ptr<State>& self) const {
    if (closed || error) return false;
    std::shared_ptr<detail::QpCore> core = qp.lock();
    if (!core) return false;
    auto handler = [self, k](async_error_code ec, Received r) { received(self, k, ec, r); };
    detail::AsyncForms<decltype(handler)>::receive(core, std::move(handler),
                                                   region.slice(std::size_t{k} * slot_bytes, slot_bytes));
    return true;
}

void NotificationInbox::State::received(const std::shared_ptr<State>& self, std::uint32_t k, async_error_code ec,
                                        Received r) {
    detail::EventCallback<Notification> to_call;
    Notification n;
    async_error_code failure;
    {
        std::lock_guard lock(self->mutex);
        if (ec) {
            ++self->statistics.failed;
            if (!self->error) self->error = static_cast<std::error_code>(ec);
            failure = ec;
            to_call = std::move(self->waiter);
        } else {
            ++self->statistics.received;
            n.qp_num = self->qp_num;
            n.immediate = r.immediate;
            n.size = static_cast<std::uint32_t>(std::min<std::size_t>(r.bytes, slot_bytes));
            std::memcpy(n.bytes.data(), self->memory.data() + std::size_t{k} * slot_bytes, n.size);
            if (self->waiter) {
                to_call = std::move(self->waiter);
            } else {
                self->unread.push_back(n);
            }
            if (self->unread.size() >= max_unread) {
                self->parked.push_back(k);
                ++self->statistics.paused;
            } else {
                (void)self->post(k, self);
            }
        }
    }
    if (to_call) to_call(failure, n); // posted to the waiter's executor by bind_event_handler
}

NotificationInbox NotificationInbox::create_impl(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots,
                                                 detail::Status& status) {
    const char* verb = "NotificationInbox";
    if (!qp || !pd) {
        status.fail(errc::invalid_argument, verb, !qp ? "the queue pair is empty" : "the protection domain is empty");
        return {};
    }
    const std::shared_ptr<detail::QpCore>& core = detail::access::core(qp);
    if (core->srq() != nullptr) {
        status.fail(errc::receives_through_srq, verb,
                    "the queue pair takes its receives from a SharedReceiveQueue: an inbox needs a queue pair's own "
                    "receive queue");
        return {};
    }
    if (const std::error_code refusal = detail::async_refusal(core.get())) {
        status.fail(refusal, verb,
                    refusal == errc::no_executor
                        ? "the queue pair's completion queue has no executor: make it with one (any completion mode)"
                        : "the queue pair's send and receive completion queues differ: asynchronous receives need one");
        return {};
    }
    if (core->qp()->qp_type != IBV_QPT_RC) {
        status.fail(errc::invalid_argument, verb, "an inbox needs a reliable connected (RC) queue pair");
        return {};
    }
    const std::uint32_t room = qp.capabilities().max_recv_wr;
    if (slots == 0 || slots > room) {
        status.fail(
            errc::invalid_argument, verb,
            "slots must be 1 to the receive queue's " + std::to_string(room) + " (got " + std::to_string(slots) + ")");
        return {};
    }
    auto state = std::make_shared<State>();
    state->qp = core;
    state->qp_num = qp.qp_num();
    state->memory.resize(std::size_t{slots} * slot_bytes);
    std::error_code ec;
    Diagnostics why;
    state->region = MemoryRegion::create(pd, state->memory.data(), state->memory.size(), Access::local_write, ec, why);
    if (ec) {
        status.fail(ec, why.verb(), why.detail() + " (the inbox's receive slots)");
        return {};
    }
    NotificationInbox inbox;
    inbox.executor_ = qp.get_executor();
    inbox.state_ = state;
    std::lock_guard lock(state->mutex);
    for (std::uint32_t k = 0; k < slots; ++k) (void)state->post(k, state);
    return inbox;
}

NotificationInbox::NotificationInbox(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots)
    : NotificationInbox(detail::or_throw([&](detail::Status& s) { return create_impl(qp, pd, slots, s); })) {}

NotificationInbox NotificationInbox::create(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots,
                                            std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& s) { return create_impl(qp, pd, slots, s); });
}

NotificationInbox& NotificationInbox::operator=(NotificationInbox&& other) noexcept {
    if (this != &other) {
        close();
        state_ = std::move(other.state_);
        executor_ = std::move(other.executor_);
    }
    return *this;
}

NotificationInbox::~NotificationInbox() {
    close();
}

void NotificationInbox::close() noexcept {
    if (!state_) return;
    detail::EventCallback<Notification> to_call;
    {
        std::lock_guard lock(state_->mutex);
        state_->closed = true;
        state_->qp.reset();
        to_call = std::move(state_->waiter);
    }
    if (to_call) to_call(boost::asio::error::operation_aborted, Notification{});
    state_.reset();
}

Notification NotificationInbox::State::take(const std::shared_ptr<State>& self) {
    Notification n = unread.front();
    unread.pop_front();
    // Room again: the slots parked at max_unread go back to the queue pair.
    while (!parked.empty() && unread.size() < max_unread) {
        (void)post(parked.back(), self);
        parked.pop_back();
    }
    return n;
}

std::optional<Notification> NotificationInbox::poll() {
    if (!state_) return std::nullopt;
    std::lock_guard lock(state_->mutex);
    if (state_->unread.empty()) return std::nullopt;
    return state_->take(state_);
}

std::size_t NotificationInbox::unread() const {
    if (!state_) return 0;
    std::lock_guard lock(state_->mutex);
    return state_->unread.size();
}

std::error_code NotificationInbox::error() const {
    if (!state_) return {};
    std::lock_guard lock(state_->mutex);
    return state_->error;
}

NotificationInbox::Statistics NotificationInbox::statistics() const {
    if (!state_) return {};
    std::lock_guard lock(state_->mutex);
    return state_->statistics;
}

void NotificationInbox::wait(const std::shared_ptr<State>& state, detail::EventCallback<Notification> callback) {
    async_error_code ec;
    Notification n;
    if (!state) {
        ec = make_error_code(errc::invalid_argument); // an empty (moved-from) inbox
    } else {
        std::lock_guard lock(state->mutex);
        if (!state->unread.empty()) {
            n = state->take(state);
        } else if (state->error) {
            ec = state->error;
        } else if (state->waiter) {
            ec = make_error_code(errc::invalid_argument); // one wait at a time
        } else {
            state->waiter = std::move(callback);
            return;
        }
    }
    callback(ec, n); // posted: never inside async_wait
}

void NotificationInbox::cancel_wait(State& s) {
    detail::EventCallback<Notification> to_call;
    {
        std::lock_guard lock(s.mutex);
        to_call = std::move(s.waiter);
    }
    if (to_call) to_call(boost::asio::error::operation_aborted, Notification{});
}

} // namespace gpuverbs
