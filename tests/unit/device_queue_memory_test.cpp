// DeviceQueue (device_queue/queue.hpp) where this machine allows: a host
// queue carries requests from a producer to a reader; capacities out of range
// and a GPU queue without a GPU are refused with their codes and words. (On
// the GPU machine, tests/gpu/device_queue_gpu_test.cpp pushes through a GPU
// queue from kernels.)
#include "gpuverbs/device_queue/queue.hpp"
#include "gpuverbs/gpu/gpu.hpp"

#include "host_ring.hpp"
#include "ring_requests.hpp"

#include <doctest/doctest.h>

namespace gpuverbs::test {

TEST_SUITE("device queue memory") {
    TEST_CASE("a host queue carries a producer's requests to the reader, and its waits end done") {
        DeviceQueue queue = DeviceQueue::on_host(6);
        REQUIRE(queue);
        CHECK(queue.gpu() == -1);
        CHECK(queue.view().slots == queue.proxy_view().slots);
        CHECK(queue.view().capacity() == 64);
        device_queue::RingReader reader(queue.proxy_view());
        std::uint64_t position = 0;
        for (std::uint64_t i = 0; i < 200; ++i) { // three laps and more
            REQUIRE(device_queue::push(queue.view(), request_of(1, i), ring_deadline(std::chrono::seconds(5)),
                                       position) == device_queue::WaitResult::done);
            device_queue::Request got;
            REQUIRE(reader.try_take(got) == device_queue::Decoded::complete);
            CHECK(same(got, request_of(1, i)));
            reader.complete(reader.taken());
        }
        CHECK(position == 199);
        CHECK(device_queue::quiet(queue.view(), ring_deadline(std::chrono::seconds(1))) ==
              device_queue::WaitResult::done);
        DeviceQueue moved = std::move(queue);
        CHECK(moved);
        CHECK_FALSE(queue); // NOLINT(bugprone-use-after-move): a moved-from queue is empty
    }

    TEST_CASE("a capacity out of range is refused in words, before any memory is taken") {
        for (const std::uint32_t log2 : {21U, 64U}) {
            CAPTURE(log2);
            try {
                (void)DeviceQueue::on_host(log2);
                FAIL("taken");
            } catch (const Error& e) {
                CHECK(e.code() == errc::invalid_argument);
                CHECK(e.detail() == "a device queue holds 2^0 to 2^20 slots; 2^" + std::to_string(log2) + " asked");
            }
            std::error_code ec;
            CHECK_FALSE(DeviceQueue::on_gpu(0, log2, ec));
            CHECK(ec == errc::invalid_argument);
        }
    }

    TEST_CASE("a GPU queue where CUDA sees no GPU fails as listing the GPUs does, in the loader's words") {
        std::error_code list_ec;
        (void)list_gpus(list_ec);
        if (!list_ec) {
            MESSAGE("this machine has a GPU: tests/gpu/device_queue_gpu_test.cpp covers it");
            return;
        }
        std::error_code ec;
        Diagnostics d;
        CHECK_FALSE(DeviceQueue::on_gpu(0, 10, ec, d));
        CHECK(ec == list_ec);
        CHECK_FALSE(d.detail().empty());
        try {
            (void)DeviceQueue::on_gpu(0, 10);
            FAIL("a GPU queue without a GPU");
        } catch (const Error& e) {
            CHECK(e.code() == list_ec);
        }
    }
}

} // namespace gpuverbs::test
