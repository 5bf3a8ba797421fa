// GPU discovery on a real GPU (the device machine); skipped without one.
#include "gpuverbs/gpu/gpu.hpp"

#include "gpu_available.hpp"

#include <doctest/doctest.h>

#include <cctype>
#include <set>

TEST_SUITE("gpu discovery on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE("every GPU has a name, a lower-case PCI bus id, memory and a compute capability") {
        auto gpus = gpuverbs::list_gpus();
        REQUIRE_FALSE(gpus.empty());
        std::set<std::string> bus_ids;
        for (std::size_t i = 0; i < gpus.size(); ++i) {
            const auto& g = gpus[i];
            CHECK(g.ordinal == static_cast<int>(i));
            CHECK_FALSE(g.name.empty());
            REQUIRE(g.pci_bus_id.size() == 12);
            CHECK(g.pci_bus_id[4] == ':');
            CHECK(g.pci_bus_id[7] == ':');
            CHECK(g.pci_bus_id[10] == '.');
            for (char c : g.pci_bus_id) CHECK(std::tolower(static_cast<unsigned char>(c)) == c);
            CHECK(g.total_memory >= (1ull << 30));
            CHECK(g.compute_capability_major >= 3);
            bus_ids.insert(g.pci_bus_id);
        }
        CHECK(bus_ids.size() == gpus.size());
    }

    TEST_CASE("the driver version is CUDA 11.3 or newer") {
        CHECK(gpuverbs::cuda_driver_version() >= 11030);
    }
}
