// What the test mains need to know about how they were started: listing cases
// (doctest_discover_tests registers each case with ctest by listing them at
// build time), or one case run by ctest, where a case that cannot run here must
// be reported as skipped (exit status 77), never as passed.
#pragma once

#include <doctest/doctest.h>

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

/// Counts the cases that really ran (a skipped case never starts).
struct RanCounter : doctest::IReporter {
    static inline int started = 0;
    explicit RanCounter(const doctest::ContextOptions& /*unused*/) {}
    void report_query(const doctest::QueryData& /*unused*/) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats& /*unused*/) override {}
    void test_case_start(const doctest::TestCaseData& /*unused*/) override { ++started; }
    void test_case_reenter(const doctest::TestCaseData& /*unused*/) override {}
    void test_case_end(const doctest::CurrentTestCaseStats& /*unused*/) override {}
    void test_case_exception(const doctest::TestCaseException& /*unused*/) override {}
    void subcase_start(const doctest::SubcaseSignature& /*unused*/) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData& /*unused*/) override {}
    void log_message(const doctest::MessageData& /*unused*/) override {}
    void test_case_skipped(const doctest::TestCaseData& /*unused*/) override {}
};

} // namespace gpuverbs::test

// Included by the test mains only (one per binary).
REGISTER_LISTENER("gpuverbs-ran-counter", 1, gpuverbs::test::RanCounter);

namespace gpuverbs::test {

/// Runs doctest as every test main does: listing names every case, also those
/// skipped here (ctest registers them); a ctest run of one case that did not
/// run (skipped: the build or the machine lacks what it needs) exits 77.
inline int run_doctest(int argc, char** argv) {
    doctest::Context context(argc, argv);
    if (listing_only(argc, argv)) context.setOption("no-skip", true);
    const int status = context.run();
    if (status == 0 && run_by_ctest() && !listing_only(argc, argv) && RanCounter::started == 0)
        return ctest_skip_status;
    return status;
}

} // namespace gpuverbs::test
