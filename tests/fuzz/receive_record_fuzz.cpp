// libFuzzer target: gpuverbs::receive_record, the framed record any exchange
// after the handshake receives (a block list, a leased list), with the
// caller's size limit taken from the input (src/connections/tcp_bootstrap.cpp: read_frame,
// frame_length; include/gpuverbs/connections/tcp_bootstrap.hpp).
//
// The input is the caller's limit, then the peer's bytes:
//   u32 max_size (big-endian; above 1 MiB counts as 1 MiB, to stay fast) |
//   everything the peer sends before it closes its side: a 4-byte
//   big-endian length, then (perhaps) the record
// The peer's bytes go into a fresh socketpair(2) whose far end is shut down
// for writing after them (a thread writes what the socket buffer does not
// hold at once), so every read ends in data or end-of-file and nothing waits
// for the deadline. receive_record must give exactly what the framing rules
// say, in the same words as the handshake's exchange (tcp_frame_fuzz.cpp):
//   fewer than 4 bytes               → gpuverbs::Error, errc::peer_closed,
//                                      "receive: the peer closed the connection
//                                      after K of 4 bytes of its record length"
//   a length N above max_size        → errc::malformed_record, "receive: the
//                                      peer announced a N-byte record; at most
//                                      max_size are allowed (not a gpuverbs peer?)"
//   fewer than N bytes after it      → errc::peer_closed, "receive: the peer
//                                      closed the connection after K of N bytes
//                                      of its record"
//   otherwise                        → the N bytes after the length, exactly;
//                                      bytes after them are left unread
// and never another exception, never a timeout (every byte is there before
// the call), and the socket back in the mode it came in.
//
// What the reader allocates is watched too (a sanitizer malloc hook, armed
// only during the call): its buffer grows with the bytes that arrived, at
// most twice them, from 64 KiB, so no single allocation may exceed
// max(64 KiB, 2 × the record bytes that arrived) — a peer announcing 1 MiB
// and sending 10 bytes costs 64 KiB, not 1 MiB. (-malloc_limit_mb=64 alone
// would not see that: the limit here is at most 1 MiB.)
#include "wire_model.hpp"

#include "gpuverbs/connections/tcp_bootstrap.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <sanitizer/allocator_interface.h>

#include <boost/asio/io_context.hpp>

#include <fcntl.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using gpuverbs::errc;

constexpr std::size_t most_max_size = std::size_t{1} << 20;
constexpr std::size_t first_chunk = std::size_t{64} << 10;

// The largest single allocation while armed (all threads; the peer's writer
// allocates nothing while it runs).
std::atomic<bool> armed{false};
std::atomic<std::size_t> largest{0};

void on_malloc(const volatile void*, std::size_t size) {
    if (!armed.load(std::memory_order_relaxed)) return;
    std::size_t seen = largest.load(std::memory_order_relaxed);
    while (size > seen && !largest.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
    }
}
void on_free(const volatile void*) {}

/// What the framing rules say: the record, or the error and its words.
struct Want {
    std::optional<errc> error;
    std::string words; ///< "VERB: DETAIL", as Error::what() has it
    fuzz::Bytes record;
};

Want model(fuzz::Bytes peer, std::size_t max_size) {
    auto closed = [](std::size_t got, std::uint64_t wanted, const char* what) {
        return "receive: the peer closed the connection after " + std::to_string(got) + " of " +
               std::to_string(wanted) + " bytes of its " + what;
    };
    if (peer.size() < 4) return {errc::peer_closed, closed(peer.size(), 4, "record length"), {}};
    const std::uint64_t length = fuzz::be(peer, 0, 4);
    if (length > max_size) {
        return {errc::malformed_record,
                "receive: the peer announced a " + std::to_string(length) + "-byte record; at most " +
                    std::to_string(max_size) + " are allowed (not a gpuverbs peer?)",
                {}};
    }
    if (peer.size() - 4 < length) return {errc::peer_closed, closed(peer.size() - 4, length, "record"), {}};
    return {std::nullopt, "", peer.subspan(4, length)};
}

/// A connected pair: `ours` for the code under test; the peer's end gets
/// `peer` and is then shut down for writing, by a thread when the socket
/// buffer cannot hold all of it at once.
class Peer {
public:
    explicit Peer(fuzz::Bytes peer) : bytes_(peer) {
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) fuzz::fail("socketpair failed");
        ours_ = fds[0];
        theirs_ = fds[1];
        // As much as fits now, without blocking; the rest from a thread.
        const int flags = ::fcntl(theirs_, F_GETFL);
        ::fcntl(theirs_, F_SETFL, flags | O_NONBLOCK);
        while (done_ < bytes_.size()) {
            ssize_t n = ::write(theirs_, bytes_.data() + done_, bytes_.size() - done_);
            if (n > 0) {
                done_ += static_cast<std::size_t>(n);
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            } else {
                fuzz::fail("writing the peer's bytes into the socketpair failed");
            }
        }
        ::fcntl(theirs_, F_SETFL, flags);
        if (done_ == bytes_.size()) {
            ::shutdown(theirs_, SHUT_WR);
        } else {
            writer_ = std::thread([this] {
                // Ends when everything is written, or when our side closes
                // early (EPIPE: the reader stopped at a bad length or a
                // complete record with bytes after it).
                while (done_ < bytes_.size()) {
                    ssize_t n = ::write(theirs_, bytes_.data() + done_, bytes_.size() - done_);
                    if (n <= 0) break;
                    done_ += static_cast<std::size_t>(n);
                }
                ::shutdown(theirs_, SHUT_WR);
            });
        }
    }
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;
    ~Peer() {
        if (ours_ >= 0) ::close(ours_);
        if (writer_.joinable()) writer_.join();
        ::close(theirs_);
    }
    /// Hands our end to an Asio socket (which then closes it; destroy it
    /// before this Peer, so that a writer still blocked gets EPIPE).
    asio::ip::tcp::socket take(asio::io_context& io) {
        asio::ip::tcp::socket s(io);
        s.assign(asio::ip::tcp::v4(), ours_);
        ours_ = -1;
        return s;
    }

private:
    fuzz::Bytes bytes_;
    std::size_t done_ = 0;
    int ours_ = -1;
    int theirs_ = -1;
    std::thread writer_;
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    std::signal(SIGPIPE, SIG_IGN); // the peer's writer may outlive our end
    if (__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) == 0) {
        fuzz::fail("cannot install the allocation hook");
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 4) return -1; // no limit: not an input of this target
    fuzz::Bytes input(reinterpret_cast<const std::byte*>(data), size);
    const std::size_t max_size = std::min<std::size_t>(fuzz::be(input, 0, 4), most_max_size);
    const fuzz::Bytes peer = input.subspan(4);
    const Want want = model(peer, max_size);

    std::optional<std::vector<std::byte>> got;
    std::optional<gpuverbs::Error> error;
    {
        Peer far(peer);
        asio::io_context io;
        asio::ip::tcp::socket socket = far.take(io);
        largest.store(0, std::memory_order_relaxed);
        armed.store(true, std::memory_order_relaxed);
        try {
            got = gpuverbs::receive_record(socket, max_size, std::chrono::seconds(5));
        } catch (const gpuverbs::Error& e) {
            error = e;
        } catch (const std::exception& e) {
            armed.store(false, std::memory_order_relaxed);
            fuzz::fail("receive_record threw something other than gpuverbs::Error: %s", e.what());
        } catch (...) {
            armed.store(false, std::memory_order_relaxed);
            fuzz::fail("receive_record threw something other than gpuverbs::Error");
        }
        armed.store(false, std::memory_order_relaxed);
        if (socket.non_blocking()) fuzz::fail("receive_record left the socket non-blocking");
    }

    // The allocation bound: only the bytes that arrived size the buffer.
    const std::size_t arrived = peer.size() < 4 ? 0 : std::min<std::size_t>(peer.size() - 4, fuzz::be(peer, 0, 4));
    const std::size_t allowed = std::max(first_chunk, 2 * arrived);
    if (largest.load() > allowed) {
        fuzz::fail("receive_record allocated %zu bytes at once after %zu bytes of the record arrived (at most %zu)",
                   largest.load(), arrived, allowed);
    }

    if (want.error) {
        if (!error)
            fuzz::fail("the framing rules say %s, receive_record returned a record",
                       fuzz::outcome(make_error_code(*want.error)).c_str());
        if (error->code() != make_error_code(*want.error)) {
            fuzz::fail("the framing rules say %s, receive_record says %s (%s)",
                       fuzz::outcome(make_error_code(*want.error)).c_str(), fuzz::outcome(error->code()).c_str(),
                       error->what());
        }
        if (error->what() != want.words) {
            fuzz::fail("the framing rules say \"%s\", receive_record says \"%s\"", want.words.c_str(), error->what());
        }
        return 0;
    }
    if (error) {
        fuzz::fail("the framing rules say a %zu-byte record, receive_record says %s (%s)", want.record.size(),
                   fuzz::outcome(error->code()).c_str(), error->what());
    }
    if (!fuzz::same_bytes(*got, want.record)) {
        fuzz::fail("receive_record returned %zu bytes other than the %zu the frame holds", got->size(),
                   want.record.size());
    }
    return 0;
}
