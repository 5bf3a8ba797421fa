// The staged path on rxe0 -> rxe1: host memory through staging buffers to a
// peer, every byte checked; the words it gives for the path, bad options, a
// foreign completion and a wrong key.
#include "rig.hpp"
#include "three_forms.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <span>
#include <string>
#include <vector>

using namespace gpuverbs;

TEST_SUITE("the staged path" * doctest::skip(!test::rig_present())) {
    TEST_CASE("host memory through staging buffers to a peer: every byte, any length; it says which path and why") {
        Device d0 = Device::open(test::rig_devices()->dev0), d1 = Device::open(test::rig_devices()->dev1);
        ProtectionDomain pd0(d0), pd1(d1);
        CompletionQueue cq0(d0, 64), cq1(d1, 64);
        const std::size_t size = (10 << 20) + 12345;
        std::vector<std::byte> source(size), target(size + 4096);
        for (std::size_t i = 0; i < size; ++i) source[i] = test::pattern(i, 41);
        MemoryRegion landing(pd1, target, Access::local_write | Access::remote_write);
        PreparedQueuePair a(pd0, cq0, cq0), b(pd1, cq1, cq1);
        (void)b.advertise(landing);
        Endpoint ea = a.endpoint(), eb = b.endpoint();
        QueuePair qa = std::move(a).connect(eb), qb = std::move(b).connect(ea);
        StagingOptions o;
        o.chunk = 1 << 20;
        o.depth = 3;
        StagedWriter writer(pd0, o, "the test asked for it");
        MESSAGE(writer.path());
        CHECK(writer.path().find("staged: ") == 0);
        CHECK(writer.path().find("3 ") != std::string::npos);
        CHECK(writer.path().find("host buffers of 1 MiB -> RDMA write (GPUDirect RDMA is not used: the test asked "
                                 "for it)") != std::string::npos);
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(writer.write(qa, cq0, source, landing.remote(), 4096) == size);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) bad += target[4096 + i] != source[i] ? 1 : 0;
        CHECK(bad == 0);
        MESSAGE("staged " << size << " bytes in 11 chunks: " << seconds << " s");
        // A range that does not fit the peer's region is refused before anything is posted.
        try {
            (void)writer.write(qa, cq0, source, landing.remote(), 8192);
            FAIL("an oversized write was accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::remote_range_outside_region);
            CHECK(std::string(e.what()).find("do not fit the remote region") != std::string::npos);
        }
        // Bad options are named.
        StagingOptions none;
        none.depth = 0;
        try {
            StagedWriter bad_writer(pd0, none, "x");
            FAIL("depth 0 accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(std::string(e.what()).find("chunk and depth must be > 0") != std::string::npos);
        }
        // A completion that is not the writer's (the CQ is shared) is an error, never taken for a chunk's.
        SendOptions mine;
        mine.context = 7;
        std::vector<std::byte> small(64);
        MemoryRegion small_mr(pd0, small, Access::local_write);
        REQUIRE_FALSE(qa.post_write(small_mr.slice(0, 64), landing.remote(), 0, mine));
        try {
            (void)writer.write(qa, cq0, std::span(source).first(1000), landing.remote(), 0);
            FAIL("a foreign completion was taken for the chunk's");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("a completion of another request came on the CQ") != std::string::npos);
        }
        // A wrong remote key fails the write naming the chunk.
        RemoteMemory wrong = landing.remote();
        wrong.rkey ^= 0x5a5a00;
        try {
            (void)writer.write(qa, cq0, std::span(source).first(3 << 20), wrong, 0);
            FAIL("a wrong key was not reported");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("chunk 0 (1048576 bytes at offset 0)") != std::string::npos);
        }
    }

    TEST_CASE("a staged writer made in a real domain clears the error_code and the Diagnostics, and says its path") {
        Device d0 = Device::open(test::rig_devices()->dev0);
        ProtectionDomain pd0(d0);
        StagingOptions o;
        o.chunk = 1 << 16;
        o.depth = 2;
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                const StagedWriter w = StagedWriter::create(pd0, o, "asked", ec);
                CHECK(w);
                CHECK(w.path().find("(GPUDirect RDMA is not used: asked)") != std::string::npos);
            },
            [&](std::error_code& ec, Diagnostics& d) { CHECK(StagedWriter::create(pd0, o, "asked", ec, d)); });
    }
}
