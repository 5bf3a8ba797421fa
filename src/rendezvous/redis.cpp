// RedisRendezvous and PeerWatch (rendezvous/redis.hpp) over hiredis.
#include "gpuverbs/many_peers/rendezvous/redis.hpp"
#include "gpuverbs/config.hpp"

#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/many_peers/rendezvous/signed.hpp"
#include "gpuverbs/observability/warnings.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#if GPUVERBS_HAVE_HIREDIS
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

using Reply = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

timeval to_timeval(std::chrono::milliseconds ms) {
    auto count = std::max<std::int64_t>(ms.count(), 1);
    return timeval{static_cast<time_t>(count / 1000), static_cast<suseconds_t>((count % 1000) * 1000)};
}

bool valid_service(const std::string& s) {
    if (s.empty() || s.size() > 100) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
               c == '-' || c == ':';
    });
}

// Token-checked operations, each one command (so a reconnect-and-retry never
// splits them): only the holder of a rank extends, writes or deletes its keys.
// KEYS[1] member key, KEYS[2] data key, ARGV[1] our token.
constexpr std::string_view refresh_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) redis.call('PEXPIRE', KEYS[2], ARGV[2]) return 1";
constexpr std::string_view publish_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) redis.call('PEXPIRE', KEYS[2], ARGV[4]) return 1";
constexpr std::string_view withdraw_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('DEL', KEYS[1], KEYS[2]) return 1";

/// The largest value a member publishes or accepts: a mesh record, signed (SignedRendezvous).
constexpr std::size_t max_value_size = wire::max_mesh_record_size + detail::record_tag_size;

std::string random_token() {
    std::random_device device;
    std::uniform_int_distribution<std::uint64_t> pick;
    return std::to_string(pick(device)) + "-" + std::to_string(pick(device));
}

} // namespace

namespace detail {

/// One connection to the store: commands under a mutex, reconnecting once
/// after the connection broke. Failures in words that never hold the password.
class RedisConnection {
public:
    explicit RedisConnection(const RedisOptions& options) : options_(&options) {}
    RedisConnection(const RedisConnection&) = delete;
    RedisConnection& operator=(const RedisConnection&) = delete;
    ~RedisConnection() { close(); }

    [[nodiscard]] std::string where() const { return options_->host + ":" + std::to_string(options_->port); }

    /// Runs one command; a reply of type error is returned as a reply (the caller words it).
    Reply command(std::initializer_list<std::string_view> args, const char* verb) {
        return command(std::span<const std::string_view>(args.begin(), args.size()), verb);
    }
    Reply command(std::span<const std::string_view> args, const char* verb) {
        std::lock_guard lock(mutex_);
        for (int attempt = 0;; ++attempt) {
            if (context_ == nullptr) open(verb);
            Reply reply = send(args);
            if (reply) return reply;
            std::string why = context_->errstr;
            context_err_ = context_->err;
            close();
            if (attempt == 1 && context_err_ == REDIS_ERR_OOM) {
                throw Error(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() +
                                " sent a reply larger than gpuverbs accepts (an array of more than " +
                                std::to_string(redis::max_array_elements) +
                                " elements, or arrays nested deeper than SCAN's): a hostile or broken store");
            }
            if (attempt == 1) {
                throw Error(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() + " did not answer (" + why +
                                "): it is down, unreachable, or slower than command_timeout (" +
                                std::to_string(options_->command_timeout.count()) + " ms)");
            }
        }
    }

private:
    Reply send(std::initializer_list<std::string_view> args) {
        return send(std::span<const std::string_view>(args.begin(), args.size()));
    }
    Reply send(std::span<const std::string_view> args) {
        std::vector<const char*> argv;
        std::vector<std::size_t> lengths;
        for (std::string_view a : args) {
            argv.push_back(a.data());
            lengths.push_back(a.size());
        }
        return Reply(static_cast<redisReply*>(
                         redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())),
                     &freeReplyObject);
    }

    void open(const char* verb) {
        timeval tv = to_timeval(options_->command_timeout);
        context_ = redisConnectWithTimeout(options_->host.c_str(), options_->port, tv);
        if (context_ == nullptr || context_->err != 0) {
            std::string why = context_ == nullptr ? "out of memory" : context_->errstr;
            close();
            throw Error(errc::rendezvous_unavailable, verb,
                        "cannot reach Redis at " + where() + ": " + why + " (is redis-server running there?)");
        }
        redisSetTimeout(context_, tv);
        redis::bound_arrays(*context_);
        if (!options_->password.empty()) {
            Reply reply = options_->user.empty() ? send({"AUTH", options_->password})
                                                 : send({"AUTH", options_->user, options_->password});
            if (!reply || reply->type == REDIS_REPLY_ERROR) {
                std::string answer =
                    reply ? redis::server_text({reply->str, reply->len}) : std::string(context_->errstr);
                close();
                throw Error(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() + " refused the credentials" +
                                (options_->user.empty() ? std::string() : " of user '" + options_->user + "'") + ": " +
                                answer);
            }
        }
        Reply pong = send({"PING"});
        if (!pong || pong->type == REDIS_REPLY_ERROR) {
            std::string answer = pong ? redis::server_text({pong->str, pong->len}) : std::string(context_->errstr);
            close();
            bool auth = answer.find("NOAUTH") != std::string::npos;
            throw Error(errc::rendezvous_unavailable, verb,
                        "Redis at " + where() + " refused us: " + answer +
                            (auth ? " (it needs a password: set RedisOptions::password)" : ""));
        }
        warn_if_open();
    }

    /// Once per store and process: a store that took us without a password
    /// and is not on this host's loopback can be read and rewritten by anyone
    /// who can reach it (docs/security.md).
    void warn_if_open() {
        if (!options_->password.empty() || redis::on_loopback(context_->fd)) return;
        static std::mutex warned_mutex;
        static std::set<std::string> warned;
        if (std::lock_guard lock(warned_mutex); !warned.insert(where()).second) return;
        detail::warn("RedisRendezvous",
                     "Redis at " + where() +
                         " answers without a password and is not on this host's loopback: anyone who can reach it "
                         "can read every member's endpoint and memory keys and rewrite their records. Set "
                         "requirepass there and RedisOptions::password here, or bind it to 127.0.0.1, and sign the "
                         "records (SignedRendezvous)");
    }

    void close() {
        if (context_ != nullptr) redisFree(context_);
        context_ = nullptr;
    }

    const RedisOptions* options_;
    std::mutex mutex_;
    redisContext* context_ = nullptr;
    int context_err_ = 0; ///< the last failed command's hiredis error (REDIS_ERR_OOM: a reply refused as too large)
};

/// A member of a service: its rank, its keys and the thread keeping them alive.
class RedisMember {
public:
    explicit RedisMember(RedisOptions options) : options_(std::move(options)), connection_(options_) {}
    RedisMember(const RedisMember&) = delete;
    RedisMember& operator=(const RedisMember&) = delete;
    ~RedisMember() { stop_refresher(); }

    RedisOptions options_;
    RedisConnection connection_;
    std::uint32_t rank = 0;
    std::string token;
    bool withdrawn = false;

    [[nodiscard]] std::string name() const {
        return "Redis service '" + options_.service + "' at " + connection_.where();
    }
    [[nodiscard]] std::string member_key(std::uint32_t r) const {
        return options_.service + "/member/" + std::to_string(r);
    }
    [[nodiscard]] std::string data_key(std::uint32_t r) const {
        return options_.service + "/data/" + std::to_string(r);
    }
    [[nodiscard]] std::string ttl_text() const { return std::to_string(options_.ttl.count()); }

    Reply checked(std::initializer_list<std::string_view> args, const char* verb) {
        Reply reply = connection_.command(args, verb);
        if (reply->type == REDIS_REPLY_ERROR) {
            throw Error(errc::rendezvous_unavailable, verb,
                        name() + " answered: " + redis::server_text({reply->str, reply->len}));
        }
        return reply;
    }

    /// How many of `keys` exist (one EXISTS).
    std::uint32_t count_existing(const std::vector<std::string>& keys) {
        std::vector<std::string_view> args{"EXISTS"};
        args.insert(args.end(), keys.begin(), keys.end());
        Reply reply = connection_.command(std::span<const std::string_view>(args), "Redis EXISTS");
        if (reply->type == REDIS_REPLY_ERROR) {
            throw Error(errc::rendezvous_unavailable, "Redis EXISTS",
                        name() + " answered: " + redis::server_text({reply->str, reply->len}));
        }
        return static_cast<std::uint32_t>(integer(reply, "Redis EXISTS"));
    }

    /// An integer reply's value; anything else is the store misbehaving.
    long long integer(const Reply& reply, const char* verb) const {
        if (reply->type != REDIS_REPLY_INTEGER) {
            throw Error(errc::rendezvous_unavailable, verb, name() + " answered with a reply that is not an integer");
        }
        return reply->integer;
    }

    void check_alive(const char* verb) {
        if (withdrawn) throw Error(errc::invalid_argument, verb, name() + ": this member has withdrawn");
        std::lock_guard lock(refresh_mutex_);
        if (!lost_.empty()) throw Error(errc::rendezvous_unavailable, verb, name() + ": " + lost_);
    }

    /// Claims `r` (SET NX with the TTL): false when a live member holds it.
    bool claim(std::uint32_t r) {
        Reply reply = checked({"SET", member_key(r), token, "NX", "PX", ttl_text()}, "Redis SET");
        if (reply->type == REDIS_REPLY_NIL) {
            // Taken, or ours: a SET whose answer was lost and that was sent again.
            Reply holder = checked({"GET", member_key(r)}, "Redis GET");
            if (holder->type != REDIS_REPLY_STRING || std::string_view(holder->str, holder->len) != token) return false;
        }
        rank = r;
        // Whatever a dead holder of this rank left behind is not ours.
        checked({"DEL", data_key(r)}, "Redis DEL");
        return true;
    }

    void start_refresher() {
        refresher_ = std::thread([this] { refresh_loop(); });
    }

    void stop_refresher() {
        {
            std::lock_guard lock(refresh_mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        if (refresher_.joinable()) refresher_.join();
    }

private:
    // Every ttl/3: extend both keys; the member key gone (we stalled past the
    // TTL, or the store lost it) means peers consider us gone: say so.
    void refresh_loop() {
        RedisConnection connection(options_);
        std::unique_lock lock(refresh_mutex_);
        while (!stopping_) {
            wake_.wait_for(lock, options_.ttl / 3, [this] { return stopping_; });
            if (stopping_) break;
            lock.unlock();
            std::string problem;
            try {
                Reply reply = connection.command(
                    {"EVAL", refresh_script, "2", member_key(rank), data_key(rank), token, ttl_text()}, "Redis EVAL");
                if (reply->type != REDIS_REPLY_INTEGER || reply->integer == 0) {
                    problem = "our membership (rank " + std::to_string(rank) +
                              ") expired: this process stalled longer than the TTL or the store lost its data; "
                              "peers consider this member gone";
                }
            } catch (const std::exception& e) {
                problem = std::string("refreshing our membership failed: ") + e.what();
            }
            lock.lock();
            // A failed refresh is remembered until one succeeds (Redis may come back in time).
            if (problem.empty() || lost_.empty()) lost_ = problem;
        }
    }

    std::mutex refresh_mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::string lost_;
    std::thread refresher_;
};

/// The ranks whose member key exists now (one SCAN pass). A reply of
/// another shape is the store misbehaving: errc::rendezvous_unavailable.
std::set<std::uint32_t> scan_members(RedisMember& m) {
    std::string cursor = "0";
    const std::string prefix = m.options_.service + "/member/";
    const std::string pattern = prefix + "*";
    std::set<std::uint32_t> present;
    redis::ScanPage page;
    std::string why;
    // A store that never says the scan is done ("0") must not hold us for ever.
    constexpr int max_pages = 1 << 16; // 65 million keys at COUNT 1000
    int pages = 0;
    do {
        if (++pages > max_pages) {
            throw Error(errc::rendezvous_unavailable, "Redis SCAN",
                        m.name() + " did not finish a SCAN within " + std::to_string(max_pages) +
                            " pages (a cursor that never returns to 0)");
        }
        Reply reply = m.checked({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, "Redis SCAN");
        if (!redis::parse_scan_reply(*reply, prefix, page, why)) {
            throw Error(errc::rendezvous_unavailable, "Redis SCAN", m.name() + " answered SCAN wrongly: " + why);
        }
        present.insert(page.ranks.begin(), page.ranks.end());
        cursor = page.cursor;
    } while (cursor != "0");
    return present;
}

std::optional<PeerEvent> next_peer_event(PeerWatchState& state, Status& status) {
    if (state.queue.empty()) {
        try {
            std::set<std::uint32_t> present = scan_members(*state.member);
            present.erase(state.member->rank);
            for (std::uint32_t r : present) {
                if (!state.known.contains(r)) state.queue.push_back({PeerEvent::Kind::joined, r});
            }
            for (std::uint32_t r : state.known) {
                if (!present.contains(r)) state.queue.push_back({PeerEvent::Kind::left, r});
            }
        } catch (const std::bad_alloc&) {
            status.fail(std::make_error_code(std::errc::not_enough_memory), "PeerWatch", "out of memory");
            return std::nullopt;
        } catch (const Error& e) {
            std::string_view text = e.what();
            status.fail(e.code(), e.verb(), std::string(text.substr(std::min(text.size(), e.verb().size() + 2))));
            return std::nullopt;
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

} // namespace detail

RedisRendezvous::RedisRendezvous(RedisOptions options) {
    if (!valid_service(options.service)) {
        throw Error(errc::invalid_argument, "RedisRendezvous",
                    "service name '" + options.service +
                        "' must have 1 to 100 letters, digits, '.', '_', '-' or ':' (it prefixes every key)");
    }
    if (options.ttl < std::chrono::milliseconds(300) || options.poll_interval <= std::chrono::milliseconds(0)) {
        throw Error(errc::invalid_argument, "RedisRendezvous",
                    "ttl must be at least 300 ms (it is refreshed every ttl/3) and poll_interval positive");
    }
    if (options.world_size && (*options.world_size == 0 || *options.world_size > wire::max_world_size)) {
        throw Error(errc::invalid_argument, "RedisRendezvous",
                    "world_size " + std::to_string(*options.world_size) + " is not between 1 and " +
                        std::to_string(wire::max_world_size));
    }
    std::uint32_t limit = options.world_size.value_or(wire::max_world_size);
    if (options.rank && *options.rank >= limit) {
        throw Error(errc::invalid_argument, "RedisRendezvous",
                    "rank " + std::to_string(*options.rank) + " is outside the world (ranks are below " +
                        std::to_string(limit) + ")");
    }
    member_ = std::make_shared<detail::RedisMember>(std::move(options));
    detail::RedisMember& m = *member_;
    m.token = random_token();
    if (m.options_.rank) {
        if (!m.claim(*m.options_.rank)) {
            throw Error(errc::rank_taken, "RedisRendezvous",
                        "rank " + std::to_string(*m.options_.rank) + " of " + m.name() +
                            " is held by a live member (if that process died, its entry expires within the TTL); "
                            "choose another rank or let the store assign one");
        }
    } else if (m.options_.world_size) {
        // A fixed world: the lowest free rank, so that ranks are 0 .. N-1 whatever ran before.
        bool claimed = false;
        for (std::uint32_t r = 0; r < limit && !claimed; ++r) claimed = m.claim(r);
        if (!claimed) {
            throw Error(errc::rank_taken, "RedisRendezvous",
                        "all " + std::to_string(limit) + " ranks of " + m.name() +
                            " are held by live members (the world is full)");
        }
    } else {
        bool claimed = false;
        for (int attempt = 0; attempt < 16 && !claimed; ++attempt) {
            Reply next = m.checked({"INCR", m.options_.service + "/next-rank"}, "Redis INCR");
            auto r = static_cast<std::uint64_t>(m.integer(next, "Redis INCR") - 1);
            if (r >= limit) {
                throw Error(errc::invalid_argument, "RedisRendezvous",
                            m.name() + " has handed out all " + std::to_string(limit) + " ranks");
            }
            claimed = m.claim(static_cast<std::uint32_t>(r));
        }
        if (!claimed) {
            throw Error(errc::rank_taken, "RedisRendezvous", m.name() + ": 16 ranks in a row were held by others");
        }
    }
    m.start_refresher();
}

RedisRendezvous::~RedisRendezvous() {
    try {
        withdraw();
    } catch (const std::exception&) {
        // The store is gone: our keys expire with their TTL.
    }
}

std::uint32_t RedisRendezvous::rank() const noexcept {
    return member_->rank;
}
std::uint32_t RedisRendezvous::world_size() const noexcept {
    return member_->options_.world_size.value_or(wire::max_world_size);
}
std::string RedisRendezvous::name() const {
    return member_->name();
}
std::chrono::milliseconds RedisRendezvous::leave_bound() const noexcept {
    return member_->options_.ttl + member_->options_.poll_interval;
}
bool RedisRendezvous::available() noexcept {
    return true;
}

void RedisRendezvous::publish(const std::string& key, std::span<const std::byte> value) {
    detail::RedisMember& m = *member_;
    m.check_alive("Redis HSET");
    if (value.size() > max_value_size) {
        throw Error(errc::invalid_argument, "RedisRendezvous::publish",
                    "a value of " + std::to_string(value.size()) + " bytes is larger than a member may publish (" +
                        std::to_string(max_value_size) + ", the largest mesh record and a signature)");
    }
    std::string_view bytes(reinterpret_cast<const char*>(value.data()), value.size());
    Reply done = m.checked(
        {"EVAL", publish_script, "2", m.member_key(m.rank), m.data_key(m.rank), m.token, key, bytes, m.ttl_text()},
        "Redis EVAL");
    if (m.integer(done, "Redis EVAL") == 0) {
        throw Error(errc::rendezvous_unavailable, "RedisRendezvous::publish",
                    m.name() + ": rank " + std::to_string(m.rank) +
                        " is no longer ours (our entry expired: this process stalled longer than the TTL or the store "
                        "lost its data); nothing was published");
    }
}

void RedisRendezvous::fence(std::chrono::milliseconds timeout) {
    detail::RedisMember& m = *member_;
    m.check_alive("RedisRendezvous::fence");
    if (!m.options_.world_size) {
        throw Error(errc::unsupported, "RedisRendezvous::fence",
                    m.name() + " is an open world: a fence needs RedisOptions::world_size");
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
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
    detail::RedisMember& m = *member_;
    m.check_alive("RedisRendezvous::lookup");
    if (peer >= world_size()) {
        throw Error(errc::invalid_argument, "RedisRendezvous::lookup",
                    m.name() + ": rank " + std::to_string(peer) + " is outside the world");
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        Reply reply = m.checked({"HGET", m.data_key(peer), key}, "Redis HGET");
        if (reply->type == REDIS_REPLY_STRING) {
            std::vector<std::byte> value;
            std::string why;
            if (!detail::redis::string_reply(*reply, max_value_size, value, why)) {
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
    detail::RedisMember& m = *member_;
    if (m.withdrawn) return;
    m.withdrawn = true;
    m.stop_refresher();
    // Only if the rank is still ours: another process may hold it after our entry expired.
    m.checked({"EVAL", withdraw_script, "2", m.member_key(m.rank), m.data_key(m.rank), m.token}, "Redis EVAL");
}

std::vector<std::uint32_t> RedisRendezvous::members() {
    std::set<std::uint32_t> present = detail::scan_members(*member_);
    return {present.begin(), present.end()};
}

#else // without hiredis: the classes exist and say why they cannot work

namespace detail {
class RedisMember {};
std::optional<PeerEvent> next_peer_event(PeerWatchState&, Status& status) {
    status.fail(errc::unsupported, "PeerWatch", "gpuverbs was built without hiredis");
    return std::nullopt;
}
} // namespace detail

RedisRendezvous::RedisRendezvous(RedisOptions) {
    throw Error(errc::unsupported, "RedisRendezvous",
                "gpuverbs was built without hiredis: install libhiredis-dev (scripts/install-deps) and configure "
                "again");
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
void RedisRendezvous::publish(const std::string&, std::span<const std::byte>) {}
void RedisRendezvous::fence(std::chrono::milliseconds) {}
std::vector<std::byte> RedisRendezvous::lookup(std::uint32_t, const std::string&, std::chrono::milliseconds) {
    return {};
}
void RedisRendezvous::withdraw() {}
std::vector<std::uint32_t> RedisRendezvous::members() {
    return {};
}

#endif

PeerWatch::PeerWatch(RedisRendezvous& rendezvous, const boost::asio::any_io_executor& executor)
    : state_(std::make_shared<detail::PeerWatchState>(executor)) {
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
    status.check();
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
