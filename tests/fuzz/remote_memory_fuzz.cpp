// libFuzzer target: wire::parse_remote_memory, the 28-byte record in which a
// peer offers a region of its memory (address, length, rkey; src/connections/wire.cpp).
// Checks, for any input:
//  - the parser agrees with the model of the layout (wire_model.hpp): same
//    verdict, same error, same fields; an address + length past 2^64 - 1 is
//    malformed_record;
//  - both forms behave (error_code: no throw, empty value on failure;
//    throwing: gpuverbs::Error only), and a valid record round-trips byte for byte;
//  - serialize() of any field values writes the documented layout, and
//    parsing it back gives the value (or malformed_record when it wraps).
#include "wire_model.hpp"

#include <cstddef>
#include <cstdint>

namespace {

using gpuverbs::RemoteMemory;
namespace wire = gpuverbs::wire;

void check(fuzz::Bytes bytes) {
    fuzz::check_parse(
        bytes, fuzz::model_remote_memory(bytes),
        [](fuzz::Bytes b, std::error_code& ec) { return wire::parse_remote_memory(b, ec); },
        [](fuzz::Bytes b) { return wire::parse_remote_memory(b); },
        [](const RemoteMemory& m) { return wire::serialize(m); });
}

void check_serialize(const RemoteMemory& value) {
    auto bytes = wire::serialize(value);
    fuzz::require(fuzz::has_magic(bytes, "GVRM") && fuzz::be(bytes, 4, 2) == 1 && fuzz::be(bytes, 6, 2) == 0,
                  "serialize(RemoteMemory) wrote a wrong header");
    fuzz::require(fuzz::remote_memory_fields(bytes) == value,
                  "serialize(RemoteMemory) put a field elsewhere than the layout");
    check(bytes);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes bytes(reinterpret_cast<const std::byte*>(data), size);
    check(bytes);
    if (size >= wire::remote_memory_size) {
        check_serialize(fuzz::remote_memory_fields(bytes.first(wire::remote_memory_size)));
    }
    return 0;
}
