// RedisRendezvous (rendezvous/redis.hpp) over the client of redis_member.hpp;
// without hiredis, the class exists and says why it cannot work.
#include "gpuverbs/many_peers/rendezvous/redis.hpp"
#include "gpuverbs/config.hpp"

#if GPUVERBS_HAVE_HIREDIS
#include "redis_member.hpp"
#endif

#include <algorithm>
#include <cstdlib>

#if GPUVERBS_HAVE_HIREDIS
#include "gpuverbs/detail/deadline.hpp"
#include "redis_replies.hpp"

#include <hiredis/hiredis.h>
#endif

namespace gpuverbs {

std::string RedisOptions::secret_from_environment(const char* name) {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): read while configuring, before the refresher thread starts
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
}

std::string PeerEvent::describe() const {
    return "rank " + std::to_string(rank) + (kind == Kind::joined ? " joined" : " left");
}

#if GPUVERBS_HAVE_HIREDIS
namespace {
/// An Error from the client's depths, as a Status: the same code, verb and words.
void keep(const Error& e, detail::Status& status) {
    const std::string what = e.what(); // "VERB: DETAIL"
    status.fail(e.code(), e.verb(), what.substr(std::min(what.size(), e.verb().size() + 2)));
}
} // namespace

RedisRendezvous::RedisRendezvous(RedisOptions options) : RedisRendezvous(std::move(options), detail::Outcome{}) {}

RedisRendezvous::RedisRendezvous(RedisOptions options, detail::Outcome outcome) {
    detail::Status status;
    try {
        join(std::move(options), status);
    } catch (const Error& e) { // the store refused us, or went away: in words, as the throwing form's
        keep(e, status);
    }
    if (!status.ok()) member_.reset(); // joined nothing: its keys (if any) expire with their TTL
    outcome.settle(status);
}

void RedisRendezvous::join(RedisOptions options, detail::Status& status) {
    if (!detail::valid_service(options.service)) {
        status.fail(errc::invalid_argument, "RedisRendezvous",
                    "service name '" + options.service +
                        "' must have 1 to 100 letters, digits, '.', '_', '-' or ':' (it prefixes every key)");
        return;
    }
    if (options.ttl < std::chrono::milliseconds(300) || options.poll_interval <= std::chrono::milliseconds(0)) {
        status.fail(errc::invalid_argument, "RedisRendezvous",
                    "ttl must be at least 300 ms (it is refreshed every ttl/3) and poll_interval positive");
        return;
    }
    if (options.world_size && (*options.world_size == 0 || *options.world_size > wire::max_world_size)) {
        status.fail(errc::invalid_argument, "RedisRendezvous",
                    "world_size " + std::to_string(*options.world_size) + " is not between 1 and " +
                        std::to_string(wire::max_world_size));
        return;
    }
    std::uint32_t limit = options.world_size.value_or(wire::max_world_size);
    if (options.rank && *options.rank >= limit) {
        status.fail(errc::invalid_argument, "RedisRendezvous",
                    "rank " + std::to_string(*options.rank) + " is outside the world (ranks are below " +
                        std::to_string(limit) + ")");
        return;
    }
    member_ = std::make_shared<detail::RedisMember>(std::move(options));
    detail::RedisMember& m = *member_;
    m.token = detail::random_token();
    if (m.options_.rank) {
        if (!m.claim(*m.options_.rank)) {
            status.fail(errc::rank_taken, "RedisRendezvous",
                        "rank " + std::to_string(*m.options_.rank) + " of " + m.name() +
                            " is held by a live member (if that process died, its entry expires within the TTL); "
                            "choose another rank or let the store assign one");
            return;
        }
    } else if (m.options_.world_size) {
        // A fixed world: the lowest free rank, so that ranks are 0 .. N-1 whatever ran before.
        bool claimed = false;
        for (std::uint32_t r = 0; r < limit && !claimed; ++r) claimed = m.claim(r);
        if (!claimed) {
            status.fail(errc::rank_taken, "RedisRendezvous",
                        "all " + std::to_string(limit) + " ranks of " + m.name() +
                            " are held by live members (the world is full)");
            return;
        }
    } else {
        bool claimed = false;
        for (int attempt = 0; attempt < 16 && !claimed; ++attempt) {
            detail::Reply next = m.checked({"INCR", m.options_.service + "/next-rank"}, "Redis INCR");
            auto r = static_cast<std::uint64_t>(m.integer(next, "Redis INCR") - 1);
            if (r >= limit) {
                status.fail(errc::invalid_argument, "RedisRendezvous",
                            m.name() + " has handed out all " + std::to_string(limit) + " ranks");
                return;
            }
            claimed = m.claim(static_cast<std::uint32_t>(r));
        }
        if (!claimed) {
            status.fail(errc::rank_taken, "RedisRendezvous", m.name() + ": 16 ranks in a row were held by others");
            return;
        }
    }
    m.start_refresher();
}

RedisRendezvous::~RedisRendezvous() {
    if (!member_) return; // never joined
    try {
        withdraw();
    } catch (const std::exception&) {
        // The store is gone: our keys expire with their TTL.
    }
}

detail::RedisMember& RedisRendezvous::joined(const char* verb) const {
    if (!member_) {
        throw Error(errc::rendezvous_unavailable, verb,
                    "this RedisRendezvous did not join its service (create() failed): create it again");
    }
    return *member_;
}

std::uint32_t RedisRendezvous::rank() const noexcept {
    return member_ ? member_->rank : 0;
}
std::uint32_t RedisRendezvous::world_size() const noexcept {
    return member_ ? member_->options_.world_size.value_or(wire::max_world_size) : 0;
}
std::string RedisRendezvous::name() const {
    return member_ ? member_->name() : "Redis (not joined)";
}
std::chrono::milliseconds RedisRendezvous::leave_bound() const noexcept {
    return member_ ? member_->options_.ttl + member_->options_.poll_interval : std::chrono::milliseconds(0);
}
bool RedisRendezvous::available() noexcept {
    return true;
}

void RedisRendezvous::publish(const std::string& key, std::span<const std::byte> value) {
    detail::RedisMember& m = joined("RedisRendezvous::publish");
    m.check_alive("Redis HSET");
    if (value.size() > detail::max_value_size) {
        throw Error(errc::invalid_argument, "RedisRendezvous::publish",
                    "a value of " + std::to_string(value.size()) + " bytes is larger than a member may publish (" +
                        std::to_string(detail::max_value_size) + ", the largest mesh record and a signature)");
    }
    std::string_view bytes(reinterpret_cast<const char*>(value.data()), value.size());
    detail::Reply done = m.checked({"EVAL", detail::publish_script, "2", m.member_key(m.rank), m.data_key(m.rank),
                                    m.token, key, bytes, m.ttl_text()},
                                   "Redis EVAL");
    if (m.integer(done, "Redis EVAL") == 0) {
        throw Error(errc::rendezvous_unavailable, "RedisRendezvous::publish",
                    m.name() + ": rank " + std::to_string(m.rank) +
                        " is no longer ours (our entry expired: this process stalled longer than the TTL or the store "
                        "lost its data); nothing was published");
    }
}

void RedisRendezvous::fence(std::chrono::milliseconds timeout) {
    detail::RedisMember& m = joined("RedisRendezvous::fence");
    m.check_alive("RedisRendezvous::fence");
    if (!m.options_.world_size) {
        throw Error(errc::unsupported, "RedisRendezvous::fence",
                    m.name() + " is an open world: a fence needs RedisOptions::world_size");
    }
    auto deadline = detail::deadline_after(timeout);
    const std::uint32_t n = *m.options_.world_size;
    for (;;) {
        // One round trip per poll: how many of the N member keys exist.
        std::vector<std::string> keys;
        keys.reserve(n);
        for (std::uint32_t r = 0; r < n; ++r) keys.push_back(m.member_key(r));
        if (m.count_existing(keys) == n) return;
        std::vector<std::uint32_t> missing;
        if (std::chrono::steady_clock::now() >= deadline) {
            for (std::uint32_t r = 0; r < n; ++r) {
                if (m.integer(m.checked({"EXISTS", keys[r]}, "Redis EXISTS"), "Redis EXISTS") == 0)
                    missing.push_back(r);
            }
        }
        if (!missing.empty()) {
            std::string list;
            for (std::size_t i = 0; i < missing.size() && i < 8; ++i)
                list += (i ? ", " : "") + std::to_string(missing[i]);
            if (missing.size() > 8) list += ", …";
            throw Error(errc::peer_missing, "RedisRendezvous::fence",
                        m.name() + ": " + std::to_string(missing.size()) + " of " +
                            std::to_string(*m.options_.world_size) + " ranks did not join within " +
                            std::to_string(timeout.count()) + " ms (missing: " + list + ")");
        }
        std::this_thread::sleep_for(m.options_.poll_interval);
    }
}

std::vector<std::byte> RedisRendezvous::lookup(std::uint32_t peer, const std::string& key,
                                               std::chrono::milliseconds timeout) {
    detail::RedisMember& m = joined("RedisRendezvous::lookup");
    m.check_alive("RedisRendezvous::lookup");
    if (peer >= world_size()) {
        throw Error(errc::invalid_argument, "RedisRendezvous::lookup",
                    m.name() + ": rank " + std::to_string(peer) + " is outside the world");
    }
    auto deadline = detail::deadline_after(timeout);
    for (;;) {
        detail::Reply reply = m.checked({"HGET", m.data_key(peer), key}, "Redis HGET");
        if (reply->type == REDIS_REPLY_STRING) {
            std::vector<std::byte> value;
            std::string why;
            if (!detail::redis::string_reply(*reply, detail::max_value_size, value, why)) {
                std::string words = m.name();
                words += ": rank ";
                words += std::to_string(peer);
                words += "'s '";
                words += key;
                words += "': ";
                words += why;
                throw Error(errc::malformed_record, "RedisRendezvous::lookup", words);
            }
            return value;
        }
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            bool member = m.integer(m.checked({"EXISTS", m.member_key(peer)}, "Redis EXISTS"), "Redis EXISTS") != 0;
            throw Error(errc::peer_missing, "RedisRendezvous::lookup",
                        "rank " + std::to_string(peer) + (member ? " is a live member of " : " is not a member of ") +
                            m.name() +
                            (member ? " but did not publish '" : " (it never joined or has left) and published no '") +
                            key + "' within " + std::to_string(timeout.count()) + " ms");
        }
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(m.options_.poll_interval, deadline - now));
    }
}

void RedisRendezvous::withdraw() {
    detail::RedisMember& m = joined("RedisRendezvous::withdraw");
    if (m.withdrawn) return;
    m.withdrawn = true;
    m.stop_refresher();
    // Only if the rank is still ours: another process may hold it after our entry expired.
    m.checked({"EVAL", detail::withdraw_script, "2", m.member_key(m.rank), m.data_key(m.rank), m.token}, "Redis EVAL");
}

std::vector<std::uint32_t> RedisRendezvous::members() {
    std::set<std::uint32_t> present = detail::scan_members(joined("RedisRendezvous::members"));
    return {present.begin(), present.end()};
}

#else // without hiredis: the class exists and says why it cannot work

RedisRendezvous::RedisRendezvous(RedisOptions options) : RedisRendezvous(std::move(options), detail::Outcome{}) {}
RedisRendezvous::RedisRendezvous(RedisOptions, detail::Outcome outcome) {
    detail::Status status;
    status.fail(errc::unsupported, "RedisRendezvous",
                "gpuverbs was built without hiredis: install libhiredis-dev (scripts/install-deps) and configure "
                "again");
    outcome.settle(status);
}
RedisRendezvous::~RedisRendezvous() = default;
std::uint32_t RedisRendezvous::rank() const noexcept {
    return 0;
}
std::uint32_t RedisRendezvous::world_size() const noexcept {
    return 0;
}
std::string RedisRendezvous::name() const {
    return "Redis (not built)";
}
std::chrono::milliseconds RedisRendezvous::leave_bound() const noexcept {
    return {};
}
bool RedisRendezvous::available() noexcept {
    return false;
}
// Without hiredis nothing joined: each operation refuses, saying why (never a
// silent no-op); leaving what was never joined is nothing to do.
namespace {
[[noreturn]] void not_built(const char* verb) {
    throw Error(errc::unsupported, verb, "gpuverbs was built without hiredis");
}
} // namespace
void RedisRendezvous::publish(const std::string&, std::span<const std::byte>) {
    not_built("RedisRendezvous::publish");
}
void RedisRendezvous::fence(std::chrono::milliseconds) {
    not_built("RedisRendezvous::fence");
}
std::vector<std::byte> RedisRendezvous::lookup(std::uint32_t, const std::string&, std::chrono::milliseconds) {
    not_built("RedisRendezvous::lookup");
}
void RedisRendezvous::withdraw() {}
std::vector<std::uint32_t> RedisRendezvous::members() {
    not_built("RedisRendezvous::members");
}

#endif

} // namespace gpuverbs
