// Wire records of a connection: an endpoint, a remote memory, and the
// handshake that carries both (wire.hpp has the layouts).
#include "gpuverbs/connections/wire.hpp"

#include "wire_codec.hpp"

#include <string>

namespace gpuverbs::wire {

using namespace codec;

std::array<std::byte, endpoint_size> serialize(const Endpoint& endpoint) {
    std::array<std::byte, endpoint_size> out{};
    Writer w(out);
    write_endpoint(w, endpoint);
    return out;
}

std::array<std::byte, remote_memory_size> serialize(const RemoteMemory& memory) {
    std::array<std::byte, remote_memory_size> out{};
    Writer w(out);
    write_remote(w, memory);
    return out;
}

std::vector<std::byte> serialize(const Handshake& handshake) {
    if (handshake.regions.size() > max_regions) {
        throw Error(errc::invalid_argument, "gpuverbs::wire::serialize",
                    "a handshake carries at most " + std::to_string(max_regions) + " regions (got " +
                        std::to_string(handshake.regions.size()) + ")");
    }
    std::vector<std::byte> out(handshake_header_size + endpoint_size + handshake.regions.size() * remote_memory_size);
    Writer w(out);
    w.header(handshake_magic, version, static_cast<std::uint16_t>(handshake.regions.size()));
    write_endpoint(w, handshake.endpoint);
    for (const RemoteMemory& m : handshake.regions) write_remote(w, m);
    return out;
}

namespace detail {

Endpoint parse_endpoint(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, endpoint_size, true, endpoint_magic, "endpoint", status)) return {};
    const char* verb = "gpuverbs::wire::parse";
    if (r.u16() != 0) {
        status.fail(errc::malformed_record, verb, "endpoint record has a non-zero reserved field");
        return {};
    }
    Endpoint e;
    e.qp_num = r.u32();
    e.psn = r.u32();
    e.lid = r.u16();
    std::uint8_t mtu = r.u8();
    std::uint8_t link = r.u8();
    r.bytes(e.gid.bytes);
    std::uint32_t reserved = r.u32();
    if (e.qp_num == 0 || e.qp_num > 0xffffff || e.psn > 0xffffff) {
        status.fail(errc::malformed_record, verb, "endpoint record has a QP number or PSN outside 24 bits");
        return {};
    }
    if (mtu < 1 || mtu > 5) {
        status.fail(errc::malformed_record, verb,
                    "endpoint record has MTU code " + std::to_string(mtu) + " (valid: 1..5)");
        return {};
    }
    if (link > static_cast<std::uint8_t>(LinkLayer::ethernet) || reserved != 0) {
        status.fail(errc::malformed_record, verb, "endpoint record has an unknown link layer or reserved bits set");
        return {};
    }
    e.mtu = static_cast<Mtu>(mtu);
    e.link_layer = static_cast<LinkLayer>(link);
    return e;
}

RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, remote_memory_size, true, remote_magic, "remote memory", status)) return {};
    if (r.u16() != 0) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "remote memory record has a non-zero reserved field");
        return {};
    }
    RemoteMemory m;
    m.address = r.u64();
    m.length = r.u64();
    m.rkey = r.u32();
    if (m.length > ~m.address) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "remote memory record's address + length overflows 64 bits");
        return {};
    }
    return m;
}

Handshake parse_handshake(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, handshake_header_size + endpoint_size, false, handshake_magic, "handshake", status)) {
        return {};
    }
    std::uint16_t count = r.u16();
    std::size_t want = handshake_header_size + endpoint_size + std::size_t{count} * remote_memory_size;
    if (count > max_regions || bytes.size() != want) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "handshake record announces " + std::to_string(count) + " regions (at most " +
                        std::to_string(max_regions) + ") in " + std::to_string(bytes.size()) + " bytes; " +
                        std::to_string(count) + " regions need exactly " + std::to_string(want));
        return {};
    }
    Handshake h;
    h.endpoint = parse_endpoint(bytes.subspan(handshake_header_size, endpoint_size), status);
    if (!status.ok()) return {};
    for (std::size_t i = 0; i < count; ++i) {
        h.regions.push_back(parse_remote_memory(
            bytes.subspan(handshake_header_size + endpoint_size + i * remote_memory_size, remote_memory_size), status));
        if (!status.ok()) return {};
    }
    return h;
}

} // namespace detail

Endpoint parse_endpoint(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_endpoint(bytes, s); });
}
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec, [&](gpuverbs::detail::Status& s) { return detail::parse_endpoint(bytes, s); });
}
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(ec, diagnostics,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_endpoint(bytes, s); });
}
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw(
        [&](gpuverbs::detail::Status& s) { return detail::parse_remote_memory(bytes, s); });
}
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(
        ec, [&](gpuverbs::detail::Status& s) { return detail::parse_remote_memory(bytes, s); });
}
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(
        ec, diagnostics, [&](gpuverbs::detail::Status& s) { return detail::parse_remote_memory(bytes, s); });
}
Handshake parse_handshake(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_handshake(bytes, s); });
}
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_handshake(bytes, s); });
}
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(ec, diagnostics,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_handshake(bytes, s); });
}

} // namespace gpuverbs::wire
