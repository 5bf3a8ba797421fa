// PeerWatch (rendezvous/redis.hpp): joins and leaves of a Redis service's
// members, polled or awaited.
#include "gpuverbs/config.hpp"
#include "gpuverbs/many_peers/rendezvous/redis.hpp"

#if GPUVERBS_HAVE_HIREDIS
#include "redis_member.hpp"
#endif

namespace gpuverbs {

namespace detail {
#if GPUVERBS_HAVE_HIREDIS
std::optional<PeerEvent> next_peer_event(PeerWatchState& state, Status& status) {
    if (state.queue.empty()) {
        std::set<std::uint32_t> present = scan_members(*state.member, status);
        if (!status.ok()) return std::nullopt;
        present.erase(state.member->rank);
        for (std::uint32_t r : present) {
            if (!state.known.contains(r)) state.queue.push_back({PeerEvent::Kind::joined, r});
        }
        for (std::uint32_t r : state.known) {
            if (!present.contains(r)) state.queue.push_back({PeerEvent::Kind::left, r});
        }
    }
    if (state.queue.empty()) return std::nullopt;
    PeerEvent event = state.queue.front();
    state.queue.pop_front();
    if (event.kind == PeerEvent::Kind::joined) {
        state.known.insert(event.rank);
    } else {
        state.known.erase(event.rank);
    }
    return event;
}
#else
class RedisMember {};
std::optional<PeerEvent> next_peer_event(PeerWatchState&, Status& status) {
    status.fail(errc::unsupported, "PeerWatch", "gpuverbs was built without hiredis");
    return std::nullopt;
}
#endif
} // namespace detail

PeerWatch::PeerWatch(RedisRendezvous& rendezvous, const boost::asio::any_io_executor& executor)
    : state_(std::make_shared<detail::PeerWatchState>(executor)) {
    if (!rendezvous) {
        throw Error(errc::invalid_argument, "PeerWatch",
                    "the RedisRendezvous did not join its service (create() failed): there is nothing to watch");
    }
    state_->member = rendezvous.member_;
}

PeerWatch::~PeerWatch() {
    try {
        cancel();
    } catch (const std::exception&) {
        // The timer could not be cancelled: nothing was waiting on it.
    }
}

void PeerWatch::cancel() {
    if (state_->waiting) state_->cancelled = true;
    state_->timer.cancel();
}

std::optional<PeerEvent> PeerWatch::poll() {
    detail::Status status;
    std::optional<PeerEvent> event = detail::next_peer_event(*state_, status);
    status.report(state_->diagnostics);
    status.check();
    return event;
}

std::optional<PeerEvent> PeerWatch::poll(std::error_code& ec) {
    detail::Status status;
    std::optional<PeerEvent> event = detail::next_peer_event(*state_, status);
    status.report(state_->diagnostics);
    ec = status.code;
    return event;
}

std::chrono::milliseconds PeerWatch::WaitOp::poll_interval() const {
#if GPUVERBS_HAVE_HIREDIS
    return state->member->options_.poll_interval;
#else
    return std::chrono::milliseconds(50);
#endif
}

} // namespace gpuverbs
