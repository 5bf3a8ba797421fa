// GPU discovery on whatever this machine has: with no driver (CI) it must fail
// with a reason naming libcuda; with a GPU it must list it.
#include "gpuverbs/gpu/gpu.hpp"

#include <doctest/doctest.h>

#include <string>

TEST_SUITE("gpu discovery") {
    TEST_CASE("listing GPUs either finds them or says exactly why not") {
        std::error_code ec;
        auto gpus = gpuverbs::list_gpus(ec);
        if (!ec) {
            REQUIRE_FALSE(gpus.empty());
            CHECK_FALSE(gpus[0].name.empty());
            CHECK(gpus[0].pci_bus_id.size() == 12); // "0000:00:06.0"
            return;
        }
        CHECK(gpus.empty());
        try {
            (void)gpuverbs::list_gpus();
            FAIL("list_gpus did not throw after list_gpus(ec) failed");
        } catch (const gpuverbs::Error& e) {
            CHECK(e.code() == ec);
            std::string what = e.what();
            if (!gpuverbs::built_with_cuda()) {
                CHECK(ec == gpuverbs::errc::built_without_cuda);
                CHECK(what.find("built without CUDA") != std::string::npos);
            } else if (ec == gpuverbs::errc::no_gpu_driver) {
                CHECK(what.find("libcuda.so.1") != std::string::npos);
            } else {
                CHECK(ec == gpuverbs::errc::no_gpu);
                CHECK(what.find("sees no GPU") != std::string::npos);
            }
        }
    }

    TEST_CASE("the driver version is available exactly when GPUs can be listed") {
        std::error_code list_ec, version_ec;
        (void)gpuverbs::list_gpus(list_ec);
        int version = gpuverbs::cuda_driver_version(version_ec);
        if (!version_ec) CHECK(version >= 11030);
        if (list_ec == gpuverbs::errc::no_gpu_driver || list_ec == gpuverbs::errc::built_without_cuda) {
            CHECK(version_ec == list_ec);
        }
    }

    TEST_CASE("CUDA error codes have their own category") {
        std::error_code ec(100, gpuverbs::cuda_category());
        CHECK(std::string(ec.category().name()) == "cuda");
        CHECK_FALSE(ec.message().empty());
    }
}
