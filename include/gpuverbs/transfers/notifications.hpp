// Notifications that reach the passive side of a transfer: the owner of the
// blocks a peer read learns when the peer is done with them (and which
// request it was), without polling its own memory.
//
//   // owner (prefill): receives on the queue pair the reader uses
//   gpuverbs::NotificationInbox inbox(qp, pd);
//   ...
//   while (auto n = inbox.poll())                 // non-blocking, from the engine's loop
//       leases.release(*n->immediate, reader_of(n->qp_num)), free_blocks(n->message());
//   // or: auto n = co_await inbox.async_wait(asio::use_awaitable);
//
//   // reader (decode): the notification goes after every read completed
//   options.notify = list.lease;                  // the immediate
//   options.notify_message = request_id_bytes;    // up to 64 bytes, carried inline
//   gpuverbs::async_transfer(qp, plan, options, handler);
//
// An inbox posts its receives (64 bytes each, in memory it registers) on
// one queue pair's receive queue, which it then owns: do not post other
// receives there. With several rails a notification arrives on whichever
// rail carried it: keep an inbox per rail's queue pair. A QueuePair
// destroyed under its inbox ends the inbox (error(): operation_aborted).
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/detail/async/event_wait.hpp"

#include <boost/asio/async_result.hpp>
#include <boost/asio/system_executor.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// What a peer's notification said.
struct Notification {
    /// The local queue pair it arrived on: which reader (one queue pair per peer).
    std::uint32_t qp_num = 0;
    /// The transfer's TransferOptions::notify (e.g. a lease id); absent for a plain send.
    std::optional<std::uint32_t> immediate;
    /// TransferOptions::notify_message: message() is its first `size` bytes.
    std::uint32_t size = 0;
    std::array<std::byte, 64> bytes{};

    [[nodiscard]] std::span<const std::byte> message() const noexcept { return {bytes.data(), size}; }
};

/// The receiving end of notifications on one queue pair (whose CQ is bound
/// to an executor: event-driven, adaptive, or polled and advanced by
/// gpuverbs::progress). Move-only.
class NotificationInbox {
public:
    static constexpr std::uint32_t slot_bytes = 64;
    /// Notifications kept unread before the inbox stops taking more (its
    /// receives are then not posted again until poll() makes room, so a peer
    /// that floods it meets receiver-not-ready, never lost notifications).
    static constexpr std::size_t max_unread = 4096;

    NotificationInbox() = default;
    /// Registers `slots` receives of 64 bytes on `pd` and posts them on `qp`.
    /// Throws gpuverbs::Error: the CQ has no executor, the send and receive
    /// CQs differ, the QP is on an SRQ or not RC, `slots` is 0 or above the
    /// receive queue's room. Its receives stay posted until the queue pair
    /// ends: a new inbox on the same queue pair finds the old one's slots
    /// taking notifications first (make one inbox per queue pair, for its life).
    /// The receives an inbox posts when not told (the one source of that default, Python's included).
    static constexpr std::uint32_t default_slots = 16;
    NotificationInbox(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots = default_slots);
    static NotificationInbox create(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots,
                                    std::error_code& ec);
    NotificationInbox(NotificationInbox&&) noexcept = default;
    NotificationInbox& operator=(NotificationInbox&& other) noexcept;
    NotificationInbox(const NotificationInbox&) = delete;
    NotificationInbox& operator=(const NotificationInbox&) = delete;
    /// Stops taking notifications; a waiting async_wait ends with
    /// operation_aborted. Receives still posted end with the queue pair.
    ~NotificationInbox();

    explicit operator bool() const noexcept { return state_ != nullptr; }
    /// The oldest unread notification, if any (never blocks; any thread).
    [[nodiscard]] std::optional<Notification> poll();
    /// How many are unread.
    [[nodiscard]] std::size_t unread() const;
    /// Why the inbox stopped (its queue pair failed or was destroyed): then
    /// no more will come. Empty while it runs.
    [[nodiscard]] std::error_code error() const;

    /// Waits for the next notification: void(async_error_code, Notification).
    /// One unread already completes it at once (posted, never inside this
    /// call); the inbox's failure ends it with that error; a second wait while
    /// one waits ends with errc::invalid_argument. Cancellation (the
    /// handler's slot) ends it with operation_aborted.
    template <boost::asio::completion_token_for<void(async_error_code, Notification)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_wait(Token&& token = Token()) {
        // The initiation holds the state, not the inbox (a deferred wait may
        // run after the inbox moved); an empty inbox completes on the system executor.
        boost::asio::any_io_executor fallback = executor_;
        if (!fallback) fallback = boost::asio::system_executor();
        return boost::asio::async_initiate<Token, void(async_error_code, Notification)>(
            [state = state_, fallback](auto handler) {
                std::weak_ptr<State> weak = state;
                auto cancel = [weak] {
                    if (auto s = weak.lock()) cancel_wait(*s);
                };
                wait(state, detail::bind_event_handler<Notification>(std::move(handler), fallback, cancel));
            },
            token);
    }

    /// How many notifications it has taken, and how many receives ended in error.
    struct Statistics {
        std::uint64_t received = 0;
        std::uint64_t failed = 0;
        std::uint64_t paused = 0; ///< times it stopped posting receives at max_unread
    };
    [[nodiscard]] Statistics statistics() const;

private:
    struct State;
    static NotificationInbox create_impl(QueuePair& qp, const ProtectionDomain& pd, std::uint32_t slots,
                                         detail::Status& status);
    static void wait(const std::shared_ptr<State>& state, detail::EventCallback<Notification> callback);
    static void cancel_wait(State& s);
    void close() noexcept;
    std::shared_ptr<State> state_;
    boost::asio::any_io_executor executor_;
};

} // namespace gpuverbs
