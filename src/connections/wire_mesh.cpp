// The wire record a mesh member publishes: its rank, its world, an
// endpoint per peer and its regions.
#include "gpuverbs/connections/wire.hpp"

#include "wire_codec.hpp"

#include <algorithm>
#include <string>

namespace gpuverbs::wire {

using namespace codec;

std::vector<std::byte> serialize(const MeshRecord& record) {
    if (std::string problem = detail::mesh_record_problem(record); !problem.empty()) {
        throw Error(errc::invalid_argument, "gpuverbs::wire::serialize", problem);
    }
    std::vector<std::byte> out(mesh_header_size + record.endpoints.size() * mesh_entry_size +
                               record.regions.size() * remote_memory_size);
    Writer w(out);
    w.header(mesh_magic, version, static_cast<std::uint16_t>(record.regions.size()));
    w.u32(record.rank);
    w.u32(record.world_size);
    w.u32(static_cast<std::uint32_t>(record.endpoints.size()));
    w.u32(0);
    for (const auto& [peer, endpoint] : record.endpoints) {
        w.u32(peer);
        w.u32(0);
        write_endpoint(w, endpoint);
    }
    for (const RemoteMemory& m : record.regions) write_remote(w, m);
    return out;
}

namespace detail {

std::string mesh_record_problem(const MeshRecord& record) {
    const std::string who = "mesh record of rank " + std::to_string(record.rank);
    if (record.world_size == 0 || record.world_size > max_world_size) {
        return who + " names a world of " + std::to_string(record.world_size) + " members (1.." +
               std::to_string(max_world_size) + ")";
    }
    if (record.rank >= record.world_size) {
        return who + " is outside its world of " + std::to_string(record.world_size) + " members";
    }
    if (record.endpoints.size() >= record.world_size) {
        return who + " has " + std::to_string(record.endpoints.size()) + " endpoints for a world of " +
               std::to_string(record.world_size) + " (at most one per other member)";
    }
    if (record.regions.size() > max_regions) {
        return who + " has " + std::to_string(record.regions.size()) + " regions (at most " +
               std::to_string(max_regions) + ")";
    }
    std::uint32_t previous = 0;
    for (std::size_t i = 0; i < record.endpoints.size(); ++i) {
        const std::uint32_t peer = record.endpoints[i].first;
        if (peer >= record.world_size || peer == record.rank || (i > 0 && peer <= previous)) {
            return who + " addresses an endpoint to rank " + std::to_string(peer) +
                   (peer == record.rank         ? " (itself)"
                    : peer >= record.world_size ? " (outside the world)"
                                                : " (out of order or twice)");
        }
        previous = peer;
    }
    return {};
}

MeshRecord parse_mesh_record(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    const char* verb = "gpuverbs::wire::parse";
    Reader r(bytes);
    if (!check_header(r, bytes, mesh_header_size, false, mesh_magic, "mesh", status)) return {};
    const std::uint16_t region_count = r.u16();
    MeshRecord m;
    m.rank = r.u32();
    m.world_size = r.u32();
    const std::uint32_t endpoint_count = r.u32();
    if (r.u32() != 0) {
        status.fail(errc::malformed_record, verb, "mesh record has a non-zero reserved field");
        return {};
    }
    // Sizes first, from the counts, before anything is allocated.
    if (endpoint_count >= max_world_size || region_count > max_regions) {
        status.fail(errc::malformed_record, verb,
                    "mesh record of rank " + std::to_string(m.rank) + " announces " + std::to_string(endpoint_count) +
                        " endpoints and " + std::to_string(region_count) + " regions (at most " +
                        std::to_string(max_world_size - 1) + " and " + std::to_string(max_regions) + ")");
        return {};
    }
    const std::size_t want = mesh_header_size + std::size_t{endpoint_count} * mesh_entry_size +
                             std::size_t{region_count} * remote_memory_size;
    if (bytes.size() != want) {
        status.fail(errc::malformed_record, verb,
                    "mesh record of rank " + std::to_string(m.rank) + " is " + std::to_string(bytes.size()) +
                        " bytes; " + std::to_string(endpoint_count) + " endpoints and " + std::to_string(region_count) +
                        " regions need exactly " + std::to_string(want));
        return {};
    }
    m.endpoints.reserve(endpoint_count);
    std::size_t at = mesh_header_size;
    for (std::uint32_t i = 0; i < endpoint_count; ++i, at += mesh_entry_size) {
        Reader entry(bytes.subspan(at, 8));
        const std::uint32_t peer = entry.u32();
        if (entry.u32() != 0) {
            status.fail(errc::malformed_record, verb, "mesh record has a non-zero reserved field in an entry");
            return {};
        }
        Endpoint e = parse_endpoint(bytes.subspan(at + 8, endpoint_size), status);
        if (!status.ok()) return {};
        m.endpoints.emplace_back(peer, e);
    }
    m.regions.reserve(region_count);
    for (std::uint16_t i = 0; i < region_count; ++i, at += remote_memory_size) {
        m.regions.push_back(parse_remote_memory(bytes.subspan(at, remote_memory_size), status));
        if (!status.ok()) return {};
    }
    if (std::string problem = mesh_record_problem(m); !problem.empty()) {
        status.fail(errc::malformed_record, verb, problem);
        return {};
    }
    return m;
}

} // namespace detail

MeshRecord parse_mesh_record(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_mesh_record(bytes, s); });
}
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_mesh_record(bytes, s); });
}
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, std::error_code& ec, Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(ec, diagnostics,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_mesh_record(bytes, s); });
}

} // namespace gpuverbs::wire

namespace gpuverbs {

const Endpoint* MeshRecord::endpoint_for(std::uint32_t peer) const noexcept {
    auto it = std::lower_bound(endpoints.begin(), endpoints.end(), peer,
                               [](const auto& entry, std::uint32_t p) { return entry.first < p; });
    return it != endpoints.end() && it->first == peer ? &it->second : nullptr;
}

} // namespace gpuverbs
