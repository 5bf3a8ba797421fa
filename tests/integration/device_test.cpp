// Device against the rig's two real RDMA devices (rxe0/rxe1 on Soft-RoCE).
#include "gpuverbs/verbs/device.hpp"

#include "rig.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using gpuverbs::Device;
using gpuverbs::errc;

namespace {

const gpuverbs::test::RigDevices& rig() {
    static const auto r = gpuverbs::test::rig_devices();
    REQUIRE_MESSAGE(r.has_value(), "run through tests/softroce/run");
    return *r;
}

bool soft_roce() {
    return rig().rig == "vm" || rig().rig == "native";
}

} // namespace

TEST_SUITE("device on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("list() reports both rig devices with their GUIDs and transport") {
        auto devices = Device::list();
        for (const std::string& name : {rig().dev0, rig().dev1}) {
            auto it = std::find_if(devices.begin(), devices.end(), [&](const auto& d) { return d.name == name; });
            REQUIRE_MESSAGE(it != devices.end(), name);
            CHECK(it->node_guid != 0);
            CHECK(it->transport == gpuverbs::Transport::infiniband); // RoCE speaks the IB transport
            CHECK(it->node_type == gpuverbs::NodeType::ca);
        }
    }

    TEST_CASE("an opened device reports real attributes") {
        Device dev = Device::open(rig().dev0);
        REQUIRE(dev);
        CHECK(dev.name() == rig().dev0);
        CHECK(dev.native_handle() != nullptr);
        gpuverbs::DeviceAttributes a = dev.query();
        CHECK(a.port_count >= 1);
        CHECK(a.max_qp > 0);
        CHECK(a.max_qp_wr > 0);
        CHECK(a.max_sge > 0);
        CHECK(a.max_mr_size > 0);
        CHECK(a.max_cqe > 0);
        auto listed = Device::list();
        auto it = std::find_if(listed.begin(), listed.end(), [&](const auto& d) { return d.name == rig().dev0; });
        REQUIRE(it != listed.end());
        CHECK(a.node_guid == it->node_guid);
        if (soft_roce()) {
            CHECK(a.vendor_id == 0xffffff); // rxe's vendor id
            CHECK(a.atomics);
        }
    }

    TEST_CASE("the rig's ports are ACTIVE, and Soft-RoCE ports are Ethernet with MTU 4096") {
        for (const std::string& name : {rig().dev0, rig().dev1}) {
            Device dev = Device::open(name);
            gpuverbs::PortAttributes p = dev.query_port(rig().port);
            CHECK(p.port == rig().port);
            CHECK(p.state == gpuverbs::PortState::active);
            CHECK(p.speed_gbps > 0);
            CHECK(p.gid_table_length > 0);
            if (soft_roce()) {
                CHECK(p.link_layer == gpuverbs::LinkLayer::ethernet);
                CHECK(p.lid == 0);
                CHECK(gpuverbs::mtu_bytes(p.active_mtu) == 4096); // veth MTU 4200 in setup-rxe
                CHECK(p.speed_gbps == doctest::Approx(10));       // veth: 1X FDR10
            }
        }
    }

    TEST_CASE("GID index from the rig is the RoCE v2 IPv4-mapped address of the device") {
        if (!rig().gid_index) return; // InfiniBand rig: no RoCE GID
        Device dev = Device::open(rig().dev0);
        auto table = dev.gid_table(rig().port);
        auto it = std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.index == *rig().gid_index; });
        REQUIRE(it != table.end());
        CHECK(it->type == gpuverbs::GidType::roce_v2);
        CHECK(it->gid.to_string() == "::ffff:" + rig().ip0);
        CHECK(it->port == rig().port);
        CHECK(it->netdev_ifindex != 0);
        if (soft_roce()) {
            CHECK(it->index == 1);
            REQUIRE(table.size() >= 2);
            CHECK(table[0].gid.is_link_local()); // rxe: 0 is the MAC-derived link-local GID
            CHECK(table[0].type == gpuverbs::GidType::roce_v2);
        }
    }

    TEST_CASE("select_gid picks the RoCE v2 IPv4-mapped GID on each device") {
        if (!rig().gid_index) return;
        for (auto [name, ip] : {std::pair{rig().dev0, rig().ip0}, std::pair{rig().dev1, rig().ip1}}) {
            Device dev = Device::open(name);
            gpuverbs::GidEntry g = dev.select_gid(rig().port);
            CHECK(g.index == *rig().gid_index);
            CHECK(g.type == gpuverbs::GidType::roce_v2);
            CHECK(g.gid.ipv4() == gpuverbs::test::parse_ipv4(ip));
        }
    }

    TEST_CASE("select_gid for an address the port does not have says what the table holds") {
        if (!rig().gid_index) return;
        Device dev = Device::open(rig().dev0);
        gpuverbs::GidPreference other{std::array<std::uint8_t, 4>{192, 0, 2, 77}};
        std::error_code ec;
        (void)dev.select_gid(rig().port, other, ec);
        CHECK(ec == errc::gid_not_found);
        try {
            (void)dev.select_gid(rig().port, other);
            FAIL("select_gid did not throw");
        } catch (const gpuverbs::Error& e) {
            std::string what = e.what();
            CHECK(what.find(rig().dev0 + " port 1 has no RoCE GID with address 192.0.2.77") != std::string::npos);
            CHECK(what.find("::ffff:" + rig().ip0) != std::string::npos);
        }
    }

    TEST_CASE("querying a port the device does not have names the valid range") {
        Device dev = Device::open(rig().dev0);
        auto ports = dev.query().port_count;
        std::error_code ec;
        (void)dev.query_port(static_cast<std::uint8_t>(ports + 1), ec);
        CHECK(ec == errc::port_not_found);
        CHECK(ec == std::errc::no_such_device);
        try {
            (void)dev.query_port(0);
            FAIL("port 0 accepted");
        } catch (const gpuverbs::Error& e) {
            CHECK(std::string(e.what()) ==
                  "ibv_query_port: " + rig().dev0 + " has no port 0 (ports are 1.." + std::to_string(ports) + ")");
        }
    }

    TEST_CASE("opening an unknown device lists the devices present") {
        try {
            (void)Device::open("mlx5_99");
            FAIL("open did not throw");
        } catch (const gpuverbs::Error& e) {
            CHECK(e.code() == errc::device_not_found);
            std::string what = e.what();
            CHECK(what.find("no RDMA device named 'mlx5_99'; devices present: ") != std::string::npos);
            CHECK(what.find(rig().dev0) != std::string::npos);
            CHECK(what.find(rig().dev1) != std::string::npos);
        }
    }

    TEST_CASE("open_first opens a device and moves leave the source empty") {
        Device a = Device::open_first();
        REQUIRE(a);
        std::string name = a.name();
        Device b = std::move(a);
        CHECK_FALSE(a); // NOLINT(bugprone-use-after-move): the moved-from state is the point
        CHECK(b.name() == name);
        std::error_code ec;
        (void)a.query(ec); // NOLINT(bugprone-use-after-move)
        CHECK(ec == errc::invalid_argument);
        CHECK(b.query_port(1).state == gpuverbs::PortState::active);
    }

    TEST_CASE("many devices can be open at once and closed in any order") {
        std::vector<Device> devices;
        devices.reserve(8);
        for (int i = 0; i < 8; ++i) devices.push_back(Device::open(i % 2 ? rig().dev1 : rig().dev0));
        devices.erase(devices.begin() + 3);
        devices.erase(devices.begin());
        for (auto& d : devices) CHECK(d.query().max_qp > 0);
    }
}
