// gpuverbs-doctor on fixture trees modelled on real machines (tests/data/topology),
// the pure topology pieces, the JSON, the command itself, and a live run on
// this machine, where every check must say why.
#include "gpuverbs/gpu/doctor.hpp"
#include "gpuverbs/detail/gpu/pcie_topology.hpp"
#include "gpuverbs/error.hpp"

#include "sysfs_fixture.hpp"

#include <doctest/doctest.h>
#include "build_has.hpp"
#include "text_checks.hpp"
#include "three_forms.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

using gpuverbs::CheckStatus;
using gpuverbs::DoctorReport;
using gpuverbs::PciPath;
using gpuverbs::test::SysfsFixture;

namespace {

std::filesystem::path topology(const char* name) {
    return std::filesystem::path(GPUVERBS_TEST_DATA_DIR) / "topology" / name;
}

/// Reads only the fixture's trees.
gpuverbs::DoctorOptions fixture_options(const SysfsFixture& f) {
    gpuverbs::DoctorOptions o;
    o.sys_root = f.sys();
    o.proc_root = f.proc();
    o.live = false;
    return o;
}

DoctorReport diagnose_fixture(const SysfsFixture& f, const char* kernel = "6.8.0-45-generic") {
    gpuverbs::DoctorOptions o = fixture_options(f);
    o.kernel_release = kernel;
    return gpuverbs::diagnose(o);
}

const gpuverbs::DoctorCheck& check(const DoctorReport& r, const std::string& id, const std::string& subject) {
    for (const auto& c : r.checks) {
        if (c.id == id && c.subject == subject) return c;
    }
    FAIL("no check ", id, " for ", subject);
    static gpuverbs::DoctorCheck none;
    return none;
}

std::optional<PciPath> path_of(const DoctorReport& r, const std::string& gpu, const std::string& nic) {
    for (const auto& p : r.paths) {
        if (p.gpu == gpu && p.nic == nic) return p.path;
    }
    return std::nullopt;
}

using gpuverbs::test::contains;

} // namespace

TEST_SUITE("doctor topology") {
    TEST_CASE("an 8-GPU server: every GPU gets its own PIX NIC, other switches are NODE or SYS") {
        SysfsFixture f(topology("hgx-8gpu-pix.topo"));
        DoctorReport r = diagnose_fixture(f);
        REQUIRE(r.conclusions.size() == 8);
        CHECK(r.paths.size() == 64);
        std::set<std::string> nics;
        for (const auto& c : r.conclusions) {
            CAPTURE(c.gpu);
            CHECK(c.path == PciPath::pix);
            CHECK(c.nccl_ib_hca == c.nic);
            CHECK(c.nccl_net_gdr_level == "PIX");
            nics.insert(c.nic);
            CHECK(check(r, "pcie-path", "GPU " + c.gpu + " - " + c.nic).status == CheckStatus::ok);
            const auto& acs = check(r, "pcie-acs", "GPU " + c.gpu + " - " + c.nic);
            CHECK(acs.status == CheckStatus::ok);
            CHECK(contains(acs.found, "ACSCtl all off"));
        }
        CHECK(nics.size() == 8); // the two GPUs of a switch take its two NICs, one each
        CHECK(path_of(r, "0000:03:00.0", "mlx5_0") == PciPath::pix);
        CHECK(path_of(r, "0000:03:00.0", "mlx5_1") == PciPath::pix);
        CHECK(path_of(r, "0000:03:00.0", "mlx5_2") == PciPath::node); // other root complex, same socket
        CHECK(path_of(r, "0000:03:00.0", "mlx5_4") == PciPath::sys);  // other socket
        CHECK(check(r, "iommu", "system").status == CheckStatus::ok);
        CHECK(contains(check(r, "iommu", "system").found, "passthrough"));
        CHECK(contains(check(r, "iommu", "system").found, "iommu=pt"));
        CHECK(check(r, "nvidia-driver", "system").status == CheckStatus::ok);
        CHECK(check(r, "nvidia-driver", "system").found == "NVIDIA driver 535.183.01, open kernel module");
        CHECK(check(r, "peermem", "system").status == CheckStatus::ok);
        CHECK(check(r, "gpu-bar1", "GPU 0000:03:00.0").found == "BAR1 is 128 GiB");
        const auto& nccl = check(r, "nccl", "system");
        CHECK(nccl.found ==
              "NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 "
              "(NCCL_NET_GDR_LEVEL default PXB suffices)");
    }

    TEST_CASE(
        "the device queue's path per GPU: its facts from the machine, the proxy or nothing, and IBGDA's "
        "reasons; relaxed ordering per NIC") {
        SysfsFixture f(topology("hgx-8gpu-pix.topo"));
        DoctorReport r = diagnose_fixture(f);
        // A fixture run asks CUDA nothing: the GPU's mapping of host memory is not known, so no path.
        const auto& dq = check(r, "device-queue", "GPU 0000:03:00.0");
        CHECK(dq.status == CheckStatus::warn);
        CHECK(dq.found ==
              "kernels cannot start transfers here: no path: the proxy cannot work here (CUDA does not see "
              "the GPU: not queried (fixture run))");
        CHECK(dq.doc == "troubleshooting.md#doctor-device-queue");
        REQUIRE(r.conclusions.size() == 8);
        CHECK(r.conclusions[0].device_queue == "none");
        // mlx5_0 is an mlx5 NIC with the doorbell mappable (PeerMappingOverride=1): what IBGDA lacks is the GPU.
        const auto& ibgda = check(r, "device-queue-gpu-direct", "GPU 0000:03:00.0");
        CHECK(ibgda.status == CheckStatus::not_applicable);
        CHECK(ibgda.found.starts_with("IBGDA is not possible: the NIC cannot register this GPU's memory ("));
        CHECK_FALSE(contains(ibgda.found, "driver"));
        CHECK_FALSE(contains(ibgda.found, "PeerMappingOverride"));
        // The NICs whose config space says: on, off; the others' is not there.
        CHECK(
            contains(check(r, "nic-relaxed-ordering", "mlx5_0").found, "relaxed ordering is enabled on 0000:05:00.0"));
        CHECK(check(r, "nic-relaxed-ordering", "mlx5_1").found ==
              "relaxed ordering is disabled on 0000:06:00.0: the NIC's writes reach memory in order");
        CHECK(check(r, "nic-relaxed-ordering", "mlx5_2").status == CheckStatus::unknown);
        // Without PeerMappingOverride, and with a NIC whose driver is not mlx5, each is named.
        SysfsFixture other(topology("two-socket-sys.topo"));
        const DoctorReport o = diagnose_fixture(other);
        REQUIRE_FALSE(o.conclusions.empty());
        const auto& why = check(o, "device-queue-gpu-direct", "GPU " + o.conclusions[0].gpu).found;
        CHECK(contains(why, "the NIC's driver is unknown: IBGDA writes mlx5 work requests"));
        CHECK(contains(why, "cannot be read (is the NVIDIA driver loaded?)"));
        CHECK(contains(gpuverbs::to_json(r), "\"device_queue\": \"none\", \"device_queue_why\": \"no path: "));
    }

    TEST_CASE("a two-socket host with the NIC on the other socket: SYS, and the old stack is named") {
        SysfsFixture f(topology("two-socket-sys.topo"));
        DoctorReport r = diagnose_fixture(f, "5.4.0-150-generic");
        REQUIRE(r.conclusions.size() == 1);
        CHECK(r.conclusions[0].path == PciPath::sys);
        CHECK(r.conclusions[0].nccl_net_gdr_level == "SYS");
        const auto& path = check(r, "pcie-path", "GPU 0000:3b:00.0 - mlx5_0");
        CHECK(path.status == CheckStatus::fail);
        CHECK(contains(path.found, "another CPU socket"));
        CHECK(path.doc == "troubleshooting.md#doctor-pcie-path");
        CHECK(check(r, "nvidia-driver", "system").status == CheckStatus::warn);
        CHECK(contains(check(r, "nvidia-driver", "system").found, "470.223.02, proprietary kernel module"));
        CHECK(check(r, "kernel-dmabuf", "system").status == CheckStatus::warn);
        CHECK(check(r, "peermem", "system").status == CheckStatus::warn);
        CHECK(check(r, "iommu", "system").found == "no IOMMU is active; no IOMMU options on the kernel command line");
        CHECK(check(r, "nccl", "system").found == "NCCL_IB_HCA=mlx5_0 NCCL_NET_GDR_LEVEL=SYS");
        CHECK(r.worst() == CheckStatus::fail);
    }

    TEST_CASE("GPU and NIC on two root ports of one root complex: PHB, a warning with NCCL's setting") {
        SysfsFixture f(topology("one-host-bridge-phb.topo"));
        DoctorReport r = diagnose_fixture(f);
        CHECK(r.conclusions.at(0).path == PciPath::phb);
        const auto& path = check(r, "pcie-path", "GPU 0000:01:00.0 - mlx5_0");
        CHECK(path.status == CheckStatus::warn);
        CHECK(contains(path.advice, "NCCL_NET_GDR_LEVEL=PHB"));
        // The path crosses both root ports; ACS is off on them.
        CHECK(check(r, "pcie-acs", "GPU 0000:01:00.0 - mlx5_0").status == CheckStatus::ok);
        CHECK(check(r, "nccl", "system").found == "NCCL_IB_HCA=mlx5_0 NCCL_NET_GDR_LEVEL=PHB");
    }

    TEST_CASE("ACS redirect on a switch port fails the pair and names the bridge; a translating IOMMU warns") {
        SysfsFixture f(topology("switch-acs-enabled.topo"));
        DoctorReport r = diagnose_fixture(f);
        CHECK(r.conclusions.at(0).path == PciPath::pix);
        const auto& acs = check(r, "pcie-acs", "GPU 0000:19:00.0 - mlx5_0");
        CHECK(acs.status == CheckStatus::fail);
        CHECK(contains(acs.found, "0000:18:00.0 SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+"));
        CHECK_FALSE(contains(acs.found, "0000:18:01.0"));
        CHECK(contains(acs.advice, "setpci"));
        const auto& iommu = check(r, "iommu", "system");
        CHECK(iommu.status == CheckStatus::warn);
        CHECK(contains(iommu.found, "GPU 0000:19:00.0 (DMA-FQ)"));
        CHECK(contains(iommu.found, "intel_iommu=on"));
        CHECK(contains(iommu.advice, "iommu=pt"));
    }

    TEST_CASE("two switches deep: PXB; ACS cannot be read without root, and says so") {
        SysfsFixture f(topology("two-level-switch-pxb.topo"));
        DoctorReport r = diagnose_fixture(f);
        CHECK(r.conclusions.at(0).path == PciPath::pxb);
        CHECK(check(r, "pcie-path", "GPU 0000:05:00.0 - mlx5_0").status == CheckStatus::ok);
        const auto& acs = check(r, "pcie-acs", "GPU 0000:05:00.0 - mlx5_0");
        CHECK(acs.status == CheckStatus::unknown);
        CHECK(acs.found.starts_with("unknown, needs root"));
        REQUIRE(r.paths.size() == 1);
        CHECK(r.paths[0].bridges ==
              std::vector<std::string>{"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:02:01.0"});
    }

    TEST_CASE("a VM's flat bus: PHB with no bridges, so ACS is not applicable") {
        SysfsFixture f(topology("vm-flat-bus.topo"));
        DoctorReport r = diagnose_fixture(f);
        CHECK(r.conclusions.at(0).path == PciPath::phb);
        CHECK(check(r, "pcie-acs", "GPU 0000:00:06.0 - mlx5_0").status == CheckStatus::not_applicable);
        CHECK(check(r, "gpu-bar1", "GPU 0000:00:06.0").found == "BAR1 is 256 GiB");
        // Without live probes the conclusion says what it could not find out.
        CHECK_FALSE(r.conclusions[0].method.has_value());
        CHECK(check(r, "registration", "GPU 0000:00:06.0").status == CheckStatus::fail);
    }
}

TEST_SUITE("doctor documentation") {
    TEST_CASE("every doc pointer a report can carry has its anchor in docs/troubleshooting.md") {
        std::ifstream in(std::filesystem::path(GPUVERBS_TEST_DATA_DIR).parent_path().parent_path() / "docs" /
                         "troubleshooting.md");
        std::stringstream text;
        text << in.rdbuf();
        std::set<std::string> docs;
        for (const char* name : {"hgx-8gpu-pix.topo", "two-socket-sys.topo", "one-host-bridge-phb.topo",
                                 "switch-acs-enabled.topo", "two-level-switch-pxb.topo", "vm-flat-bus.topo"}) {
            SysfsFixture f(topology(name));
            for (const auto& c : diagnose_fixture(f, "5.4.0").checks) {
                if (!c.doc.empty()) docs.insert(c.doc);
            }
        }
        for (const auto& c : gpuverbs::diagnose().checks) {
            if (!c.doc.empty()) docs.insert(c.doc);
        }
        CHECK(docs.size() >= 12);
        for (const auto& doc : docs) {
            CAPTURE(doc);
            REQUIRE(doc.starts_with("troubleshooting.md#"));
            CHECK(contains(text.str(), "<a id=\"" + doc.substr(doc.find('#') + 1) + "\"></a>"));
        }
    }
}

TEST_SUITE("doctor pieces") {
    TEST_CASE("path classes from chains") {
        using gpuverbs::detail::classify_path;
        using gpuverbs::detail::PciChain;
        PciChain gpu{"0000:03:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0"}, 0};
        PciChain same_switch{"0000:04:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0"}, 0};
        PciChain other_port{"0000:81:00.0", "pci0000:00", {"0000:00:02.0"}, 0};
        PciChain other_root_same_node{"0000:41:00.0", "pci0000:40", {"0000:40:01.0"}, 0};
        PciChain other_socket{"0000:c1:00.0", "pci0000:c0", {"0000:c0:01.0"}, 1};
        CHECK(classify_path(gpu, same_switch) == PciPath::pix);
        CHECK(classify_path(gpu, other_port) == PciPath::phb);
        CHECK(classify_path(gpu, other_root_same_node) == PciPath::node);
        CHECK(classify_path(gpu, other_socket) == PciPath::sys);
        PciChain deep{
            "0000:09:00.0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:08:00.0"}, 0};
        CHECK(classify_path(deep, same_switch) == PciPath::pxb);
        CHECK(classify_path(same_switch, deep) == PciPath::pxb);
    }

    TEST_CASE("ACS from config space: absent, off, redirecting, unreadable, and a chain of capabilities") {
        using gpuverbs::detail::AcsState;
        using gpuverbs::detail::parse_acs;
        std::vector<std::uint8_t> config(4096, 0);
        CHECK(parse_acs(config).kind == AcsState::absent);
        CHECK(parse_acs(std::span(config).first(256)).kind == AcsState::unknown);
        // AER at 0x100 pointing to ACS at 0x148.
        config[0x100] = 0x01;
        config[0x102] = 0x81; // version 1, next 0x148 (0x148 << 20 split over bytes 2-3)
        config[0x103] = 0x14;
        config[0x148] = 0x0d;
        config[0x14a] = 0x01;
        CHECK(parse_acs(config).kind == AcsState::disabled);
        config[0x14e] = 0x04; // ReqRedir
        AcsState on = parse_acs(config);
        CHECK(on.kind == AcsState::redirecting);
        CHECK(on.detail == "ReqRedir+");
        config[0x14e] = 0x11; // SrcValid + UpstreamFwd: no redirection of peer traffic
        CHECK(parse_acs(config).kind == AcsState::disabled);
        // A loop in the capability list ends.
        config[0x14a] = 0x01;
        config[0x148] = 0x0b;
        config[0x14a] = 0x01 | 0x00;
        config[0x14b] = 0x10; // next = 0x100
        CHECK(parse_acs(config).kind == AcsState::absent);
    }

    TEST_CASE("relaxed ordering from the PCI Express capability's Device Control, through a chain of capabilities") {
        using gpuverbs::detail::parse_relaxed_ordering;
        std::vector<std::uint8_t> config(256, 0);
        CHECK_FALSE(parse_relaxed_ordering(config).has_value()); // no capabilities at all
        config[0x34] = 0x40;
        config[0x40] = 0x01; // power management, next at 0x60
        config[0x41] = 0x60;
        config[0x60] = 0x10; // PCI Express
        CHECK(parse_relaxed_ordering(config) == false);
        config[0x68] = 0x10 | 0x20; // Enable Relaxed Ordering, and Extended Tag beside it
        CHECK(parse_relaxed_ordering(config) == true);
        config[0x68] = 0x20;
        CHECK(parse_relaxed_ordering(config) == false);
        CHECK_FALSE(parse_relaxed_ordering(std::span(config).first(0x30)).has_value()); // too short
        CHECK_FALSE(parse_relaxed_ordering(std::span(config).first(0x64)).has_value()); // the capability cut off
        config[0x41] = 0x40; // a loop that never reaches it ends
        CHECK_FALSE(parse_relaxed_ordering(config).has_value());
    }

    TEST_CASE("BAR1 is the second memory BAR, after a 32-bit or a 64-bit BAR0") {
        namespace fs = std::filesystem;
        fs::path root = fs::temp_directory_path() / ("gpuverbs-bar1-" + std::to_string(::getpid()));
        fs::create_directories(root / "bus/pci/devices/0000:01:00.0");
        auto write = [&](const char* text) { std::ofstream(root / "bus/pci/devices/0000:01:00.0/resource") << text; };
        write(
            "0x00000000de000000 0x00000000deffffff 0x0000000000040200\n"
            "0x000000c000000000 0x000000c00fffffff 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n");
        CHECK(gpuverbs::detail::read_bar1_bytes(root.string(), "0000:01:00.0") == (std::uint64_t{256} << 20));
        write(
            "0x0000104002000000 0x0000104002ffffff 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
            "0x0000100000000000 0x0000103fffffffff 0x000000000014220c\n");
        CHECK(gpuverbs::detail::read_bar1_bytes(root.string(), "0000:01:00.0") == (std::uint64_t{256} << 30));
        CHECK(gpuverbs::detail::read_bar1_bytes(root.string(), "0000:02:00.0") == 0);
        fs::remove_all(root);
    }

    TEST_CASE("the JSON report has the documented shape and escapes text") {
        DoctorReport r;
        r.checks.push_back({"memlock", "system", CheckStatus::warn, "a \"quoted\"\nline", "do\\this", "x.md#y"});
        r.paths.push_back({"0000:03:00.0", "mlx5_0", PciPath::pix, {"0000:02:00.0"}});
        gpuverbs::GpuConclusion c;
        c.gpu = "0000:03:00.0";
        c.nic = "mlx5_0";
        c.path = PciPath::pix;
        c.method = gpuverbs::Registration::dmabuf;
        c.rejected = {{gpuverbs::Registration::peermem, "nvidia_peermem is not loaded"}};
        c.nccl_ib_hca = "mlx5_0";
        c.nccl_net_gdr_level = "PIX";
        r.conclusions.push_back(c);
        std::string json = gpuverbs::to_json(r);
        CHECK(json == R"({
  "schema": "gpuverbs-doctor/1",
  "worst": "warn",
  "checks": [
    {"id": "memlock", "subject": "system", "status": "warn", "found": "a \"quoted\"\nline", "advice": "do\\this", "doc": "x.md#y"}
  ],
  "paths": [
    {"gpu": "0000:03:00.0", "nic": "mlx5_0", "class": "PIX", "bridges": ["0000:02:00.0"]}
  ],
  "conclusions": [
    {"gpu": "0000:03:00.0", "nic": "mlx5_0", "class": "PIX", "method": "dmabuf", "rejected": [{"method": "peermem", "reason": "nvidia_peermem is not loaded"}], "nccl": {"NCCL_IB_HCA": "mlx5_0", "NCCL_NET_GDR_LEVEL": "PIX"}, "device_queue": null, "device_queue_why": null}
  ]
}
)");
    }

    TEST_CASE("the command: --json on a fixture, exit status by the worst result, bad arguments" *
              doctest::skip(!gpuverbs::test::build_has::doctor)) {
        SysfsFixture f(topology("two-socket-sys.topo"));
        auto self = std::filesystem::read_symlink("/proc/self/exe");
        std::string doctor = (self.parent_path().parent_path() / "gpuverbs-doctor").string();
        auto run = [](const std::string& command, std::string& out) {
            FILE* pipe = ::popen(command.c_str(), "r");
            REQUIRE(pipe != nullptr);
            char chunk[4096];
            while (std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) out.append(chunk, n);
            int status = ::pclose(pipe);
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        };
        std::string out;
        int rc =
            run(doctor + " --json --no-live --kernel-release 5.4.0 --sys-root " + f.sys() + " --proc-root " + f.proc(),
                out);
        CHECK(rc == 2);
        CHECK(out.starts_with("{\n  \"schema\": \"gpuverbs-doctor/1\",\n  \"worst\": \"fail\","));
        CHECK(contains(out, R"("class": "SYS")"));
        std::string text;
        CHECK(run(doctor + " --no-live --sys-root " + f.sys() + " --proc-root " + f.proc(), text) == 2);
        CHECK(contains(text, "[fail]    pcie-path: SYS: the NIC is on another CPU socket than the GPU"));
        CHECK_FALSE(contains(text, "\033[")); // no colour into a pipe
        std::string bad;
        CHECK(run(doctor + " --frobnicate 2>&1", bad) == 64);
        CHECK(contains(bad, "unknown argument '--frobnicate'"));
    }

    TEST_CASE("a live run on this machine says why for every check that is not ok") {
        DoctorReport r = gpuverbs::diagnose();
        CHECK_FALSE(r.checks.empty());
        for (const auto& c : r.checks) {
            CAPTURE(c.id);
            CAPTURE(c.subject);
            CHECK_FALSE(c.found.empty());
            if (c.status == CheckStatus::warn || c.status == CheckStatus::fail) {
                CHECK_FALSE(c.advice.empty());
                CHECK(c.doc.starts_with("troubleshooting.md#doctor-"));
            }
        }
        std::string text = gpuverbs::format_report(r);
        CHECK(contains(text, "worst result: "));
    }
}

TEST_SUITE("choosing the NIC nearest a GPU") {
    TEST_CASE("an 8-GPU server: the two NICs on the GPU's switch first, then the same socket, the other socket last") {
        SysfsFixture f(topology("hgx-8gpu-pix.topo"));
        const gpuverbs::DoctorOptions o = fixture_options(f);
        const gpuverbs::NicChoice c = gpuverbs::choose_nic("0000:03:00.0", o);
        REQUIRE(c.ranked.size() == 8);
        CHECK(c.nearest() == "mlx5_0");
        CHECK(c.ranked[0].path == PciPath::pix);
        CHECK(c.ranked[1].nic == "mlx5_1");
        CHECK(c.ranked[1].path == PciPath::pix);
        CHECK(c.ranked.back().path == PciPath::sys); // never before a nearer one
        for (std::size_t i = 1; i < c.ranked.size(); ++i) {
            CHECK(static_cast<int>(*c.ranked[i - 1].path) <= static_cast<int>(*c.ranked[i].path));
        }
        CHECK(c.rails(2) == std::vector<std::string>{"mlx5_0", "mlx5_1"});
        CHECK(c.rails(20).size() == 8);
        CHECK(c.ranked[0].why == "mlx5_0: PIX, behind the same PCIe switch as the GPU");
        CHECK_MESSAGE(c.why.find("mlx5_0 is nearest to GPU 0000:03:00.0: PIX, behind the same PCIe switch as the "
                                 "GPU; as near: mlx5_1 PIX; farther: mlx5_2 NODE") == 0,
                      c.why);
        CHECK(contains(c.why, "mlx5_4 SYS"));
        // The doctor's conclusion for that GPU is the same device.
        DoctorReport r = diagnose_fixture(f);
        for (const auto& conclusion : r.conclusions) {
            if (conclusion.gpu == "0000:03:00.0") CHECK(conclusion.nic == "mlx5_0");
        }
    }

    TEST_CASE("the only NIC is on the other socket: chosen, and the words say what it costs") {
        SysfsFixture f(topology("two-socket-sys.topo"));
        const gpuverbs::DoctorOptions o = fixture_options(f);
        const gpuverbs::NicChoice c = gpuverbs::choose_nic("0000:3b:00.0", o);
        CHECK(c.nearest() == "mlx5_0");
        CHECK(c.why == "mlx5_0 is nearest to GPU 0000:3b:00.0: SYS, across the CPU interconnect, on another NUMA node");
        // A GPU that is not there is named, alike in the three forms.
        const std::string what = gpuverbs::test::check_fails_alike(
            gpuverbs::errc::invalid_argument, [&] { return gpuverbs::choose_nic("0000:99:00.0", o); },
            [&](std::error_code& ec) {
                const gpuverbs::NicChoice none = gpuverbs::choose_nic("0000:99:00.0", o, ec);
                CHECK(none.ranked.empty());
                return none;
            },
            [&](std::error_code& ec, gpuverbs::Diagnostics& d) {
                return gpuverbs::choose_nic("0000:99:00.0", o, ec, d);
            });
        CHECK_MESSAGE(what.starts_with("choose_nic: no PCI device 0000:99:00.0 under " + o.sys_root), what);
        gpuverbs::test::check_succeeds_clean(
            [&](std::error_code& ec) { CHECK(gpuverbs::choose_nic("0000:3b:00.0", o, ec).nearest() == "mlx5_0"); },
            [&](std::error_code& ec, gpuverbs::Diagnostics& d) {
                CHECK(gpuverbs::choose_nic("0000:3b:00.0", o, ec, d).nearest() == "mlx5_0");
            });
    }

    TEST_CASE("pure ranking: never across the CPU interconnect when a nearer device exists; software devices last") {
        using gpuverbs::GpuNicPath;
        std::vector<GpuNicPath> paths{{"g", "rxe0", std::nullopt, {}},
                                      {"g", "far", PciPath::sys, {}},
                                      {"g", "host", PciPath::phb, {}},
                                      {"g", "node", PciPath::node, {}}};
        gpuverbs::NicChoice c = gpuverbs::detail::rank_nics("g", paths);
        std::vector<std::string> order;
        for (const auto& n : c.ranked) order.push_back(n.nic);
        CHECK(order == std::vector<std::string>{"host", "node", "far", "rxe0"});
        CHECK(c.ranked.back().why ==
              "rxe0: no PCIe location, a software device such as Soft-RoCE: its distance is unknown");
        // Equally near: the one fewer GPUs use first (the doctor spreads GPUs over NICs), else by name.
        std::vector<GpuNicPath> two{{"g", "b", PciPath::pix, {}}, {"g", "a", PciPath::pix, {}}};
        CHECK(gpuverbs::detail::rank_nics("g", two).nearest() == "a");
        CHECK(gpuverbs::detail::rank_nics("g", two, {{"a", 1}}).nearest() == "b");
        CHECK(gpuverbs::detail::rank_nics("g", {}).why == "no RDMA device: GPU g has no NIC to use");
    }
}
