// GPU memory on a real GPU (the device machine); skipped without one.
// Allocation of many sizes and both kinds, views on interior pointers and on
// cudaMalloc memory, real dma-buf export of whole, interior and VMM ranges,
// the GPU probes, byte-exact copies, no leaks, and register_gpu_memory's
// reasons on a machine with a GPU but no RDMA device.
#include "gpuverbs/detail/gpu/gpu_registration.hpp"
#include "gpuverbs/transfers/registration_cache.hpp"
#include "gpuverbs/transfers/staging.hpp"
#include "gpuverbs/verbs/device.hpp"

#include "gpu_available.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <vector>

#if GPUVERBS_TEST_HAVE_CUDART
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#endif

using namespace gpuverbs;

namespace {

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 167 + std::size_t{seed} * 13 + (i >> 12)) & 0xff);
    return v;
}

// What the kernel says about an fd: "exp_name:\tnv_dmabuf" for a CUDA dma-buf.
std::string fdinfo(int fd) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(fd));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Exports `m` as the registration would, checks the fd is a CUDA dma-buf, closes it.
detail::DmabufExport export_and_check(const GpuMemory& m) {
    detail::Status status;
    detail::DmabufExport e = detail::real_inputs(m).export_dmabuf(m, status);
    INFO(status.detail);
    REQUIRE(status.ok());
    REQUIRE(e.fd >= 0);
    CHECK(contains(fdinfo(e.fd), "nv_dmabuf"));
    CHECK(::close(e.fd) == 0);
    return e;
}

} // namespace

TEST_SUITE("GPU memory on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE("buffers of many sizes, both kinds, copy byte-exact and describe themselves") {
        const std::size_t sizes[] = {1, 4095, 4096, 65537, 1 << 20, (3 << 20) + 17, 64 << 20};
        for (GpuAllocation kind : {GpuAllocation::device, GpuAllocation::vmm, GpuAllocation::automatic}) {
            for (std::size_t size : sizes) {
                CAPTURE(to_string(kind));
                CAPTURE(size);
                GpuBuffer b(size, {.gpu = 0, .allocation = kind});
                REQUIRE(b);
                CHECK(b.size() == size);
                CHECK(b.allocated_size() >= size);
                CHECK(b.allocated_size() % (64 << 10) == 0);
                CHECK(b.gpu() == 0);
                CHECK(b.allocation() == (kind == GpuAllocation::device ? GpuAllocation::device : GpuAllocation::vmm));
                CHECK(b.pci_bus_id() == list_gpus()[0].pci_bus_id);
                auto in = pattern(size, static_cast<unsigned>(size));
                b.copy_from_host(in);
                std::vector<std::byte> out(size);
                b.copy_to_host(out);
                CHECK(out == in);
                // The driver's view of the allocation matches ours.
                GpuMemory seen = GpuMemory::from_address(b.address(), size);
                CHECK(seen.allocation_base == b.address());
                CHECK(seen.allocation_size >= size);
                CHECK(seen.allocation == b.allocation());
                CHECK(seen.gpu_direct_rdma_capable);
                b.fill(std::byte{0x5a});
                b.copy_to_host(out);
                CHECK(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{0x5a}; }));
            }
        }
    }

    TEST_CASE("automatic picks VMM where GPUDirect RDMA on VMM memory is supported") {
        GpuBuffer b(1);
        CHECK(b.allocation() == GpuAllocation::vmm); // H100/H200: GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED=1
        CHECK(b.allocated_size() % (2 << 20) == 0);
    }

    TEST_CASE("copies outside the buffer are refused and copy nothing") {
        GpuBuffer b(4096, {.allocation = GpuAllocation::device});
        b.fill(std::byte{1});
        std::vector<std::byte> big(4097, std::byte{9});
        std::error_code ec;
        copy_to_gpu(b, 0, big, ec);
        CHECK(ec == errc::invalid_argument);
        copy_to_gpu(b, 4000, std::span(big).first(97), ec);
        CHECK(ec == errc::invalid_argument);
        std::vector<std::byte> out(4096);
        b.copy_to_host(out);
        CHECK(std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{1}; }));
        CHECK_THROWS_AS(b.copy_to_host(out, 1), Error);
        // Partial copies at an offset land exactly there.
        std::vector<std::byte> part(10, std::byte{7});
        b.copy_from_host(part, 100);
        b.copy_to_host(out);
        for (std::size_t i = 0; i < out.size(); ++i) {
            if (out[i] != std::byte(i >= 100 && i < 110 ? 7 : 1)) FAIL("byte ", i, " wrong");
        }
    }

    TEST_CASE("buffers free their memory: allocating far more than the GPU holds in turn works") {
        std::size_t total = list_gpus()[0].total_memory;
        std::size_t chunk = std::size_t{4} << 30;
        std::size_t rounds = total / chunk * 3; // three times the GPU's memory in all
        for (GpuAllocation kind : {GpuAllocation::device, GpuAllocation::vmm}) {
            for (std::size_t i = 0; i < rounds; ++i) {
                GpuBuffer b(chunk, {.allocation = kind});
                REQUIRE(b);
            }
        }
        // Moves transfer ownership; the moved-from buffer is empty and harmless.
        GpuBuffer a(1 << 20);
        std::uint64_t address = a.address();
        GpuBuffer b = std::move(a);
        CHECK_FALSE(a); // NOLINT(bugprone-use-after-move)
        CHECK(b.address() == address);
        b = GpuBuffer(1 << 20, {.allocation = GpuAllocation::device});
        CHECK(b.allocation() == GpuAllocation::device);
    }

    TEST_CASE("a GPU that does not exist and a zero size are named") {
        std::error_code ec;
        CHECK_FALSE(GpuBuffer::create(4096, {.gpu = 64}, ec));
        CHECK(ec == errc::invalid_argument);
        try {
            GpuBuffer b(4096, {.gpu = 64});
            FAIL("no exception");
        } catch (const Error& e) {
            CHECK(contains(e.what(), "there is no GPU 64"));
        }
    }

    TEST_CASE("views on interior pointers find their allocation") {
        GpuBuffer b(1 << 20, {.allocation = GpuAllocation::device});
        GpuMemory inner = GpuMemory::from_address(b.address() + 4097, 1000);
        CHECK(inner.allocation_base == b.address());
        CHECK(inner.offset_in_allocation() == 4097);
        CHECK(inner.gpu == 0);
        auto in = pattern(1000, 3);
        copy_to_gpu(inner, 0, in);
        std::vector<std::byte> whole(1 << 20);
        b.copy_to_host(whole);
        CHECK(std::equal(in.begin(), in.end(), whole.begin() + 4097));
        // A range running past the allocation is refused, with the numbers.
        std::error_code ec;
        (void)GpuMemory::from_address(b.address() + b.allocated_size() - 10, 20, ec);
        CHECK(ec == errc::invalid_argument);
        try {
            (void)GpuMemory::from_address(b.address() + b.allocated_size() - 10, 20);
        } catch (const Error& e) {
            CHECK(contains(e.what(), "runs 10 bytes past the end of its allocation"));
        }
    }

    TEST_CASE("host memory is not GPU memory") {
        std::vector<int> host(100);
        std::error_code ec;
        (void)GpuMemory::from_pointer(host.data(), 400, ec);
        CHECK(ec == errc::not_gpu_memory);
        try {
            (void)GpuMemory::from_pointer(host.data(), 400);
        } catch (const Error& e) {
            CHECK(contains(e.what(), "is not memory CUDA knows"));
        }
    }

#if GPUVERBS_TEST_HAVE_CUDART
    TEST_CASE("memory from cudaMalloc, cudaMallocHost and cudaMallocManaged") {
        void* p = nullptr;
        REQUIRE(cudaMalloc(&p, 3 << 20) == cudaSuccess);
        GpuMemory whole = GpuMemory::from_pointer(p, 3 << 20);
        CHECK(whole.allocation == GpuAllocation::device);
        CHECK(whole.gpu_direct_rdma_capable);
        GpuMemory inner = GpuMemory::from_pointer(static_cast<char*>(p) + 12345, 100);
        CHECK(inner.allocation_base == whole.address);
        CHECK(inner.offset_in_allocation() == 12345);
        auto in = pattern(100, 9);
        copy_to_gpu(inner, 0, in);
        std::vector<std::byte> out(100);
        REQUIRE(cudaMemcpy(out.data(), static_cast<char*>(p) + 12345, 100, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(out == in);
        export_and_check(whole);
        CHECK(export_and_check(inner).offset == 12345 % static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
        CHECK(cudaFree(p) == cudaSuccess);

        // A small cudaMalloc: its export range is rounded to whole pages inside the driver's allocation.
        REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
        GpuMemory small = GpuMemory::from_pointer(p, 1000);
        INFO("cuMemGetAddressRange says " << small.allocation_size << " bytes");
        export_and_check(small);
        CHECK(cudaFree(p) == cudaSuccess);

        void* pinned = nullptr;
        REQUIRE(cudaMallocHost(&pinned, 4096) == cudaSuccess);
        std::error_code ec;
        (void)GpuMemory::from_pointer(pinned, 4096, ec);
        CHECK(ec == errc::not_gpu_memory);
        try {
            (void)GpuMemory::from_pointer(pinned, 4096);
        } catch (const Error& e) {
            CHECK(contains(e.what(), "host memory known to CUDA"));
        }
        CHECK(cudaFreeHost(pinned) == cudaSuccess);

        void* managed = nullptr;
        REQUIRE(cudaMallocManaged(&managed, 4096) == cudaSuccess);
        try {
            (void)GpuMemory::from_pointer(managed, 4096);
            FAIL("managed memory accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::not_gpu_memory);
            CHECK(contains(e.what(), "managed memory"));
        }
        CHECK(cudaFree(managed) == cudaSuccess);
    }
#endif

    TEST_CASE("real dma-buf export of whole, interior and VMM ranges") {
        auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        for (GpuAllocation kind : {GpuAllocation::device, GpuAllocation::vmm}) {
            CAPTURE(to_string(kind));
            GpuBuffer b(8 << 20, {.allocation = kind});
            CHECK(export_and_check(b).offset == 0);
            CHECK(export_and_check(b.memory().slice(4096, 4096)).offset == 0);
            CHECK(export_and_check(b.memory().slice(5000, 100)).offset == 5000 % page);
            CHECK(export_and_check(b.memory().slice((2 << 20) - 8, 16)).offset == ((2 << 20) - 8) % page);
        }
    }

    TEST_CASE("the GPU probes read the real attributes") {
        Check gdr = probe_gpu_direct_rdma(0);
        CHECK_MESSAGE(gdr.ok, gdr.reason);
        Check dmabuf = probe_gpu_dmabuf(0);
        CHECK_MESSAGE(dmabuf.ok, dmabuf.reason);
        Check none = probe_gpu_direct_rdma(64);
        CHECK_FALSE(none.ok);
        CHECK(contains(none.reason, "there is no GPU 64"));
        // Hopper orders RDMA writes for the owner; the flush is then a no-op that must still succeed.
        CHECK(gpu_orders_rdma_writes(0));
        CHECK_NOTHROW(flush_gpu_direct_rdma_writes(0));
        CHECK_THROWS_AS(flush_gpu_direct_rdma_writes(64), Error);
    }

    TEST_CASE("with a GPU and no RDMA device, the reasons name the missing half exactly") {
        std::error_code ec;
        (void)Device::list(ec);
        auto devices = Device::list(ec);
        if (!devices.empty()) return; // a machine with both halves: not ours
        GpuBuffer b(1 << 20);
        // No device means no protection domain: the NIC half answers "no RDMA device".
        auto explained = explain_gpu_registration(ProtectionDomain{}, b);
        CHECK(explained.probes.gpu_direct_rdma.ok);
        CHECK(explained.probes.memory.ok);
        CHECK(explained.probes.gpu_dmabuf.ok);
        CHECK(explained.probes.nic_dmabuf == Check::no("no RDMA device (the ProtectionDomain is empty)"));
        CHECK_FALSE(explained.probes.peermem.ok); // no nvidia_peermem on the device machine
        CHECK(explained.plan.order.empty());
        REQUIRE(explained.plan.rejected.size() == 2);
        CHECK(explained.plan.rejected[0] ==
              Rejection{Registration::dmabuf, "no RDMA device (the ProtectionDomain is empty)"});
        CHECK(explained.plan.rejected[1].method == Registration::peermem);
        CHECK(explained.plan.rejected[1].reason.starts_with(
            "nvidia_peermem is not loaded (no /sys/module/nvidia_peermem"));
        // And the call itself refuses the empty protection domain by name.
        try {
            (void)register_gpu_memory(ProtectionDomain{}, b, access_all);
            FAIL("no exception");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(contains(e.what(), "the ProtectionDomain is empty"));
        }
        // What opening a device says here is what the example prints.
        try {
            (void)Device::open_first();
            FAIL("an RDMA device appeared");
        } catch (const Error& e) {
            CHECK(e.code() == errc::no_rdma_device);
        }
    }

#if GPUVERBS_TEST_HAVE_CUDART
    TEST_CASE("VMM memory made without the GPUDirect RDMA flag is named as such") {
        // Made through the driver API the way a framework's allocator might, without the flag.
        auto get = [](const char* name, auto& fn, unsigned version) {
            void* p = nullptr;
            REQUIRE(cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, nullptr) == cudaSuccess);
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        };
        PFN_cuMemGetAllocationGranularity_v10020 granularity_of = nullptr;
        PFN_cuMemCreate_v10020 create = nullptr;
        PFN_cuMemAddressReserve_v10020 reserve = nullptr;
        PFN_cuMemMap_v10020 map = nullptr;
        PFN_cuMemSetAccess_v10020 set_access = nullptr;
        PFN_cuMemUnmap_v10020 unmap = nullptr;
        PFN_cuMemAddressFree_v10020 address_free = nullptr;
        PFN_cuMemRelease_v10020 release = nullptr;
        get("cuMemGetAllocationGranularity", granularity_of, 10020);
        get("cuMemCreate", create, 10020);
        get("cuMemAddressReserve", reserve, 10020);
        get("cuMemMap", map, 10020);
        get("cuMemSetAccess", set_access, 10020);
        get("cuMemUnmap", unmap, 10020);
        get("cuMemAddressFree", address_free, 10020);
        get("cuMemRelease", release, 10020);
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        std::size_t size = 0;
        REQUIRE(granularity_of(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
        CUmemGenericAllocationHandle handle = 0;
        CUdeviceptr ptr = 0;
        REQUIRE(create(&handle, size, &prop, 0) == CUDA_SUCCESS);
        REQUIRE(reserve(&ptr, size, size, 0, 0) == CUDA_SUCCESS);
        REQUIRE(map(ptr, size, 0, handle, 0) == CUDA_SUCCESS);
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        REQUIRE(set_access(ptr, size, &access, 1) == CUDA_SUCCESS);

        GpuMemory m = GpuMemory::from_address(ptr, size);
        CHECK(m.allocation == GpuAllocation::vmm);
        CHECK_FALSE(m.gpu_direct_rdma_capable);
        auto explained = explain_gpu_registration(ProtectionDomain{}, m);
        CHECK_FALSE(explained.probes.memory.ok);
        CHECK(contains(explained.probes.memory.reason, "allocated without GPUDirect RDMA capability"));
        CHECK(contains(explained.plan.rejected[1].reason, "gpuDirectRDMACapable=1"));

        CHECK(unmap(ptr, size) == CUDA_SUCCESS);
        CHECK(address_free(ptr, size) == CUDA_SUCCESS);
        CHECK(release(handle) == CUDA_SUCCESS);
    }
#endif
}

// gpuverbs-doctor's live run on the GPU machine: the GPU and its attributes
// found, the open kernel module recognised, and no RDMA device named as such.
#include "gpuverbs/gpu/doctor.hpp"

TEST_SUITE("gpuverbs-doctor on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE("the doctor sees the GPU, the open module, DMA-BUF on the GPU side, and no RDMA device") {
        DoctorReport r = diagnose();
        auto gpus = list_gpus();
        std::string subject = "GPU " + gpus[0].pci_bus_id;
        auto find = [&](const std::string& id, const std::string& s) -> const DoctorCheck& {
            for (const auto& c : r.checks) {
                if (c.id == id && c.subject == s) return c;
            }
            FAIL("no check ", id, " for ", s);
            static DoctorCheck none;
            return none;
        };
        CHECK(find("gpu", subject).status == CheckStatus::ok);
        CHECK(find("gpu", subject).found.starts_with(gpus[0].name + ", CUDA device 0"));
        CHECK(find("nvidia-driver", "system").status == CheckStatus::ok);
        CHECK(contains(find("nvidia-driver", "system").found, "open kernel module"));
        CHECK(find("gpu-direct-rdma", subject).status == CheckStatus::ok);
        CHECK(find("gpu-dmabuf", subject).status == CheckStatus::ok);
        CHECK(find("gpu-vmm-rdma", subject).status == CheckStatus::ok);
        CHECK(find("gpu-write-ordering", subject).status == CheckStatus::ok);
        CHECK(find("gpu-bar1", subject).status == CheckStatus::ok);
        CHECK(find("rdma-devices", "system").status == CheckStatus::fail);
        CHECK(contains(find("rdma-devices", "system").found, "/sys/class/infiniband is empty"));
        CHECK(find("registration", subject).status == CheckStatus::fail);
        REQUIRE(r.conclusions.size() == gpus.size());
        CHECK(r.conclusions[0].nic.empty());
        CHECK_FALSE(r.conclusions[0].method.has_value());
        // The device queue: the GPU maps host memory (no reason about it), yet with no RDMA device there is no path.
        const GpuDirectAttributes a = gpu_direct_attributes(0);
        CHECK(a.can_map_host_memory);
        CHECK(a.unified_addressing);
        CHECK(find("device-queue", subject).status == CheckStatus::warn);
        CHECK(find("device-queue", subject).found ==
              "kernels cannot start transfers here: no path: the proxy cannot work here (there is no RDMA device)");
        CHECK(find("device-queue-gpu-direct", subject).found == "IBGDA is not possible: there is no RDMA device");
        CHECK(find("device-queue-atomics", subject)
                  .found.starts_with(std::string("host-native atomics ") + (a.host_native_atomics ? "yes" : "no") +
                                     ": not needed"));
        CHECK(r.conclusions[0].device_queue == "none");
        MESSAGE("device queue on this GPU: " << find("device-queue-atomics", subject).found);
    }
}

namespace {
std::string detail_hex(std::uint64_t v) {
    char text[24];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
    return text;
}
} // namespace

TEST_SUITE("the registration cache on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE(
        "a buffer freed and allocated again at the same address has a new buffer id: the stale entry is "
        "dropped, never served") {
        constexpr std::size_t size = 4 << 20;
        std::uint64_t address = 0;
        std::uint64_t first_id = 0;
        {
            GpuBuffer a(size, GpuBufferOptions{0, GpuAllocation::device});
            const GpuMemory m = GpuMemory::from_pointer(a.pointer(), size);
            address = m.address;
            first_id = m.buffer_id;
        }
        CHECK(first_id != 0);
        // The driver hands a freed range out again at once; try a few allocations until it does.
        std::vector<GpuBuffer> held;
        GpuMemory again;
        for (int tries = 0; tries < 8 && again.address != address; ++tries) {
            held.emplace_back(size, GpuBufferOptions{0, GpuAllocation::device});
            again = GpuMemory::from_pointer(held.back().pointer(), size);
        }
        REQUIRE_MESSAGE(again.address == address, "the driver did not reuse the freed address in 8 allocations");
        CHECK(again.buffer_id != 0);
        CHECK(again.buffer_id != first_id);
        MESSAGE("address " << detail_hex(address) << " reused: buffer id " << std::to_string(first_id) << " -> "
                           << std::to_string(again.buffer_id));
        // The cache's index, fed the real ids: the old entry is stale, dropped, and the lookup misses.
        detail::RegistrationIndex<int> index(RegistrationCacheOptions{});
        index.insert(index.plan_miss(address, address + size, Access::local_write, first_id), 1);
        CHECK(index.find(address, address + size, Access::local_write, first_id) == 1); // before the free: a hit
        CHECK_FALSE(index.find(address, address + 4096, Access::local_write, again.buffer_id).has_value());
        CHECK(index.statistics().stale == 1);
        CHECK(index.statistics().regions == 0);
        // An interior view of the new buffer has the same id (the allocation's, not the range's).
        CHECK(GpuMemory::from_address(address + 12345, 100).buffer_id == again.buffer_id);
    }
}

TEST_SUITE("the staged path's copy pipeline on a real GPU" * doctest::skip(!gpuverbs::test::gpu_available())) {
    TEST_CASE("GPU -> host and host -> GPU in chunks through pinned buffers: every byte, any length") {
        for (std::size_t size :
             {std::size_t{1}, std::size_t{4096}, std::size_t{(3 << 20) + 12345}, std::size_t{64} << 20}) {
            CAPTURE(size);
            GpuBuffer gpu(size);
            const auto in = pattern(size, static_cast<unsigned>(size % 251));
            copy_to_gpu(gpu, 0, in);
            StagingOptions o;
            o.chunk = 1 << 20;
            o.depth = 3;
            CopyPipeline pipeline(o);
            CHECK(pipeline.buffers().cuda_pinned());
            std::vector<std::byte> out(size);
            std::size_t chunks = 0;
            std::size_t expected_offset = 0;
            pipeline.from_gpu(gpu.memory(), [&](std::span<const std::byte> chunk, std::size_t offset) {
                CHECK(offset == expected_offset); // in order
                expected_offset += chunk.size();
                std::copy(chunk.begin(), chunk.end(), out.begin() + static_cast<std::ptrdiff_t>(offset));
                ++chunks;
            });
            CHECK(chunks == (size + o.chunk - 1) / o.chunk);
            CHECK(out == in);
            // Back: a new pattern produced chunk by chunk, copied to the GPU, read back.
            const auto back = pattern(size, 77);
            pipeline.to_gpu(gpu.memory(), [&](std::span<std::byte> chunk, std::size_t offset) {
                std::copy_n(back.begin() + static_cast<std::ptrdiff_t>(offset), chunk.size(), chunk.begin());
            });
            std::vector<std::byte> check(size);
            copy_from_gpu(gpu, 0, check);
            CHECK(check == back);
        }
    }
}
