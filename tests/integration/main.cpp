// Integration tests run against real RDMA devices named by the Soft-RoCE rig.
// Run outside the rig, every test is skipped and this says why; the test
// command counts skips and fails when integration tests did not really run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "ctest_case.hpp"
#include "rig.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    if (gpuverbs::test::listing_only(argc, argv)) {
        // Only the names (doctest_discover_tests reads them).
    } else if (auto rig = gpuverbs::test::rig_devices()) {
        std::printf("integration tests on %s and %s (port %u, %s rig)\n", rig->dev0.c_str(), rig->dev1.c_str(),
                    unsigned(rig->port), rig->rig.c_str());
    } else {
        std::printf(
            "integration tests SKIPPED: GPUVERBS_TEST_DEV0 is not set; run them through "
            "tests/softroce/run, which provides two RDMA devices\n");
        if (gpuverbs::test::run_by_ctest()) return gpuverbs::test::ctest_skip_status;
    }
    doctest::Context context(argc, argv);
    // Listing names every case, also those skipped here (for ctest's registration).
    if (gpuverbs::test::listing_only(argc, argv)) context.setOption("no-skip", true);
    return context.run();
}
