// The device queue's GPU half on a real GPU (issue 37): kernels of 1, 32 and
// 132 blocks push 10^8 descriptors each through the real ring in mapped
// pinned host memory to a real host reader, which checks every descriptor
// (position, contents, each thread's order) and returns credits; the waits end
// with their codes when the reader stops or closes the queue; and the GPU
// writes the same bytes as the host compiler. Built where nvcc is (CMake's
// CUDA language), else the suite is skipped saying so.
#include <doctest/doctest.h>

#include "gpu_available.hpp"

#if GPUVERBS_TEST_HAVE_RING_KERNELS
#include "device_queue/ring_kernels.hpp"
#include "gpuverbs/device_queue/queue.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

// Inside a namespace, not with file-wide using-directives: the GPU tests
// compile in batches, where these names must not reach the other files'.
namespace gpuverbs::test::ring {

using namespace gpuverbs::device_queue;
using namespace std::chrono_literals;

namespace {

struct ReadResult {
    std::uint64_t taken = 0, corrupt = 0, wrong = 0, out_of_order = 0;
    double seconds = 0;
};

/// A stop of the reader: after taking `at` descriptors, it sleeps `pause`.
struct ReaderPause {
    std::uint64_t at;
    std::chrono::milliseconds pause;
};

/// The host reader: takes `total` descriptors from `threads` producers, checks each, returns credits every 32
/// (and pauses as `pauses` says). A skipped position (a producer gave up) counts as wrong.
ReadResult read_all(const QueueView& host, std::uint32_t threads, std::uint64_t total, std::chrono::seconds limit,
                    const std::vector<ReaderPause>& pauses = {}) {
    RingReader reader(host);
    std::size_t next_pause = 0;
    std::vector<std::uint64_t> next(threads, 0);
    ReadResult r;
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = start + limit;
    std::uint32_t spins = 0;
    while (reader.taken() < total) {
        Request got;
        const Decoded d = reader.try_take(got);
        if (d == Decoded::incomplete) {
            // Nothing to take: what was taken completes (as a proxy's requests do), or a ring smaller
            // than a batch of 32 would wait on its own credits.
            if (reader.taken() != 0) reader.complete(reader.taken());
            if (++spins % 4096 == 0 && std::chrono::steady_clock::now() > give_up) break;
            continue;
        }
        if (d == Decoded::corrupt) {
            ++r.corrupt;
            break;
        }
        if (next_pause < pauses.size() && reader.taken() >= pauses[next_pause].at) {
            reader.complete(reader.taken());
            std::this_thread::sleep_for(pauses[next_pause++].pause);
        }
        if (d == Decoded::skipped || got.peer >= threads) {
            ++r.wrong;
        } else {
            if (got.signal_value != next[got.peer]) ++r.out_of_order;
            if (!same(got, request_of(got.peer, got.signal_value))) ++r.wrong;
            next[got.peer] = got.signal_value + 1;
        }
        if ((reader.taken() & 31) == 0) reader.complete(reader.taken());
    }
    reader.complete(reader.taken());
    r.taken = reader.taken();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
}

} // namespace

TEST_SUITE("device queue ring on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE("the GPU encodes a descriptor into the same 64 bytes as the host compiler") {
        std::string why;
        for (const auto& [thread, n, position, log2] :
             {std::tuple{0U, 0ULL, 0ULL, 10U}, std::tuple{4223U, 123456ULL, 5000ULL, 10U},
              std::tuple{17U, (1ULL << 40) + 3, (1ULL << 50) + 7, 20U}}) {
            std::uint64_t gpu[descriptor_words] = {}, host[descriptor_words] = {};
            REQUIRE_MESSAGE(encode_on_gpu(thread, n, position, log2, gpu, why), why);
            encode(request_of(thread, n), position, log2, host);
            for (std::size_t i = 0; i < descriptor_words; ++i) CHECK(gpu[i] == host[i]);
        }
    }

    TEST_CASE("kernels of 1, 32 and 132 blocks push 10^8 descriptors each through the ring, every one checked") {
        DeviceRing ring;
        std::string why;
        REQUIRE_MESSAGE(ring.create(12, why), why); // 4096 slots: each run wraps it about 24,000 times
        for (const int blocks : {1, 32, 132}) {
            CAPTURE(blocks);
            REQUIRE_MESSAGE(ring.reset(why), why);
            const int threads = 32;
            const std::uint64_t per_thread = (100'000'000ULL + blocks * threads - 1) / (blocks * threads);
            const std::uint64_t total = per_thread * blocks * threads;
            REQUIRE_MESSAGE(start_producers(ring.device, blocks, threads, per_thread, 10'000'000'000ULL, why), why);
            const ReadResult r = read_all(ring.host, blocks * threads, total, 300s);
            std::uint64_t failed = 0;
            REQUIRE_MESSAGE(finish(failed, why), why);
            ProducerWords words;
            REQUIRE_MESSAGE(ring.producer_words(words, why), why);
            std::printf(
                "device queue: %d x %d GPU threads pushed %llu descriptors; one host thread took them in "
                "%.2f s (%.1f M/s), %llu corrupt, %llu wrong, %llu out of order\n",
                blocks, threads, static_cast<unsigned long long>(r.taken), r.seconds, r.taken / r.seconds / 1e6,
                static_cast<unsigned long long>(r.corrupt), static_cast<unsigned long long>(r.wrong),
                static_cast<unsigned long long>(r.out_of_order));
            CHECK(r.taken == total);
            CHECK(r.corrupt == 0);
            CHECK(r.wrong == 0);
            CHECK(r.out_of_order == 0);
            CHECK(failed == 0);
            CHECK(words.reserved == total);
        }
    }

    TEST_CASE(
        "the library's own DeviceQueue on the GPU: 32 x 32 kernel threads push 2 million descriptors through "
        "it, every one checked") {
        gpuverbs::DeviceQueue queue = gpuverbs::DeviceQueue::on_gpu(0, 12);
        REQUIRE(queue);
        CHECK(queue.gpu() == 0);
        CHECK(queue.view().producer != nullptr);
        CHECK(queue.proxy_view().producer == nullptr); // GPU memory: the producers' own
        std::string why;
        const std::uint64_t per_thread = 2048;
        const std::uint64_t total = per_thread * 32 * 32;
        REQUIRE_MESSAGE(start_producers(queue.view(), 32, 32, per_thread, 10'000'000'000ULL, why), why);
        const ReadResult r = read_all(queue.proxy_view(), 32 * 32, total, 120s);
        std::uint64_t failed = 0;
        REQUIRE_MESSAGE(finish(failed, why), why);
        CHECK(r.taken == total);
        CHECK(r.corrupt == 0);
        CHECK(r.wrong == 0);
        CHECK(r.out_of_order == 0);
        CHECK(failed == 0);
        // Closed by its reader, the queue ends the kernels' next pushes at once, free slots and all: fail()
        // copies the error into the producers' words in GPU memory (the queue's own stream, beside the kernels).
        RingReader closer(queue.proxy_view());
        closer.fail(QueueError::closed);
        REQUIRE_MESSAGE(start_producers(queue.view(), 1, 32, 4, 10'000'000'000ULL, why), why);
        std::uint64_t refused = 0;
        REQUIRE_MESSAGE(finish(refused, why), why);
        CHECK(refused == 32 * 4);
        ProducerWords words;
        REQUIRE_MESSAGE(producer_words_of(queue.view(), words, why), why);
        CHECK(words.error == static_cast<std::uint32_t>(QueueError::closed));
        CHECK(words.reserved == total + 32 * 4); // their tickets, taken and cancelled
        // A GPU that does not exist is refused in words.
        std::error_code ec;
        gpuverbs::Diagnostics d;
        CHECK_FALSE(gpuverbs::DeviceQueue::on_gpu(99, 12, ec, d));
        CHECK(ec == gpuverbs::errc::invalid_argument);
        CHECK(d.detail().starts_with("there is no CUDA device 99 ("));
    }

    TEST_CASE("with the reader stopped a full ring, quiet and wait_signal end timed out; once closed, queue closed") {
        DeviceRing ring;
        std::string why;
        REQUIRE_MESSAGE(ring.create(8, why), why);
        WaitProbe probe;
        REQUIRE_MESSAGE(probe_waits(ring.device, 2'000'000, probe, why), why); // 2 ms
        CHECK(probe.push_into_free == static_cast<std::uint32_t>(WaitResult::done));
        CHECK(probe.push_into_full == static_cast<std::uint32_t>(WaitResult::timed_out));
        CHECK(probe.quiet == static_cast<std::uint32_t>(WaitResult::timed_out));
        CHECK(probe.wait_signal == static_cast<std::uint32_t>(WaitResult::timed_out));
        // Each ended at its deadline, not before, and within the documented bound past it (10 ms: a wait
        // looks at the clock between naps of 64 ns; the bound is the promise, not a speed).
        for (std::uint64_t ns : {probe.push_into_full_ns, probe.quiet_ns, probe.wait_signal_ns}) {
            CHECK(ns >= 2'000'000);
            CHECK(ns < 12'000'000);
        }
        ProducerWords words;
        REQUIRE_MESSAGE(ring.producer_words(words, why), why);
        CHECK(words.reserved == 257); // the push that found no slot took a ticket and gave it up:
        RingReader skipper(ring.host);
        Request got;
        for (int i = 0; i < 256; ++i) REQUIRE(skipper.try_take(got) == Decoded::complete);
        CHECK(skipper.try_take(got) == Decoded::incomplete); // its slot is position 0's, not completed
        skipper.complete(1);
        CHECK(skipper.try_take(got) == Decoded::skipped); // then the reader skips it, never waits on it

        RingReader(ring.host).fail(QueueError::closed);
        REQUIRE_MESSAGE(probe_waits(ring.device, 1'000'000'000ULL, probe, why), why); // a second each, unused
        // A push into a closed queue returns its code at once, even where slots are free.
        CHECK(probe.push_into_free == static_cast<std::uint32_t>(WaitResult::queue_closed));
        CHECK(probe.push_into_full == static_cast<std::uint32_t>(WaitResult::queue_closed));
        CHECK(probe.push_into_full_ns < 1'000'000'000ULL);
        CHECK(probe.quiet == static_cast<std::uint32_t>(WaitResult::queue_closed));
        CHECK(probe.wait_signal == static_cast<std::uint32_t>(WaitResult::queue_closed));
        CHECK(probe.quiet_ns < 1'000'000'000ULL);
    }

    TEST_CASE("more GPU threads than slots, with reader pauses: every push ends done, none starves") {
        // Issue 50's cases: 132 x 32 threads into 4,096 slots and 32 x 32 into 64, the reader stopping
        // three times for 30 ms, every push with no timeout (device::no_timeout: UINT64_MAX, which
        // saturates instead of wrapping). Tickets are served in order: the longest push is reported
        // against the reader's pauses.
        struct Case {
            std::uint32_t log2;
            int blocks, threads;
            std::uint64_t per_thread;
        };
        for (const Case c :
             {Case{12, 132, 32, 2000}, Case{6, 32, 32, 2000}, Case{4, 1, 32, 20000}, Case{0, 1, 32, 2000}}) {
            CAPTURE(c.log2);
            CAPTURE(c.blocks);
            DeviceRing ring;
            std::string why;
            REQUIRE_MESSAGE(ring.create(c.log2, why), why);
            const std::uint64_t total = c.per_thread * c.blocks * c.threads;
            REQUIRE_MESSAGE(start_producers(ring.device, c.blocks, c.threads, c.per_thread, ~std::uint64_t{0}, why),
                            why);
            const std::vector<ReaderPause> pauses{{total / 4, 30ms}, {total / 2, 30ms}, {3 * total / 4, 30ms}};
            const ReadResult r = read_all(ring.host, c.blocks * c.threads, total, 300s, pauses);
            std::uint64_t failed = 0, longest = 0;
            REQUIRE_MESSAGE(finish(failed, longest, why), why);
            std::printf(
                "device queue: %d x %d GPU threads into %llu slots, %llu descriptors in %.2f s (%.1f M/s), "
                "reader paused 3 x 30 ms; longest push %.2f ms; %llu not done, %llu wrong, %llu out of order\n",
                c.blocks, c.threads, 1ULL << c.log2, static_cast<unsigned long long>(r.taken), r.seconds,
                r.taken / r.seconds / 1e6, longest / 1e6, static_cast<unsigned long long>(failed),
                static_cast<unsigned long long>(r.wrong), static_cast<unsigned long long>(r.out_of_order));
            CHECK(r.taken == total);
            CHECK(r.corrupt == 0);
            CHECK(r.wrong == 0);
            CHECK(r.out_of_order == 0);
            CHECK(failed == 0);
        }
    }
}

} // namespace gpuverbs::test::ring

#else

TEST_SUITE("device queue ring on a real GPU" * doctest::skip(true) *
           doctest::description("built without nvcc (CMake found no CUDA compiler)")) {
    TEST_CASE("the device queue's kernels need nvcc") {}
}

#endif
