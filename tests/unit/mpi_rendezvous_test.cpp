// MpiRendezvous's construction in its three forms, over a pretend MPI
// (tests/fuzz/fake_mpi/mpi.h: the names the header-only MpiRendezvous uses,
// defined below), so that a program that forgot MPI_Init and a communicator
// that refuses are seen without an MPI library.
#include "gpuverbs/many_peers/rendezvous/mpi.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>

using namespace gpuverbs;

namespace {
/// What the pretend MPI answers.
struct PretendMpi {
    int initialized = 1;
    int size_error = MPI_SUCCESS; // MPI_Comm_size's answer when not MPI_SUCCESS
} mpi;
} // namespace

int MPI_Initialized(int* flag) {
    *flag = mpi.initialized;
    return MPI_SUCCESS;
}
int MPI_Comm_rank(MPI_Comm, int* rank) {
    *rank = 1;
    return MPI_SUCCESS;
}
int MPI_Comm_size(MPI_Comm, int* size) {
    *size = 4;
    return mpi.size_error;
}
int MPI_Allgather(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm) {
    return 1;
}
int MPI_Allgatherv(const void*, int, MPI_Datatype, void*, const int*, const int*, MPI_Datatype, MPI_Comm) {
    return 1;
}
int MPI_Error_string(int, char* text, int* length) {
    const char* words = "MPI_ERR_COMM: invalid communicator";
    std::strcpy(text, words);
    *length = static_cast<int>(std::strlen(words));
    return MPI_SUCCESS;
}

TEST_SUITE("MPI rendezvous construction") {
    TEST_CASE("a program without MPI_Init, or a communicator that refuses, fails alike in the three forms") {
        struct Case {
            const char* name;
            PretendMpi answers;
            std::string what;
        };
        const Case cases[] = {
            {"MPI not initialised", {0, MPI_SUCCESS}, "MpiRendezvous: MPI is not initialised: call MPI_Init first"},
            {"MPI_Comm_size refuses", {1, 5}, "MPI_Comm_size: MPI_ERR_COMM: invalid communicator"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            mpi = c.answers;
            const std::string what = test::check_fails_alike(
                errc::rendezvous_unavailable, [] { return MpiRendezvous(MPI_COMM_WORLD); },
                [](std::error_code& ec) {
                    MpiRendezvous r = MpiRendezvous::create(MPI_COMM_WORLD, ec);
                    CHECK(r.world_size() == 0);
                    CHECK_THROWS_WITH_AS(r.fence({}), doctest::Contains("no world (create() failed)"), Error);
                    return 0;
                },
                [](std::error_code& ec, Diagnostics& d) { return MpiRendezvous::create(MPI_COMM_WORLD, ec, d); });
            CHECK(what == c.what);
        }
        mpi = {};
    }

    TEST_CASE("a member of an initialised world clears the error_code and the Diagnostics") {
        mpi = {};
        test::check_succeeds_clean(
            [](std::error_code& ec) {
                const MpiRendezvous r = MpiRendezvous::create(MPI_COMM_WORLD, ec);
                CHECK(r.rank() == 1);
                CHECK(r.world_size() == 4);
            },
            [](std::error_code& ec, Diagnostics& d) { return MpiRendezvous::create(MPI_COMM_WORLD, ec, d); });
    }
}
