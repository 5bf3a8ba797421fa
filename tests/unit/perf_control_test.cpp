// gpuverbs-perf's control channel, the server's side (benchmarks/perf/control.hpp):
// every round it runs fits its buffer, and every word it refuses is named.
#include "../../benchmarks/perf/control.hpp"
#include "text_checks.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace perf::control;

namespace {

using gpuverbs::test::contains;

// Feeds `words` to a server with a buffer of `buffer_bytes`; the last action.
Action after(std::size_t buffer_bytes, const std::vector<std::uint64_t>& words) {
    ServerRounds rounds(buffer_bytes);
    Action last;
    for (std::uint64_t w : words) last = rounds.on_word(w);
    return last;
}

} // namespace

TEST_SUITE("gpuverbs-perf control") {
    TEST_CASE("a round from 1 byte up to the server's buffer and 1 to 2^32 - 1 iterations passes") {
        CHECK_FALSE(check_round(1, 1, 65536));
        CHECK_FALSE(check_round(65536, 1, 65536));
        CHECK_FALSE(check_round(4096, 5000, 65536));
        CHECK_FALSE(check_round(65536, 4294967295ull, 65536));
    }

    TEST_CASE("a size larger than the server's buffer is refused, naming the size and the buffer") {
        auto why = check_round(65537, 100, 65536);
        REQUIRE(why);
        CHECK(*why ==
              "the client asked for 65537-byte messages; this server's buffer holds 65536 bytes: start the server "
              "with --size 65537 (or the client's --max-size)");
        auto huge = check_round(0xffffffffffffffffull, 100, 65536);
        REQUIRE(huge);
        CHECK(contains(*huge, "18446744073709551615-byte messages; this server's buffer holds 65536 bytes"));
    }

    TEST_CASE("a size of 0 is refused, naming the sizes the server takes") {
        auto why = check_round(0, 100, 65536);
        REQUIRE(why);
        CHECK(*why ==
              "the client asked for 0-byte messages; a round's messages are 1 to 65536 bytes here (a different "
              "gpuverbs-perf?)");
    }

    TEST_CASE("an iteration count of 0 or above 32 bits is refused, naming the count and the limit") {
        auto zero = check_round(64, 0, 65536);
        REQUIRE(zero);
        CHECK(*zero == "the client asked for 0 iterations; a round runs 1 to 4294967295 (a different gpuverbs-perf?)");
        auto wide = check_round(64, 4294967296ull, 65536);
        REQUIRE(wide);
        CHECK(*wide == "the client asked for 4294967296 iterations; a round runs at most 4294967295");
    }

    TEST_CASE("the server runs the round the client asks for, then ends it on DONE") {
        ServerRounds rounds(65536);
        CHECK(rounds.on_word(4096).kind == Action::Kind::read);
        Action run = rounds.on_word(5000);
        CHECK(run.kind == Action::Kind::run);
        CHECK(run.round == Round{4096, 5000});
        CHECK(rounds.on_word(done).kind == Action::Kind::end_round);
        CHECK(rounds.on_word(65536).kind == Action::Kind::read);
        CHECK(rounds.on_word(1).round == Round{65536, 1});
        CHECK(rounds.on_word(done).kind == Action::Kind::end_round);
        CHECK(rounds.on_word(finished).kind == Action::Kind::finish);
    }

    TEST_CASE("a round the buffer cannot hold is refused before it runs, with check_round's words") {
        Action a = after(65536, {131072, 10});
        CHECK(a.kind == Action::Kind::refuse);
        CHECK(a.error == *check_round(131072, 10, 65536));
        CHECK(after(65536, {64, 0}).kind == Action::Kind::refuse);
        CHECK(after(65536, {64, 1ull << 40}).kind == Action::Kind::refuse);
        CHECK(after(65536, {4096, 1, done, 65537, 1}).kind == Action::Kind::refuse);
    }

    TEST_CASE("a word other than DONE at the end of a round stops the server as out of step") {
        Action a = after(65536, {4096, 10, 12345});
        CHECK(a.kind == Action::Kind::fail);
        CHECK(contains(a.error, "out of step"));
        CHECK(contains(a.error, "it sent 12345"));
    }

    TEST_CASE("after the rounds end, any further word fails") {
        CHECK(after(65536, {finished, 4096}).kind == Action::Kind::fail);
        CHECK(after(65536, {131072, 10, done}).kind == Action::Kind::fail);
        CHECK(after(65536, {4096, 10, 7, done}).kind == Action::Kind::fail);
    }

    TEST_CASE("the control words are distinct, and FINISHED cannot be a size") {
        CHECK(ready != done);
        CHECK(ready != refused);
        CHECK(done != refused);
        CHECK(check_round(finished, 1, 65536));
    }
}
