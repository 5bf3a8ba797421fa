// libFuzzer target: wire::parse_endpoint, the 40-byte record a peer sends to
// say where its queue pair is (src/connections/wire.cpp). Checks, for any input:
//  - the parser agrees with the model of the layout (wire_model.hpp): same
//    verdict, same error (malformed_record / unsupported_version), same fields;
//  - both forms behave (error_code: no throw, empty value on failure;
//    throwing: gpuverbs::Error only), and a valid record round-trips byte for byte;
//  - serialize() of any field values (read from the input where the layout
//    puts them, in or out of range) writes the documented layout, and parsing
//    it back gives the value, or malformed_record when a field is out of range.
#include "wire_model.hpp"

#include <cstddef>
#include <cstdint>

namespace {

using gpuverbs::Endpoint;
namespace wire = gpuverbs::wire;

void check(fuzz::Bytes bytes) {
    fuzz::check_parse(
        bytes, fuzz::model_endpoint(bytes),
        [](fuzz::Bytes b, std::error_code& ec) { return wire::parse_endpoint(b, ec); },
        [](fuzz::Bytes b) { return wire::parse_endpoint(b); }, [](const Endpoint& e) { return wire::serialize(e); });
}

void check_serialize(const Endpoint& value) {
    auto bytes = wire::serialize(value);
    fuzz::require(fuzz::has_magic(bytes, "GVEP") && fuzz::be(bytes, 4, 2) == 1 && fuzz::be(bytes, 6, 2) == 0 &&
                      fuzz::be(bytes, 36, 4) == 0,
                  "serialize(Endpoint) wrote a wrong header or reserved field");
    fuzz::require(fuzz::endpoint_fields(bytes) == value, "serialize(Endpoint) put a field elsewhere than the layout");
    auto want = fuzz::model_endpoint(bytes);
    fuzz::require(!want.error || *want.error == gpuverbs::errc::malformed_record,
                  "serialize(Endpoint) wrote a record of another version");
    check(bytes);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes bytes(reinterpret_cast<const std::byte*>(data), size);
    check(bytes);
    if (size >= wire::endpoint_size) check_serialize(fuzz::endpoint_fields(bytes.first(wire::endpoint_size)));
    return 0;
}
