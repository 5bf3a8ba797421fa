// GPU tests run on a machine with an NVIDIA GPU and driver. Without one every
// test is skipped, and this says why (the driver's or loader's own reason).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "gpu_available.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    if (gpuverbs::test::gpu_skip_reason().empty()) {
        std::printf("GPU tests on %s\n", gpuverbs::test::first_gpu_name().c_str());
    } else {
        std::printf("GPU tests SKIPPED: %s\n", gpuverbs::test::gpu_skip_reason().c_str());
    }
    doctest::Context context(argc, argv);
    return context.run();
}
