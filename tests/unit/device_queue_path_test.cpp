// Which path a device queue's requests take (device_queue/path.hpp), from
// injected answers: the decision the doctor makes from the machine's
// (doctor_test.cpp runs it on fixture trees; the GPU test on the H100).
#include "gpuverbs/device_queue/path.hpp"

#include <doctest/doctest.h>

namespace gpuverbs::test {

namespace {

/// A machine where everything IBGDA needs is there.
DeviceQueuePathFacts everything() {
    DeviceQueuePathFacts f;
    f.host_mapped_memory = Check::yes();
    f.nic = Check::yes();
    f.nic_driver = "mlx5_core";
    f.gpu_memory_reachable = Check::yes();
    f.doorbell_mappable = Check::yes();
    return f;
}

} // namespace

TEST_SUITE("device queue path") {
    TEST_CASE(
        "an mlx5 NIC that reaches GPU memory with the doorbell mappable: IBGDA possible, the proxy used, "
        "since no GPU-direct backend is built") {
        const DeviceQueuePathChoice c = choose_device_queue_path(everything());
        CHECK(c.path == DeviceQueuePath::proxy);
        CHECK(c.proxy.ok);
        CHECK(c.gpu_direct.ok);
        CHECK(c.why ==
              "the proxy: IBGDA is possible on this GPU and NIC, but gpuverbs has no GPU-direct backend yet "
              "(docs/gpu-initiated.md plans it)");
        DeviceQueuePathFacts built = everything();
        built.gpu_direct_backend = true;
        const DeviceQueuePathChoice direct = choose_device_queue_path(built);
        CHECK(direct.path == DeviceQueuePath::gpu_direct);
        CHECK(direct.why == "GPU-direct: the GPU and the NIC allow IBGDA");
        CHECK(to_string(direct.path) == "gpu-direct");
    }

    TEST_CASE("Soft-RoCE, EFA or any NIC but mlx5: the proxy, and IBGDA's reason names the driver") {
        for (const char* driver : {"rdma_rxe", "efa", "irdma", ""}) {
            CAPTURE(driver);
            DeviceQueuePathFacts f = everything();
            f.nic_driver = driver;
            const DeviceQueuePathChoice c = choose_device_queue_path(f);
            CHECK(c.path == DeviceQueuePath::proxy);
            CHECK_FALSE(c.gpu_direct.ok);
            const std::string named = *driver != 0 ? driver : "unknown";
            CHECK(c.gpu_direct.reason == "the NIC's driver is " + named +
                                             ": IBGDA writes mlx5 work requests, so it needs an mlx5 NIC (ConnectX)");
            CHECK(c.why == "the proxy: IBGDA is not possible here (" + c.gpu_direct.reason + ")");
        }
    }

    TEST_CASE("every missing piece of IBGDA is named, in order") {
        DeviceQueuePathFacts f = everything();
        f.nic_driver = "rdma_rxe";
        f.gpu_memory_reachable = Check::no("no registration method works");
        f.doorbell_mappable = Check::no("no PeerMappingOverride");
        f.gpu_direct_backend = true; // built, yet not possible: the proxy
        const DeviceQueuePathChoice c = choose_device_queue_path(f);
        CHECK(c.path == DeviceQueuePath::proxy);
        CHECK(c.gpu_direct.reason ==
              "the NIC's driver is rdma_rxe: IBGDA writes mlx5 work requests, so it needs an "
              "mlx5 NIC (ConnectX); no registration method works; no PeerMappingOverride");
    }

    TEST_CASE("no NIC, or a GPU that cannot map host memory: no path, saying why") {
        DeviceQueuePathFacts f = everything();
        f.nic = Check::no("there is no RDMA device");
        DeviceQueuePathChoice c = choose_device_queue_path(f);
        CHECK(c.path == DeviceQueuePath::none);
        CHECK(c.why == "no path: the proxy cannot work here (there is no RDMA device)");
        CHECK(c.gpu_direct.reason == "there is no RDMA device");
        CHECK(to_string(c.path) == "none");

        f = everything();
        f.host_mapped_memory = Check::no("the GPU cannot map pinned host memory");
        c = choose_device_queue_path(f);
        CHECK(c.path == DeviceQueuePath::none);
        CHECK(c.why == "no path: the proxy cannot work here (the GPU cannot map pinned host memory)");
        CHECK(c.gpu_direct.ok); // the hardware would allow IBGDA; the proxy's own need is what fails
    }
}

} // namespace gpuverbs::test
