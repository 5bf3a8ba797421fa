// What a Redis server answers, read without trusting it (private to src/):
// a store anyone on the host can run, or a peer can impersonate, sends
// replies of any shape; these functions never throw on one, never read past
// it, and say in words what was wrong. Fuzzed with the bytes of a fake
// server (tests/fuzz/redis_reply_fuzz.cpp).
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpuverbs::detail::redis {

/// One page of a SCAN over "SERVICE/member/*".
struct ScanPage {
    std::string cursor;               ///< "0" when the scan is complete
    std::vector<std::uint32_t> ranks; ///< the ranks of the member keys on this page (below max_world_size)
};

/// Reads a SCAN reply: [cursor, [key, ...]]. Keys that are not `prefix`
/// followed by 1 to 5 digits are skipped (not gpuverbs' keys). False, with
/// `why`, for a reply of another shape (an element that is not a string, a
/// cursor that is not a number).
bool parse_scan_reply(const redisReply& reply, std::string_view prefix, ScanPage& page, std::string& why);

/// A string reply's bytes when it is a string of at most `max_size` bytes.
/// False, with `why`, otherwise (checked before anything is copied).
bool string_reply(const redisReply& reply, std::size_t max_size, std::vector<std::byte>& value, std::string& why);

/// Makes `context`'s reader refuse an array announcing more than
/// max_array_elements, and an array nested in another unless SCAN's shape (a
/// parent of at most two elements, no deeper): the connection fails with
/// "Out of memory". hiredis allocates 8 bytes per announced element before
/// any arrives, so 12 bytes ("*100000000\r\n") from a hostile server would
/// cost 800 MB, and nested arrays would multiply that.
void bound_arrays(redisContext& context);
/// The same for a reader of one's own (the fuzz target reads through it).
void bound_arrays(redisReader& reader);
inline constexpr long long max_array_elements = 1 << 17;

/// Whether the socket's peer is this host's loopback (127.0.0.0/8, ::1, or
/// IPv4 loopback mapped into IPv6) or a Unix socket. False when it cannot tell.
bool on_loopback(int fd) noexcept;

/// A server's text made safe to put in a message: at most 200 bytes,
/// printable ASCII only (anything else becomes '?'), "…" when cut.
std::string server_text(std::string_view text);

} // namespace gpuverbs::detail::redis
