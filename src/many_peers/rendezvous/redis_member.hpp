// The Redis client behind RedisRendezvous and PeerWatch (redis.hpp): one
// connection to the store (commands under a mutex, reconnecting once) and a
// member of a service (its rank, its keys, the thread keeping them alive).
// Private to src/many_peers/rendezvous/; built only with hiredis.
#pragma once

#include "gpuverbs/config.hpp"
#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/many_peers/rendezvous/redis.hpp"
#include "gpuverbs/many_peers/rendezvous/signed.hpp"
#include "gpuverbs/observability/warnings.hpp"

#include "redis_replies.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace gpuverbs::detail {

using Reply = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

inline timeval to_timeval(std::chrono::milliseconds ms) {
    auto count = std::max<std::int64_t>(ms.count(), 1);
    return timeval{static_cast<time_t>(count / 1000), static_cast<suseconds_t>((count % 1000) * 1000)};
}

inline bool valid_service(const std::string& s) {
    if (s.empty() || s.size() > 100) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
               c == '-' || c == ':';
    });
}

// Token-checked operations, each one command (so a reconnect-and-retry never
// splits them): only the holder of a rank extends, writes or deletes its keys.
// KEYS[1] member key, KEYS[2] data key, ARGV[1] our token.
inline constexpr std::string_view refresh_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) redis.call('PEXPIRE', KEYS[2], ARGV[2]) return 1";
inline constexpr std::string_view publish_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) redis.call('PEXPIRE', KEYS[2], ARGV[4]) return 1";
inline constexpr std::string_view withdraw_script =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('DEL', KEYS[1], KEYS[2]) return 1";

/// The largest value a member publishes or accepts: a mesh record, signed (SignedRendezvous).
inline constexpr std::size_t max_value_size = wire::max_mesh_record_size + record_tag_size;

inline std::string random_token() {
    std::random_device device;
    std::uniform_int_distribution<std::uint64_t> pick;
    return std::to_string(pick(device)) + "-" + std::to_string(pick(device));
}

/// One connection to the store: commands under a mutex, reconnecting once
/// after the connection broke. Failures in words that never hold the password.
class RedisConnection {
public:
    explicit RedisConnection(const RedisOptions& options) : options_(&options) {}
    RedisConnection(const RedisConnection&) = delete;
    RedisConnection& operator=(const RedisConnection&) = delete;
    ~RedisConnection() { close(); }

    [[nodiscard]] std::string where() const { return options_->host + ":" + std::to_string(options_->port); }

    /// Runs one command; a reply of type error is returned as a reply (the
    /// caller words it). No reply (null), with the words in `status`, when
    /// the store cannot be reached or did not answer twice.
    Reply command(std::initializer_list<std::string_view> args, const char* verb, Status& status) {
        return command(std::span<const std::string_view>(args.begin(), args.size()), verb, status);
    }
    Reply command(std::span<const std::string_view> args, const char* verb, Status& status) {
        std::lock_guard lock(mutex_);
        for (int attempt = 0;; ++attempt) {
            if (context_ == nullptr && !open(verb, status)) return Reply(nullptr, &freeReplyObject);
            Reply reply = send(args);
            if (reply) return reply;
            std::string why = context_->errstr;
            context_err_ = context_->err;
            close();
            if (attempt == 1 && context_err_ == REDIS_ERR_OOM) {
                status.fail(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() +
                                " sent a reply larger than gpuverbs accepts (an array of more than " +
                                std::to_string(redis::max_array_elements) +
                                " elements, or arrays nested deeper than SCAN's): a hostile or broken store");
                return reply;
            }
            if (attempt == 1) {
                status.fail(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() + " did not answer (" + why +
                                "): it is down, unreachable, or slower than command_timeout (" +
                                std::to_string(options_->command_timeout.count()) + " ms)");
                return reply;
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

    /// Connects and authenticates; false, with the words in `status`, when the store cannot be used.
    bool open(const char* verb, Status& status) {
        timeval tv = to_timeval(options_->command_timeout);
        context_ = redisConnectWithTimeout(options_->host.c_str(), options_->port, tv);
        if (context_ == nullptr || context_->err != 0) {
            std::string why = context_ == nullptr ? "out of memory" : context_->errstr;
            close();
            status.fail(errc::rendezvous_unavailable, verb,
                        "cannot reach Redis at " + where() + ": " + why + " (is redis-server running there?)");
            return false;
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
                status.fail(errc::rendezvous_unavailable, verb,
                            "Redis at " + where() + " refused the credentials" +
                                (options_->user.empty() ? std::string() : " of user '" + options_->user + "'") + ": " +
                                answer);
                return false;
            }
        }
        Reply pong = send({"PING"});
        if (!pong || pong->type == REDIS_REPLY_ERROR) {
            std::string answer = pong ? redis::server_text({pong->str, pong->len}) : std::string(context_->errstr);
            close();
            bool auth = answer.find("NOAUTH") != std::string::npos;
            status.fail(errc::rendezvous_unavailable, verb,
                        "Redis at " + where() + " refused us: " + answer +
                            (auth ? " (it needs a password: set RedisOptions::password)" : ""));
            return false;
        }
        warn_if_open();
        return true;
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

    /// The reply to one command; null, with the words in `status`, when the
    /// store failed or answered with an error.
    Reply checked(std::initializer_list<std::string_view> args, const char* verb, Status& status) {
        return checked(std::span<const std::string_view>(args.begin(), args.size()), verb, status);
    }
    Reply checked(std::span<const std::string_view> args, const char* verb, Status& status) {
        Reply reply = connection_.command(args, verb, status);
        if (reply && reply->type == REDIS_REPLY_ERROR) {
            status.fail(errc::rendezvous_unavailable, verb,
                        name() + " answered: " + redis::server_text({reply->str, reply->len}));
            reply.reset();
        }
        return reply;
    }

    /// The integer answer to one command; nothing, with the words in
    /// `status`, when the store failed or answered with something else.
    std::optional<long long> integer(std::span<const std::string_view> args, const char* verb, Status& status) {
        Reply reply = checked(args, verb, status);
        if (!reply) return std::nullopt;
        if (reply->type != REDIS_REPLY_INTEGER) {
            status.fail(errc::rendezvous_unavailable, verb, name() + " answered with a reply that is not an integer");
            return std::nullopt;
        }
        return reply->integer;
    }
    std::optional<long long> integer(std::initializer_list<std::string_view> args, const char* verb, Status& status) {
        return integer(std::span<const std::string_view>(args.begin(), args.size()), verb, status);
    }

    /// How many of `keys` exist (one EXISTS); nothing when the store failed.
    std::optional<long long> count_existing(const std::vector<std::string>& keys, Status& status) {
        std::vector<std::string_view> args{"EXISTS"};
        args.insert(args.end(), keys.begin(), keys.end());
        return integer(std::span<const std::string_view>(args), "Redis EXISTS", status);
    }

    /// False, with the words in `status`, once this member withdrew or lost its membership.
    bool check_alive(const char* verb, Status& status) {
        if (withdrawn) {
            status.fail(errc::invalid_argument, verb, name() + ": this member has withdrawn");
            return false;
        }
        std::lock_guard lock(refresh_mutex_);
        if (!lost_.empty()) {
            status.fail(errc::rendezvous_unavailable, verb, name() + ": " + lost_);
            return false;
        }
        return true;
    }

    /// Claims `r` (SET NX with the TTL): false when a live member holds it
    /// or the store failed (then `status` says so).
    bool claim(std::uint32_t r, Status& status) {
        Reply reply = checked({"SET", member_key(r), token, "NX", "PX", ttl_text()}, "Redis SET", status);
        if (!reply) return false;
        if (reply->type == REDIS_REPLY_NIL) {
            // Taken, or ours: a SET whose answer was lost and that was sent again.
            Reply holder = checked({"GET", member_key(r)}, "Redis GET", status);
            if (!holder || holder->type != REDIS_REPLY_STRING || std::string_view(holder->str, holder->len) != token)
                return false;
        }
        // Whatever a dead holder of this rank left behind is not ours.
        if (!checked({"DEL", data_key(r)}, "Redis DEL", status)) return false;
        rank = r;
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
            Status status;
            Reply reply =
                connection.command({"EVAL", refresh_script, "2", member_key(rank), data_key(rank), token, ttl_text()},
                                   "Redis EVAL", status);
            if (!reply) {
                problem = "refreshing our membership failed: " + status.verb + ": " + status.detail;
            } else if (reply->type != REDIS_REPLY_INTEGER || reply->integer == 0) {
                problem = "our membership (rank " + std::to_string(rank) +
                          ") expired: this process stalled longer than the TTL or the store lost its data; "
                          "peers consider this member gone";
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
/// another shape is the store misbehaving: errc::rendezvous_unavailable in
/// `status` (and an empty set).
std::set<std::uint32_t> scan_members(RedisMember& m, Status& status);

} // namespace gpuverbs::detail
