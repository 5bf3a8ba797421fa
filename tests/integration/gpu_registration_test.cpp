// register_gpu_memory's NIC half on real RDMA devices (Soft-RoCE, no GPU):
// the dma-buf probe really runs and its answer is named in the error; with
// the GPU half's answers injected, each method reaches its real verbs call
// (ibv_reg_dmabuf_mr, ibv_reg_mr), the automatic policy falls back, the
// exported fd is closed, and the region it gives carries real RDMA writes.
#include "rig_pair.hpp"
#include "text_checks.hpp"

#include "gpuverbs/detail/gpu/gpu_registration.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

using namespace gpuverbs;
using gpuverbs::test::fill_pattern;
using gpuverbs::test::has_pattern;
using gpuverbs::test::Pair;
using gpuverbs::test::poll_for;

namespace {

using gpuverbs::test::contains;

// Host memory standing in for GPU memory: what the peermem path hands to
// ibv_reg_mr is a pointer either way.
GpuMemory stand_in(std::span<std::byte> bytes) {
    GpuMemory m;
    m.address = reinterpret_cast<std::uintptr_t>(bytes.data());
    m.size = bytes.size();
    m.allocation_base = m.address;
    m.allocation_size = m.size;
    m.gpu_direct_rdma_capable = true;
    return m;
}

// The GPU half says yes to everything; the exporter hands out a real fd (a
// memfd: a file the NIC driver must reject as not a dma-buf, if it gets that far).
struct InjectedGpu {
    std::vector<int> exported;
    detail::RegistrationInputs inputs(std::optional<Check> nic = std::nullopt) {
        detail::RegistrationInputs in;
        in.gpu_direct_rdma = Check::yes();
        in.memory = Check::yes();
        in.gpu_dmabuf = Check::yes();
        in.peermem = Check::yes();
        in.nic_dmabuf = std::move(nic);
        in.export_dmabuf = [this](const GpuMemory&, detail::Status&) {
            int fd = ::memfd_create("gpuverbs-test-dmabuf", MFD_CLOEXEC);
            REQUIRE(fd >= 0);
            REQUIRE(::ftruncate(fd, 1 << 20) == 0);
            exported.push_back(fd);
            return detail::DmabufExport{fd, 0};
        };
        return in;
    }
    [[nodiscard]] bool all_closed() const {
        for (int fd : exported) {
            if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) return false;
        }
        return true;
    }
};

// One rxe device, a protection domain, host memory standing in for GPU
// memory, the injected GPU half, and what a registration reports.
struct OnRxe {
    Device device = Device::open(gpuverbs::test::rig_devices()->dev0);
    ProtectionDomain pd{device};
    std::vector<std::byte> host = std::vector<std::byte>(1 << 16);
    InjectedGpu gpu;
    std::vector<Rejection> why;
    detail::Status status;
};

} // namespace

TEST_SUITE("GPU registration on Soft-RoCE" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE_FIXTURE(OnRxe, "the NIC-side dma-buf probe really runs on rxe and says it is unsupported") {
        Check answer = probe_nic_dmabuf(pd);
        CHECK_FALSE(answer.ok);
        CHECK(answer.reason.starts_with("the NIC " + device.name() +
                                        " does not support dma-buf memory regions (EOPNOTSUPP)"));
        CHECK(probe_nic_dmabuf(pd) == answer); // cached, same words
    }

    TEST_CASE_FIXTURE(OnRxe, "without a GPU, register_gpu_memory names every method and every reason") {
        std::string thrown;
        try {
            (void)register_gpu_memory(pd, stand_in(host), access_all);
            FAIL("register_gpu_memory succeeded without a GPU");
        } catch (const GpuRegistrationError& e) {
            CHECK(e.code() == errc::gpu_direct_unavailable);
            REQUIRE(e.rejections().size() == 2);
            const Rejection& dmabuf = e.rejections()[0];
            const Rejection& peermem = e.rejections()[1];
            CHECK(dmabuf.method == Registration::dmabuf);
            CHECK(peermem.method == Registration::peermem);
            const char* driver = built_with_cuda() ? "libcuda.so.1 could not be loaded" : "built without CUDA";
            CHECK(contains(dmabuf.reason, driver));
            CHECK(contains(dmabuf.reason, "the NIC " + device.name() + " does not support dma-buf memory regions"));
            CHECK(contains(peermem.reason, driver));
            CHECK(contains(peermem.reason, "nvidia_peermem is not loaded"));
            std::string what = e.what();
            thrown = what;
            CHECK(what.starts_with("register_gpu_memory: cannot register 65536 bytes of GPU memory at 0x"));
            CHECK(contains(what, " on " + device.name() + " for RDMA: DMA-BUF: "));
            CHECK(contains(what, "; peermem: "));
        }
        // The error_code form gives the same reasons as data.
        std::error_code ec;
        CHECK_FALSE(register_gpu_memory(pd, stand_in(host), access_all, GpuRegistration::automatic, ec, &why));
        CHECK(ec == errc::gpu_direct_unavailable);
        CHECK(why.size() == 2);
        // … and with Diagnostics, the same words as the exception.
        Diagnostics diag;
        std::vector<Rejection> again;
        ec.clear();
        CHECK_FALSE(register_gpu_memory(pd, stand_in(host), access_all, GpuRegistration::automatic, ec, diag, &again));
        CHECK(ec == errc::gpu_direct_unavailable);
        CHECK(diag.message() == thrown);
        CHECK(again == why);
        // explain_gpu_registration answers without registering.
        auto explained = explain_gpu_registration(pd, stand_in(host));
        CHECK(explained.plan.order.empty());
        CHECK(explained.plan.rejected == why);
        CHECK_FALSE(explained.probes.nic_dmabuf.ok);
    }

    TEST_CASE(
        "automatic tries ibv_reg_dmabuf_mr, closes the fd, falls back to peermem's ibv_reg_mr, and the region "
        "carries RDMA writes") {
        Pair p(1 << 20);
        std::vector<std::byte> gpu_stand_in(1 << 20);
        InjectedGpu gpu;
        std::vector<Rejection> why;
        detail::Status status;
        // The NIC's answer is injected as yes so the DMA-BUF attempt happens; rxe then refuses it for real.
        MemoryRegion mr =
            detail::register_gpu_memory_with(p.b.pd, stand_in(gpu_stand_in), access_all, GpuRegistration::automatic,
                                             gpu.inputs(Check::yes()), why, status);
        REQUIRE(status.ok());
        REQUIRE(mr);
        CHECK(mr.registration() == Registration::peermem);
        CHECK(mr.iova() == reinterpret_cast<std::uintptr_t>(gpu_stand_in.data()));
        CHECK(mr.length() == gpu_stand_in.size());
        REQUIRE(why.size() == 1);
        CHECK(why[0].method == Registration::dmabuf);
        CHECK(why[0].reason.starts_with("ibv_reg_dmabuf_mr on " + p.b.device.name() + " failed: "));
        CHECK(contains(why[0].reason, "(errno " + std::to_string(EOPNOTSUPP) + ")"));
        CHECK(gpu.exported.size() == 1);
        CHECK(gpu.all_closed());

        // The region is real: side a writes into it over the wire.
        fill_pattern(p.a.memory, 42);
        REQUIRE_FALSE(p.a.qp.post_write(p.a.mr.all(), mr.remote()));
        auto done = poll_for(p.a.cq, 1);
        REQUIRE(done.size() == 1);
        CHECK(done[0].ok());
        CHECK(has_pattern(gpu_stand_in, 42));
    }

    TEST_CASE_FIXTURE(OnRxe, "policy dmabuf reaches ibv_reg_dmabuf_mr only, and fails with rxe's answer") {
        MemoryRegion mr = detail::register_gpu_memory_with(pd, stand_in(host), access_all, GpuRegistration::dmabuf,
                                                           gpu.inputs(Check::yes()), why, status);
        CHECK_FALSE(mr);
        CHECK(status.code == errc::gpu_direct_unavailable);
        REQUIRE(why.size() == 2);
        CHECK(why[0].method == Registration::dmabuf);
        CHECK(contains(why[0].reason, "ibv_reg_dmabuf_mr on " + device.name() + " failed"));
        CHECK(why[1] == Rejection{Registration::peermem,
                                  "not tried: the registration policy is dmabuf (GpuRegistration or "
                                  "GPUVERBS_GPU_REGISTRATION)"});
        CHECK(gpu.all_closed());
    }

    TEST_CASE_FIXTURE(OnRxe, "with the real NIC answer, automatic skips DMA-BUF on rxe and registers through peermem") {
        MemoryRegion mr = detail::register_gpu_memory_with(pd, stand_in(host), Access::local_write,
                                                           GpuRegistration::automatic, gpu.inputs(), why, status);
        REQUIRE(mr);
        CHECK(mr.registration() == Registration::peermem);
        CHECK(gpu.exported.empty()); // never exported: the probe ruled DMA-BUF out
        REQUIRE(why.size() == 1);
        CHECK(contains(why[0].reason, "does not support dma-buf memory regions (EOPNOTSUPP)"));
    }

    TEST_CASE_FIXTURE(OnRxe, "a failed export is a reason, and the fallback still runs") {
        auto inputs = gpu.inputs(Check::yes());
        inputs.export_dmabuf = [](const GpuMemory&, detail::Status& s) {
            s.fail(errc::cuda_error, "cuMemGetHandleForAddressRange", "cannot export: CUDA_ERROR_INVALID_VALUE");
            return detail::DmabufExport{};
        };
        MemoryRegion mr = detail::register_gpu_memory_with(pd, stand_in(host), access_all, GpuRegistration::automatic,
                                                           inputs, why, status);
        REQUIRE(mr);
        CHECK(mr.registration() == Registration::peermem);
        REQUIRE(why.size() == 1);
        CHECK(why[0].reason == "cannot export: CUDA_ERROR_INVALID_VALUE");
    }

    TEST_CASE_FIXTURE(OnRxe, "peermem refused by the kernel (unmapped pages: EFAULT) is a reason, not a crash") {
        // A reserved range with no access: the kernel cannot pin it, as when nvidia_peermem does not take GPU pages.
        void* hole = ::mmap(nullptr, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(hole != MAP_FAILED);
        MemoryRegion mr =
            detail::register_gpu_memory_with(pd, stand_in({static_cast<std::byte*>(hole), 1 << 16}), access_all,
                                             GpuRegistration::peermem, gpu.inputs(), why, status);
        CHECK_FALSE(mr);
        CHECK(status.code == errc::gpu_direct_unavailable);
        REQUIRE(why.size() == 2);
        CHECK(contains(why[1].reason, "ibv_reg_mr on " + device.name() + " failed: "));
        CHECK(contains(status.detail, "peermem: ibv_reg_mr"));
        ::munmap(hole, 1 << 16);
        // The protection domain is still usable.
        std::vector<std::byte> small(4096);
        CHECK(MemoryRegion(pd, small, access_all));
    }

    TEST_CASE_FIXTURE(OnRxe, "GPUVERBS_GPU_REGISTRATION overrides automatic, and a bad value is named") {
        ::setenv(gpu_registration_env, "dmabuf", 1); // NOLINT(concurrency-mt-unsafe): no other thread reads it now
        MemoryRegion mr = detail::register_gpu_memory_with(pd, stand_in(host), access_all, GpuRegistration::automatic,
                                                           gpu.inputs(), why, status);
        CHECK_FALSE(mr);
        CHECK(contains(status.detail, "not tried: the registration policy is dmabuf"));
        ::setenv(gpu_registration_env, "sometimes", 1); // NOLINT(concurrency-mt-unsafe)
        detail::Status bad;
        CHECK_FALSE(detail::register_gpu_memory_with(pd, stand_in(host), access_all, GpuRegistration::automatic,
                                                     gpu.inputs(), why, bad));
        CHECK(bad.code == errc::invalid_argument);
        CHECK(contains(bad.detail, "GPUVERBS_GPU_REGISTRATION='sometimes'"));
        ::unsetenv(gpu_registration_env); // NOLINT(concurrency-mt-unsafe)
        detail::Status ok;
        CHECK(detail::register_gpu_memory_with(pd, stand_in(host), access_all, GpuRegistration::automatic, gpu.inputs(),
                                               why, ok));
    }

#if GPUVERBS_TEST_HAVE_EXAMPLE_04
    TEST_CASE("the GPUDirect example, run on Soft-RoCE without a GPU, prints every reason and exits cleanly") {
        auto self = std::filesystem::read_symlink("/proc/self/exe");
        std::string example = (self.parent_path().parent_path() / "examples" / "04_gpudirect_write").string();
        std::string device = gpuverbs::test::rig_devices()->dev1;
        std::string command = example + " server --device " + device + " --port 18590 2>&1";
        FILE* pipe = ::popen(command.c_str(), "r");
        REQUIRE(pipe != nullptr);
        std::string out;
        char chunk[512];
        while (std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) out.append(chunk, n);
        int status = ::pclose(pipe);
        INFO(out);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
        CHECK(out.starts_with("server: GPUDirect RDMA is not available on this machine:\n  DMA-BUF: "));
        CHECK(contains(out, "the NIC " + device + " does not support dma-buf memory regions (EOPNOTSUPP)"));
        CHECK(contains(out, "\n  peermem: "));
        CHECK(contains(out, "nvidia_peermem is not loaded"));
        CHECK(contains(out, built_with_cuda() ? "libcuda.so.1 could not be loaded" : "built without CUDA"));
    }
#endif
}

// gpuverbs-doctor's live run on Soft-RoCE: the rxe devices are found, their
// ports and GIDs checked, and the real dma-buf probe answers EOPNOTSUPP.
#include "gpuverbs/gpu/doctor.hpp"

TEST_SUITE("gpuverbs-doctor on Soft-RoCE" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("the doctor finds the rxe devices, their active ports and RoCE v2 GIDs, and DMA-BUF unsupported") {
        DoctorReport r = diagnose();
        auto find = [&](const std::string& id, const std::string& subject) -> const DoctorCheck* {
            for (const auto& c : r.checks) {
                if (c.id == id && c.subject == subject) return &c;
            }
            return nullptr;
        };
        for (const std::string& dev : {gpuverbs::test::rig_devices()->dev0, gpuverbs::test::rig_devices()->dev1}) {
            CAPTURE(dev);
            const DoctorCheck* state = find("port-state", dev + " port 1");
            REQUIRE(state != nullptr);
            CHECK(state->status == CheckStatus::ok);
            CHECK(state->found.starts_with("ACTIVE, Ethernet"));
            const DoctorCheck* gid = find("port-gid", dev + " port 1");
            REQUIRE(gid != nullptr);
            CHECK(contains(gid->found, "RoCE v2 would be used"));
            const DoctorCheck* dmabuf = find("nic-dmabuf", dev);
            REQUIRE(dmabuf != nullptr);
            CHECK(dmabuf->status == CheckStatus::warn);
            CHECK(
                dmabuf->found.starts_with("the NIC " + dev + " does not support dma-buf memory regions (EOPNOTSUPP)"));
        }
        const DoctorCheck* devices = find("rdma-devices", "system");
        REQUIRE(devices != nullptr);
        CHECK(devices->status == CheckStatus::ok);
        CHECK(contains(devices->found, "(software)"));
        const DoctorCheck* rdma_core = find("rdma-core", "system");
        REQUIRE(rdma_core != nullptr);
        CHECK(contains(rdma_core->found, "ibv_reg_dmabuf_mr present"));
        CHECK(r.worst() == CheckStatus::fail); // no GPU in the rig
    }
}
