// The "why no RDMA device" sentence, on fixture sysfs trees.
#include "gpuverbs/detail/verbs/rdma_presence.hpp"

#include "scratch_dir.hpp"
#include "text_checks.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using gpuverbs::test::ScratchDir;

namespace {

using gpuverbs::test::contains;

} // namespace

TEST_SUITE("rdma presence") {
    TEST_CASE("a kernel without RDMA support is named as such, with the fixes") {
        ScratchDir dir;
        std::string why = gpuverbs::detail::explain_no_rdma_devices((dir.path / "class/infiniband").string());
        CHECK(contains(why, "the kernel has no RDMA support loaded"));
        CHECK(contains(why, "does not exist"));
        CHECK(contains(why, "mlx5_ib"));
        CHECK(contains(why, "rdma link add rxe0 type rxe netdev"));
    }

    TEST_CASE("a kernel with RDMA support but no device says the device is missing") {
        ScratchDir dir;
        fs::create_directories(dir.path / "class/infiniband");
        std::string why = gpuverbs::detail::explain_no_rdma_devices((dir.path / "class/infiniband").string());
        CHECK(contains(why, "supports RDMA but has no RDMA device"));
        CHECK(contains(why, "is empty"));
        CHECK_FALSE(contains(why, "provider"));
    }

    TEST_CASE("devices no provider claimed are listed with the packages to install") {
        ScratchDir dir;
        fs::create_directories(dir.path / "class/infiniband/mlx5_0");
        std::string why = gpuverbs::detail::explain_no_rdma_devices((dir.path / "class/infiniband").string());
        CHECK(contains(why, "the kernel has mlx5_0 in"));
        CHECK(contains(why, "no libibverbs provider claimed them"));
        CHECK(contains(why, "ibverbs-providers"));
    }
}
