// GPU tests run on a machine with an NVIDIA GPU and driver. Without one every
// test is skipped, and this says why (the driver's or loader's own reason).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "ctest_case.hpp"
#include "gpu_available.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    if (gpuverbs::test::listing_only(argc, argv)) {
        // Only the names (doctest_discover_tests reads them).
    } else if (gpuverbs::test::gpu_skip_reason().empty()) {
        std::printf("GPU tests on %s\n", gpuverbs::test::first_gpu_name().c_str());
    } else {
        std::printf("GPU tests SKIPPED: %s\n", gpuverbs::test::gpu_skip_reason().c_str());
        if (gpuverbs::test::run_by_ctest()) return gpuverbs::test::ctest_skip_status;
    }
    return gpuverbs::test::run_doctest(argc, argv);
}
