// libFuzzer target: wire::parse_mesh_record, the record a mesh member
// publishes (its rank, an endpoint per peer, its regions; src/connections/wire.cpp).
// Checks, for any input:
//  - both forms behave (error_code: no throw, an empty value on failure;
//    throwing: gpuverbs::Error only, with the same code);
//  - a record that parses is well-formed by the serializer's own rules and
//    round-trips byte for byte; the endpoint addressed to each listed peer is
//    found, and none is found for the record's own rank;
//  - the size is checked against the counts before anything is allocated
//    (-malloc_limit_mb catches an allocation sized from a peer's count).
#include "gpuverbs/connections/wire.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace {

namespace wire = gpuverbs::wire;

void require(bool ok) {
    if (!ok) __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    std::error_code ec;
    gpuverbs::MeshRecord record = wire::parse_mesh_record(bytes, ec);
    try {
        gpuverbs::MeshRecord thrown = wire::parse_mesh_record(bytes);
        require(!ec && thrown == record);
    } catch (const gpuverbs::Error& e) {
        require(ec && e.code() == ec && e.verb() == "gpuverbs::wire::parse");
    }
    if (ec) {
        require(record == gpuverbs::MeshRecord{});
        return 0;
    }
    require(wire::detail::mesh_record_problem(record).empty());
    auto again = wire::serialize(record);
    require(again.size() == size && std::equal(again.begin(), again.end(), bytes.begin()));
    for (const auto& [peer, endpoint] : record.endpoints) {
        const gpuverbs::Endpoint* found = record.endpoint_for(peer);
        require(found != nullptr && *found == endpoint);
    }
    require(record.endpoint_for(record.rank) == nullptr);
    return 0;
}
