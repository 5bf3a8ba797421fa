// The serialized forms of what peers exchange to connect: Endpoint,
// RemoteMemory, and the Handshake that carries one Endpoint and up to
// max_regions RemoteMemory records. Fixed layouts, big-endian, versioned:
//
//   Endpoint (40 bytes)      "GVEP" u16 version u16 0 | u32 qp_num | u32 psn | u16 lid |
//                            u8 mtu (ibv_mtu) | u8 link_layer | 16-byte GID | u32 0
//   RemoteMemory (28 bytes)  "GVRM" u16 version u16 0 | u64 address | u64 length | u32 rkey
//   Handshake                "GVHS" u16 version u16 count | Endpoint | count × RemoteMemory
//   MeshRecord               "GVMR" u16 version u16 regions | u32 rank | u32 world size |
//                            u32 endpoints | u32 0 | endpoints × (u32 peer rank | u32 0 | Endpoint) |
//                            regions × RemoteMemory
//   Block list               "GVBL" u16 version u16 regions | u32 blocks | u32 0 | regions × RemoteMemory |
//                            blocks × (u16 region index | u16 0 | u32 0 | u64 offset | u64 length)
//   Leased block list        "GVLL" u16 version u16 0 | u64 list version | u32 lease | u32 lease ms |
//                            Block list (the rest of the record)
//
// Parsing checks sizes, magic, version, reserved fields and value ranges, and
// fails with errc::malformed_record or errc::unsupported_version saying what
// was wrong; it never returns a half-parsed value.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace gpuverbs {

/// What one side tells the other to connect and to let it access memory.
struct Handshake {
    Endpoint endpoint;
    std::vector<RemoteMemory> regions;
    friend bool operator==(const Handshake&, const Handshake&) = default;
};

/// A block list under a lease (transfers/leases.hpp): the owner keeps the
/// blocks as they are until the reader releases the lease (the transfer's
/// notification carries its id) or it expires; the list's version lets a
/// reader refuse a list older than one it already had from that owner.
/// What a leased list's blocks let the reader reach (LeasedBlockList::scope).
enum class LeaseScope : std::uint16_t {
    /// Each block names its whole region: the reader can reach every byte of
    /// those regions (within their access) for as long as they are registered.
    whole_regions = 0,
    /// Each block names a region registered for this lease alone, over its
    /// run of contiguous blocks: the reader can reach exactly the leased
    /// bytes, and nothing once the lease has ended (BlockLeases::grant with a
    /// protection domain).
    lease_regions = 1,
};

struct LeasedBlockList {
    std::uint64_t version = 0; ///< grows with every list the owner hands out
    std::uint32_t lease = 0;   ///< the id the reader's notification carries back
    /// How long after the reader receives the list it may still use the
    /// blocks (the owner waits longer: BlockLeasesOptions::grace).
    std::chrono::milliseconds ttl{0};
    std::vector<RemoteBlock> blocks;
    LeaseScope scope = LeaseScope::whole_regions;
    friend bool operator==(const LeasedBlockList&, const LeasedBlockList&) = default;
};

/// What one member of a mesh publishes once (rendezvous.hpp): for every peer
/// the endpoint of the queue pair it prepared for that peer, and the memory
/// every peer may access. Each pair agrees on one QP pair: p's QP for q
/// connects to q's QP for p. O(N) bytes per member, read once by each peer.
struct MeshRecord {
    std::uint32_t rank = 0;
    std::uint32_t world_size = 0;
    /// (peer rank, endpoint of my QP for that peer), peer ranks strictly increasing.
    std::vector<std::pair<std::uint32_t, Endpoint>> endpoints;
    std::vector<RemoteMemory> regions;
    /// The endpoint addressed to `peer`, or nullptr.
    [[nodiscard]] const Endpoint* endpoint_for(std::uint32_t peer) const noexcept;
    friend bool operator==(const MeshRecord&, const MeshRecord&) = default;
};

namespace wire {

inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t endpoint_size = 40;
inline constexpr std::size_t remote_memory_size = 28;
inline constexpr std::size_t handshake_header_size = 8;
inline constexpr std::size_t max_regions = 64;
inline constexpr std::size_t max_handshake_size =
    handshake_header_size + endpoint_size + max_regions * remote_memory_size;
inline constexpr std::size_t mesh_header_size = 24;
inline constexpr std::size_t mesh_entry_size = 8 + endpoint_size;
inline constexpr std::size_t block_list_header_size = 16;
inline constexpr std::size_t block_entry_size = 24;
inline constexpr std::size_t leased_header_size = 24;
/// The most blocks one list carries (a KV-cache request is hundreds to thousands).
inline constexpr std::uint32_t max_blocks = 1u << 20;
/// The largest mesh a record describes (ranks 0 .. max_world_size - 1).
inline constexpr std::uint32_t max_world_size = 65536;
inline constexpr std::size_t max_mesh_record_size =
    mesh_header_size + (max_world_size - 1) * mesh_entry_size + max_regions * remote_memory_size;

std::array<std::byte, endpoint_size> serialize(const Endpoint& endpoint);
std::array<std::byte, remote_memory_size> serialize(const RemoteMemory& memory);
/// Throws gpuverbs::Error (errc::invalid_argument) with more than max_regions regions.
std::vector<std::byte> serialize(const Handshake& handshake);
/// Throws gpuverbs::Error (errc::invalid_argument) for a record parse_mesh_record would refuse.
std::vector<std::byte> serialize(const MeshRecord& record);
/// A block list: its distinct regions once (blocks of one region carry the
/// same RemoteMemory, e.g. mr.remote()), then 24 bytes per block. Throws
/// gpuverbs::Error (errc::invalid_argument) for a list parse_block_list would refuse.
std::vector<std::byte> serialize(std::span<const RemoteBlock> blocks);
/// A leased block list: the lease header, then the block list. Throws as the block list does.
std::vector<std::byte> serialize(const LeasedBlockList& list);

/// The parsers refuse a record with errc::malformed_record (wrong size,
/// magic, reserved bits or contents; the words say which field) or
/// errc::unsupported_version, in three forms: throwing gpuverbs::Error, the
/// error_code, and the error_code with the words kept in `diagnostics`.
Endpoint parse_endpoint(std::span<const std::byte> bytes);
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec);
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics);
Handshake parse_handshake(std::span<const std::byte> bytes);
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec);
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics);
/// Checks sizes, ranks (rank < world size <= max_world_size; peer ranks below
/// the world size, not the record's own, strictly increasing) and every
/// endpoint and region as their own parsers do.
MeshRecord parse_mesh_record(std::span<const std::byte> bytes);
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, std::error_code& ec);
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics);
/// Checks sizes, counts (1 to max_blocks blocks, at most max_regions
/// regions), reserved fields, each region as parse_remote_memory does, and
/// that every block has a length and lies inside its region.
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes);
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, std::error_code& ec);
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, std::error_code& ec,
                                          Diagnostics& diagnostics);
/// Checks the lease header (its reserved word, a lease time of at most a
/// day) and the block list that follows as parse_block_list does.
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes);
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, std::error_code& ec);
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, std::error_code& ec,
                                        Diagnostics& diagnostics);

namespace detail {
Endpoint parse_endpoint(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
Handshake parse_handshake(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, gpuverbs::detail::Status& status);
/// Why `blocks` cannot be sent or accepted; empty when well-formed.
std::string block_list_problem(std::span<const RemoteBlock> blocks);
/// Why `record` cannot be sent or accepted; empty when it is well-formed.
std::string mesh_record_problem(const MeshRecord& record);
} // namespace detail

} // namespace wire
} // namespace gpuverbs
