// gpuverbs-perf's control channel, the server's side of it, without a socket:
// the client's words go in, what the server does next comes out (as
// Boost.Redis's exec_fsm), so tests/unit/perf_control_test.cpp and
// tests/fuzz/perf_control_fuzz.cpp can feed it any words a peer could send.
//
// After the handshake and the mode check (gpuverbs_perf.cpp: run_client,
// run_server), the client drives one round per message size, in 64-bit words
// in the host's byte order:
//
//   client                         server
//   SIZE ITERATIONS          →     (checks them: check_round)
//                            ←     READY, or REFUSED and the server stops
//   (both run the round)
//   DONE                     →
//                            ←     DONE
//   ... one such exchange per size ...
//   FINISHED (0)             →     (the server exits)
//
// The server sizes nothing from the client's numbers: a round runs only when
// its size fits the server's buffer and its count fits the 32 bits the runner
// counts in; anything else stops the server with a message naming the value
// and the limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace perf::control {

/// The server's answers and the client's end-of-round and end-of-run words.
inline constexpr std::uint64_t ready = 0x5245414459ull;       // "READY"
inline constexpr std::uint64_t done = 0x444f4e45ull;          // "DONE"
inline constexpr std::uint64_t refused = 0x52454655534544ull; // "REFUSED"
inline constexpr std::uint64_t finished = 0;                  // in place of a size: no more rounds

/// The most messages one round runs: the runner counts them in 32 bits.
inline constexpr std::uint64_t max_iterations = std::numeric_limits<std::uint32_t>::max();

/// One round as the client asks for it, checked.
struct Round {
    std::size_t size = 0;         ///< bytes per message, 1 .. the server's buffer
    std::uint32_t iterations = 0; ///< messages, 1 .. max_iterations
    friend bool operator==(const Round&, const Round&) = default;
};

/// Why a server whose buffer holds `buffer_bytes` cannot run `iterations`
/// messages of `size` bytes, in words naming the value and the limit; nothing
/// when it can.
inline std::optional<std::string> check_round(std::uint64_t size, std::uint64_t iterations, std::size_t buffer_bytes) {
    if (size == 0) {
        return "the client asked for 0-byte messages; a round's messages are 1 to " + std::to_string(buffer_bytes) +
               " bytes here (a different gpuverbs-perf?)";
    }
    if (size > buffer_bytes) {
        return "the client asked for " + std::to_string(size) + "-byte messages; this server's buffer holds " +
               std::to_string(buffer_bytes) + " bytes: start the server with --size " + std::to_string(size) +
               " (or the client's --max-size)";
    }
    if (iterations == 0) {
        return "the client asked for 0 iterations; a round runs 1 to " + std::to_string(max_iterations) +
               " (a different gpuverbs-perf?)";
    }
    if (iterations > max_iterations) {
        return "the client asked for " + std::to_string(iterations) + " iterations; a round runs at most " +
               std::to_string(max_iterations);
    }
    return std::nullopt;
}

/// What the server does after a word from the client.
struct Action {
    enum class Kind {
        read,      ///< read the next word
        run,       ///< answer READY and run `round`, then read the next word
        end_round, ///< the round is over on both sides: answer DONE, then read the next word
        finish,    ///< the client is done: stop, successfully
        refuse,    ///< answer REFUSED and stop with `error`
        fail,      ///< stop with `error` (the peer is out of step)
    };
    Kind kind = Kind::read;
    Round round;       ///< for run
    std::string error; ///< for refuse and fail
};

/// The server's side of the rounds: feed it each word the client sends, do
/// what it says. After finish, refuse or fail it only fails.
class ServerRounds {
public:
    /// `buffer_bytes`: the largest message the server's buffer holds.
    explicit ServerRounds(std::size_t buffer_bytes) noexcept : buffer_bytes_(buffer_bytes) {}

    Action on_word(std::uint64_t word) {
        switch (state_) {
            case State::size:
                if (word == finished) {
                    state_ = State::over;
                    return {Action::Kind::finish, {}, {}};
                }
                size_ = word;
                state_ = State::iterations;
                return {Action::Kind::read, {}, {}};
            case State::iterations:
                if (auto why = check_round(size_, word, buffer_bytes_)) {
                    state_ = State::over;
                    return {Action::Kind::refuse, {}, std::move(*why)};
                }
                state_ = State::in_round;
                return {Action::Kind::run, {static_cast<std::size_t>(size_), static_cast<std::uint32_t>(word)}, {}};
            case State::in_round:
                if (word != done) {
                    state_ = State::over;
                    return {Action::Kind::fail,
                            {},
                            "the peer is out of step with this gpuverbs-perf (a different version?): it sent " +
                                std::to_string(word) + " where DONE, the end of the round, was due"};
                }
                state_ = State::size;
                return {Action::Kind::end_round, {}, {}};
            case State::over: break;
        }
        return {Action::Kind::fail, {}, "the client sent a word after the rounds ended"};
    }

private:
    enum class State { size, iterations, in_round, over };
    std::size_t buffer_bytes_;
    State state_ = State::size;
    std::uint64_t size_ = 0;
};

} // namespace perf::control
