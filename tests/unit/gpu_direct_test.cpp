// The pure half of GPU registration: the decision for every combination of
// probe answers and policies, the policy override, the error texts, the
// dma-buf range and iova arithmetic, the NIC probe's reading of errno, the
// peermem probe on fixture sysfs trees, and what GPU calls say without a GPU.
#include "gpuverbs/detail/gpu/gpu_registration.hpp"

#include "scratch_dir.hpp"
#include "text_checks.hpp"
#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using gpuverbs::Check;
using gpuverbs::GpuDirectProbes;
using gpuverbs::GpuRegistration;
using gpuverbs::Registration;
using gpuverbs::Rejection;
using gpuverbs::test::ScratchDir;

namespace {

using gpuverbs::test::contains;

GpuDirectProbes all_yes() {
    return {Check::yes(), Check::yes(), Check::yes(), Check::yes(), Check::yes()};
}

} // namespace

TEST_SUITE("gpu registration decision") {
    TEST_CASE("every combination of probe answers and policies gives the documented plan") {
        const std::array policies{GpuRegistration::automatic, GpuRegistration::dmabuf, GpuRegistration::peermem};
        int combinations = 0;
        for (unsigned bits = 0; bits < 32; ++bits) {
            GpuDirectProbes p;
            auto answer = [&](unsigned bit, const char* why) {
                return bits & (1u << bit) ? Check::yes() : Check::no(why);
            };
            p.gpu_direct_rdma = answer(0, "no gdr");
            p.memory = answer(1, "bad memory");
            p.gpu_dmabuf = answer(2, "gpu cannot export");
            p.nic_dmabuf = answer(3, "nic cannot import");
            p.peermem = answer(4, "no peermem");
            const bool common = p.gpu_direct_rdma.ok && p.memory.ok;
            const bool dmabuf_works = common && p.gpu_dmabuf.ok && p.nic_dmabuf.ok;
            const bool peermem_works = common && p.peermem.ok;
            for (GpuRegistration policy : policies) {
                CAPTURE(bits);
                CAPTURE(gpuverbs::to_string(policy));
                ++combinations;
                auto plan = gpuverbs::plan_gpu_registration(policy, p);
                CHECK(plan.policy == policy);
                std::vector<Registration> expected;
                bool dmabuf_allowed = policy != GpuRegistration::peermem;
                bool peermem_allowed = policy != GpuRegistration::dmabuf;
                if (dmabuf_allowed && dmabuf_works) expected.push_back(Registration::dmabuf);
                if (peermem_allowed && peermem_works) expected.push_back(Registration::peermem);
                CHECK(plan.order == expected);
                // Every method is either in the order or rejected, never both, never silently dropped.
                CHECK(plan.order.size() + plan.rejected.size() == 2);
                for (const Rejection& r : plan.rejected) {
                    CHECK_FALSE(r.reason.empty());
                    bool allowed = r.method == Registration::dmabuf ? dmabuf_allowed : peermem_allowed;
                    CHECK(contains(r.reason, "not tried") == !allowed);
                    if (!allowed) continue;
                    // The reason names exactly the failed checks this method needs.
                    CHECK(contains(r.reason, "no gdr") == !p.gpu_direct_rdma.ok);
                    CHECK(contains(r.reason, "bad memory") == !p.memory.ok);
                    bool dmabuf = r.method == Registration::dmabuf;
                    CHECK(contains(r.reason, "gpu cannot export") == (dmabuf && !p.gpu_dmabuf.ok));
                    CHECK(contains(r.reason, "nic cannot import") == (dmabuf && !p.nic_dmabuf.ok));
                    CHECK(contains(r.reason, "no peermem") == (!dmabuf && !p.peermem.ok));
                }
            }
        }
        CHECK(combinations == 96);
    }

    TEST_CASE("automatic prefers DMA-BUF and keeps peermem as the fallback") {
        auto plan = gpuverbs::plan_gpu_registration(GpuRegistration::automatic, all_yes());
        CHECK(plan.order == std::vector{Registration::dmabuf, Registration::peermem});
        CHECK(plan.rejected.empty());
    }

    TEST_CASE("the same reason from two probes is said once") {
        GpuDirectProbes p = all_yes();
        p.gpu_direct_rdma = Check::no("no NVIDIA GPU driver");
        p.gpu_dmabuf = Check::no("no NVIDIA GPU driver");
        p.nic_dmabuf = Check::no("the NIC rxe0 does not support dma-buf memory regions (EOPNOTSUPP)");
        auto plan = gpuverbs::plan_gpu_registration(GpuRegistration::automatic, p);
        REQUIRE(plan.rejected.size() == 2);
        CHECK(plan.rejected[0].reason ==
              "no NVIDIA GPU driver, and the NIC rxe0 does not support dma-buf memory regions (EOPNOTSUPP)");
        CHECK(plan.rejected[1].reason == "no NVIDIA GPU driver");
    }

    TEST_CASE("the error text lists every method and why, in the words of the issue") {
        std::vector<Rejection> r{
            {Registration::dmabuf, "the NIC rxe0 does not support dma-buf memory regions (EOPNOTSUPP)"},
            {Registration::peermem, "nvidia_peermem is not loaded (no /sys/module/nvidia_peermem)"}};
        CHECK(gpuverbs::describe_rejections(r) ==
              "DMA-BUF: the NIC rxe0 does not support dma-buf memory regions (EOPNOTSUPP); peermem: nvidia_peermem "
              "is not loaded (no /sys/module/nvidia_peermem)");
        gpuverbs::GpuRegistrationError e("cannot register: " + gpuverbs::describe_rejections(r), r);
        CHECK(e.code() == gpuverbs::errc::gpu_direct_unavailable);
        CHECK(e.rejections() == r);
        CHECK(std::string(e.what()).starts_with("register_gpu_memory: cannot register: DMA-BUF: the NIC rxe0"));
    }
}

TEST_SUITE("gpu registration policy") {
    TEST_CASE("policies parse and print as the environment variable spells them") {
        for (auto p : {GpuRegistration::automatic, GpuRegistration::dmabuf, GpuRegistration::peermem}) {
            CHECK(gpuverbs::parse_gpu_registration(gpuverbs::to_string(p)) == p);
        }
        CHECK_FALSE(gpuverbs::parse_gpu_registration("DMABUF").has_value());
        CHECK_FALSE(gpuverbs::parse_gpu_registration("").has_value());
    }

    TEST_CASE("the environment overrides automatic only") {
        using gpuverbs::detail::effective_policy;
        gpuverbs::detail::Status s;
        CHECK(effective_policy(GpuRegistration::automatic, nullptr, s) == GpuRegistration::automatic);
        CHECK(effective_policy(GpuRegistration::automatic, "", s) == GpuRegistration::automatic);
        CHECK(effective_policy(GpuRegistration::automatic, "peermem", s) == GpuRegistration::peermem);
        CHECK(effective_policy(GpuRegistration::automatic, "dmabuf", s) == GpuRegistration::dmabuf);
        CHECK(effective_policy(GpuRegistration::dmabuf, "peermem", s) == GpuRegistration::dmabuf);
        CHECK(effective_policy(GpuRegistration::peermem, "bogus", s) == GpuRegistration::peermem);
        CHECK(s.ok());
        (void)effective_policy(GpuRegistration::automatic, "dma-buf", s);
        CHECK(s.code == gpuverbs::errc::invalid_argument);
        CHECK(s.detail ==
              "GPUVERBS_GPU_REGISTRATION='dma-buf' is not a registration policy: use auto, dmabuf or "
              "peermem (or unset it)");
    }
}

TEST_SUITE("gpu registration arithmetic") {
    TEST_CASE("dma-buf export ranges are whole host pages around the memory, with the offset") {
        using gpuverbs::detail::dmabuf_export_range;
        using R = gpuverbs::detail::DmabufRange;
        CHECK(dmabuf_export_range(0x7f0000000000, 1 << 20, 4096) == R{0x7f0000000000, 1 << 20, 0});
        CHECK(dmabuf_export_range(0x7f0000001000, 100, 4096) == R{0x7f0000001000, 4096, 0});
        CHECK(dmabuf_export_range(0x7f0000001010, 100, 4096) == R{0x7f0000001000, 4096, 0x10});
        CHECK(dmabuf_export_range(0x7f0000001ff0, 0x20, 4096) == R{0x7f0000001000, 8192, 0xff0});
        CHECK(dmabuf_export_range(0x7f0000010000, 1, 65536) == R{0x7f0000010000, 65536, 0});
    }

    TEST_CASE("a DMA-BUF region reports the GPU address, not the offset rdma-core leaves in ibv_mr::addr") {
        using gpuverbs::detail::registered_iova;
        CHECK(registered_iova(Registration::dmabuf, 0x7f0000001010, 0x10) == 0x7f0000001010);
        CHECK(registered_iova(Registration::peermem, 0x7f0000001010, 0x7f0000001010) == 0x7f0000001010);
        CHECK(registered_iova(Registration::host, 0x1000, 0x1000) == 0x1000);
    }

    TEST_CASE("kernel releases parse to (major, minor)") {
        using gpuverbs::detail::parse_kernel_release;
        CHECK(parse_kernel_release("6.1.0-27-amd64") == std::pair{6, 1});
        CHECK(parse_kernel_release("5.11.22") == std::pair{5, 11});
        CHECK(parse_kernel_release("5.12") == std::pair{5, 12});
        CHECK(*parse_kernel_release("5.11.22") < std::pair{5, 12});
        CHECK_FALSE(parse_kernel_release("linux").has_value());
        CHECK_FALSE(parse_kernel_release("6").has_value());
    }
}

TEST_SUITE("gpu registration probes") {
    TEST_CASE("the NIC probe's errno means supported, unsupported, or an unexpected failure") {
        using gpuverbs::detail::nic_dmabuf_answer;
        CHECK(nic_dmabuf_answer("mlx5_0", true, EBADF).ok);
        CHECK(nic_dmabuf_answer("mlx5_0", true, 0).ok);
        Check rxe = nic_dmabuf_answer("rxe0", true, EOPNOTSUPP);
        CHECK_FALSE(rxe.ok);
        CHECK(rxe.reason.starts_with("the NIC rxe0 does not support dma-buf memory regions (EOPNOTSUPP)"));
        Check old = nic_dmabuf_answer("mlx4_0", true, EPROTONOSUPPORT);
        CHECK(contains(old.reason, "(EPROTONOSUPPORT)"));
        Check missing = nic_dmabuf_answer("rxe0", false, 0);
        CHECK(contains(missing.reason, "rdma-core 34 or newer"));
        Check odd = nic_dmabuf_answer("rxe0", true, ENOMEM);
        CHECK(contains(odd.reason, "failed unexpectedly"));
        CHECK(contains(odd.reason, "(errno " + std::to_string(ENOMEM) + ")"));
    }

    TEST_CASE("peermem is found by any of the files NCCL and UCX look for, and named when absent") {
        ScratchDir dir;
        Check none = gpuverbs::probe_peermem(dir.path.string());
        CHECK_FALSE(none.ok);
        CHECK(none.reason.starts_with("nvidia_peermem is not loaded (no " +
                                      (dir.path / "module/nvidia_peermem").string()));
        CHECK(contains(none.reason, "modprobe nvidia-peermem"));
        for (const char* file : {"module/nvidia_peermem/version", "module/nv_peer_mem/version",
                                 "kernel/mm/memory_peers/nv_mem/version", "kernel/mm/memory_peers/nv_mem_nc/version"}) {
            CAPTURE(file);
            ScratchDir one;
            one.write(file, "1.0\n");
            CHECK(gpuverbs::probe_peermem(one.path.string()).ok);
        }
        // A directory without the version file (module being unloaded) is not enough.
        fs::create_directories(dir.path / "module/nvidia_peermem");
        CHECK_FALSE(gpuverbs::probe_peermem(dir.path.string()).ok);
    }
}

TEST_SUITE("gpu memory without a GPU") {
    TEST_CASE("GPU calls fail with the driver's reason where there is no GPU, and GpuBuffer stays empty") {
        std::error_code gpus_ec;
        (void)gpuverbs::list_gpus(gpus_ec);
        std::error_code ec;
        auto buffer = gpuverbs::GpuBuffer::create(4096, {}, ec);
        if (!gpus_ec) {
            CHECK_FALSE(ec);
            CHECK(buffer);
            return; // a GPU is here: tests/gpu covers it
        }
        CHECK(ec == gpus_ec);
        CHECK_FALSE(buffer);
        CHECK(buffer.address() == 0);
        try {
            gpuverbs::GpuBuffer thrown(4096);
            FAIL("GpuBuffer did not throw without a GPU");
        } catch (const gpuverbs::Error& e) {
            CHECK(e.code() == gpus_ec);
            CHECK(contains(e.what(), gpuverbs::built_with_cuda() ? "libcuda.so.1" : "built without CUDA"));
        }
        int host = 0;
        (void)gpuverbs::GpuMemory::from_pointer(&host, sizeof host, ec);
        CHECK(ec == gpus_ec);
        Check gdr = gpuverbs::probe_gpu_direct_rdma(0);
        CHECK_FALSE(gdr.ok);
        CHECK(contains(gdr.reason, gpuverbs::built_with_cuda() ? "libcuda.so.1" : "built without CUDA"));
        CHECK(gpuverbs::probe_gpu_dmabuf(0) == gdr);
        // The flush and ordering queries name the missing driver, not a bad argument.
        for (auto call :
             {+[] { (void)gpuverbs::gpu_orders_rdma_writes(0); }, +[] { gpuverbs::flush_gpu_direct_rdma_writes(0); }}) {
            try {
                call();
                FAIL("no exception without a GPU");
            } catch (const gpuverbs::Error& e) {
                CHECK(e.code() == gpus_ec);
            }
        }
    }

    TEST_CASE("bad sizes are refused before the driver is asked") {
        std::error_code ec;
        CHECK_FALSE(gpuverbs::GpuBuffer::create(0, {}, ec));
        CHECK(ec == gpuverbs::errc::invalid_argument);
        (void)gpuverbs::GpuMemory::from_address(0x1000, 0, ec);
        CHECK(ec == gpuverbs::errc::invalid_argument);
        gpuverbs::GpuMemory m;
        m.address = 0x1000;
        m.size = 16;
        std::array<std::byte, 32> host{};
        gpuverbs::copy_to_gpu(m, 0, host, ec);
        CHECK(ec == gpuverbs::errc::invalid_argument);
        gpuverbs::copy_from_gpu(m, 8, std::span(host).first(9), ec);
        CHECK(ec == gpuverbs::errc::invalid_argument);
        CHECK(m.slice(8, 100).size == 8);
        CHECK(m.slice(8, 100).address == 0x1008);
        CHECK(m.slice(100, 1).size == 0);
    }

    TEST_CASE("fill_gpu, gpu_pci_bus_id and the flush fail alike in the three forms, with or without a GPU") {
        gpuverbs::GpuMemory m;
        m.address = 0x1000;
        m.size = 16;
        // A range outside the memory: refused before the driver is asked.
        CHECK(gpuverbs::test::check_fails_alike(
                  gpuverbs::errc::invalid_argument,
                  [&] {
                      gpuverbs::fill_gpu(m, 8, 16, std::byte{1});
                      return 0;
                  },
                  [&](std::error_code& ec) {
                      gpuverbs::fill_gpu(m, 8, 16, std::byte{1}, ec);
                      return 0;
                  },
                  [&](std::error_code& ec, gpuverbs::Diagnostics& d) {
                      gpuverbs::fill_gpu(m, 8, 16, std::byte{1}, ec, d);
                      return 0;
                  })
                  .starts_with("cuMemsetD8: "));
        // GPU 64 is on no machine we run on: without a driver the driver is
        // named, with one the missing GPU; each form says the same.
        (void)gpuverbs::test::check_forms_agree(
            [] { return gpuverbs::gpu_pci_bus_id(64); },
            [](std::error_code& ec) {
                std::string id = gpuverbs::gpu_pci_bus_id(64, ec);
                CHECK(id.empty());
                return id;
            },
            [](std::error_code& ec, gpuverbs::Diagnostics& d) { return gpuverbs::gpu_pci_bus_id(64, ec, d); });
        (void)gpuverbs::test::check_forms_agree(
            [] {
                gpuverbs::flush_gpu_direct_rdma_writes(64);
                return 0;
            },
            [](std::error_code& ec) {
                gpuverbs::flush_gpu_direct_rdma_writes(64, ec);
                return 0;
            },
            [](std::error_code& ec, gpuverbs::Diagnostics& d) {
                gpuverbs::flush_gpu_direct_rdma_writes(64, ec, d);
                return 0;
            });
    }

    TEST_CASE("registering on an empty protection domain or with inconsistent access names the problem") {
        gpuverbs::GpuMemory m;
        m.address = 0x1000;
        m.size = 4096;
        m.gpu_direct_rdma_capable = true;
        std::error_code ec;
        std::vector<Rejection> why;
        auto mr = gpuverbs::register_gpu_memory(gpuverbs::ProtectionDomain{}, m, gpuverbs::access_all,
                                                GpuRegistration::automatic, ec, &why);
        CHECK_FALSE(mr);
        CHECK(ec == gpuverbs::errc::invalid_argument);
        try {
            (void)gpuverbs::register_gpu_memory(gpuverbs::ProtectionDomain{}, m, gpuverbs::Access::remote_write);
            FAIL("no exception");
        } catch (const gpuverbs::Error& e) {
            CHECK(std::string(e.what()) ==
                  "register_gpu_memory: cannot register 4096 bytes of GPU memory at 0x1000 (GPU 0): the "
                  "ProtectionDomain is empty");
        }
    }
}
