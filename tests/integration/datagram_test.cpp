// Unreliable datagrams between rxe0 and rxe1.
#include "gpuverbs/datagram.hpp"
#include "connected_pair.hpp"

#include <doctest/doctest.h>

using namespace gpuverbs;
using gpuverbs::test::poll_for;

namespace {

bool rig_present() {
    return gpuverbs::test::rig_devices().has_value();
}

struct UdSide {
    Device device;
    ProtectionDomain pd{device};
    CompletionQueue cq{device, 256};
    std::vector<std::byte> memory = std::vector<std::byte>(1 << 16);
    MemoryRegion mr{pd, memory, access_all};
    UdQueuePair ud;
    explicit UdSide(const std::string& name, std::uint32_t qkey = UdQueuePair::default_qkey)
        : device(Device::open(name)) {
        ud = UdQueuePair(pd, cq, cq, {}, qkey);
    }
};

} // namespace

TEST_SUITE("unreliable datagrams on real RDMA" * doctest::skip(!rig_present())) {
    TEST_CASE("a datagram arrives after the 40-byte routing header, with the sender's QP number") {
        UdSide a(gpuverbs::test::rig_devices()->dev0), b(gpuverbs::test::rig_devices()->dev1);
        AddressHandle to_b(a.pd, a.ud, b.ud.endpoint());
        REQUIRE_FALSE(b.ud.post_receive(b.mr.slice(0, UdQueuePair::grh_size + 2048), 5));
        gpuverbs::test::fill_pattern(std::span(a.memory).first(1000), 8);
        REQUIRE_FALSE(a.ud.post_send(a.mr.slice(0, 1000), to_b, b.ud.qp_num(), b.ud.qkey(), {.context = 6}));
        auto sent = poll_for(a.cq, 1);
        REQUIRE(sent.size() == 1);
        CHECK(sent[0].ok());
        CHECK(sent[0].context == 6);
        auto got = poll_for(b.cq, 1);
        REQUIRE(got.size() == 1);
        CHECK(got[0].ok());
        CHECK(got[0].context == 5);
        CHECK(got[0].opcode == Opcode::receive);
        CHECK(got[0].byte_length == UdQueuePair::grh_size + 1000);
        CHECK(got[0].source_qp == a.ud.qp_num());
        CHECK(gpuverbs::test::has_pattern(std::span(b.memory).subspan(UdQueuePair::grh_size, 1000), 8));
    }

    TEST_CASE("datagrams carry immediate data") {
        UdSide a(gpuverbs::test::rig_devices()->dev0), b(gpuverbs::test::rig_devices()->dev1);
        AddressHandle to_b(a.pd, a.ud, b.ud.endpoint());
        REQUIRE_FALSE(b.ud.post_receive(b.mr.slice(0, UdQueuePair::grh_size + 64)));
        REQUIRE_FALSE(a.ud.post_send_with_imm(a.mr.slice(0, 16), to_b, b.ud.qp_num(), b.ud.qkey(), 0x1234));
        auto got = poll_for(b.cq, 1);
        REQUIRE(got.size() == 1);
        CHECK(got[0].immediate == 0x1234u);
    }

    TEST_CASE("a datagram with the wrong Q_Key is dropped by the receiver, as UD allows") {
        UdSide a(gpuverbs::test::rig_devices()->dev0), b(gpuverbs::test::rig_devices()->dev1, 0x2222);
        AddressHandle to_b(a.pd, a.ud, b.ud.endpoint());
        REQUIRE_FALSE(b.ud.post_receive(b.mr.slice(0, UdQueuePair::grh_size + 64)));
        REQUIRE_FALSE(a.ud.post_send(a.mr.slice(0, 16), to_b, b.ud.qp_num(), 0x3333));
        CHECK(poll_for(a.cq, 1).at(0).ok()); // the sender cannot know
        CHECK(poll_for(b.cq, 1, std::chrono::milliseconds(300)).empty());
        // The right key gets through on the same receive.
        REQUIRE_FALSE(a.ud.post_send(a.mr.slice(0, 16), to_b, b.ud.qp_num(), 0x2222));
        CHECK(poll_for(b.cq, 1).size() == 1);
    }

    TEST_CASE("a datagram longer than the MTU is refused locally") {
        UdSide a(gpuverbs::test::rig_devices()->dev0), b(gpuverbs::test::rig_devices()->dev1);
        AddressHandle to_b(a.pd, a.ud, b.ud.endpoint());
        std::uint32_t mtu = mtu_bytes(a.ud.endpoint().mtu);
        CHECK(a.ud.post_send(a.mr.slice(0, mtu + 1), to_b, b.ud.qp_num(), b.ud.qkey()) == errc::invalid_argument);
        CHECK_FALSE(a.ud.post_send(a.mr.slice(0, mtu), to_b, b.ud.qp_num(), b.ud.qkey()));
        CHECK(poll_for(a.cq, 1).size() == 1);
    }
}
