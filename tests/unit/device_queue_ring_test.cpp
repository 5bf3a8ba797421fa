// The device queue's ring without a GPU: the same header the GPU half
// compiles, driven by CPU producer threads into one reader. Every descriptor is
// checked (position and contents), the ring wraps many times, a torn or stale
// descriptor is never taken, and every wait ends with its code by its deadline
// when the reader stops, fails the peer or closes the queue.
#include "gpuverbs/device_queue/ring.hpp"

#include "host_ring.hpp"
#include "ring_requests.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

// In the ring's own namespace, not with a using-directive: the unit tests
// compile in batches, where this file's names must not reach the others'.
namespace gpuverbs::device_queue {

using namespace std::chrono_literals;

namespace {

using HostQueue = test::HostRing;

std::uint64_t in_ns(std::chrono::nanoseconds d) {
    return test::ring_deadline(d);
}

using test::request_of;
using test::same;

} // namespace

TEST_SUITE("device queue ring") {
    TEST_CASE("a descriptor is 64 bytes of eight stamped words that decode to the request encoded") {
        CHECK(sizeof(Descriptor) == 64);
        CHECK(alignof(Descriptor) == 64);
        CHECK(sizeof(ProducerWords) == 128);
        CHECK(sizeof(ProxyWords) == 128);
        Request r = request_of(7, 123456);
        r.src_offset = payload_mask;
        r.signal_value = payload_mask - 1;
        std::uint64_t words[descriptor_words];
        encode(r, 5000, 10, words);
        Request back;
        REQUIRE(decode(words, 5000, 10, back) == Decoded::complete);
        CHECK(same(r, back));
        for (std::uint64_t w : words) CHECK((w >> 56) == (((5000 >> 10) & 0x7f) | 0x80));
        // Offsets beyond 56 bits cannot be carried: they are cut, never spill into the stamp.
        r.dst_offset = ~std::uint64_t{0};
        encode(r, 5000, 10, words);
        REQUIRE(decode(words, 5000, 10, back) == Decoded::complete);
        CHECK(back.dst_offset == payload_mask);
    }

    TEST_CASE("every allowed ring size lays its proxy's words on their alignment, past the slots") {
        // A one-slot ring's slots end at 64 bytes; the proxy's words need 128
        // (UBSan stopped the unit tests on the misaligned access before this).
        for (std::uint32_t log2 = 0; log2 <= 20; ++log2) {
            CAPTURE(log2);
            CHECK(proxy_offset(log2) % alignof(ProxyWords) == 0);
            CHECK(proxy_offset(log2) >= (std::size_t{1} << log2) * descriptor_bytes);
            CHECK(host_bytes(log2) == proxy_offset(log2) + sizeof(ProxyWords) + cancel_marks(log2));
        }
        const HostQueue one(0);
        CHECK(reinterpret_cast<std::uintptr_t>(one.view.proxy) % alignof(ProxyWords) ==
              0); // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    }

    TEST_CASE("stamps are never zero and differ from the lap before, so zeroed and stale slots are no descriptor") {
        for (std::uint64_t lap = 0; lap < 1000; ++lap) {
            const std::uint64_t position = lap << 8;
            CHECK(stamp(position, 8) != 0);
            CHECK(stamp(position, 8) != stamp(position - 256, 8));
        }
        std::uint64_t zero[descriptor_words] = {};
        Request out;
        CHECK(decode(zero, 0, 8, out) == Decoded::incomplete);
        // The slot still holds the previous lap's descriptor: not this position's.
        std::uint64_t old[descriptor_words];
        encode(request_of(1, 1), 3, 8, old);
        CHECK(decode(old, 3 + 256, 8, out) == Decoded::incomplete);
    }

    TEST_CASE("a descriptor whose words are half this lap's and half the last is incomplete, then complete") {
        std::uint64_t before[descriptor_words], after[descriptor_words];
        encode(request_of(2, 9), 17, 4, before);      // lap 1 of a 16-slot ring
        encode(request_of(3, 10), 17 + 16, 4, after); // the same slot one lap later
        Request out;
        for (std::size_t written = 0; written < descriptor_words; ++written) {
            std::uint64_t slot[descriptor_words];
            for (std::size_t i = 0; i < descriptor_words; ++i) slot[i] = i < written ? after[i] : before[i];
            CHECK(decode(slot, 17 + 16, 4, out) == Decoded::incomplete);
            // Any one word written out of order: still incomplete.
            slot[descriptor_words - 1 - written] = after[descriptor_words - 1 - written];
            if (written + 1 < descriptor_words) CHECK(decode(slot, 17 + 16, 4, out) == Decoded::incomplete);
        }
        CHECK(decode(after, 17 + 16, 4, out) == Decoded::complete);
        CHECK(same(out, request_of(3, 10)));
    }

    TEST_CASE("a stamped descriptor at the wrong position or with no such operation is corrupt") {
        std::uint64_t words[descriptor_words];
        encode(request_of(1, 2), 40, 4, words);
        Request out;
        // Position 40 and 40 + 2 * 128 * 16 share a stamp (the lap counter wraps at 128): only the position word tells.
        CHECK(decode(words, 40 + 2 * 128 * 16, 4, out) == Decoded::corrupt);
        words[0] = (words[0] & ~(std::uint64_t{0xff} << 48)) | (std::uint64_t{9} << 48);
        CHECK(decode(words, 40, 4, out) == Decoded::corrupt);
    }

    TEST_CASE("decode_put (the proxy's run of puts) takes exactly what decode calls a complete put to its peer") {
        // Every op, two peers, positions across laps, and each word torn, stale or bit-flipped in turn:
        // decode_put accepts exactly when decode says complete, put, this peer, with the same fields.
        std::uint64_t seed = 12345;
        auto next = [&seed] { // the high bits of an LCG (its low bits repeat with short periods)
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            return (seed >> 32) | (seed << 32);
        };
        std::size_t accepted = 0, refused = 0;
        for (int round = 0; round < 20000; ++round) {
            Request r = request_of(static_cast<std::uint32_t>(next() % 4), next() % 1000);
            r.op = static_cast<Op>(1 + next() % 4);
            r.peer = static_cast<std::uint16_t>(next() % 2);
            r.src_window = static_cast<std::uint16_t>(next() % 3);
            r.dst_window = static_cast<std::uint16_t>(next() % 3);
            r.src_offset = next() & payload_mask;
            r.dst_offset = next() & payload_mask;
            r.bytes = next() & payload_mask;
            const std::uint32_t log2 = static_cast<std::uint32_t>(next() % 11);
            const std::uint64_t position = next() % (std::uint64_t{1} << 40);
            std::uint64_t words[descriptor_words];
            encode(r, position, log2, words);
            switch (next() % 4) {
                case 0: break;                                                                        // as written
                case 1: words[next() % descriptor_words] ^= std::uint64_t{1} << (next() % 64); break; // a bit flipped
                case 2: { // one word from another lap
                    std::uint64_t other[descriptor_words];
                    encode(r, position + (std::uint64_t{1} << log2), log2, other);
                    const std::size_t i = next() % descriptor_words;
                    words[i] = other[i];
                    break;
                }
                default: break;
            }
            const std::uint64_t at = next() % 8 == 0 ? position + 1 : position; // now and then, the wrong position
            const auto peer = static_cast<std::uint16_t>(next() % 2);
            Request full;
            const bool want =
                decode(words, at, log2, full) == Decoded::complete && full.op == Op::put && full.peer == peer;
            PutFields f;
            const bool got = decode_put(words, at, stamp(at, log2), put_to(peer), f);
            REQUIRE(got == want);
            if (got) {
                CHECK(f.src_window() == full.src_window);
                CHECK(f.dst_window() == full.dst_window);
                CHECK(f.src_offset == full.src_offset);
                CHECK(f.dst_offset == full.dst_offset);
                CHECK(f.bytes == full.bytes);
                ++accepted;
            } else {
                ++refused;
            }
        }
        CHECK(accepted > 1000); // both sides exercised
        CHECK(refused > 1000);
    }

    TEST_CASE("four CPU producers push 800,000 descriptors through a 1024-slot ring, every one checked") {
        HostQueue q(10);
        constexpr std::uint16_t producers = 4;
        constexpr std::uint64_t each = 200'000;
        std::atomic<int> failed_pushes{0};
        std::vector<std::thread> threads;
        for (std::uint16_t t = 0; t < producers; ++t) {
            threads.emplace_back([&, t] {
                for (std::uint64_t n = 0; n < each; ++n) {
                    std::uint64_t position = 0;
                    if (push(q.view, request_of(t, n), in_ns(30s), position) != WaitResult::done) ++failed_pushes;
                }
            });
        }
        RingReader reader(q.view);
        std::vector<std::uint64_t> next(producers, 0);
        std::uint64_t corrupt = 0, out_of_order = 0, wrong = 0;
        const auto give_up = std::chrono::steady_clock::now() + 120s;
        while (reader.taken() < producers * each && std::chrono::steady_clock::now() < give_up) {
            Request r;
            const Decoded d = reader.try_take(r);
            if (d == Decoded::incomplete) {
                std::this_thread::yield(); // more threads than cores here: let the producers run
                continue;
            }
            if (d == Decoded::corrupt) {
                ++corrupt;
                break;
            }
            if (r.peer >= producers) {
                ++wrong;
                continue;
            }
            if (r.signal_value != next[r.peer]) ++out_of_order;
            if (!same(r, request_of(r.peer, r.signal_value))) ++wrong;
            next[r.peer] = r.signal_value + 1;
            // Credits in batches of 32, as a proxy returns them once its requests complete.
            if (reader.taken() % 32 == 0) reader.complete(reader.taken());
        }
        reader.complete(reader.taken());
        for (auto& t : threads) t.join();
        CHECK(reader.taken() == producers * each);
        CHECK(corrupt == 0);
        CHECK(wrong == 0);
        CHECK(out_of_order == 0);
        CHECK(failed_pushes == 0);
        for (std::uint16_t t = 0; t < producers; ++t) CHECK(next[t] == each);
        CHECK(q.producer->reserved == producers * each);
        CHECK(q.producer->reserved / q.view.capacity() >= 780); // wrapped the ring 781 times
    }

    TEST_CASE("a full ring whose reader stopped ends a push timed out by its deadline; the reader skips its position") {
        HostQueue q(4);
        std::uint64_t position = 0;
        for (int i = 0; i < 16; ++i) REQUIRE(push(q.view, request_of(0, i), in_ns(1s), position) == WaitResult::done);
        const auto start = std::chrono::steady_clock::now();
        CHECK(push(q.view, request_of(0, 16), in_ns(50ms), position) == WaitResult::timed_out);
        const auto took = std::chrono::steady_clock::now() - start;
        CHECK(took >= 50ms);
        CHECK(took < 2s);
        CHECK(q.producer->reserved == 17); // its ticket was taken, and given up:
        CHECK(*q.view.cancel_of(16) == 1); // marked, so the reader never waits on it
        CHECK(quiet(q.view, in_ns(20ms)) == WaitResult::timed_out);
        // The reader takes and completes four: four pushes fit again (positions 17 to 20).
        RingReader reader(q.view);
        Request r;
        for (int i = 0; i < 4; ++i) REQUIRE(reader.try_take(r) == Decoded::complete);
        reader.complete(4);
        CHECK(quiet_until(q.view, 3, in_ns(1s)) == WaitResult::done);
        // Positions 17 to 19 have free slots (below credit 4 + 16); 20 waits for credit 5 and gives up.
        for (int i = 0; i < 3; ++i) CHECK(push(q.view, request_of(0, 17 + i), in_ns(1s), position) == WaitResult::done);
        CHECK(position == 19);
        CHECK(push(q.view, request_of(0, 20), in_ns(10ms), position) == WaitResult::timed_out);
        // In order: 4 to 15, then 16 skipped (its mark cleared), then 17 to 19, then 20 skipped.
        for (int i = 4; i < 16; ++i) REQUIRE(reader.try_take(r) == Decoded::complete);
        CHECK(reader.try_take(r) == Decoded::skipped);
        CHECK(*q.view.cancel_of(16) == 0);
        for (int i = 17; i < 20; ++i) {
            REQUIRE(reader.try_take(r) == Decoded::complete);
            CHECK(r.signal_value == static_cast<std::uint64_t>(i));
        }
        // 20's mark counts only once its slot is free (position 4 completed): until then, incomplete.
        CHECK(reader.try_take(r) == Decoded::incomplete);
        reader.complete(reader.taken()); // the skipped position's credit returns with the rest
        CHECK(reader.try_take(r) == Decoded::skipped);
        CHECK(reader.taken() == 21);
        CHECK(reader.try_take(r) == Decoded::incomplete);
        reader.complete(reader.taken());
        CHECK(push(q.view, request_of(0, 21), in_ns(1s), position) == WaitResult::done);
        CHECK(position == 21);
    }

    TEST_CASE("more producers than slots: every push ends done, served in ticket order, none waits for ever") {
        // 8 producers into a 4-slot ring whose reader pauses three times: with a
        // compare-and-swap reservation a producer could lose every race; with
        // tickets each waits only for the positions ahead of it.
        HostQueue q(2);
        constexpr std::uint16_t producers = 8;
        constexpr std::uint64_t each = 500;
        std::atomic<int> not_done{0};
        std::atomic<std::uint64_t> longest_ns{0};
        std::vector<std::thread> threads;
        for (std::uint16_t t = 0; t < producers; ++t) {
            threads.emplace_back([&, t] {
                for (std::uint64_t n = 0; n < each; ++n) {
                    std::uint64_t position = 0;
                    const std::uint64_t before = detail::now_ns();
                    if (push(q.view, request_of(t, n), in_ns(60s), position) != WaitResult::done) ++not_done;
                    const std::uint64_t waited = detail::now_ns() - before;
                    std::uint64_t seen = longest_ns.load();
                    while (waited > seen && !longest_ns.compare_exchange_weak(seen, waited)) {
                    }
                }
            });
        }
        RingReader reader(q.view);
        std::vector<std::uint64_t> next(producers, 0);
        std::uint64_t wrong = 0, out_of_order = 0, skipped = 0;
        int pauses = 0;
        const auto give_up = std::chrono::steady_clock::now() + 120s;
        while (reader.taken() < producers * each && std::chrono::steady_clock::now() < give_up) {
            Request r;
            const Decoded d = reader.try_take(r);
            if (d == Decoded::incomplete) {
                std::this_thread::yield();
                continue;
            }
            if (d == Decoded::skipped) {
                ++skipped;
            } else if (d != Decoded::complete || r.peer >= producers || !same(r, request_of(r.peer, r.signal_value))) {
                ++wrong;
            } else {
                if (r.signal_value != next[r.peer]) ++out_of_order;
                next[r.peer] = r.signal_value + 1;
            }
            reader.complete(reader.taken());
            if (pauses < 3 && reader.taken() == (pauses + 1) * producers * each / 4) { // the reader stops a while
                std::this_thread::sleep_for(30ms);
                ++pauses;
            }
        }
        for (auto& t : threads) t.join();
        CHECK(not_done == 0);
        CHECK(skipped == 0);
        CHECK(wrong == 0);
        CHECK(out_of_order == 0);
        CHECK(reader.taken() == producers * each);
        CHECK(pauses == 3);
        MESSAGE("longest push: " << longest_ns.load() / 1000 << " us, with 3 reader pauses of 30 ms");
    }

    TEST_CASE("a push into a closed or failed queue returns its code at once, even with free slots, and is skipped") {
        HostQueue q(6);
        RingReader reader(q.view);
        std::uint64_t position = 0;
        REQUIRE(push(q.view, request_of(0, 0), in_ns(1s), position) == WaitResult::done);
        reader.fail(QueueError::closed);
        const auto start = std::chrono::steady_clock::now();
        CHECK(push(q.view, request_of(0, 1), no_deadline, position) == WaitResult::queue_closed);
        CHECK(std::chrono::steady_clock::now() - start < 1s);
        reader.fail(QueueError::refused);
        CHECK(push(q.view, request_of(0, 2), in_ns(1s), position) == WaitResult::refused);
        reader.fail(QueueError::peer_failed);
        CHECK(push(q.view, request_of(0, 3), in_ns(1s), position) == WaitResult::peer_failed);
        Request r;
        CHECK(reader.try_take(r) == Decoded::complete);
        for (int i = 1; i < 4; ++i) CHECK(reader.try_take(r) == Decoded::skipped);
        CHECK(reader.try_take(r) == Decoded::incomplete);
    }

    TEST_CASE("timeouts saturate: no_timeout never passes, a huge timeout is no deadline, not one in the past") {
        CHECK(deadline_after(no_timeout) == no_deadline);
        CHECK(deadline_after(no_timeout - 1) == no_deadline);
        const std::uint64_t now = detail::now_ns();
        const std::uint64_t soon = deadline_after(1'000'000);
        CHECK(soon >= now + 1'000'000);
        CHECK(soon < now + 1'000'000'000);
        // A wait with no deadline ends with the queue's word.
        HostQueue q(0); // one slot
        std::uint64_t position = 0;
        REQUIRE(push(q.view, request_of(0, 0), no_deadline, position) == WaitResult::done);
        RingReader reader(q.view);
        std::thread proxy([&] {
            std::this_thread::sleep_for(20ms);
            reader.fail(QueueError::closed);
        });
        CHECK(push(q.view, request_of(0, 1), no_deadline, position) == WaitResult::queue_closed);
        CHECK(quiet(q.view, no_deadline) == WaitResult::queue_closed);
        proxy.join();
    }

    TEST_CASE("a ring of one slot serves four producers in turn, every descriptor checked") {
        HostQueue q(0);
        constexpr std::uint16_t producers = 4;
        constexpr std::uint64_t each = 500;
        std::atomic<int> not_done{0};
        std::vector<std::thread> threads;
        for (std::uint16_t t = 0; t < producers; ++t) {
            threads.emplace_back([&, t] {
                for (std::uint64_t n = 0; n < each; ++n) {
                    std::uint64_t position = 0;
                    if (push(q.view, request_of(t, n), in_ns(60s), position) != WaitResult::done) ++not_done;
                }
            });
        }
        RingReader reader(q.view);
        std::vector<std::uint64_t> next(producers, 0);
        std::uint64_t wrong = 0;
        const auto give_up = std::chrono::steady_clock::now() + 60s;
        while (reader.taken() < producers * each && std::chrono::steady_clock::now() < give_up) {
            Request r;
            const Decoded d = reader.try_take(r);
            if (d == Decoded::incomplete) {
                std::this_thread::yield();
                continue;
            }
            if (d != Decoded::complete || r.peer >= producers || r.signal_value != next[r.peer]) ++wrong;
            if (d == Decoded::complete && r.peer < producers) next[r.peer] = r.signal_value + 1;
            reader.complete(reader.taken());
        }
        for (auto& t : threads) t.join();
        CHECK(not_done == 0);
        CHECK(wrong == 0);
        CHECK(reader.taken() == producers * each);
    }

    TEST_CASE("every wait ends with the proxy's word: a peer failed, the queue closed") {
        HostQueue q(4);
        std::uint64_t position = 0;
        for (int i = 0; i < 16; ++i) REQUIRE(push(q.view, request_of(0, i), in_ns(1s), position) == WaitResult::done);
        std::uint64_t signal = 0;
        RingReader reader(q.view);
        std::thread proxy([&] {
            std::this_thread::sleep_for(20ms);
            reader.fail(QueueError::peer_failed);
        });
        const auto start = std::chrono::steady_clock::now();
        CHECK(push(q.view, request_of(0, 16), in_ns(30s), position) == WaitResult::peer_failed);
        CHECK(std::chrono::steady_clock::now() - start < 10s);
        proxy.join();
        CHECK(quiet(q.view, in_ns(30s)) == WaitResult::peer_failed);
        CHECK(wait_signal(q.view, &signal, 1, in_ns(30s)) == WaitResult::peer_failed);
        reader.fail(QueueError::closed);
        CHECK(quiet(q.view, in_ns(30s)) == WaitResult::queue_closed);
        CHECK(wait_signal(q.view, &signal, 1, in_ns(30s)) == WaitResult::queue_closed);
    }

    TEST_CASE("wait_signal ends done once the word reaches the value, timed out while it does not") {
        HostQueue q(4);
        std::uint64_t signal = 0;
        CHECK(wait_signal(q.view, &signal, 1, in_ns(10ms)) == WaitResult::timed_out);
        std::thread peer([&] {
            std::this_thread::sleep_for(10ms);
            std::atomic_ref<std::uint64_t>(signal).store(3, std::memory_order_release);
        });
        CHECK(wait_signal(q.view, &signal, 3, in_ns(30s)) == WaitResult::done);
        peer.join();
        CHECK(wait_signal(q.view, &signal, 2, in_ns(0ms)) == WaitResult::done);
    }

    TEST_CASE("a warp-sized reservation waits whole for its slots; given up, all of it is skipped") {
        HostQueue q(5); // 32 slots
        std::uint64_t first = 0;
        REQUIRE(reserve(q.view, 20, in_ns(1s), first) == WaitResult::done);
        CHECK(first == 0);
        CHECK(reserve(q.view, 13, in_ns(10ms), first) == WaitResult::timed_out); // 20 + 13 > 32
        CHECK(first == 20);
        CHECK(q.producer->reserved == 33);
        for (std::uint64_t p = 20; p < 33; ++p) CHECK(*q.view.cancel_of(p) == 1);
        REQUIRE(reserve(q.view, 12, in_ns(10ms), first) == WaitResult::timed_out); // 33 + 12 > 32 too
        for (std::uint64_t p = 0; p < 20; ++p) write(q.view, p, request_of(0, p));
        RingReader reader(q.view);
        Request r;
        for (int i = 0; i < 20; ++i) REQUIRE(reader.try_take(r) == Decoded::complete);
        for (int i = 20; i < 32; ++i) CHECK(reader.try_take(r) == Decoded::skipped);
        CHECK(reader.try_take(r) == Decoded::incomplete); // 32's slot is 0's, not completed yet
        reader.complete(20);
        for (int i = 32; i < 45; ++i) CHECK(reader.try_take(r) == Decoded::skipped);
        reader.complete(reader.taken());
        REQUIRE(reserve(q.view, 32, in_ns(1s), first) == WaitResult::done); // the whole ring again
        CHECK(first == 45);
    }
}

} // namespace gpuverbs::device_queue
