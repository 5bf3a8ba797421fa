// libFuzzer target: what RedisRendezvous makes of a Redis server's replies
// (src/many_peers/rendezvous/redis_replies.cpp, namespace gpuverbs::detail::redis). The
// input is everything a fake server sends; hiredis' reader (the one
// redisContext uses) turns it into replies, one after the other until it
// has no complete reply left or reports a protocol error, and every reply
// and every element nested in it goes through the three functions, each
// checked against a model written from redis_replies.hpp:
//
//  - parse_scan_reply(reply, "svc/member/", page, why): true exactly for
//    [cursor, [key, ...]] with a cursor of 1 to 20 digits and only strings
//    as keys; then page.cursor is the cursor and page.ranks are, in order,
//    the numbers of the keys that are "svc/member/" and 1 to 5 digits,
//    below wire::max_world_size (other keys skipped). False: `why` says
//    something and the page is empty (whatever it held before);
//  - string_reply(reply, max, value, why), for limits around the reply's
//    size: true exactly for a string of at most `max` bytes, and `value` is
//    its bytes; false: `value` is empty and `why` says something;
//  - server_text(text), for every text a reply carries (and the whole
//    input): the first 200 bytes with each byte outside 0x20..0x7e turned
//    into '?', then "…" (E2 80 A6) when cut: so at most 203 bytes, printable
//    ASCII but for that trailing ellipsis.
// And the words `why` gives are printable ASCII: they never repeat the
// server's bytes raw. Sanitizers catch a read past a reply.
//
// The reader is bounded the way RedisRendezvous bounds its connection's
// (redis::bound_arrays): each reply that comes out is checked against that
// bound too: no array above max_array_elements, and an array nested only in
// an array of at most two elements, one level deep (SCAN's shape).
#include "wire_model.hpp"

#include "many_peers/rendezvous/redis_replies.hpp"

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace redis = gpuverbs::detail::redis;
namespace wire = gpuverbs::wire;

constexpr std::string_view prefix = "svc/member/";
bool printable(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

std::string_view text_of(const redisReply& r) {
    return r.str == nullptr ? std::string_view() : std::string_view(r.str, r.len);
}

bool digits(std::string_view s, std::size_t most) {
    return !s.empty() && s.size() <= most &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// --- server_text --------------------------------------------------------------------
void check_server_text(std::string_view text) {
    std::string want;
    for (std::size_t i = 0; i < text.size() && i < 200; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        want += c >= 0x20 && c <= 0x7e ? static_cast<char>(c) : '?';
    }
    if (text.size() > 200) want += "\xe2\x80\xa6";
    const std::string got = redis::server_text(text);
    fuzz::require(got.size() <= 203, "server_text gave more than 203 bytes");
    const bool cut = got.size() >= 3 && got.compare(got.size() - 3, 3, "\xe2\x80\xa6") == 0 && text.size() > 200;
    fuzz::require(printable(cut ? std::string_view(got).substr(0, got.size() - 3) : std::string_view(got)),
                  "server_text gave a byte outside printable ASCII");
    fuzz::require(got == want, "server_text differs from the first 200 bytes, made printable, and \"...\" when cut");
}

// --- parse_scan_reply ---------------------------------------------------------------
struct ScanModel {
    bool ok = false;
    redis::ScanPage page;
};

ScanModel model_scan(const redisReply& r) {
    ScanModel m;
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2) return m;
    const redisReply& cursor = *r.element[0];
    const redisReply& keys = *r.element[1];
    if (cursor.type != REDIS_REPLY_STRING || !digits(text_of(cursor), 20)) return m;
    if (keys.type != REDIS_REPLY_ARRAY) return m;
    for (std::size_t i = 0; i < keys.elements; ++i) {
        const redisReply& key = *keys.element[i];
        if (key.type != REDIS_REPLY_STRING) return m;
        const std::string_view name = text_of(key);
        if (name.substr(0, prefix.size()) != prefix) continue;
        const std::string_view number = name.substr(std::min(name.size(), prefix.size()));
        if (!digits(number, 5)) continue;
        const unsigned long rank = std::stoul(std::string(number));
        if (rank < wire::max_world_size) m.page.ranks.push_back(static_cast<std::uint32_t>(rank));
    }
    m.ok = true;
    m.page.cursor = std::string(text_of(cursor));
    return m;
}

void check_scan(const redisReply& r) {
    const ScanModel want = model_scan(r);
    redis::ScanPage page{"left over", {1, 2, 3}};
    std::string why;
    const bool ok = redis::parse_scan_reply(r, prefix, page, why);
    if (ok != want.ok) {
        fuzz::fail("the model says SCAN reply %s, parse_scan_reply says %s (%s)", want.ok ? "valid" : "invalid",
                   ok ? "valid" : "invalid", why.c_str());
    }
    if (!ok) {
        fuzz::require(!why.empty(), "parse_scan_reply refused a reply without saying why");
        fuzz::require(printable(why), "parse_scan_reply's words are not printable ASCII");
        fuzz::require(page.cursor.empty() && page.ranks.empty(), "a refused SCAN reply left a page behind");
        return;
    }
    for (std::uint32_t rank : page.ranks)
        fuzz::require(rank < wire::max_world_size, "a SCAN rank is outside any world");
    fuzz::require(page.cursor == want.page.cursor, "parse_scan_reply read another cursor");
    fuzz::require(page.ranks == want.page.ranks, "parse_scan_reply read other ranks than the member keys name");
}

// --- string_reply -------------------------------------------------------------------
void check_string(const redisReply& r, std::size_t max_size) {
    std::vector<std::byte> value(3, std::byte{0x5a}); // left over from before
    std::string why;
    const bool ok = redis::string_reply(r, max_size, value, why);
    const bool want = r.type == REDIS_REPLY_STRING && r.len <= max_size;
    if (ok != want) {
        fuzz::fail("the model says %s, string_reply says %s for a reply of type %d and %zu bytes, at most %zu",
                   want ? "accept" : "refuse", ok ? "accept" : "refuse", r.type, r.len, max_size);
    }
    if (!ok) {
        fuzz::require(value.empty(), "a refused string reply left a value behind");
        fuzz::require(!why.empty(), "string_reply refused a reply without saying why");
        fuzz::require(printable(why), "string_reply's words are not printable ASCII");
        return;
    }
    fuzz::require(value.size() <= max_size, "string_reply gave more bytes than allowed");
    const auto* first = reinterpret_cast<const std::byte*>(r.str);
    fuzz::require(std::equal(value.begin(), value.end(), first, first + r.len),
                  "string_reply gave other bytes than the reply's");
}

// --- the array bound ------------------------------------------------------------------
void check_bound(const redisReply& r, int depth) {
    if (r.type != REDIS_REPLY_ARRAY) return;
    fuzz::require(static_cast<long long>(r.elements) <= redis::max_array_elements,
                  "an array above max_array_elements came through the bounded reader");
    for (std::size_t i = 0; i < r.elements; ++i) {
        if (r.element[i]->type != REDIS_REPLY_ARRAY) continue;
        fuzz::require(depth == 0 && r.elements <= 2,
                      "an array nested other than in SCAN's shape came through the bounded reader");
        check_bound(*r.element[i], depth + 1);
    }
}

void check_reply(const redisReply& r) {
    check_scan(r);
    for (std::size_t max_size : {std::size_t{0}, r.len - (r.len > 0 ? 1 : 0), r.len, r.len + 1, std::size_t{1} << 20}) {
        check_string(r, max_size);
    }
    if (r.str != nullptr) check_server_text(text_of(r));
    if (r.type == REDIS_REPLY_ARRAY) {
        for (std::size_t i = 0; i < r.elements; ++i) check_reply(*r.element[i]);
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    check_server_text(std::string_view(reinterpret_cast<const char*>(data), size));
    redisReader* reader = redisReaderCreate();
    if (reader == nullptr) fuzz::fail("redisReaderCreate failed");
    redis::bound_arrays(*reader);
    if (size > 0 && redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) != REDIS_OK) {
        fuzz::fail("redisReaderFeed refused the bytes");
    }
    for (;;) {
        void* reply = nullptr;
        if (redisReaderGetReply(reader, &reply) != REDIS_OK || reply == nullptr) break;
        check_bound(*static_cast<redisReply*>(reply), 0);
        check_reply(*static_cast<redisReply*>(reply));
        freeReplyObject(reply);
    }
    redisReaderFree(reader);
    return 0;
}
