#include "gpuverbs/verbs/gid.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace gpuverbs {

std::string_view to_string(GidType type) noexcept {
    switch (type) {
        case GidType::ib: return "IB";
        case GidType::roce_v1: return "RoCE v1";
        case GidType::roce_v2: return "RoCE v2";
    }
    return "unknown";
}

std::string_view to_string(LinkLayer layer) noexcept {
    switch (layer) {
        case LinkLayer::unspecified: return "unspecified";
        case LinkLayer::infiniband: return "InfiniBand";
        case LinkLayer::ethernet: return "Ethernet";
    }
    return "unknown";
}

Gid Gid::from_native(const ibv_gid& gid) noexcept {
    Gid g;
    std::memcpy(g.bytes.data(), gid.raw, g.bytes.size());
    return g;
}

ibv_gid Gid::to_native() const noexcept {
    ibv_gid gid{};
    std::memcpy(gid.raw, bytes.data(), bytes.size());
    return gid;
}

std::optional<Gid> Gid::parse(std::string_view text) {
    std::string s(text);
    Gid g;
    if (inet_pton(AF_INET6, s.c_str(), g.bytes.data()) != 1) return std::nullopt;
    return g;
}

bool Gid::is_zero() const noexcept {
    return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

bool Gid::is_ipv4_mapped() const noexcept {
    return std::all_of(bytes.begin(), bytes.begin() + 10, [](std::uint8_t b) { return b == 0; }) && bytes[10] == 0xff &&
           bytes[11] == 0xff;
}

bool Gid::is_link_local() const noexcept {
    return bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80;
}

std::optional<std::array<std::uint8_t, 4>> Gid::ipv4() const noexcept {
    if (!is_ipv4_mapped()) return std::nullopt;
    return std::array<std::uint8_t, 4>{bytes[12], bytes[13], bytes[14], bytes[15]};
}

std::string Gid::to_string() const {
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, bytes.data(), text, sizeof text);
    return text;
}

namespace {

// Lower is better; max() means "never".
unsigned rank(const GidEntry& e, LinkLayer link_layer, const GidPreference& preference) {
    constexpr unsigned never = std::numeric_limits<unsigned>::max();
    if (e.gid.is_zero()) return never;
    if (preference.ipv4 && e.gid.ipv4() != preference.ipv4) return never;
    if (link_layer != LinkLayer::ethernet) return e.type == GidType::ib ? 0 : never;
    if (e.type == GidType::ib) return never;
    unsigned address_rank = e.gid.is_ipv4_mapped() ? 0 : e.gid.is_link_local() ? 2 : 1;
    return (e.type == GidType::roce_v2 ? 0 : 3) + address_rank;
}

} // namespace

std::optional<GidEntry> select_gid(std::span<const GidEntry> table, LinkLayer link_layer,
                                   const GidPreference& preference) {
    const GidEntry* best = nullptr;
    unsigned best_rank = std::numeric_limits<unsigned>::max();
    for (const GidEntry& e : table) {
        unsigned r = rank(e, link_layer, preference);
        if (r < best_rank || (r == best_rank && best != nullptr && e.index < best->index)) {
            best = &e;
            best_rank = r;
        }
    }
    if (best == nullptr || best_rank == std::numeric_limits<unsigned>::max()) return std::nullopt;
    return *best;
}

} // namespace gpuverbs
