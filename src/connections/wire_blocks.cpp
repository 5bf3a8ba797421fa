// Wire records of block lists: the blocks of a transfer (regions once,
// then offsets and lengths) and the leased list that wraps them.
#include "gpuverbs/connections/wire.hpp"

#include "wire_codec.hpp"

#include <algorithm>
#include <string>

namespace gpuverbs::wire {

using namespace codec;

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

} // namespace detail

LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw(
        [&](gpuverbs::detail::Status& s) { return detail::parse_leased_block_list(bytes, s); });
}
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(
        ec, [&](gpuverbs::detail::Status& s) { return detail::parse_leased_block_list(bytes, s); });
}
LeasedBlockList parse_leased_block_list(std::span<const std::byte> bytes, std::error_code& ec,
                                        Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(
        ec, diagnostics, [&](gpuverbs::detail::Status& s) { return detail::parse_leased_block_list(bytes, s); });
}
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes) {
    return gpuverbs::detail::or_throw([&](gpuverbs::detail::Status& s) { return detail::parse_block_list(bytes, s); });
}
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, std::error_code& ec) {
    return gpuverbs::detail::or_code(ec,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_block_list(bytes, s); });
}
std::vector<RemoteBlock> parse_block_list(std::span<const std::byte> bytes, std::error_code& ec,
                                          Diagnostics& diagnostics) {
    return gpuverbs::detail::or_code(ec, diagnostics,
                                     [&](gpuverbs::detail::Status& s) { return detail::parse_block_list(bytes, s); });
}

} // namespace gpuverbs::wire
