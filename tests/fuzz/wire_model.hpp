// What the fuzz targets share: a failed check that libFuzzer records as a
// crash, a model of wire.hpp's records written from the layout in the
// header's comment (not from src/connections/wire.cpp), and the checks each parse must
// pass against it. A target hands its input to a parser and to the model;
// both must agree on whether the record is valid, on the error (malformed
// or unsupported version) and on every field, and a valid record must come
// back byte for byte from serialize().
#pragma once

#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/error.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace fuzz {

using Bytes = std::span<const std::byte>;

/// Says which property broke and stops with a trap, which libFuzzer reports
/// as a crash and saves the input for.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* format, ...) {
    std::fputs("fuzz check failed: ", stderr);
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fputc('\n', stderr);
    __builtin_trap();
}

inline void require(bool ok, const char* what) {
    if (!ok) fail("%s", what);
}

// The model below reads version 1 of the layouts; a new version needs a new model.
static_assert(gpuverbs::wire::version == 1);
static_assert(gpuverbs::wire::endpoint_size == 40 && gpuverbs::wire::remote_memory_size == 28 &&
              gpuverbs::wire::handshake_header_size == 8 && gpuverbs::wire::max_regions == 64);
static_assert(gpuverbs::wire::max_handshake_size == 8 + 40 + 64 * 28);

/// Big-endian unsigned integer of `n` bytes at `at`.
inline std::uint64_t be(Bytes b, std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | std::to_integer<std::uint64_t>(b[at + i]);
    return v;
}

inline bool has_magic(Bytes b, std::string_view magic) {
    return std::equal(magic.begin(), magic.end(), b.begin(), [](char c, std::byte x) {
        return static_cast<unsigned char>(c) == std::to_integer<unsigned>(x);
    });
}

/// What the model says a parse must give: an error, or the value.
template <class T>
struct Expected {
    std::optional<gpuverbs::errc> error; ///< empty: the record is valid
    T value{};
};

// The fields of a 40-byte endpoint record, read where the layout puts them,
// without any check (MTU and link layer keep out-of-range codes).
inline gpuverbs::Endpoint endpoint_fields(Bytes b) {
    gpuverbs::Endpoint e;
    e.qp_num = static_cast<std::uint32_t>(be(b, 8, 4));
    e.psn = static_cast<std::uint32_t>(be(b, 12, 4));
    e.lid = static_cast<std::uint16_t>(be(b, 16, 2));
    e.mtu = static_cast<gpuverbs::Mtu>(be(b, 18, 1));
    e.link_layer = static_cast<gpuverbs::LinkLayer>(be(b, 19, 1));
    for (std::size_t i = 0; i < 16; ++i) e.gid.bytes[i] = static_cast<std::uint8_t>(be(b, 20 + i, 1));
    return e;
}

// The fields of a 28-byte remote memory record, unchecked.
inline gpuverbs::RemoteMemory remote_memory_fields(Bytes b) {
    return {be(b, 8, 8), be(b, 16, 8), static_cast<std::uint32_t>(be(b, 24, 4))};
}

// A record's 8-byte header: magic, version, then the record's own word.
inline std::optional<gpuverbs::errc> header_error(Bytes b, std::string_view magic) {
    if (!has_magic(b, magic)) return gpuverbs::errc::malformed_record;
    if (be(b, 4, 2) != 1) return gpuverbs::errc::unsupported_version;
    return std::nullopt;
}

inline Expected<gpuverbs::Endpoint> model_endpoint(Bytes b) {
    using gpuverbs::errc;
    if (b.size() != 40) return {errc::malformed_record};
    if (auto e = header_error(b, "GVEP")) return {e};
    if (be(b, 6, 2) != 0 || be(b, 36, 4) != 0) return {errc::malformed_record};
    gpuverbs::Endpoint e = endpoint_fields(b);
    bool qp_ok = e.qp_num >= 1 && e.qp_num < (1u << 24) && e.psn < (1u << 24);
    bool mtu_ok = be(b, 18, 1) >= 1 && be(b, 18, 1) <= 5; // IBV_MTU_256 .. IBV_MTU_4096
    bool link_ok = be(b, 19, 1) <= 2;                     // unspecified, infiniband, ethernet
    if (!qp_ok || !mtu_ok || !link_ok) return {errc::malformed_record};
    return {std::nullopt, e};
}

inline Expected<gpuverbs::RemoteMemory> model_remote_memory(Bytes b) {
    using gpuverbs::errc;
    if (b.size() != 28) return {errc::malformed_record};
    if (auto e = header_error(b, "GVRM")) return {e};
    if (be(b, 6, 2) != 0) return {errc::malformed_record};
    gpuverbs::RemoteMemory m = remote_memory_fields(b);
    // [address, address + length) must not wrap: address + length <= 2^64 - 1.
    std::uint64_t end = 0;
    if (__builtin_add_overflow(m.address, m.length, &end)) return {errc::malformed_record};
    return {std::nullopt, m};
}

inline Expected<gpuverbs::Handshake> model_handshake(Bytes b) {
    using gpuverbs::errc;
    if (b.size() < 48) return {errc::malformed_record};
    if (auto e = header_error(b, "GVHS")) return {e};
    std::size_t count = be(b, 6, 2);
    if (count > 64 || b.size() != 48 + 28 * count) return {errc::malformed_record};
    gpuverbs::Handshake h;
    auto endpoint = model_endpoint(b.subspan(8, 40));
    if (endpoint.error) return {endpoint.error};
    h.endpoint = endpoint.value;
    for (std::size_t i = 0; i < count; ++i) {
        auto region = model_remote_memory(b.subspan(48 + 28 * i, 28));
        if (region.error) return {region.error};
        h.regions.push_back(region.value);
    }
    return {std::nullopt, h};
}

/// "malformed_record" for an error the model predicts; the code's own words otherwise.
inline std::string outcome(std::error_code ec) {
    if (!ec) return "success";
    if (ec.category() == gpuverbs::gpuverbs_category()) {
        switch (static_cast<gpuverbs::errc>(ec.value())) {
            case gpuverbs::errc::malformed_record: return "malformed_record";
            case gpuverbs::errc::unsupported_version: return "unsupported_version";
            case gpuverbs::errc::peer_closed: return "peer_closed";
            default: break;
        }
    }
    return ec.category().name() + std::string(": ") + ec.message();
}

inline bool same_bytes(Bytes a, Bytes b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

/// The checks of one parse. `parse_code(bytes, ec)` is the error_code form,
/// `parse_throw(bytes)` the throwing form, `serialize(value)` the writer:
///  - the error_code form never throws; it fails exactly when the model
///    does, with the model's error, and then returns an empty value;
///  - the throwing form throws gpuverbs::Error with that code (and nothing
///    else), or returns the same value;
///  - a valid record parses to the model's fields, serialize() gives back
///    the same bytes (the layouts have one encoding per value), and parsing
///    those gives the same value again.
template <class T, class ParseCode, class ParseThrow, class Serialize>
void check_parse(Bytes bytes, const Expected<T>& want, ParseCode parse_code, ParseThrow parse_throw,
                 Serialize serialize) {
    std::error_code ec;
    T got;
    try {
        got = parse_code(bytes, ec);
    } catch (...) {
        fail("the error_code form of the parser threw");
    }
    if (want.error) {
        if (ec != make_error_code(*want.error)) {
            fail("the model says %s, the parser says %s", outcome(make_error_code(*want.error)).c_str(),
                 outcome(ec).c_str());
        }
        require(got == T{}, "a failed parse returned a half-parsed value instead of an empty one");
        try {
            (void)parse_throw(bytes);
            fail("the throwing form accepted a record the error_code form refused");
        } catch (const gpuverbs::Error& e) {
            require(e.code() == ec, "the throwing form failed with another code than the error_code form");
            require(e.verb() == "gpuverbs::wire::parse", "the error does not name gpuverbs::wire::parse");
        } catch (...) {
            fail("the throwing form threw something other than gpuverbs::Error");
        }
        return;
    }
    if (ec) fail("the model says success, the parser says %s", outcome(ec).c_str());
    require(got == want.value, "the parser read other field values than the record holds");
    auto again = serialize(got);
    require(same_bytes(again, bytes), "serialize(parse(bytes)) differs from bytes");
    std::error_code ec2;
    T twice = parse_code(again, ec2);
    require(!ec2 && twice == got, "parse(serialize(x)) differs from x");
    try {
        require(parse_throw(bytes) == got, "the throwing form parsed another value");
    } catch (...) {
        fail("the throwing form threw for a valid record");
    }
}

} // namespace fuzz
