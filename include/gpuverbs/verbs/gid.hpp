// GIDs: the 128-bit port addresses of InfiniBand and RoCE, their types, and
// the rule that picks the one a connection should use.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace gpuverbs {

/// How a port's link is framed; RoCE devices report ethernet.
enum class LinkLayer : std::uint8_t { unspecified, infiniband, ethernet };

/// The protocol a GID table entry belongs to.
enum class GidType : std::uint8_t {
    ib,      ///< native InfiniBand
    roce_v1, ///< RoCE v1: Ethernet frames, not routable
    roce_v2, ///< RoCE v2: UDP/IP, routable; what RoCE users almost always want
};

std::string_view to_string(GidType type) noexcept;
std::string_view to_string(LinkLayer layer) noexcept;

/// A GID value. Byte order is the wire's (network) order.
struct Gid {
    std::array<std::uint8_t, 16> bytes{};

    static Gid from_native(const ibv_gid& gid) noexcept;
    [[nodiscard]] ibv_gid to_native() const noexcept;

    /// Parses the IPv6 text form ("fe80::1", "::ffff:10.0.0.1").
    static std::optional<Gid> parse(std::string_view text);

    [[nodiscard]] bool is_zero() const noexcept;
    /// ::ffff:a.b.c.d, the form RoCE v2 uses for an IPv4 address.
    [[nodiscard]] bool is_ipv4_mapped() const noexcept;
    /// fe80::/10, derived from the MAC address; not routable.
    [[nodiscard]] bool is_link_local() const noexcept;
    /// The IPv4 address of an IPv4-mapped GID.
    [[nodiscard]] std::optional<std::array<std::uint8_t, 4>> ipv4() const noexcept;
    /// IPv6 text form, e.g. "::ffff:10.0.0.1".
    [[nodiscard]] std::string to_string() const;

    friend bool operator==(const Gid&, const Gid&) = default;
};

/// One valid entry of a port's GID table.
struct GidEntry {
    std::uint32_t index = 0;
    std::uint8_t port = 0;
    Gid gid;
    GidType type = GidType::ib;
    /// The network interface behind a RoCE GID (0 on InfiniBand).
    std::uint32_t netdev_ifindex = 0;
};

/// What select_gid should look for beyond its defaults.
struct GidPreference {
    /// Only GIDs carrying this IPv4 address (RoCE), e.g. to pick the address
    /// a peer can route to on a multi-homed port.
    std::optional<std::array<std::uint8_t, 4>> ipv4;
};

/// Picks the GID a connection should use, the way RDMA users expect:
/// on InfiniBand the lowest-index IB GID (normally index 0); on Ethernet
/// (RoCE) a RoCE v2 GID, preferring an IPv4-mapped address, then a global
/// IPv6 address, then link-local, and RoCE v1 only when no v2 entry exists.
/// Ties go to the lowest index. Zero GIDs never match. Pure function.
std::optional<GidEntry> select_gid(std::span<const GidEntry> table, LinkLayer link_layer,
                                   const GidPreference& preference = {});

} // namespace gpuverbs
