// libFuzzer target: wire::parse_block_list, the remote side of a block-list
// transfer as a peer sends it (src/connections/wire.cpp). Checks, for any input:
//  - both forms behave (error_code: no throw, an empty list on failure;
//    throwing: gpuverbs::Error only, with the same code);
//  - a list that parses is well-formed by the serializer's own rules (every
//    block has a length and lies inside its region) and survives a round trip
//    through the serializer (which lists each region once);
//  - the size is checked against the counts before anything is allocated
//    (-malloc_limit_mb catches an allocation sized from a peer's count).
#include "gpuverbs/connections/wire.hpp"

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
    std::vector<gpuverbs::RemoteBlock> blocks = wire::parse_block_list(bytes, ec);
    try {
        std::vector<gpuverbs::RemoteBlock> thrown = wire::parse_block_list(bytes);
        require(!ec && thrown == blocks);
    } catch (const gpuverbs::Error& e) {
        require(ec && e.code() == ec && e.verb() == "gpuverbs::wire::parse");
    }
    if (ec) {
        require(blocks.empty());
        return 0;
    }
    require(wire::detail::block_list_problem(blocks).empty());
    for (const auto& b : blocks) require(b.length > 0 && b.memory.contains(b.offset, b.length));
    auto again = wire::serialize(blocks);
    require(again.size() <= size); // the same regions, each at most once
    require(wire::parse_block_list(again) == blocks);
    return 0;
}
