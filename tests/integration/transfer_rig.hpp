// What the transfer suites share: the queue pairs they use, the block
// layouts they move (mixed sizes shuffled, or equal blocks scattered), the
// byte pattern and its checks, and what a transfer's handler was given.
#pragma once

#include "rig_pair.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace gpuverbs::test {

/// The transfer suites' queue pairs: 128 sends deep, 4 pieces a request.
inline QueuePairOptions transfer_qp_options() {
    QueuePairOptions o = test_qp_options();
    o.max_send_wr = 128;
    o.max_send_sge = 4;
    return o;
}

/// A pair as the transfer suites use it: event-driven CQs bound to
/// `executor`, and each side's memory the other's to write and read (no atomics).
inline Pair transfer_pair(const boost::asio::any_io_executor& executor, std::size_t bytes) {
    return Pair(executor, AsyncOptions{CompletionMode::event_driven, {}}, bytes, transfer_qp_options(), {},
                Access::local_write | Access::remote_write | Access::remote_read);
}

inline std::byte pattern(std::size_t i, std::uint32_t seed) {
    return std::byte((i * 131 + seed) % 251);
}

/// `count` blocks of mixed sizes (1 .. max_block, multiples of nothing), laid
/// out contiguously on the source, and a shuffled placement on the
/// destination with gaps (so that few neighbours coalesce).
struct Layout {
    std::vector<std::size_t> lengths, source, destination;
    std::size_t bytes = 0;
};
inline Layout layout(std::size_t count, std::size_t max_block, std::uint32_t seed) {
    Layout l;
    std::mt19937 random(seed);
    for (std::size_t k = 0; k < count; ++k) l.lengths.push_back(1 + random() % max_block);
    std::size_t at = 0;
    for (std::size_t n : l.lengths) {
        l.source.push_back(at);
        at += n;
    }
    l.bytes = at;
    std::vector<std::size_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random);
    l.destination.resize(count);
    at = 0;
    for (std::size_t k : order) {
        l.destination[k] = at;
        at += l.lengths[k] + 1 + random() % 3; // a gap of 1-3 bytes
    }
    return l;
}

/// The lists of a transfer: the local blocks and the remote ones.
struct Lists {
    std::vector<LocalBuffer> local;
    std::vector<RemoteBlock> remote;
};

/// 40 blocks of 100 bytes, packed in `from` and every other 100 bytes in
/// `to`, with the peer's key of block `wrong_at` spoiled: the device refuses
/// that block (a remote access error) after the ones before it completed.
inline Lists lists_with_wrong_key(const MemoryRegion& from, const RemoteMemory& to, std::size_t wrong_at = 23) {
    RemoteMemory wrong = to;
    wrong.rkey ^= 0x5a5a00;
    Lists out;
    for (std::size_t k = 0; k < 40; ++k) {
        out.local.push_back(from.slice(k * 100, 100));
        out.remote.push_back({k == wrong_at ? wrong : to, k * 200, 100});
    }
    return out;
}

/// The lists of a write of layout `l`: its source blocks in `from`, its
/// destination blocks in `to`.
inline Lists write_lists(const Layout& l, const MemoryRegion& from, const RemoteMemory& to) {
    Lists out;
    for (std::size_t k = 0; k < l.lengths.size(); ++k) {
        out.local.push_back(from.slice(l.source[k], l.lengths[k]));
        out.remote.push_back({to, l.destination[k], l.lengths[k]});
    }
    return out;
}

/// Destination bytes of layout `l` in `to` that differ from the pattern written with `seed`.
inline std::size_t wrong_bytes(const Layout& l, std::span<const std::byte> to, std::uint32_t seed) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < l.lengths.size(); ++k) {
        for (std::size_t i = 0; i < l.lengths[k]; ++i) {
            bad += to[l.destination[k] + i] != pattern(l.source[k] + i, seed) ? 1 : 0;
        }
    }
    return bad;
}

/// `blocks` blocks of `block` bytes, contiguous on the source and scattered
/// in reverse order on the destination, a block apart (block k at
/// (2 x blocks - 1 - 2k) x block): no two coalesce.
struct Scatter {
    std::size_t blocks = 0, block = 0;

    [[nodiscard]] std::size_t bytes() const { return blocks * block; }
    /// Memory that holds the destination.
    [[nodiscard]] std::size_t span() const { return 2 * blocks * block; }
    /// Where block k lands.
    [[nodiscard]] std::size_t at(std::size_t k) const { return (2 * blocks - 1 - 2 * k) * block; }

    [[nodiscard]] Lists lists(const MemoryRegion& from, const RemoteMemory& to) const {
        Lists out;
        for (std::size_t k = 0; k < blocks; ++k) {
            out.local.push_back(from.slice(k * block, block));
            out.remote.push_back({to, at(k), block});
        }
        return out;
    }
    /// The write of every block, one request each (TransferLimits{1}).
    [[nodiscard]] TransferPlan plan(const MemoryRegion& from, const RemoteMemory& to) const {
        const Lists l = lists(from, to);
        return TransferPlan(TransferDirection::write, l.local, l.remote, TransferLimits{1});
    }
    /// Writes the pattern of `seed` over the source.
    void fill(std::span<std::byte> from, std::uint32_t seed) const {
        for (std::size_t i = 0; i < bytes(); ++i) from[i] = pattern(i, seed);
    }
    /// Bytes at the destination `to` that differ from the pattern of `seed`,
    /// in every block, or only in those `report` says landed; every `stride`th byte.
    [[nodiscard]] std::size_t wrong(std::span<const std::byte> to, std::uint32_t seed,
                                    const TransferReport* report = nullptr, std::size_t stride = 1) const {
        std::size_t bad = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            if (report != nullptr && report->remote_blocks[k] != BlockState::landed) continue;
            for (std::size_t i = 0; i < block; i += stride)
                bad += to[at(k) + i] != pattern(k * block + i, seed) ? 1 : 0;
        }
        return bad;
    }
    /// Bytes at the destination `to` no longer `before` in the blocks that `report` puts in `state`.
    [[nodiscard]] std::size_t touched(std::span<const std::byte> to, const TransferReport& report, BlockState state,
                                      std::byte before = std::byte{0xEE}) const {
        std::size_t changed = 0;
        for (std::size_t k = 0; k < blocks; ++k) {
            if (report.remote_blocks[k] != state) continue;
            for (std::size_t i = 0; i < block; ++i) changed += to[at(k) + i] != before ? 1 : 0;
        }
        return changed;
    }
};

/// What a transfer's handler was given, and how many times it ran.
struct Outcome {
    int calls = 0;
    boost::system::error_code result;
    std::size_t moved = 0;   ///< transfer.bytes
    TransferResult transfer; ///< what the handler received: the bytes, the failed blocks, the report

    /// The handler that records it (and then runs `also`).
    template <class Also = void (*)()>
    auto handler(Also also = [] {}) {
        return [this, also](boost::system::error_code ec, TransferResult r) mutable {
            ++calls;
            result = ec;
            moved = r.bytes;
            transfer = std::move(r);
            also();
        };
    }
};

} // namespace gpuverbs::test
