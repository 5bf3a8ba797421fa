// Reading a Redis server's replies without trusting them (redis_replies.hpp).
#include "redis_replies.hpp"

#include "gpuverbs/connections/wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

namespace gpuverbs::detail::redis {

namespace {

bool all_digits(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string_view text_of(const redisReply& r) {
    return r.str == nullptr ? std::string_view() : std::string_view(r.str, r.len);
}

const char* type_name(int type) {
    switch (type) {
        case REDIS_REPLY_STRING: return "a string";
        case REDIS_REPLY_ARRAY: return "an array";
        case REDIS_REPLY_INTEGER: return "an integer";
        case REDIS_REPLY_NIL: return "nil";
        case REDIS_REPLY_STATUS: return "a status";
        case REDIS_REPLY_ERROR: return "an error";
        default: return "a reply of another type";
    }
}

/// hiredis' array constructor, bounded (its element count is an int before
/// hiredis 1.0, a size_t since: deduced).
template <class F>
struct BoundedArray;
template <class R, class Task, class N>
struct BoundedArray<R (*)(Task, N)> {
    static inline R (*original)(Task, N) = nullptr;
    // The only arrays gpuverbs asks for are SCAN's: [cursor, [keys]]. An
    // array inside another is accepted only in a parent of at most two
    // elements, and no deeper, so one reply costs at most two bounded arrays.
    static R create(Task task, N elements) {
        if (static_cast<long long>(elements) > max_array_elements) return nullptr; // the reader: "Out of memory"
        const auto* parent = task->parent;
        if (parent != nullptr && (parent->parent != nullptr || parent->elements > 2)) return nullptr;
        return original(task, elements);
    }
};
using Bounded = BoundedArray<decltype(redisReplyObjectFunctions::createArray)>;

/// hiredis' own reply constructors (copied from a fresh reader), with createArray bounded.
const redisReplyObjectFunctions* bounded_functions() {
    static const redisReplyObjectFunctions* functions = [] {
        static redisReplyObjectFunctions copy{};
        redisReader* reader = redisReaderCreate();
        if (reader == nullptr || reader->fn == nullptr) {
            if (reader != nullptr) redisReaderFree(reader);
            return static_cast<const redisReplyObjectFunctions*>(nullptr);
        }
        copy = *reader->fn;
        redisReaderFree(reader);
        Bounded::original = copy.createArray;
        copy.createArray = &Bounded::create;
        return static_cast<const redisReplyObjectFunctions*>(&copy);
    }();
    return functions;
}

} // namespace

void bound_arrays(redisReader& reader) {
    const redisReplyObjectFunctions* functions = bounded_functions();
    // The reader only reads through fn (hiredis declares it non-const).
    if (functions != nullptr)
        reader.fn = const_cast<redisReplyObjectFunctions*>(functions); // NOLINT(cppcoreguidelines-pro-type-const-cast)
}

void bound_arrays(redisContext& context) {
    if (context.reader != nullptr) bound_arrays(*context.reader);
}

bool on_loopback(int fd) noexcept {
    sockaddr_storage peer{};
    socklen_t size = sizeof peer;
    if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) return false;
    if (peer.ss_family == AF_UNIX) return true;
    if (peer.ss_family == AF_INET) {
        const auto& v4 = reinterpret_cast<const sockaddr_in&>(peer);
        return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
    }
    if (peer.ss_family == AF_INET6) {
        const in6_addr& a = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
        return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
    }
    return false;
}

bool parse_scan_reply(const redisReply& reply, std::string_view prefix, ScanPage& page, std::string& why) {
    page = {};
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 || reply.element == nullptr ||
        reply.element[0] == nullptr || reply.element[1] == nullptr) {
        why = std::string("SCAN answered ") + type_name(reply.type) +
              (reply.type == REDIS_REPLY_ARRAY ? " of " + std::to_string(reply.elements) + " elements" : "") +
              ", not [cursor, keys]";
        return false;
    }
    const redisReply& cursor = *reply.element[0];
    const redisReply& keys = *reply.element[1];
    if (cursor.type != REDIS_REPLY_STRING || !all_digits(text_of(cursor)) || cursor.len > 20) {
        why = std::string("SCAN's cursor is ") + type_name(cursor.type) +
              (cursor.type == REDIS_REPLY_STRING ? " that is not a number" : "");
        return false;
    }
    if (keys.type != REDIS_REPLY_ARRAY || (keys.elements > 0 && keys.element == nullptr)) {
        why = std::string("SCAN's keys are ") + type_name(keys.type) + ", not an array";
        return false;
    }
    page.cursor = std::string(text_of(cursor));
    for (std::size_t i = 0; i < keys.elements; ++i) {
        const redisReply* key = keys.element[i];
        if (key == nullptr || key->type != REDIS_REPLY_STRING) {
            why = "SCAN's key " + std::to_string(i) + " is " + (key == nullptr ? "missing" : type_name(key->type)) +
                  ", not a string";
            page = {};
            return false;
        }
        const std::string_view name = text_of(*key);
        if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue; // not ours
        const std::string_view digits = name.substr(prefix.size());
        if (digits.size() > 5 || !all_digits(digits)) continue; // not a key gpuverbs wrote
        std::uint32_t rank = 0;
        for (char c : digits) rank = rank * 10 + static_cast<std::uint32_t>(c - '0');
        if (rank < wire::max_world_size) page.ranks.push_back(rank);
    }
    return true;
}

bool string_reply(const redisReply& reply, std::size_t max_size, std::vector<std::byte>& value, std::string& why) {
    value.clear();
    if (reply.type != REDIS_REPLY_STRING) {
        why = std::string("the store answered ") + type_name(reply.type) + ", not a string";
        return false;
    }
    if (reply.len > max_size) {
        why = "the store holds a value of " + std::to_string(reply.len) + " bytes; at most " +
              std::to_string(max_size) + " are accepted (not a value gpuverbs wrote)";
        return false;
    }
    const auto* first = reinterpret_cast<const std::byte*>(reply.str);
    value.assign(first, first + reply.len);
    return true;
}

std::string server_text(std::string_view text) {
    constexpr std::size_t most = 200;
    std::string out;
    out.reserve(std::min(text.size(), most) + 3);
    for (std::size_t i = 0; i < text.size() && i < most; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    if (text.size() > most) out += "\xe2\x80\xa6"; // …
    return out;
}

} // namespace gpuverbs::detail::redis
