// Integration tests run against real RDMA devices named by the Soft-RoCE rig.
// Run outside the rig, every test is skipped and this says why; the test
// command counts skips and fails when integration tests did not really run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "rig.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    if (auto rig = gpuverbs::test::rig_devices()) {
        std::printf("integration tests on %s and %s (port %u, %s rig)\n", rig->dev0.c_str(), rig->dev1.c_str(),
                    unsigned(rig->port), rig->rig.c_str());
    } else {
        std::printf(
            "integration tests SKIPPED: GPUVERBS_TEST_DEV0 is not set; run them through "
            "tests/softroce/run, which provides two RDMA devices\n");
    }
    doctest::Context context(argc, argv);
    return context.run();
}
