// libFuzzer target: gpuverbs-perf's control channel, the server's side
// (benchmarks/perf/control.hpp: check_round, ServerRounds), which takes the
// size and iteration count of every round from the client.
//
// The input: the server's buffer size (8 bytes, little-endian), then the
// words the client sends (8 bytes each, little-endian; a trailing partial
// word is dropped, as a peer that closes mid-word ends the conversation).
// Each word goes to ServerRounds, and for any input:
//  - every action is what the conversation's rules (below, written from
//    control.hpp's description) say: a size, then a count, then DONE, until
//    FINISHED (0) in place of a size;
//  - a round runs only with 1 <= size <= the buffer and 1 <= count <=
//    2^32 - 1, exactly as the client sent them; the server then touches its
//    buffer where gpuverbs-perf's write_lat server does (the last byte of the
//    lower half and of the upper half of a buffer twice that size), in a real
//    allocation that AddressSanitizer watches, for buffers up to 64 KiB;
//  - any other round is refused with check_round's words, which name the bad
//    value and the limit; a word other than DONE after a round fails;
//  - after finish, refuse or fail, every further word fails.
#include "../../benchmarks/perf/control.hpp"
#include "wire_model.hpp" // fuzz::fail, fuzz::require

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace {

using perf::control::Action;
using Kind = perf::control::Action::Kind;

std::uint64_t le64(const std::uint8_t* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

bool contains(const std::string& text, std::uint64_t number) {
    return text.find(std::to_string(number)) != std::string::npos;
}

// The rules, as the model sees them: where the conversation stands.
enum class Expect { size, iterations, done, over };

void check_refusal(const std::string& error, std::uint64_t size, std::uint64_t iterations, std::uint64_t buffer) {
    fuzz::require(!error.empty(), "a refused round came without a reason");
    auto why = perf::control::check_round(size, iterations, buffer);
    fuzz::require(why && *why == error, "the refusal's words are not check_round's");
    if (size == 0 || size > buffer) {
        fuzz::require(contains(error, size) && contains(error, buffer),
                      "a refused size's reason does not name the size and the buffer");
    } else {
        fuzz::require(contains(error, iterations) && contains(error, perf::control::max_iterations),
                      "a refused count's reason does not name the count and the limit");
    }
}

// Touches the server's buffer where a write_lat round of `size` bytes does.
void touch(std::vector<std::byte>& host, std::size_t buffer, std::size_t size) {
    host[size - 1] = std::byte{0};                   // serve(): the polled mark
    host[buffer + size - 1] = std::byte{1};          // post_marked_write(): the sent mark
    volatile std::byte seen = host.data()[size - 1]; // wait_mark()
    (void)seen;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 8) return -1;
    static_assert(sizeof(std::size_t) == sizeof(std::uint64_t), "any buffer size the input names is a size_t");
    const std::uint64_t buffer = le64(data);
    std::optional<std::vector<std::byte>> host; // the write_lat server's host buffer, for small buffers
    if (buffer <= 65536) host.emplace(2 * buffer);

    perf::control::ServerRounds rounds(static_cast<std::size_t>(buffer));
    Expect expect = Expect::size;
    std::uint64_t asked_size = 0;
    for (std::size_t at = 8; at + 8 <= size; at += 8) {
        const std::uint64_t word = le64(data + at);
        Action a = rounds.on_word(word);
        switch (expect) {
            case Expect::size:
                if (word == perf::control::finished) {
                    fuzz::require(a.kind == Kind::finish, "FINISHED in place of a size did not finish");
                    expect = Expect::over;
                } else {
                    fuzz::require(a.kind == Kind::read, "a size did not make the server read the count");
                    asked_size = word;
                    expect = Expect::iterations;
                }
                break;
            case Expect::iterations: {
                bool fits =
                    asked_size >= 1 && asked_size <= buffer && word >= 1 && word <= perf::control::max_iterations;
                if (!fits) {
                    fuzz::require(a.kind == Kind::refuse, "a round outside the limits was not refused");
                    check_refusal(a.error, asked_size, word, buffer);
                    expect = Expect::over;
                    break;
                }
                fuzz::require(a.kind == Kind::run, "a round inside the limits did not run");
                fuzz::require(a.round.size == asked_size && a.round.iterations == word,
                              "the round run is not the one the client asked for");
                fuzz::require(a.round.size >= 1 && a.round.size <= buffer && a.round.iterations >= 1,
                              "a round outside the server's buffer ran");
                if (host) touch(*host, static_cast<std::size_t>(buffer), a.round.size);
                expect = Expect::done;
                break;
            }
            case Expect::done:
                if (word == perf::control::done) {
                    fuzz::require(a.kind == Kind::end_round, "DONE after a round did not end it");
                    expect = Expect::size;
                } else {
                    fuzz::require(a.kind == Kind::fail && !a.error.empty(),
                                  "a word other than DONE after a round did not fail with a reason");
                    fuzz::require(contains(a.error, word), "the out-of-step reason does not name the word");
                    expect = Expect::over;
                }
                break;
            case Expect::over:
                fuzz::require(a.kind == Kind::fail && !a.error.empty(),
                              "a word after the conversation ended did not fail with a reason");
                break;
        }
    }
    return 0;
}
