// What the test mains need to know about how they were started: listing cases
// (doctest_discover_tests registers each case with ctest by listing them at
// build time), or one case run by ctest, where a case that cannot run here must
// be reported as skipped (exit status 77), never as passed.
#pragma once

#include <cstdlib>
#include <string_view>

namespace gpuverbs::test {

/// The exit status ctest counts as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
inline constexpr int ctest_skip_status = 77;

/// doctest was asked to list cases or suites, not run them: print nothing else.
inline bool listing_only(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a.starts_with("--list") || a.starts_with("-ltc") || a.starts_with("-lts") || a.starts_with("-lr"))
            return true;
    }
    return false;
}

/// ctest runs this case on its own (GPUVERBS_CTEST_CASE is set in its environment).
inline bool run_by_ctest() {
    return std::getenv("GPUVERBS_CTEST_CASE") != nullptr; // NOLINT(concurrency-mt-unsafe): main, before any thread
}

} // namespace gpuverbs::test
