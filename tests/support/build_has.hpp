// What this build has, for the tests: the library's optional dependencies
// (<gpuverbs/config.hpp>) and the programs the tests start (tests/CMakeLists.txt).
// A case that needs something the build lacks is skipped, never failed or
// passed: its suite carries `* doctest::skip(!test::build_has::...)` and the
// test mains print what is missing before the run (missing_in_build()).
#pragma once

#include "gpuverbs/config.hpp"

#include <string>

#ifndef GPUVERBS_TEST_HAVE_EXAMPLES
#define GPUVERBS_TEST_HAVE_EXAMPLES 0
#endif
#ifndef GPUVERBS_TEST_HAVE_DOCTOR
#define GPUVERBS_TEST_HAVE_DOCTOR 0
#endif

namespace gpuverbs::test::build_has {

inline constexpr bool rdmacm = GPUVERBS_HAVE_RDMACM != 0;
inline constexpr bool cuda = GPUVERBS_HAVE_CUDA != 0;
inline constexpr bool pmix = GPUVERBS_HAVE_PMIX != 0;
inline constexpr bool mpi = GPUVERBS_HAVE_MPI != 0;
inline constexpr bool hiredis = GPUVERBS_HAVE_HIREDIS != 0;
/// The example programs (they need CLI11): the two-process tests start them.
inline constexpr bool examples = GPUVERBS_TEST_HAVE_EXAMPLES != 0;
/// gpuverbs-doctor (needs CLI11).
inline constexpr bool doctor = GPUVERBS_TEST_HAVE_DOCTOR != 0;

} // namespace gpuverbs::test::build_has

namespace gpuverbs::test {

/// "" when the build has everything; else one line naming what it lacks and
/// which tests are skipped for it.
inline std::string missing_in_build() {
    std::string out;
    auto lacks = [&](bool have, const char* what) {
        if (have) return;
        out += out.empty() ? "this build lacks " : "; ";
        out += what;
    };
    lacks(build_has::rdmacm, "librdmacm (GPUVERBS_WITH_RDMACM): the rdma_cm cases are skipped");
    lacks(build_has::cuda, "the CUDA toolkit (GPUVERBS_WITH_CUDA): GPU cases see built_without_cuda");
    lacks(build_has::pmix, "PMIx (GPUVERBS_WITH_PMIX): the PMIx job cases are skipped");
    lacks(build_has::mpi, "MPI (GPUVERBS_WITH_MPI): the MPI job case is skipped");
    lacks(build_has::hiredis, "hiredis (GPUVERBS_WITH_HIREDIS): the Redis service cases are skipped");
    lacks(build_has::examples, "the examples (CLI11, GPUVERBS_WITH_CLI11): the cases that start them are skipped");
    lacks(build_has::doctor, "gpuverbs-doctor (CLI11, GPUVERBS_WITH_CLI11): the command's case is skipped");
    return out;
}

} // namespace gpuverbs::test
