// libFuzzer target: the TCP bootstrap's framing, as a peer's bytes reach it
// through a real connected socket (src/connections/tcp_bootstrap.cpp: exchange_impl,
// read_frame; include/gpuverbs/connections/tcp_bootstrap.hpp: ExchangeHandshakeOp).
//
// The input is everything the peer sends before it closes its side: a 4-byte
// big-endian length, then (perhaps) the record. Each input is run through
// both the blocking exchange (detail::exchange_impl, the body of
// exchange_handshake's error_code form, which keeps the words) and
// async_exchange_handshake with a Diagnostics (an io_context), each on a
// fresh socketpair(2) whose far end holds the input and is shut down for
// writing, so every read ends in data or end-of-file and nothing waits for a
// deadline. Both must give exactly what the framing rules say:
//   fewer than 4 bytes                      → errc::peer_closed, "the peer
//                                             closed the connection after K of
//                                             4 bytes of its record length"
//   a length above wire::max_handshake_size → errc::malformed_record, "the peer
//                                             announced a N-byte record; at
//                                             most 1840 are allowed (not a
//                                             gpuverbs peer?)", before anything
//                                             is allocated for it
//   fewer than length bytes after it        → errc::peer_closed, "… after K of
//                                             N bytes of its record"
//   otherwise                               → what the model of the handshake
//                                             record says (wire_model.hpp);
//                                             bytes after the record are ignored
// both in the same words (verb and detail) whenever they fail, and a
// handshake that arrives must be the one the bytes encode (framing its
// serialization gives back the input's first 4 + length bytes).
//
// A Unix-domain socketpair stands in for TCP: the code under test only reads,
// writes, polls and switches the descriptor to non-blocking mode, which
// behave the same, and a socketpair needs no port or listener per input.
#include "wire_model.hpp"

#include "gpuverbs/connections/tcp_bootstrap.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace {

namespace asio = boost::asio;
namespace wire = gpuverbs::wire;
using gpuverbs::errc;
using gpuverbs::Handshake;

// What we send: any valid handshake; the peer side never reads it.
Handshake ours() {
    Handshake h;
    h.endpoint.qp_num = 0x123;
    h.endpoint.psn = 0x456;
    h.endpoint.mtu = gpuverbs::Mtu::mtu_1024;
    h.endpoint.link_layer = gpuverbs::LinkLayer::ethernet;
    h.endpoint.gid.bytes[15] = 1;
    h.regions.push_back({0x10000, 4096, 7});
    return h;
}

// The framing rules above, applied to the peer's bytes.
fuzz::Expected<Handshake> model_frame(fuzz::Bytes in) {
    if (in.size() < 4) return {errc::peer_closed};
    std::uint64_t length = fuzz::be(in, 0, 4);
    if (length > wire::max_handshake_size) return {errc::malformed_record};
    if (in.size() - 4 < length) return {errc::peer_closed};
    return fuzz::model_handshake(in.subspan(4, length));
}

// The words the framing rules give ("" where the record's parser speaks).
std::string model_words(fuzz::Bytes in) {
    auto closed = [](std::size_t got, std::uint64_t wanted, const char* what) {
        return "the peer closed the connection after " + std::to_string(got) + " of " + std::to_string(wanted) +
               " bytes of its " + what;
    };
    if (in.size() < 4) return closed(in.size(), 4, "record length");
    std::uint64_t length = fuzz::be(in, 0, 4);
    if (length > wire::max_handshake_size) {
        return "the peer announced a " + std::to_string(length) + "-byte record; at most " +
               std::to_string(wire::max_handshake_size) + " are allowed (not a gpuverbs peer?)";
    }
    if (in.size() - 4 < length) return closed(in.size() - 4, length, "record");
    return "";
}

// What one exchange gave: the code, the words, the handshake.
struct Outcome {
    std::error_code ec;
    std::string verb, detail;
    Handshake got;
};

// A connected pair: `ours` for the code under test; the peer's end already
// holds `in` and is shut down for writing (end-of-file after `in`).
struct SocketPair {
    int ours = -1;
    int theirs = -1;
    explicit SocketPair(fuzz::Bytes in) {
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) fuzz::fail("socketpair failed");
        ours = fds[0];
        theirs = fds[1];
        std::size_t done = 0;
        while (done < in.size()) {
            ssize_t n = ::write(theirs, in.data() + done, in.size() - done);
            if (n <= 0) fuzz::fail("writing the peer's bytes into the socketpair failed");
            done += static_cast<std::size_t>(n);
        }
        ::shutdown(theirs, SHUT_WR);
    }
    SocketPair(const SocketPair&) = delete;
    SocketPair& operator=(const SocketPair&) = delete;
    ~SocketPair() {
        if (ours >= 0) ::close(ours);
        ::close(theirs);
    }
    /// Hands our end to an Asio socket (which then closes it).
    asio::ip::tcp::socket take(asio::io_context& io) {
        asio::ip::tcp::socket s(io);
        s.assign(asio::ip::tcp::v4(), ours);
        ours = -1;
        return s;
    }
};

void check_outcome(const char* form, fuzz::Bytes in, const fuzz::Expected<Handshake>& want, const Outcome& out) {
    const std::error_code& ec = out.ec;
    const Handshake& got = out.got;
    if (want.error) {
        if (ec != make_error_code(*want.error)) {
            fuzz::fail("%s: the framing rules say %s, the exchange says %s", form,
                       fuzz::outcome(make_error_code(*want.error)).c_str(), fuzz::outcome(ec).c_str());
        }
        if (!(got == Handshake{})) fuzz::fail("%s: a failed exchange returned a half-parsed handshake", form);
        if (out.detail.empty()) fuzz::fail("%s: the exchange failed without words", form);
        std::string words = model_words(in);
        if (words.empty()) return; // the record's parser speaks (wire_model.hpp checks its verb)
        if (out.detail != words) {
            fuzz::fail("%s: the framing rules say \"%s\", the exchange says \"%s\"", form, words.c_str(),
                       out.detail.c_str());
        }
        if (out.verb != "receive") fuzz::fail("%s: the failure names \"%s\", not receive", form, out.verb.c_str());
        return;
    }
    if (ec) fuzz::fail("%s: the framing rules say success, the exchange says %s", form, fuzz::outcome(ec).c_str());
    if (!(got == want.value)) fuzz::fail("%s: received another handshake than the frame holds", form);
    auto framed = gpuverbs::detail::frame_record(wire::serialize(got));
    if (!fuzz::same_bytes(framed, in.first(std::min(in.size(), framed.size())))) {
        fuzz::fail("%s: frame_record(serialize(received)) differs from the frame that arrived", form);
    }
}

Outcome check_blocking(fuzz::Bytes in, const fuzz::Expected<Handshake>& want) {
    asio::io_context io;
    SocketPair pair(in);
    asio::ip::tcp::socket socket = pair.take(io);
    gpuverbs::detail::Status status;
    Outcome out;
    try {
        // End-of-file always comes; the deadline is only there to report a hang as a failure.
        out.got = gpuverbs::detail::exchange_impl(socket, ours(), std::chrono::seconds(2), status);
    } catch (...) {
        fuzz::fail("exchange_handshake (error_code form) threw");
    }
    out.ec = status.code;
    out.verb = status.verb;
    out.detail = status.detail;
    check_outcome("exchange_handshake", in, want, out);
    return out;
}

Outcome check_async(fuzz::Bytes in, const fuzz::Expected<Handshake>& want) {
    asio::io_context io;
    SocketPair pair(in);
    asio::ip::tcp::socket socket = pair.take(io);
    std::optional<std::error_code> ec;
    gpuverbs::Diagnostics diagnostics;
    Outcome out;
    gpuverbs::async_exchange_handshake(socket, ours(), diagnostics, [&](boost::system::error_code e, Handshake h) {
        ec = std::error_code(e);
        out.got = std::move(h);
    });
    try {
        io.run();
    } catch (...) {
        fuzz::fail("async_exchange_handshake threw out of io_context::run");
    }
    if (!ec) fuzz::fail("async_exchange_handshake never completed");
    out.ec = *ec;
    out.verb = diagnostics.verb();
    out.detail = diagnostics.detail();
    if (!out.ec && !diagnostics.message().empty()) fuzz::fail("a successful exchange left words in its Diagnostics");
    check_outcome("async_exchange_handshake", in, want, out);
    return out;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    std::signal(SIGPIPE, SIG_IGN); // a write to a closed socket must be an error, not the end of the fuzzer
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // The socketpair must hold the whole input without a reader; beyond the
    // largest frame (4 + max_handshake_size) more bytes are never read anyway.
    if (size > std::size_t{64} * 1024) return -1;
    fuzz::Bytes in(reinterpret_cast<const std::byte*>(data), size);
    fuzz::Expected<Handshake> want = model_frame(in);
    Outcome blocking = check_blocking(in, want);
    Outcome async = check_async(in, want);
    if (blocking.verb != async.verb || blocking.detail != async.detail) {
        fuzz::fail("the blocking exchange says \"%s: %s\", the asynchronous one \"%s: %s\"", blocking.verb.c_str(),
                   blocking.detail.c_str(), async.verb.c_str(), async.detail.c_str());
    }
    return 0;
}
