// libFuzzer target: wire::parse_handshake, the record each side of the TCP
// bootstrap sends: an 8-byte header with a region count, an Endpoint, and
// count RemoteMemory records (src/connections/wire.cpp). Checks, for any input:
//  - the parser agrees with the model of the layout (wire_model.hpp): same
//    verdict, same error, same endpoint and regions; a count above
//    wire::max_regions or one that does not match the size is malformed_record;
//  - both forms behave (error_code: no throw, empty value on failure;
//    throwing: gpuverbs::Error only), and a valid record round-trips byte for byte;
//  - serialize() of any handshake built from the input (the endpoint and as
//    many regions as the bytes after it hold, valid or not) writes the
//    documented layout and parses back to it, and with more than
//    wire::max_regions regions throws gpuverbs::Error(invalid_argument).
#include "wire_model.hpp"

#include <cstddef>
#include <cstdint>

namespace {

using gpuverbs::Handshake;
namespace wire = gpuverbs::wire;

void check(fuzz::Bytes bytes) {
    fuzz::check_parse(
        bytes, fuzz::model_handshake(bytes),
        [](fuzz::Bytes b, std::error_code& ec) { return wire::parse_handshake(b, ec); },
        [](fuzz::Bytes b) { return wire::parse_handshake(b); }, [](const Handshake& h) { return wire::serialize(h); });
}

void check_serialize(const Handshake& value) {
    if (value.regions.size() > wire::max_regions) {
        try {
            (void)wire::serialize(value);
        } catch (const gpuverbs::Error& e) {
            fuzz::require(e.code() == gpuverbs::errc::invalid_argument,
                          "serialize(Handshake) with too many regions failed with another code than invalid_argument");
            return;
        } catch (...) {
            fuzz::fail("serialize(Handshake) threw something other than gpuverbs::Error");
        }
        fuzz::fail("serialize(Handshake) wrote %zu regions (at most %zu allowed)", value.regions.size(),
                   wire::max_regions);
    }
    auto bytes = wire::serialize(value);
    std::size_t count = value.regions.size();
    fuzz::require(bytes.size() == 48 + 28 * count, "serialize(Handshake) wrote a record of the wrong size");
    fuzz::require(fuzz::has_magic(bytes, "GVHS") && fuzz::be(bytes, 4, 2) == 1 && fuzz::be(bytes, 6, 2) == count,
                  "serialize(Handshake) wrote a wrong header or count");
    fuzz::Bytes all(bytes);
    fuzz::require(fuzz::endpoint_fields(all.subspan(8, 40)) == value.endpoint,
                  "serialize(Handshake) put the endpoint elsewhere than the layout");
    for (std::size_t i = 0; i < count; ++i) {
        fuzz::require(fuzz::remote_memory_fields(all.subspan(48 + 28 * i, 28)) == value.regions[i],
                      "serialize(Handshake) put a region elsewhere than the layout");
    }
    check(bytes);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes bytes(reinterpret_cast<const std::byte*>(data), size);
    check(bytes);
    if (size >= 48) {
        Handshake h;
        h.endpoint = fuzz::endpoint_fields(bytes.subspan(8, 40));
        for (std::size_t at = 48; at + 28 <= size; at += 28) {
            h.regions.push_back(fuzz::remote_memory_fields(bytes.subspan(at, 28)));
        }
        check_serialize(h);
    }
    return 0;
}
