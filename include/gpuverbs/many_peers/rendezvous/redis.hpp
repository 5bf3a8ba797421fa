// The rendezvous of a service: workers that join and leave while it runs
// meet through a Redis store (Debian's redis-server; hiredis as the client).
//
//   gpuverbs::RedisOptions options{.host = "10.0.0.1", .service = "kv-cache"};
//   options.password = gpuverbs::RedisOptions::secret_from_environment("GPUVERBS_REDIS_PASSWORD");
//   gpuverbs::RedisRendezvous store(options);        // a fresh rank unless options.rank
//   gpuverbs::Mesh mesh(store, pd, cq, {mr.remote()});
//   gpuverbs::PeerWatch watch(store, io.get_executor());
//   watch.async_wait_peer([&](boost::system::error_code ec, gpuverbs::PeerEvent e) { ... });
//
// Keys, all under the service name (SERVICE):
//   SERVICE/member/RANK   a string, set with NX: who holds the rank (a random token)
//   SERVICE/data/RANK     a hash: what the member published, one field per key
//   SERVICE/next-rank     INCR counter handing out ranks
// Both member keys carry a TTL (options.ttl) that a thread refreshes every
// ttl/3 while the process lives: a crashed worker disappears within ttl, a
// clean one withdraws at once. Joins and leaves are seen by polling the member
// keys (SCAN, every poll_interval): no keyspace notifications to configure,
// works with any Redis; a leave is seen within ttl + poll_interval.
//
// Authentication: AUTH with options.password (and options.user for an ACL
// user). The password is never logged nor put in a message; pass it through
// the environment or a file, not the command line. Redis without TLS belongs
// on a private network (docs/many-peers.md).
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/many_peers/rendezvous.hpp"

#include "gpuverbs/detail/async/async_token.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace gpuverbs {

struct RedisOptions {
    std::string host = "127.0.0.1";
    std::uint16_t port = 6379;
    /// An ACL user (Redis 6 and later); empty: AUTH with the password alone.
    std::string user;
    /// Empty: no AUTH. Never logged nor copied into messages.
    std::string password;
    /// The namespace of every key: letters, digits and . _ - : (1 to 100 characters).
    std::string service = "gpuverbs";
    /// Default: a fresh rank from the store (never reused within the service).
    std::optional<std::uint32_t> rank;
    /// A fixed world (fence() waits for ranks 0 .. N-1); default: an open world.
    std::optional<std::uint32_t> world_size;
    /// How long a member stays after its process stops refreshing it.
    std::chrono::milliseconds ttl{3000};
    /// How often lookups, fences and watches ask the store again.
    std::chrono::milliseconds poll_interval{50};
    /// The longest one Redis command may take (connect included).
    std::chrono::milliseconds command_timeout{2000};

    /// The value of environment variable `name`, or empty.
    static std::string secret_from_environment(const char* name);
};

/// A member joining or leaving (PeerWatch).
struct PeerEvent {
    enum class Kind { joined, left };
    Kind kind = Kind::joined;
    std::uint32_t rank = 0;
    /// "rank 3 joined" / "rank 3 left".
    [[nodiscard]] std::string describe() const;
    friend bool operator==(const PeerEvent&, const PeerEvent&) = default;
};

namespace detail {
class RedisMember;
struct PeerWatchState;
/// The next event for the watch (polling the store once when none is queued).
std::optional<PeerEvent> next_peer_event(PeerWatchState& state, Status& status);
} // namespace detail

class RedisRendezvous : public RendezvousForms<RedisRendezvous> {
public:
    using RendezvousForms::fence;
    using RendezvousForms::lookup;
    using RendezvousForms::publish;
    using RendezvousForms::withdraw;

    /// Connects, authenticates and joins the service (its rank claimed with
    /// SET NX). Throws gpuverbs::Error: errc::rendezvous_unavailable (cannot
    /// reach Redis, credentials refused), errc::rank_taken (options.rank held
    /// by a live member), errc::invalid_argument, errc::unsupported (built
    /// without hiredis).
    explicit RedisRendezvous(RedisOptions options);
    /// The same without throwing: on failure `ec` is set and the member
    /// returned has not joined (explicit operator bool is false; its
    /// operations fail with errc::rendezvous_unavailable). Not movable, it is
    /// returned in place: `RedisRendezvous store = RedisRendezvous::create(options, ec);`.
    static RedisRendezvous create(RedisOptions options, std::error_code& ec) {
        return RedisRendezvous(std::move(options), detail::Outcome{&ec, nullptr});
    }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static RedisRendezvous create(RedisOptions options, std::error_code& ec, Diagnostics& diagnostics) {
        return RedisRendezvous(std::move(options), detail::Outcome{&ec, &diagnostics});
    }
    RedisRendezvous(const RedisRendezvous&) = delete;
    RedisRendezvous& operator=(const RedisRendezvous&) = delete;
    /// Withdraws (errors ignored) and stops refreshing.
    ~RedisRendezvous();

    [[nodiscard]] std::uint32_t rank() const noexcept;
    /// options.world_size, or wire::max_world_size for an open world.
    [[nodiscard]] std::uint32_t world_size() const noexcept;
    /// "Redis service 'SERVICE' at HOST:PORT" (never the password).
    [[nodiscard]] std::string name() const;

    /// One token-checked command. Each operation also has the throwing and
    /// (…, ec) forms (RendezvousForms).
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec,
                 Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { publish_impl(key, value, s); });
    }
    /// Fixed world only: waits until ranks 0 .. world_size-1 are all members.
    void fence(std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { fence_impl(timeout, s); });
    }
    /// Waits (polling) until `peer` has published `key`.
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return lookup_impl(peer, key, timeout, s); });
    }
    /// Leaves the service now: its keys are deleted; the object can do nothing more.
    void withdraw(std::error_code& ec, Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { withdraw_impl(s); });
    }

    /// The live members' ranks (ours included), ascending.
    [[nodiscard]] std::vector<std::uint32_t> members() {
        return detail::or_throw([&](detail::Status& s) { return members_impl(s); });
    }
    [[nodiscard]] std::vector<std::uint32_t> members(std::error_code& ec) {
        return detail::or_code(ec, [&](detail::Status& s) { return members_impl(s); });
    }
    [[nodiscard]] std::vector<std::uint32_t> members(std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return members_impl(s); });
    }
    /// The bound on seeing a crashed member leave: ttl + poll_interval.
    [[nodiscard]] std::chrono::milliseconds leave_bound() const noexcept;
    /// Whether this gpuverbs was built with hiredis.
    static bool available() noexcept;
    /// False for a member create() could not join.
    explicit operator bool() const noexcept { return member_ != nullptr; }

private:
    friend class PeerWatch;
    RedisRendezvous(RedisOptions options, detail::Outcome outcome);
    void join(RedisOptions options, detail::Status& status);
    /// The member, or null with errc::rendezvous_unavailable naming `verb` when create() could not join.
    [[nodiscard]] detail::RedisMember* joined(const char* verb, detail::Status& status) const;
    void publish_impl(const std::string& key, std::span<const std::byte> value, detail::Status& status);
    void fence_impl(std::chrono::milliseconds timeout, detail::Status& status);
    std::vector<std::byte> lookup_impl(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                       detail::Status& status);
    void withdraw_impl(detail::Status& status);
    std::vector<std::uint32_t> members_impl(detail::Status& status);
    std::shared_ptr<detail::RedisMember> member_;
};

namespace detail {
struct PeerWatchState {
    explicit PeerWatchState(const boost::asio::any_io_executor& executor) : timer(executor) {}
    boost::asio::steady_timer timer;
    std::shared_ptr<RedisMember> member;
    std::set<std::uint32_t> known;
    std::deque<PeerEvent> queue;
    Diagnostics diagnostics;
    bool waiting = false;
    bool cancelled = false;
};
} // namespace detail

/// Watches a service's members: each other member that joins or leaves is
/// reported once, in order (the members present when the watch starts are
/// reported as joined first). Each check is a blocking Redis SCAN on the
/// executor's thread (fast on a local network; bounded by command_timeout).
class PeerWatch {
public:
    /// `rendezvous` must outlive the watch (and have joined: errc::invalid_argument otherwise).
    PeerWatch(RedisRendezvous& rendezvous, const boost::asio::any_io_executor& executor);
    PeerWatch(const PeerWatch&) = delete;
    PeerWatch& operator=(const PeerWatch&) = delete;
    /// Cancels a pending wait (its handler gets operation_aborted).
    ~PeerWatch();

    /// The next join or leave: void(async_error_code, PeerEvent). The
    /// operation holds the watch's shared state: the PeerWatch may be
    /// destroyed meanwhile (the wait then ends with operation_aborted).
    /// Errors: the store failed (the code; the words in diagnostics()),
    /// operation_aborted after cancel(), in_progress when another wait is
    /// pending (one at a time). Never completes inside this call.
    template <boost::asio::completion_token_for<void(async_error_code, PeerEvent)> Token =
                  default_token_t<boost::asio::any_io_executor>>
    auto async_wait_peer(Token&& token = Token()) {
        return boost::asio::async_compose<Token, void(async_error_code, PeerEvent)>(WaitOp{state_}, token,
                                                                                    state_->timer);
    }
    /// One check now: the next event, or nothing. Throws gpuverbs::Error when the store fails.
    std::optional<PeerEvent> poll();
    /// The same without throwing: nothing, with `ec` set, when the store fails
    /// (the words in diagnostics()).
    std::optional<PeerEvent> poll(std::error_code& ec);
    void cancel();
    /// The members seen so far, ourselves excluded.
    [[nodiscard]] const std::set<std::uint32_t>& known() const noexcept { return state_->known; }
    /// The words for the last failed wait.
    [[nodiscard]] const Diagnostics& diagnostics() const noexcept { return state_->diagnostics; }

private:
    struct WaitOp {
        std::shared_ptr<detail::PeerWatchState> state;
        enum class Step { start, rejected, polling } step = Step::start;
        template <class Self>
        void operator()(Self& self, boost::system::error_code ec = {}) {
            if (step == Step::rejected) return self.complete(boost::asio::error::in_progress, PeerEvent{});
            if (step == Step::start) {
                if (state->waiting) { // one wait at a time; never complete inside the initiating call
                    step = Step::rejected;
                    return boost::asio::post(state->timer.get_executor(), std::move(self));
                }
                state->waiting = true;
                state->cancelled = false;
                step = Step::polling;
                state->timer.expires_after(std::chrono::milliseconds(0));
                return state->timer.async_wait(std::move(self));
            }
            // A cancel() that came after the timer had fired is seen here.
            if (ec || state->cancelled) {
                state->waiting = false;
                return self.complete(ec ? ec : boost::asio::error::operation_aborted, PeerEvent{});
            }
            detail::Status status;
            std::optional<PeerEvent> event = detail::next_peer_event(*state, status);
            if (!status.ok() || event) {
                state->waiting = false;
                status.report(state->diagnostics);
                return self.complete(detail::to_asio_error(status.code), event.value_or(PeerEvent{}));
            }
            state->timer.expires_after(poll_interval());
            state->timer.async_wait(std::move(self));
        }
        [[nodiscard]] std::chrono::milliseconds poll_interval() const;
    };
    std::shared_ptr<detail::PeerWatchState> state_;
};

} // namespace gpuverbs
