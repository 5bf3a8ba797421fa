// The serialized forms of what peers exchange to connect: Endpoint,
// RemoteMemory, and the Handshake that carries one Endpoint and up to
// max_regions RemoteMemory records. Fixed layouts, big-endian, versioned:
//
//   Endpoint (40 bytes)      "GVEP" u16 version u16 0 | u32 qp_num | u32 psn | u16 lid |
//                            u8 mtu (ibv_mtu) | u8 link_layer | 16-byte GID | u32 0
//   RemoteMemory (28 bytes)  "GVRM" u16 version u16 0 | u64 address | u64 length | u32 rkey
//   Handshake                "GVHS" u16 version u16 count | Endpoint | count × RemoteMemory
//
// Parsing checks sizes, magic, version, reserved fields and value ranges, and
// fails with errc::malformed_record or errc::unsupported_version saying what
// was wrong; it never returns a half-parsed value.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/memory_region.hpp"
#include "gpuverbs/queue_pair_types.hpp"

#include <array>
#include <cstddef>
#include <span>
#include <system_error>
#include <vector>

namespace gpuverbs {

/// What one side tells the other to connect and to let it access memory.
struct Handshake {
    Endpoint endpoint;
    std::vector<RemoteMemory> regions;
    friend bool operator==(const Handshake&, const Handshake&) = default;
};

namespace wire {

inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t endpoint_size = 40;
inline constexpr std::size_t remote_memory_size = 28;
inline constexpr std::size_t handshake_header_size = 8;
inline constexpr std::size_t max_regions = 64;
inline constexpr std::size_t max_handshake_size =
    handshake_header_size + endpoint_size + max_regions * remote_memory_size;

std::array<std::byte, endpoint_size> serialize(const Endpoint& endpoint);
std::array<std::byte, remote_memory_size> serialize(const RemoteMemory& memory);
/// Throws gpuverbs::Error (errc::invalid_argument) with more than max_regions regions.
std::vector<std::byte> serialize(const Handshake& handshake);

Endpoint parse_endpoint(std::span<const std::byte> bytes);
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec);
Handshake parse_handshake(std::span<const std::byte> bytes);
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec);

namespace detail {
Endpoint parse_endpoint(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
Handshake parse_handshake(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
} // namespace detail

} // namespace wire
} // namespace gpuverbs
