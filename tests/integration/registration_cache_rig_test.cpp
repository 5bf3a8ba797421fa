// The registration cache on a real device (rxe0 <-> rxe1): a registration
// the device refuses, a read-only key a peer cannot write through, hits that
// move data, and 10,000 mixed requests within the cache's bounds.
#include "process_resources.hpp"
#include "rig.hpp"
#include "rig_pair.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <system_error>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

TEST_SUITE("registration cache on a real device" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "a registration the device refuses: the error_code forms return no region and the words, the throwing "
        "form throws them, the cache stays as it was") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 1 << 20);
        RegistrationCache cache(p.a.pd);
        // An address range nothing is mapped at: ibv_reg_mr fails with EFAULT.
        std::span<std::byte> unmapped(reinterpret_cast<std::byte*>(std::uintptr_t{0x10000}), 4096); // NOLINT
        std::error_code ec;
        CHECK(cache.get(unmapped, Access::local_write, ec) == nullptr);
        CHECK(ec == std::errc::bad_address);
        Diagnostics words;
        CHECK(cache.get(unmapped, Access::local_write, ec, words) == nullptr);
        CHECK(words.verb() == "ibv_reg_mr");
        try {
            (void)cache.get(unmapped, Access::local_write);
            FAIL("registered unmapped memory");
        } catch (const Error& e) {
            CHECK(e.code() == ec);
            CHECK(std::string(e.what()) == words.message());
        }
        CHECK(cache.statistics().regions == 0);
        // and it still works.
        CHECK(cache.get(std::span(p.a.memory).first(4096), Access::local_write) != nullptr);
        CHECK(cache.statistics().regions == 1);
    }

    TEST_CASE("attack: a peer given the key of a read-only request from the cache cannot write through it") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 1 << 20);
        RegistrationCache cache(p.a.pd);
        std::span<std::byte> memory(p.a.memory);
        // The owner's own use registered everything a peer could do...
        auto everything = cache.get(memory, access_all);
        // ...then it advertises a part for reading only.
        auto readable = cache.get(memory.subspan(4096, 4096), Access::remote_read);
        REQUIRE(readable != nullptr);
        CHECK(readable != everything);
        CHECK(readable->access() == Access::remote_read);
        // The peer tries to write with the key it was given.
        std::fill(p.a.memory.begin() + 4096, p.a.memory.begin() + 8192, std::byte{0x11});
        RemoteMemory advertised = readable->remote();
        const std::error_code posted = p.b.qp.post_write(p.b.mr.slice(0, 4096), advertised, 0);
        REQUIRE_MESSAGE(!posted, posted.message());
        Completion c;
        for (auto until = std::chrono::steady_clock::now() + 10s; p.b.cq.poll({&c, 1}) == 0;) {
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "the write did not complete");
        }
        MESSAGE("the peer's write: " << c.status.message());
        CHECK(c.status.raw() == IBV_WC_REM_ACCESS_ERR);
        CHECK(std::all_of(p.a.memory.begin() + 4096, p.a.memory.begin() + 8192,
                          [](std::byte b) { return b == std::byte{0x11}; }));
    }

    TEST_CASE("hits hand back the same region; data moves through it; 10,000 mixed requests stay within the bounds") {
        asio::io_context io;
        test::Pair p = test::transfer_pair(io.get_executor(), 32 << 20);
        const int baseline = test::registered_regions();
        REQUIRE_MESSAGE(baseline >= 0, "rdma (iproute2) is needed to count registrations");
        RegistrationCache cache(p.a.pd, {.max_regions = 16, .max_bytes = 8 << 20});
        std::span<std::byte> memory(p.a.memory);
        const Access rw = Access::local_write | Access::remote_read;

        auto first = cache.get(memory.subspan(4096, 65536), rw);
        auto again = cache.get(memory.subspan(8192, 4096), rw);
        CHECK(first == again); // covered, with the same access: the same registration
        CHECK(cache.statistics().hits == 1);
        CHECK(cache.statistics().misses == 1);

        // A write from memory registered through the cache.
        for (std::size_t i = 0; i < 4096; ++i) p.a.memory[8192 + i] = std::byte(i % 253);
        REQUIRE_FALSE(p.a.qp.post_write(again->slice(8192 - 4096, 4096), p.b.mr.remote(), 0));
        Completion c;
        for (auto until = std::chrono::steady_clock::now() + 10s; p.a.cq.poll({&c, 1}) == 0;) {
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "the write did not complete");
        }
        CHECK(c.ok());
        CHECK(std::equal(p.b.memory.begin(), p.b.memory.begin() + 4096, p.a.memory.begin() + 8192));

        // invalidate before the memory goes away: the next request registers again.
        cache.invalidate(memory.data() + 4096, 65536);
        CHECK(cache.statistics().invalidations == 1);
        auto fresh = cache.get(memory.subspan(8192, 4096), Access::local_write);
        CHECK(fresh != again);
        first.reset();
        again.reset();
        fresh.reset();

        std::mt19937 random(11);
        int most = 0;
        for (int i = 0; i < 10000; ++i) {
            std::size_t begin = (random() % 8192) * 4096;
            std::size_t length = 1 + random() % (256 << 10);
            if (begin + length > memory.size()) length = memory.size() - begin;
            Access access = random() % 3 == 0 ? rw : Access::local_write;
            auto mr = cache.get(memory.subspan(begin, length), access);
            std::size_t offset = reinterpret_cast<std::uintptr_t>(memory.data() + begin) -
                                 reinterpret_cast<std::uintptr_t>(mr->address());
            auto covers = mr->slice(offset, length);
            REQUIRE(covers.in_region());
            REQUIRE(cache.statistics().regions <= 16);
            if (i % 50 == 49) most = std::max(most, test::registered_regions() - baseline);
        }
        auto s = cache.statistics();
        MESSAGE("10,000 requests: " << s.hits << " hits, " << s.misses << " misses, " << s.evictions << " evictions, "
                                    << s.merges << " merges; at most " << most << " regions registered at once; "
                                    << s.bytes_pinned << " bytes pinned at the end");
        CHECK(most <= 16);
        CHECK((s.bytes_pinned <= (8u << 20) || s.regions == 1)); // a single region may exceed the bound alone
        CHECK(s.hits + s.misses == 10000 + 3);
    }
}
