// The byte codec every gpuverbs wire record shares (src/connections/wire*.cpp):
// big-endian writers and readers, each record's 8-byte header (magic,
// version, the record's own word) and its check, and the records that
// others embed (an endpoint, a remote memory). Internal: not installed.
#pragma once

#include "gpuverbs/connections/wire.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace gpuverbs::wire::codec {

inline constexpr std::array<char, 4> endpoint_magic{'G', 'V', 'E', 'P'};
inline constexpr std::array<char, 4> remote_magic{'G', 'V', 'R', 'M'};
inline constexpr std::array<char, 4> handshake_magic{'G', 'V', 'H', 'S'};
inline constexpr std::array<char, 4> mesh_magic{'G', 'V', 'M', 'R'};
inline constexpr std::array<char, 4> block_list_magic{'G', 'V', 'B', 'L'};
inline constexpr std::array<char, 4> leased_magic{'G', 'V', 'L', 'L'};
/// The longest lease a list may carry (longer is a unit mistake, not a lease).
inline constexpr std::uint32_t max_lease_ms = 24u * 3600u * 1000u;

class Writer {
public:
    explicit Writer(std::span<std::byte> out) : out_(out) {}
    void magic(const std::array<char, 4>& m) {
        for (char c : m) u8(static_cast<std::uint8_t>(c));
    }
    /// A record's 8-byte header: magic, version, and the record's own 16-bit word.
    void header(const std::array<char, 4>& m, std::uint16_t record_version, std::uint16_t word) {
        magic(m);
        u16(record_version);
        u16(word);
    }
    void u8(std::uint8_t v) { out_[at_++] = std::byte{v}; }
    void u16(std::uint16_t v) { be(v, 2); }
    void u32(std::uint32_t v) { be(v, 4); }
    void u64(std::uint64_t v) { be(v, 8); }
    void bytes(std::span<const std::uint8_t> b) {
        for (std::uint8_t v : b) u8(v);
    }

private:
    void be(std::uint64_t v, int n) {
        for (int i = n - 1; i >= 0; --i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    std::span<std::byte> out_;
    std::size_t at_ = 0;
};

class Reader {
public:
    explicit Reader(std::span<const std::byte> in) : in_(in) {}
    bool magic(const std::array<char, 4>& m) {
        bool same = true;
        for (char c : m) same = (u8() == static_cast<std::uint8_t>(c)) && same;
        return same;
    }
    std::uint8_t u8() { return std::to_integer<std::uint8_t>(in_[at_++]); }
    std::uint16_t u16() { return static_cast<std::uint16_t>(be(2)); }
    std::uint32_t u32() { return static_cast<std::uint32_t>(be(4)); }
    std::uint64_t u64() { return be(8); }
    void bytes(std::span<std::uint8_t> out) {
        for (std::uint8_t& v : out) v = u8();
    }

private:
    std::uint64_t be(int n) {
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = (v << 8) | u8();
        return v;
    }
    std::span<const std::byte> in_;
    std::size_t at_ = 0;
};

inline void write_endpoint(Writer& w, const Endpoint& e) {
    w.header(endpoint_magic, version, 0);
    w.u32(e.qp_num);
    w.u32(e.psn);
    w.u16(e.lid);
    w.u8(static_cast<std::uint8_t>(e.mtu));
    w.u8(static_cast<std::uint8_t>(e.link_layer));
    w.bytes(e.gid.bytes);
    w.u32(0);
}

inline void write_remote(Writer& w, const RemoteMemory& m) {
    w.header(remote_magic, version, 0);
    w.u64(m.address);
    w.u64(m.length);
    w.u32(m.rkey);
}

// Checks size, magic, version and the reserved word of a record's 8-byte header.
inline bool check_header(Reader& r, std::span<const std::byte> bytes, std::size_t want, bool exact,
                         const std::array<char, 4>& magic, const char* what, gpuverbs::detail::Status& status) {
    const char* verb = "gpuverbs::wire::parse";
    if (bytes.size() < want || (exact && bytes.size() != want)) {
        status.fail(errc::malformed_record, verb,
                    std::string(what) + " record is " + std::to_string(bytes.size()) + " bytes; it must be " +
                        (exact ? "" : "at least ") + std::to_string(want) +
                        (bytes.size() < want ? " (truncated)" : " (trailing bytes)"));
        return false;
    }
    if (!r.magic(magic)) {
        status.fail(errc::malformed_record, verb,
                    std::string("not a gpuverbs ") + what + " record (wrong magic; expected \"" +
                        std::string(magic.begin(), magic.end()) + "\")");
        return false;
    }
    if (std::uint16_t v = r.u16(); v != version) {
        status.fail(errc::unsupported_version, verb,
                    std::string(what) + " record has version " + std::to_string(v) + "; this gpuverbs reads version " +
                        std::to_string(version) + " (update both sides to the same gpuverbs release)");
        return false;
    }
    return true;
}

} // namespace gpuverbs::wire::codec
