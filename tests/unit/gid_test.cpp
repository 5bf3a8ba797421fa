#include "gpuverbs/verbs/gid.hpp"

#include <doctest/doctest.h>

#include <vector>

using gpuverbs::Gid;
using gpuverbs::GidEntry;
using gpuverbs::GidType;
using gpuverbs::LinkLayer;

namespace {

Gid gid(const char* text) {
    auto g = Gid::parse(text);
    REQUIRE_MESSAGE(g.has_value(), text);
    return *g;
}

GidEntry entry(std::uint32_t index, const char* text, GidType type) {
    return GidEntry{index, 1, gid(text), type, 3};
}

} // namespace

TEST_SUITE("gid") {
    TEST_CASE("a GID parses from and prints to its IPv6 text form") {
        CHECK(gid("::ffff:10.0.0.1").to_string() == "::ffff:10.0.0.1");
        CHECK(gid("fe80::e478:4aff:fec3:dd51").to_string() == "fe80::e478:4aff:fec3:dd51");
        CHECK(gid("fe80::1").bytes[0] == 0xfe);
        CHECK_FALSE(Gid::parse("10.0.0.1").has_value());
        CHECK_FALSE(Gid::parse("not a gid").has_value());
    }

    TEST_CASE("a GID converts to and from ibv_gid without changing a byte") {
        Gid g = gid("2001:db8::ffff:1");
        ibv_gid raw = g.to_native();
        CHECK(Gid::from_native(raw) == g);
        CHECK(raw.raw[0] == 0x20);
        CHECK(raw.raw[15] == 0x01);
    }

    TEST_CASE("an IPv4-mapped GID reports its IPv4 address") {
        Gid g = gid("::ffff:10.0.0.2");
        CHECK(g.is_ipv4_mapped());
        CHECK_FALSE(g.is_link_local());
        REQUIRE(g.ipv4().has_value());
        CHECK(*g.ipv4() == std::array<std::uint8_t, 4>{10, 0, 0, 2});
        CHECK_FALSE(gid("fe80::1").ipv4().has_value());
        CHECK_FALSE(gid("::1").is_ipv4_mapped());
    }

    TEST_CASE("link-local and zero GIDs are recognised") {
        CHECK(gid("fe80::1").is_link_local());
        CHECK(gid("febf::1").is_link_local());
        CHECK_FALSE(gid("fec0::1").is_link_local());
        CHECK(Gid{}.is_zero());
        CHECK_FALSE(gid("::1").is_zero());
    }

    TEST_CASE("on RoCE the RoCE v2 IPv4-mapped GID is chosen over link-local and v1 entries") {
        std::vector<GidEntry> table{
            entry(0, "fe80::1", GidType::roce_v1),         entry(1, "fe80::1", GidType::roce_v2),
            entry(2, "::ffff:10.0.0.1", GidType::roce_v1), entry(3, "::ffff:10.0.0.1", GidType::roce_v2),
            entry(4, "2001:db8::1", GidType::roce_v2),
        };
        auto chosen = gpuverbs::select_gid(table, LinkLayer::ethernet);
        REQUIRE(chosen.has_value());
        CHECK(chosen->index == 3);
    }

    TEST_CASE("on RoCE a global IPv6 v2 GID beats a link-local one when no IPv4 is configured") {
        std::vector<GidEntry> table{
            entry(0, "fe80::1", GidType::roce_v2),
            entry(1, "2001:db8::1", GidType::roce_v2),
        };
        auto chosen = gpuverbs::select_gid(table, LinkLayer::ethernet);
        REQUIRE(chosen.has_value());
        CHECK(chosen->index == 1);
    }

    TEST_CASE("on RoCE a v1 GID is chosen only when the port has no v2 entry") {
        std::vector<GidEntry> table{
            entry(0, "fe80::1", GidType::roce_v1),
            entry(1, "::ffff:192.168.1.5", GidType::roce_v1),
        };
        auto chosen = gpuverbs::select_gid(table, LinkLayer::ethernet);
        REQUIRE(chosen.has_value());
        CHECK(chosen->index == 1);
        CHECK(chosen->type == GidType::roce_v1);
    }

    TEST_CASE("on InfiniBand the lowest-index IB GID is chosen") {
        std::vector<GidEntry> table{
            entry(2, "fe80::2:c903:a:1", GidType::ib),
            entry(0, "fe80::2:c903:a:0", GidType::ib),
        };
        auto chosen = gpuverbs::select_gid(table, LinkLayer::infiniband);
        REQUIRE(chosen.has_value());
        CHECK(chosen->index == 0);
    }

    TEST_CASE("zero GIDs, empty tables and wrong-protocol entries select nothing") {
        CHECK_FALSE(gpuverbs::select_gid({}, LinkLayer::ethernet).has_value());
        std::vector<GidEntry> zero{GidEntry{0, 1, Gid{}, GidType::roce_v2, 0}};
        CHECK_FALSE(gpuverbs::select_gid(zero, LinkLayer::ethernet).has_value());
        std::vector<GidEntry> ib{entry(0, "fe80::1", GidType::ib)};
        CHECK_FALSE(gpuverbs::select_gid(ib, LinkLayer::ethernet).has_value());
        std::vector<GidEntry> roce{entry(0, "fe80::1", GidType::roce_v2)};
        CHECK_FALSE(gpuverbs::select_gid(roce, LinkLayer::infiniband).has_value());
    }

    TEST_CASE("an IPv4 preference picks the GID carrying that address or nothing") {
        std::vector<GidEntry> table{
            entry(1, "::ffff:10.0.0.1", GidType::roce_v2),
            entry(2, "::ffff:172.16.0.9", GidType::roce_v2),
        };
        gpuverbs::GidPreference want{std::array<std::uint8_t, 4>{172, 16, 0, 9}};
        auto chosen = gpuverbs::select_gid(table, LinkLayer::ethernet, want);
        REQUIRE(chosen.has_value());
        CHECK(chosen->index == 2);
        gpuverbs::GidPreference absent{std::array<std::uint8_t, 4>{10, 9, 9, 9}};
        CHECK_FALSE(gpuverbs::select_gid(table, LinkLayer::ethernet, absent).has_value());
    }

    TEST_CASE("GID types and link layers print the names ibv_devinfo uses") {
        CHECK(gpuverbs::to_string(GidType::roce_v2) == "RoCE v2");
        CHECK(gpuverbs::to_string(GidType::roce_v1) == "RoCE v1");
        CHECK(gpuverbs::to_string(GidType::ib) == "IB");
        CHECK(gpuverbs::to_string(LinkLayer::ethernet) == "Ethernet");
        CHECK(gpuverbs::to_string(LinkLayer::infiniband) == "InfiniBand");
    }
}
