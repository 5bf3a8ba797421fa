// What the staged path refuses before it touches a device, in its three
// forms: options StagingBuffers cannot hold, a GPU the copy pipeline cannot
// use, a protection domain the writer cannot register its buffers in. A
// writer that is made (it needs a real domain) is checked in the rig
// (integration/staged_test.cpp).
#include "gpuverbs/transfers/staging.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace gpuverbs;

namespace {

StagingOptions options_of(std::size_t chunk, std::uint32_t depth, int gpu = 0) {
    StagingOptions o;
    o.chunk = chunk;
    o.depth = depth;
    o.gpu = gpu;
    return o;
}

struct BadOptions {
    const char* name;
    StagingOptions options;
    std::string what;
};

const std::vector<BadOptions>& bad_options() {
    static const std::vector<BadOptions> cases{
        {"chunk 0", options_of(0, 4), "StagingOptions: chunk and depth must be > 0 (chunk 0, depth 4)"},
        {"depth 0", options_of(4096, 0), "StagingOptions: chunk and depth must be > 0 (chunk 4096, depth 0)"},
        {"chunk times depth past the address space", options_of(SIZE_MAX / 2 + 1, 2),
         "StagingOptions: chunk times depth is more bytes than the address space holds (chunk " +
             std::to_string(SIZE_MAX / 2 + 1) + ", depth 2): make them smaller"},
    };
    return cases;
}

} // namespace

TEST_SUITE("the staged path's set-up") {
    TEST_CASE("staging buffers refuse bad options alike in the three forms, and come back empty") {
        for (const BadOptions& c : bad_options()) {
            CAPTURE(c.name);
            const std::string what = test::check_fails_alike(
                errc::invalid_argument, [&] { return StagingBuffers(c.options); },
                [&](std::error_code& ec) {
                    const StagingBuffers b = StagingBuffers::create(c.options, ec);
                    CHECK_FALSE(b);
                    CHECK(b.count() == 0);
                    CHECK(b.all().empty());
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) { return StagingBuffers::create(c.options, ec, d); });
            CHECK(what == c.what);
        }
    }

    TEST_CASE("staging buffers that are made clear the error_code and the Diagnostics") {
        test::check_succeeds_clean(
            [](std::error_code& ec) {
                const StagingBuffers b = StagingBuffers::create(options_of(4096, 3), ec);
                CHECK(b.count() == 3);
                CHECK(b.all().size() == 3 * 4096);
            },
            [](std::error_code& ec, Diagnostics& d) {
                CHECK(StagingBuffers::create(options_of(8192, 1), ec, d).chunk() == 8192);
            });
    }

    TEST_CASE("a copy pipeline refuses bad options, and a GPU it cannot use, alike in the three forms") {
        for (const BadOptions& c : bad_options()) {
            CAPTURE(c.name);
            CHECK(test::check_fails_alike(
                      errc::invalid_argument, [&] { return CopyPipeline(c.options); },
                      [&](std::error_code& ec) { return CopyPipeline::create(c.options, ec); },
                      [&](std::error_code& ec, Diagnostics& d) { return CopyPipeline::create(c.options, ec, d); }) ==
                  c.what);
        }
        // No GPU 9999 anywhere: without CUDA, its driver or a GPU, that is
        // the reason; with them, CUDA's invalid device.
        const StagingOptions no_such_gpu = options_of(4096, 2, 9999);
        (void)test::check_forms_agree(
            [&] { return CopyPipeline(no_such_gpu); },
            [&](std::error_code& ec) {
                CopyPipeline p = CopyPipeline::create(no_such_gpu, ec);
                CHECK_FALSE(p);
                CHECK_THROWS_WITH_AS(p.from_gpu(GpuMemory{}, [](std::span<const std::byte>, std::size_t) {}),
                                     "CopyPipeline::from_gpu: the CopyPipeline is empty", Error);
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) { return CopyPipeline::create(no_such_gpu, ec, d); });
    }

    TEST_CASE("a staged writer refuses bad options, and a domain it cannot register in, alike in the three forms") {
        const ProtectionDomain no_pd; // empty: its buffers cannot be registered
        std::vector<BadOptions> cases = bad_options();
        cases.push_back({"an empty protection domain", options_of(4096, 2),
                         "StagedWriter: the ProtectionDomain is empty: the staging buffers cannot be registered"});
        for (const BadOptions& c : cases) {
            CAPTURE(c.name);
            const std::string what = test::check_fails_alike(
                errc::invalid_argument, [&] { return StagedWriter(no_pd, c.options, "asked"); },
                [&](std::error_code& ec) {
                    StagedWriter w = StagedWriter::create(no_pd, c.options, "asked", ec);
                    CHECK_FALSE(w);
                    QueuePair qp;
                    CompletionQueue cq;
                    CHECK_THROWS_WITH_AS((void)w.write(qp, cq, std::span<const std::byte>(), RemoteMemory{}),
                                         "StagedWriter::write: the StagedWriter is empty", Error);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    return StagedWriter::create(no_pd, c.options, "asked", ec, d);
                });
            CHECK(what == c.what);
        }
    }
}
