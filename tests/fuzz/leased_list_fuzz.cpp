// libFuzzer target: wire::parse_leased_block_list, a block list under a lease
// as its owner sends it (src/connections/wire.cpp; the "GVLL" layout in wire.hpp):
//
//   "GVLL" u16 version u16 scope | u64 list version | u32 lease | u32 lease ms | Block list
//
// (scope: 0 whole regions, 1 regions of the lease alone; a reserved 0 before 0.3)
//
// Checks, for any input:
//  - both forms behave (error_code: no throw, an empty value on failure;
//    throwing: gpuverbs::Error only, with the same code, naming
//    gpuverbs::wire::parse);
//  - the outcome is what a model of the 24-byte lease header says (written
//    from the layout above: size, magic, version, a scope of 0 or 1, a lease of
//    at most a day), with the block list that follows judged by
//    wire::parse_block_list alone (block_list_fuzz checks that one against
//    its own rules): the leased list is valid exactly when the header is and
//    the rest is a valid block list, with the same error otherwise;
//  - a list that parses carries the header's fields and that block list, is
//    well-formed by the serializer's rules, and survives a round trip
//    through wire::serialize(LeasedBlockList), whose first 24 bytes are the
//    input's (the block list part may come back shorter: the serializer
//    lists each region once);
//  - nothing is allocated from an unchecked count (-malloc_limit_mb).
#include "wire_model.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace {

namespace wire = gpuverbs::wire;
using gpuverbs::errc;
using gpuverbs::LeasedBlockList;

static_assert(wire::leased_header_size == 24 && wire::block_list_header_size == 16);

/// A day, the longest lease the layout allows.
constexpr std::uint64_t max_lease_ms = 24ull * 3600 * 1000;

/// The header's verdict, then the block list's.
fuzz::Expected<LeasedBlockList> model_leased(fuzz::Bytes in) {
    if (in.size() < 24) return {errc::malformed_record};
    if (auto e = fuzz::header_error(in, "GVLL")) return {e};
    if (fuzz::be(in, 6, 2) > 1) return {errc::malformed_record};
    if (fuzz::be(in, 20, 4) > max_lease_ms) return {errc::malformed_record};
    LeasedBlockList want;
    want.scope = static_cast<gpuverbs::LeaseScope>(fuzz::be(in, 6, 2));
    want.version = fuzz::be(in, 8, 8);
    want.lease = static_cast<std::uint32_t>(fuzz::be(in, 16, 4));
    want.ttl = std::chrono::milliseconds(fuzz::be(in, 20, 4));
    std::error_code ec;
    want.blocks = wire::parse_block_list(in.subspan(24), ec);
    if (ec) {
        if (ec.category() != gpuverbs::gpuverbs_category())
            fuzz::fail("parse_block_list failed outside gpuverbs' codes");
        return {static_cast<errc>(ec.value())};
    }
    return {std::nullopt, want};
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes in(reinterpret_cast<const std::byte*>(data), size);
    const fuzz::Expected<LeasedBlockList> want = model_leased(in);

    std::error_code ec;
    LeasedBlockList got;
    try {
        got = wire::parse_leased_block_list(in, ec);
    } catch (...) {
        fuzz::fail("the error_code form of parse_leased_block_list threw");
    }
    try {
        LeasedBlockList thrown = wire::parse_leased_block_list(in);
        if (ec)
            fuzz::fail("the throwing form accepted a list the error_code form refused (%s)", fuzz::outcome(ec).c_str());
        fuzz::require(thrown == got, "the throwing form parsed another list than the error_code form");
    } catch (const gpuverbs::Error& e) {
        fuzz::require(ec && e.code() == ec, "the throwing form failed with another code than the error_code form");
        fuzz::require(e.verb() == "gpuverbs::wire::parse", "the error does not name gpuverbs::wire::parse");
    } catch (...) {
        fuzz::fail("the throwing form threw something other than gpuverbs::Error");
    }

    if (want.error) {
        if (ec != make_error_code(*want.error)) {
            fuzz::fail("the model says %s, the parser says %s", fuzz::outcome(make_error_code(*want.error)).c_str(),
                       fuzz::outcome(ec).c_str());
        }
        fuzz::require(got == LeasedBlockList{}, "a failed parse returned a half-parsed list instead of an empty one");
        return 0;
    }
    if (ec) fuzz::fail("the model says success, the parser says %s", fuzz::outcome(ec).c_str());
    fuzz::require(got == want.value, "the parser read other header fields or blocks than the record holds");

    // Well-formed by the serializer's own rules.
    fuzz::require(got.ttl.count() >= 0 && static_cast<std::uint64_t>(got.ttl.count()) <= max_lease_ms,
                  "a parsed lease is longer than a day");
    fuzz::require(!got.blocks.empty() && got.blocks.size() <= wire::max_blocks,
                  "a parsed list has no or too many blocks");
    fuzz::require(wire::detail::block_list_problem(got.blocks).empty(), "a parsed list is not well-formed");
    for (const auto& b : got.blocks) {
        fuzz::require(b.length > 0 && b.memory.contains(b.offset, b.length), "a parsed block lies outside its region");
    }

    // The round trip: the same header bytes, the same value, never longer.
    std::vector<std::byte> again;
    try {
        again = wire::serialize(got);
    } catch (...) {
        fuzz::fail("serialize refused a list the parser accepted");
    }
    fuzz::require(again.size() <= size, "serialize(parse(bytes)) is longer than bytes");
    fuzz::require(fuzz::same_bytes(fuzz::Bytes(again).first(24), in.first(24)),
                  "serialize(parse(bytes)) has another lease header than bytes");
    std::error_code ec2;
    LeasedBlockList twice = wire::parse_leased_block_list(again, ec2);
    fuzz::require(!ec2 && twice == got, "parse(serialize(x)) differs from x");
    return 0;
}
