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
RedisRendezvous::RedisRendezvous(RedisOptions options) : RedisRendezvous(std::move(options), detail::Outcome{}) {}

RedisRendezvous::RedisRendezvous(RedisOptions options, detail::Outcome outcome) {
    detail::Status status;
    join(std::move(options), status);
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
        if (!m.claim(*m.options_.rank, status)) {
            if (!status.ok()) return; // the store failed
            status.fail(errc::rank_taken, "RedisRendezvous",
                        "rank " + std::to_string(*m.options_.rank) + " of " + m.name() +
                            " is held by a live member (if that process died, its entry expires within the TTL); "
                            "choose another rank or let the store assign one");
            return;
        }
    } else if (m.options_.world_size) {
        // A fixed world: the lowest free rank, so that ranks are 0 .. N-1 whatever ran before.
        bool claimed = false;
        for (std::uint32_t r = 0; r < limit && !claimed && status.ok(); ++r) claimed = m.claim(r, status);
        if (!status.ok()) return;
        if (!claimed) {
            status.fail(errc::rank_taken, "RedisRendezvous",
                        "all " + std::to_string(limit) + " ranks of " + m.name() +
                            " are held by live members (the world is full)");
            return;
        }
    } else {
        bool claimed = false;
        for (int attempt = 0; attempt < 16 && !claimed; ++attempt) {
            std::optional<long long> next =
                m.integer({"INCR", m.options_.service + "/next-rank"}, "Redis INCR", status);
            if (!next) return;
            auto r = static_cast<std::uint64_t>(*next - 1);
            if (r >= limit) {
                status.fail(errc::invalid_argument, "RedisRendezvous",
                            m.name() + " has handed out all " + std::to_string(limit) + " ranks");
                return;
            }
            claimed = m.claim(static_cast<std::uint32_t>(r), status);
            if (!status.ok()) return;
        }
        if (!claimed) {
            status.fail(errc::rank_taken, "RedisRendezvous", m.name() + ": 16 ranks in a row were held by others");
            return;
        }
    }
    m.start_refresher();
}

RedisRendezvous::~RedisRendezvous() {
    if (!member_) return;   // never joined
    detail::Status ignored; // the store is gone: our keys expire with their TTL
    withdraw_impl(ignored);
}

detail::RedisMember* RedisRendezvous::joined(const char* verb, detail::Status& status) const {
    if (!member_) {
        status.fail(errc::rendezvous_unavailable, verb,
                    "this RedisRendezvous did not join its service (create() failed): create it again");
    }
    return member_.get();
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

void RedisRendezvous::publish_impl(const std::string& key, std::span<const std::byte> value, detail::Status& status) {
    detail::RedisMember* joined_member = joined("RedisRendezvous::publish", status);
    if (joined_member == nullptr || !joined_member->check_alive("Redis HSET", status)) return;
    detail::RedisMember& m = *joined_member;
    if (value.size() > detail::max_value_size) {
        status.fail(errc::invalid_argument, "RedisRendezvous::publish",
                    "a value of " + std::to_string(value.size()) + " bytes is larger than a member may publish (" +
                        std::to_string(detail::max_value_size) + ", the largest mesh record and a signature)");
        return;
    }
    std::string_view bytes(reinterpret_cast<const char*>(value.data()), value.size());
    std::optional<long long> done = m.integer({"EVAL", detail::publish_script, "2", m.member_key(m.rank),
                                               m.data_key(m.rank), m.token, key, bytes, m.ttl_text()},
                                              "Redis EVAL", status);
    if (done && *done == 0) {
        status.fail(errc::rendezvous_unavailable, "RedisRendezvous::publish",
                    m.name() + ": rank " + std::to_string(m.rank) +
                        " is no longer ours (our entry expired: this process stalled longer than the TTL or the store "
                        "lost its data); nothing was published");
    }
}

void RedisRendezvous::fence_impl(std::chrono::milliseconds timeout, detail::Status& status) {
    detail::RedisMember* joined_member = joined("RedisRendezvous::fence", status);
    if (joined_member == nullptr || !joined_member->check_alive("RedisRendezvous::fence", status)) return;
    detail::RedisMember& m = *joined_member;
    if (!m.options_.world_size) {
        status.fail(errc::unsupported, "RedisRendezvous::fence",
                    m.name() + " is an open world: a fence needs RedisOptions::world_size");
        return;
    }
    auto deadline = detail::deadline_after(timeout);
    const std::uint32_t n = *m.options_.world_size;
    for (;;) {
        // One round trip per poll: how many of the N member keys exist.
        std::vector<std::string> keys;
        keys.reserve(n);
        for (std::uint32_t r = 0; r < n; ++r) keys.push_back(m.member_key(r));
        std::optional<long long> present = m.count_existing(keys, status);
        if (!present || *present == n) return;
        std::vector<std::uint32_t> missing;
        if (std::chrono::steady_clock::now() >= deadline) {
            for (std::uint32_t r = 0; r < n; ++r) {
                std::optional<long long> exists = m.integer({"EXISTS", keys[r]}, "Redis EXISTS", status);
                if (!exists) return;
                if (*exists == 0) missing.push_back(r);
            }
        }
        if (!missing.empty()) {
            std::string list;
            for (std::size_t i = 0; i < missing.size() && i < 8; ++i)
                list += (i ? ", " : "") + std::to_string(missing[i]);
            if (missing.size() > 8) list += ", …";
            status.fail(errc::peer_missing, "RedisRendezvous::fence",
                        m.name() + ": " + std::to_string(missing.size()) + " of " +
                            std::to_string(*m.options_.world_size) + " ranks did not join within " +
                            std::to_string(timeout.count()) + " ms (missing: " + list + ")");
            return;
        }
        std::this_thread::sleep_for(m.options_.poll_interval);
    }
}

std::vector<std::byte> RedisRendezvous::lookup_impl(std::uint32_t peer, const std::string& key,
                                                    std::chrono::milliseconds timeout, detail::Status& status) {
    detail::RedisMember* joined_member = joined("RedisRendezvous::lookup", status);
    if (joined_member == nullptr || !joined_member->check_alive("RedisRendezvous::lookup", status)) return {};
    detail::RedisMember& m = *joined_member;
    if (peer >= world_size()) {
        status.fail(errc::invalid_argument, "RedisRendezvous::lookup",
                    m.name() + ": rank " + std::to_string(peer) + " is outside the world");
        return {};
    }
    auto deadline = detail::deadline_after(timeout);
    for (;;) {
        detail::Reply reply = m.checked({"HGET", m.data_key(peer), key}, "Redis HGET", status);
        if (!reply) return {};
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
                status.fail(errc::malformed_record, "RedisRendezvous::lookup", words);
                return {};
            }
            return value;
        }
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            std::optional<long long> exists = m.integer({"EXISTS", m.member_key(peer)}, "Redis EXISTS", status);
            if (!exists) return {};
            bool member = *exists != 0;
            status.fail(errc::peer_missing, "RedisRendezvous::lookup",
                        "rank " + std::to_string(peer) + (member ? " is a live member of " : " is not a member of ") +
                            m.name() +
                            (member ? " but did not publish '" : " (it never joined or has left) and published no '") +
                            key + "' within " + std::to_string(timeout.count()) + " ms");
            return {};
        }
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(m.options_.poll_interval, deadline - now));
    }
}

void RedisRendezvous::withdraw_impl(detail::Status& status) {
    detail::RedisMember* joined_member = joined("RedisRendezvous::withdraw", status);
    if (joined_member == nullptr) return;
    detail::RedisMember& m = *joined_member;
    if (m.withdrawn) return;
    m.withdrawn = true;
    m.stop_refresher();
    // Only if the rank is still ours: another process may hold it after our entry expired.
    (void)m.checked({"EVAL", detail::withdraw_script, "2", m.member_key(m.rank), m.data_key(m.rank), m.token},
                    "Redis EVAL", status);
}

std::vector<std::uint32_t> RedisRendezvous::members_impl(detail::Status& status) {
    detail::RedisMember* m = joined("RedisRendezvous::members", status);
    if (m == nullptr) return {};
    std::set<std::uint32_t> present = detail::scan_members(*m, status);
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
void not_built(const char* verb, detail::Status& status) {
    status.fail(errc::unsupported, verb, "gpuverbs was built without hiredis");
}
} // namespace
void RedisRendezvous::publish_impl(const std::string&, std::span<const std::byte>, detail::Status& status) {
    not_built("RedisRendezvous::publish", status);
}
void RedisRendezvous::fence_impl(std::chrono::milliseconds, detail::Status& status) {
    not_built("RedisRendezvous::fence", status);
}
std::vector<std::byte> RedisRendezvous::lookup_impl(std::uint32_t, const std::string&, std::chrono::milliseconds,
                                                    detail::Status& status) {
    not_built("RedisRendezvous::lookup", status);
    return {};
}
void RedisRendezvous::withdraw_impl(detail::Status&) {}
std::vector<std::uint32_t> RedisRendezvous::members_impl(detail::Status& status) {
    not_built("RedisRendezvous::members", status);
    return {};
}

#endif

} // namespace gpuverbs
