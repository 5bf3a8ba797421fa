// The shared doctest main of the unit tests: says what the build lacks (and
// so which cases are skipped), then runs doctest. Run by ctest one case at a
// time, a case that was skipped exits 77 (ctest's "skipped"), never 0.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "build_has.hpp"
#include "ctest_case.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    if (!gpuverbs::test::listing_only(argc, argv)) {
        if (std::string missing = gpuverbs::test::missing_in_build(); !missing.empty())
            std::printf("%s\n", missing.c_str());
    }
    return gpuverbs::test::run_doctest(argc, argv);
}
