// Unreliable datagrams between rxe0 and rxe1.
#include "gpuverbs/verbs/datagram.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

using namespace gpuverbs;
using gpuverbs::test::poll_for;

namespace {

struct UdSide {
    Device device;
    ProtectionDomain pd{device};
    CompletionQueue cq{device, 256};
    std::vector<std::byte> memory = std::vector<std::byte>(1 << 16);
    MemoryRegion mr{pd, memory, access_all};
    UdQueuePair ud;
    explicit UdSide(const std::string& name, std::optional<std::uint32_t> qkey = std::nullopt)
        : device(Device::open(name)) {
        ud = UdQueuePair(pd, cq, cq, {}, qkey);
    }
};

} // namespace

TEST_SUITE("unreliable datagrams on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
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

    TEST_CASE("the error_code forms of UD set-up make a queue pair and an address handle that carry a datagram") {
        const auto rig = *gpuverbs::test::rig_devices();
        UdSide a(rig.dev0), b(rig.dev1);
        std::error_code ec = make_error_code(errc::invalid_argument); // must be cleared on success
        UdQueuePair sender = UdQueuePair::create(a.pd, a.cq, a.cq, {}, ec);
        REQUIRE_FALSE(ec);
        REQUIRE(sender);
        // Its qkey is random (31 bits: never a controlled qkey), not the well-known 0x11111111.
        CHECK(sender.qkey() != UdQueuePair::default_qkey);
        CHECK(sender.qkey() < 0x80000000U);
        CHECK(sender.qkey() != a.ud.qkey());
        UdQueuePair receiver = UdQueuePair::create(b.pd, b.cq, b.cq, {}, 0x4444, ec);
        REQUIRE_FALSE(ec);
        CHECK(receiver.qkey() == 0x4444u);
        ec = make_error_code(errc::invalid_argument);
        AddressHandle to_b = AddressHandle::create(a.pd, sender, receiver.endpoint(), ec);
        REQUIRE_FALSE(ec);
        REQUIRE(to_b);
        REQUIRE_FALSE(receiver.post_receive(b.mr.slice(0, UdQueuePair::grh_size + 64), 9));
        REQUIRE_FALSE(sender.post_send(a.mr.slice(0, 32), to_b, receiver.qp_num(), receiver.qkey()));
        CHECK(poll_for(a.cq, 1).at(0).ok());
        auto got = poll_for(b.cq, 1);
        REQUIRE(got.size() == 1);
        CHECK(got[0].context == 9);
        CHECK(got[0].source_qp == sender.qp_num());
    }

    TEST_CASE(
        "a UD queue pair on a port the device lacks: create returns port_not_found and an empty QP, the "
        "constructor throws it") {
        UdSide a(gpuverbs::test::rig_devices()->dev0);
        QueuePairOptions options;
        options.port = 99;
        std::error_code ec;
        UdQueuePair ud = UdQueuePair::create(a.pd, a.cq, a.cq, options, ec);
        CHECK(ec == errc::port_not_found);
        CHECK_FALSE(ud);
        CHECK(gpuverbs::test::thrown_code([&] { (void)UdQueuePair(a.pd, a.cq, a.cq, options); }) == ec);
        CHECK_THROWS_WITH_AS(UdQueuePair(a.pd, a.cq, a.cq, options), doctest::Contains("has no port 99"), Error);
    }

    TEST_CASE("a UD queue pair deeper than the device allows: both forms give ibv_create_qp's errno and say why") {
        UdSide a(gpuverbs::test::rig_devices()->dev0);
        QueuePairOptions options;
        options.max_send_wr = 1u << 30;
        std::error_code ec;
        UdQueuePair ud = UdQueuePair::create(a.pd, a.cq, a.cq, options, ec);
        REQUIRE(ec);
        CHECK(ec.category() == std::system_category());
        CHECK_FALSE(ud);
        CHECK(gpuverbs::test::thrown_code([&] { (void)UdQueuePair(a.pd, a.cq, a.cq, options); }) == ec);
        try {
            UdQueuePair thrown(a.pd, a.cq, a.cq, options);
            FAIL("a UD queue pair of 2^30 sends was created");
        } catch (const Error& e) {
            CHECK(e.verb() == "ibv_create_qp");
            std::string what = e.what();
            CHECK_MESSAGE(what.find("cannot create a UD queue pair on " + a.device.name() +
                                    " with max_send_wr=1073741824") != std::string::npos,
                          what);
            CHECK_MESSAGE(what.find("(errno " + std::to_string(ec.value()) + ")") != std::string::npos, what);
        }
    }

    TEST_CASE("a UD queue pair from an empty protection domain: both forms give invalid_argument") {
        UdSide a(gpuverbs::test::rig_devices()->dev0);
        ProtectionDomain empty;
        std::error_code ec;
        CHECK_FALSE(UdQueuePair::create(empty, a.cq, a.cq, {}, ec));
        CHECK(ec == errc::invalid_argument);
        CHECK(gpuverbs::test::thrown_code([&] { (void)UdQueuePair(empty, a.cq, a.cq); }) == ec);
    }

    TEST_CASE(
        "an address handle to an endpoint without a GID: create returns invalid_endpoint and an empty handle, "
        "the constructor throws it") {
        const auto rig = *gpuverbs::test::rig_devices();
        UdSide a(rig.dev0), b(rig.dev1);
        Endpoint no_gid = b.ud.endpoint();
        no_gid.gid = Gid{};
        no_gid.lid = 0; // nothing to route by, on RoCE and on InfiniBand
        std::error_code ec;
        AddressHandle ah = AddressHandle::create(a.pd, a.ud, no_gid, ec);
        CHECK(ec == errc::invalid_endpoint);
        CHECK_FALSE(ah);
        CHECK(ah.native_handle() == nullptr);
        CHECK(gpuverbs::test::thrown_code([&] { (void)AddressHandle(a.pd, a.ud, no_gid); }) == ec);
        CHECK_THROWS_WITH_AS(
            AddressHandle(a.pd, a.ud, no_gid),
            "ibv_create_ah: the remote endpoint has no GID to address it by: on RoCE the peer's port needs an "
            "IP address (its GID table has no RoCE entry)",
            Error);
    }

    TEST_CASE("an address handle from an empty UD queue pair: both forms give invalid_argument") {
        UdSide a(gpuverbs::test::rig_devices()->dev0);
        UdQueuePair empty;
        std::error_code ec;
        CHECK_FALSE(AddressHandle::create(a.pd, empty, a.ud.endpoint(), ec));
        CHECK(ec == errc::invalid_argument);
        CHECK(gpuverbs::test::thrown_code([&] { (void)AddressHandle(a.pd, empty, a.ud.endpoint()); }) == ec);
    }
}
