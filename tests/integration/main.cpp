// Integration tests run against real RDMA devices named by the Soft-RoCE rig.
// Run outside the rig, every test is skipped and this says why; the test
// command counts skips and fails when integration tests did not really run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "build_has.hpp"
#include "ctest_case.hpp"
#include "rig.hpp"

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
    if (!gpuverbs::test::listing_only(argc,
                                      argv)) { // listing prints only the names (doctest_discover_tests reads them)
        if (std::string missing = gpuverbs::test::missing_in_build(); !missing.empty())
            std::printf("%s\n", missing.c_str());
        if (auto rig = gpuverbs::test::rig_devices()) {
            std::printf("integration tests on %s and %s (port %u, %s rig)\n", rig->dev0.c_str(), rig->dev1.c_str(),
                        unsigned(rig->port), rig->rig.c_str());
        } else {
            std::printf(
                "integration tests SKIPPED: GPUVERBS_TEST_DEV0 is not set; run them through "
                "tests/softroce/run, which provides two RDMA devices\n");
            if (gpuverbs::test::run_by_ctest()) return gpuverbs::test::ctest_skip_status;
        }
    }
    return gpuverbs::test::run_doctest(argc, argv);
}
