#include "gpuverbs/connections/wire.hpp"

#include <algorithm>
#include <cstring>

namespace gpuverbs::wire {
namespace {

constexpr std::array<char, 4> endpoint_magic{'G', 'V', 'E', 'P'};
constexpr std::array<char, 4> remote_magic{'G', 'V', 'R', 'M'};
constexpr std::array<char, 4> handshake_magic{'G', 'V', 'H', 'S'};
constexpr std::array<char, 4> mesh_magic{'G', 'V', 'M', 'R'};
constexpr std::array<char, 4> block_list_magic{'G', 'V', 'B', 'L'};
constexpr std::array<char, 4> leased_magic{'G', 'V', 'L', 'L'};
/// The longest lease a list may carry (longer is a unit mistake, not a lease).
constexpr std::uint32_t max_lease_ms = 24u * 3600u * 1000u;

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

void write_endpoint(Writer& w, const Endpoint& e) {
    w.header(endpoint_magic, version, 0);
    w.u32(e.qp_num);
    w.u32(e.psn);
    w.u16(e.lid);
    w.u8(static_cast<std::uint8_t>(e.mtu));
    w.u8(static_cast<std::uint8_t>(e.link_layer));
    w.bytes(e.gid.bytes);
    w.u32(0);
}

void write_remote(Writer& w, const RemoteMemory& m) {
    w.header(remote_magic, version, 0);
    w.u64(m.address);
    w.u64(m.length);
    w.u32(m.rkey);
}

// Checks size, magic, version and the reserved word of a record's 8-byte header.
bool check_header(Reader& r, std::span<const std::byte> bytes, std::size_t want, bool exact,
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

} // namespace

std::array<std::byte, endpoint_size> serialize(const Endpoint& endpoint) {
    std::array<std::byte, endpoint_size> out{};
    Writer w(out);
    write_endpoint(w, endpoint);
    return out;
}

std::array<std::byte, remote_memory_size> serialize(const RemoteMemory& memory) {
    std::array<std::byte, remote_memory_size> out{};
    Writer w(out);
    write_remote(w, memory);
    return out;
}

std::vector<std::byte> serialize(const Handshake& handshake) {
    if (handshake.regions.size() > max_regions) {
        throw Error(errc::invalid_argument, "gpuverbs::wire::serialize",
                    "a handshake carries at most " + std::to_string(max_regions) + " regions (got " +
                        std::to_string(handshake.regions.size()) + ")");
    }
    std::vector<std::byte> out(handshake_header_size + endpoint_size + handshake.regions.size() * remote_memory_size);
    Writer w(out);
    w.header(handshake_magic, version, static_cast<std::uint16_t>(handshake.regions.size()));
    write_endpoint(w, handshake.endpoint);
    for (const RemoteMemory& m : handshake.regions) write_remote(w, m);
    return out;
}

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

std::vector<std::byte> serialize(std::span<const RemoteBlock> blocks) {
    if (std::string problem = detail::block_list_problem(blocks); !problem.empty()) {
        throw Error(errc::invalid_argument, "gpuverbs::wire::serialize", problem);
    }
    std::vector<RemoteMemory> regions;
    std::vector<std::uint16_t> index(blocks.size());
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        auto it = std::find(regions.begin(), regions.end(), blocks[k].memory);
        if (it == regions.end()) {
            if (regions.size() == max_regions) {
                throw Error(errc::invalid_argument, "gpuverbs::wire::serialize",
                            "the blocks lie in more than " + std::to_string(max_regions) + " regions");
            }
            it = regions.insert(regions.end(), blocks[k].memory);
        }
        index[k] = static_cast<std::uint16_t>(it - regions.begin());
    }
    std::vector<std::byte> out(block_list_header_size + regions.size() * remote_memory_size +
                               blocks.size() * block_entry_size);
    Writer w(out);
    w.header(block_list_magic, version, static_cast<std::uint16_t>(regions.size()));
    w.u32(static_cast<std::uint32_t>(blocks.size()));
    w.u32(0);
    for (const RemoteMemory& m : regions) write_remote(w, m);
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        w.u16(index[k]);
        w.u16(0);
        w.u32(0);
        w.u64(blocks[k].offset);
        w.u64(blocks[k].length);
    }
    return out;
}

std::vector<std::byte> serialize(const LeasedBlockList& list) {
    if (list.ttl.count() < 0 || list.ttl.count() > max_lease_ms) {
        throw Error(
            errc::invalid_argument, "gpuverbs::wire::serialize",
            "a lease lasts 0 to " + std::to_string(max_lease_ms) + " ms, not " + std::to_string(list.ttl.count()));
    }
    const std::vector<std::byte> blocks = serialize(std::span<const RemoteBlock>(list.blocks));
    std::vector<std::byte> out(leased_header_size + blocks.size());
    if (list.scope != LeaseScope::whole_regions && list.scope != LeaseScope::lease_regions) {
        throw Error(errc::invalid_argument, "gpuverbs::wire::serialize",
                    "a leased list's scope is whole_regions (0) or lease_regions (1), not " +
                        std::to_string(static_cast<unsigned>(list.scope)));
    }
    Writer w(out);
    w.header(leased_magic, version, static_cast<std::uint16_t>(list.scope)); // a reserved word before 0.3
    w.u64(list.version);
    w.u32(list.lease);
    w.u32(static_cast<std::uint32_t>(list.ttl.count()));
    std::copy(blocks.begin(), blocks.end(), out.begin() + leased_header_size);
    return out;
}

namespace detail {

LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    const char* verb = "gpuverbs::wire::parse";
    Reader r(bytes);
    if (!check_header(r, bytes, leased_header_size, false, leased_magic, "leased block list", status)) return {};
    const std::uint16_t scope = r.u16();
    if (scope > static_cast<std::uint16_t>(LeaseScope::lease_regions)) {
        status.fail(errc::malformed_record, verb,
                    "leased block list has scope " + std::to_string(scope) +
                        "; this gpuverbs knows 0 (whole regions) and 1 (regions of the lease alone)");
        return {};
    }
    LeasedBlockList out;
    out.scope = static_cast<LeaseScope>(scope);
    out.version = r.u64();
    out.lease = r.u32();
    const std::uint32_t ms = r.u32();
    if (ms > max_lease_ms) {
        status.fail(errc::malformed_record, verb,
                    "leased block list asks for a lease of " + std::to_string(ms) + " ms (at most " +
                        std::to_string(max_lease_ms) + ")");
        return {};
    }
    out.ttl = std::chrono::milliseconds(ms);
    out.blocks = parse_block_list(bytes.subspan(leased_header_size), status);
    if (!status.ok()) return {};
    return out;
}

std::string block_list_problem(std::span<const RemoteBlock> blocks) {
    if (blocks.empty() || blocks.size() > max_blocks) {
        return "a block list has 1 to " + std::to_string(max_blocks) + " blocks, not " + std::to_string(blocks.size());
    }
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        const RemoteBlock& b = blocks[k];
        if (b.length == 0) return "block " + std::to_string(k) + " has length 0";
        if (b.memory.address > UINT64_MAX - b.memory.length) {
            return "block " + std::to_string(k) + "'s region wraps past the end of the address space";
        }
        if (!b.memory.contains(b.offset, b.length)) {
            return "block " + std::to_string(k) + " (" + std::to_string(b.length) + " bytes at offset " +
                   std::to_string(b.offset) + ") lies outside its region of " + std::to_string(b.memory.length) +
                   " bytes";
        }
    }
    return {};
}

std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    const char* verb = "gpuverbs::wire::parse";
    Reader r(bytes);
    if (!check_header(r, bytes, block_list_header_size, false, block_list_magic, "block list", status)) return {};
    const std::uint16_t region_count = r.u16();
    const std::uint32_t block_count = r.u32();
    if (r.u32() != 0) {
        status.fail(errc::malformed_record, verb, "block list has a non-zero reserved field");
        return {};
    }
    if (block_count == 0 || block_count > max_blocks || region_count == 0 || region_count > max_regions) {
        status.fail(errc::malformed_record, verb,
                    "block list announces " + std::to_string(block_count) + " blocks in " +
                        std::to_string(region_count) + " regions (1 to " + std::to_string(max_blocks) + " and 1 to " +
                        std::to_string(max_regions) + ")");
        return {};
    }
    const std::size_t want = block_list_header_size + std::size_t{region_count} * remote_memory_size +
                             std::size_t{block_count} * block_entry_size;
    if (bytes.size() != want) {
        status.fail(errc::malformed_record, verb,
                    "block list is " + std::to_string(bytes.size()) + " bytes; " + std::to_string(block_count) +
                        " blocks in " + std::to_string(region_count) + " regions need exactly " + std::to_string(want));
        return {};
    }
    std::vector<RemoteMemory> regions;
    regions.reserve(region_count);
    std::size_t at = block_list_header_size;
    for (std::uint16_t i = 0; i < region_count; ++i, at += remote_memory_size) {
        regions.push_back(parse_remote_memory(bytes.subspan(at, remote_memory_size), status));
        if (!status.ok()) {
            status.detail = "block list region " + std::to_string(i) + ": " + status.detail;
            return {};
        }
    }
    std::vector<RemoteBlock> blocks;
    blocks.reserve(block_count);
    for (std::uint32_t k = 0; k < block_count; ++k, at += block_entry_size) {
        Reader e(bytes.subspan(at, block_entry_size));
        const std::uint16_t region = e.u16();
        if (e.u16() != 0 || e.u32() != 0) {
            status.fail(errc::malformed_record, verb, "block " + std::to_string(k) + " has a non-zero reserved field");
            return {};
        }
        if (region >= region_count) {
            status.fail(errc::malformed_record, verb,
                        "block " + std::to_string(k) + " names region " + std::to_string(region) + " of " +
                            std::to_string(region_count));
            return {};
        }
        const std::uint64_t offset = e.u64();
        const std::uint64_t length = e.u64();
        blocks.push_back(RemoteBlock{regions[region], offset, length});
    }
    if (std::string problem = block_list_problem(blocks); !problem.empty()) {
        status.fail(errc::malformed_record, verb, "block list: " + problem);
        return {};
    }
    return blocks;
}

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

Endpoint parse_endpoint(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, endpoint_size, true, endpoint_magic, "endpoint", status)) return {};
    const char* verb = "gpuverbs::wire::parse";
    if (r.u16() != 0) {
        status.fail(errc::malformed_record, verb, "endpoint record has a non-zero reserved field");
        return {};
    }
    Endpoint e;
    e.qp_num = r.u32();
    e.psn = r.u32();
    e.lid = r.u16();
    std::uint8_t mtu = r.u8();
    std::uint8_t link = r.u8();
    r.bytes(e.gid.bytes);
    std::uint32_t reserved = r.u32();
    if (e.qp_num == 0 || e.qp_num > 0xffffff || e.psn > 0xffffff) {
        status.fail(errc::malformed_record, verb, "endpoint record has a QP number or PSN outside 24 bits");
        return {};
    }
    if (mtu < 1 || mtu > 5) {
        status.fail(errc::malformed_record, verb,
                    "endpoint record has MTU code " + std::to_string(mtu) + " (valid: 1..5)");
        return {};
    }
    if (link > static_cast<std::uint8_t>(LinkLayer::ethernet) || reserved != 0) {
        status.fail(errc::malformed_record, verb, "endpoint record has an unknown link layer or reserved bits set");
        return {};
    }
    e.mtu = static_cast<Mtu>(mtu);
    e.link_layer = static_cast<LinkLayer>(link);
    return e;
}

RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, remote_memory_size, true, remote_magic, "remote memory", status)) return {};
    if (r.u16() != 0) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "remote memory record has a non-zero reserved field");
        return {};
    }
    RemoteMemory m;
    m.address = r.u64();
    m.length = r.u64();
    m.rkey = r.u32();
    if (m.length > ~m.address) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "remote memory record's address + length overflows 64 bits");
        return {};
    }
    return m;
}

Handshake parse_handshake(std::span<const std::byte> bytes, gpuverbs::detail::Status& status) {
    Reader r(bytes);
    if (!check_header(r, bytes, handshake_header_size + endpoint_size, false, handshake_magic, "handshake", status)) {
        return {};
    }
    std::uint16_t count = r.u16();
    std::size_t want = handshake_header_size + endpoint_size + std::size_t{count} * remote_memory_size;
    if (count > max_regions || bytes.size() != want) {
        status.fail(errc::malformed_record, "gpuverbs::wire::parse",
                    "handshake record announces " + std::to_string(count) + " regions (at most " +
                        std::to_string(max_regions) + ") in " + std::to_string(bytes.size()) + " bytes; " +
                        std::to_string(count) + " regions need exactly " + std::to_string(want));
        return {};
    }
    Handshake h;
    h.endpoint = parse_endpoint(bytes.subspan(handshake_header_size, endpoint_size), status);
    if (!status.ok()) return {};
    for (std::size_t i = 0; i < count; ++i) {
        h.regions.push_back(parse_remote_memory(
            bytes.subspan(handshake_header_size + endpoint_size + i * remote_memory_size, remote_memory_size), status));
        if (!status.ok()) return {};
    }
    return h;
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

Endpoint parse_endpoint(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_endpoint(bytes, s); });
}
Endpoint parse_endpoint(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec, [&](gpuverbs::detail::Status& s) { return detail::parse_endpoint(bytes, s); });
}
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw(
        [&](gpuverbs::detail::Status& s) { return detail::parse_remote_memory(bytes, s); });
}
RemoteMemory parse_remote_memory(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(
        ec, [&](gpuverbs::detail::Status& s) { return detail::parse_remote_memory(bytes, s); });
}
Handshake parse_handshake(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_handshake(bytes, s); });
}
Handshake parse_handshake(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_handshake(bytes, s); });
}

LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw(
        [&](gpuverbs::detail::Status& s) { return detail::parse_leased_block_list(bytes, s); });
}
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(
        ec, [&](gpuverbs::detail::Status& s) { return detail::parse_leased_block_list(bytes, s); });
}

std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_block_list(bytes, s); });
}
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_block_list(bytes, s); });
}
MeshRecord parse_mesh_record(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_mesh_record(bytes, s); });
}
MeshRecord parse_mesh_record(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
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
