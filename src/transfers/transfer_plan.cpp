// TransferPlan (transfer_plan.hpp): check two block lists, coalesce
// neighbours, cut into work requests.
#include "gpuverbs/transfers/transfer_plan.hpp"

#include "gpuverbs/detail/data_path/posting_path.hpp"

#include "text.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <tuple>
#include <type_traits>
#include <utility>

namespace gpuverbs {

namespace {

/// Two blocks that would put bytes in the same place: the destination side of
/// the transfer (remote for writes, local for reads). Entries: (key, begin, end, index).
bool find_overlap(std::vector<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::size_t>>& ranges,
                  const char* side, detail::Status& status) {
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t k = 1; k < ranges.size(); ++k) {
        const auto& [key_a, begin_a, end_a, index_a] = ranges[k - 1];
        const auto& [key_b, begin_b, end_b, index_b] = ranges[k];
        if (key_a == key_b && begin_b < end_a) {
            status.fail(errc::invalid_argument, "TransferPlan",
                        std::string(side) + " blocks " + std::to_string(std::min(index_a, index_b)) + " and " +
                            std::to_string(std::max(index_a, index_b)) + " overlap (bytes " +
                            detail::hex_address(begin_b) + " to " + detail::hex_address(std::min(end_a, end_b)) +
                            (std::string(side) == "remote" ? " of rkey " + detail::hex_address(key_a) : std::string()) +
                            "): both would be written, and which lands last is undefined");
            return true;
        }
    }
    return false;
}

} // namespace

namespace detail {

namespace {

enum class FastPlan : std::uint8_t { planned, general };

/// The destination address of pair k: the remote block's for a write, the
/// local block's for a read (keyed by address alone: two registrations of the
/// same bytes are still the same bytes).
template <bool Write>
std::uint64_t destination(std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
                          std::size_t k) noexcept {
    if constexpr (Write) {
        return remote[k].memory.address + remote[k].offset;
    } else {
        return local[k].address;
    }
}

/// Whether blocks of `unit` bytes starting at `origin` + a multiple of it each
/// have a slot of their own (one bit per slot of the range they span).
template <bool Write, bool PowerOfTwo>
bool one_per_slot(std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote, std::uint64_t origin,
                  std::uint64_t unit, std::uint64_t slots) {
    std::vector<std::uint64_t> taken(slots / 64 + 1);
    const int shift = std::countr_zero(unit);
    for (std::size_t k = 0; k < local.size(); ++k) {
        const std::uint64_t offset = destination<Write>(local, remote, k) - origin;
        const std::uint64_t slot = PowerOfTwo ? offset >> shift : offset / unit;
        const std::uint64_t misaligned = PowerOfTwo ? offset & (unit - 1) : offset % unit;
        const std::uint64_t bit = std::uint64_t{1} << (slot % 64);
        std::uint64_t& word = taken[slot / 64];
        if (misaligned != 0 || (word & bit) != 0) return false;
        word |= bit;
    }
    return true;
}

/// Block k of one list with block k of the other (plan_pairs' source).
struct ListPairs {
    std::span<const LocalBuffer> local;
    std::span<const RemoteBlock> remote;
    [[nodiscard]] std::size_t size() const noexcept { return local.size(); }
    /// The first pair's remote key and length (the destination key and unit of plan_pairs).
    [[nodiscard]] std::uint32_t first_rkey() const noexcept { return remote[0].memory.rkey; }
    [[nodiscard]] std::uint64_t first_length() const noexcept { return remote[0].length; }
    /// Calls step(l, b, k) for each pair in order; false as soon as one answers false.
    template <class Step>
    bool each(Step&& step) const {
        for (std::size_t k = 0; k < local.size(); ++k) {
            if (!step(local[k], remote[k], k)) return false;
        }
        return true;
    }
};

/// The pairs of a StridedPairs, made as they are walked (no list).
struct StridedSource {
    const StridedPairs& p;
    [[nodiscard]] std::size_t size() const noexcept { return p.segments.size() * p.local_ids.size(); }
    [[nodiscard]] std::uint32_t first_rkey() const noexcept { return p.segments[0].remote.rkey; }
    [[nodiscard]] std::uint64_t first_length() const noexcept { return p.length; }
    template <class Step>
    bool each(Step&& step) const {
        const std::size_t n = p.local_ids.size();
        std::size_t k = 0;
        for (const StridedSegment& s : p.segments) {
            LocalBuffer l{0, p.length, s.lkey, s.region_begin, s.region_end};
            RemoteBlock b{s.remote, 0, p.length};
            for (std::size_t i = 0; i < n; ++i, ++k) {
                l.address = s.local_base + p.local_ids[i] * p.local_stride;
                b.offset = s.remote_base + p.remote_ids[i] * p.remote_stride;
                if (!step(l, b, k)) return false;
            }
        }
        return true;
    }
};

/// The plan of the common shapes in one pass: block k of one list pairs with
/// block k of the other (equal lengths, none longer than a message), the
/// destination side under one key. Every check the general walk makes is made
/// here per block while the requests are written, into storage sized once
/// for the worst case (no growth, no per-block call). The overlap check needs
/// no sort when the destination blocks come in order, or are of one size at
/// multiples of it (a pool's slots); a StridedSource's caller has made it
/// (its ids). Anything else — or a block that fails a check, so that the
/// general walk names it — answers `general`. `planned` with `status` failed
/// means the destination blocks overlap.
template <bool Write, class Pairs>
FastPlan plan_pairs(const Pairs& pairs, std::uint32_t max_sge, std::uint64_t max_message,
                    PlanArray<TransferPlan::Request>& requests, PlanArray<LocalBuffer>& pieces,
                    PlanArray<ibv_sge>& sges, std::uint64_t& bytes, Status& status) {
    constexpr bool lists = std::is_same_v<Pairs, ListPairs>;
    const std::size_t n = pairs.size();
    requests = PlanArray<TransferPlan::Request>(n);
    pieces = PlanArray<LocalBuffer>(n);
    sges = PlanArray<ibv_sge>(n);
    // The request being grown and its last piece (one before the first: none yet).
    std::size_t requests_made = 0;
    std::size_t pieces_made = 0;
    TransferPlan::Request* request = nullptr;
    LocalBuffer* piece = nullptr;
    ibv_sge* sge = nullptr;
    // The destination side: in order so far, one key, one block length.
    const std::uint32_t dest_key = Write ? pairs.first_rkey() : 0;
    const std::uint64_t unit = pairs.first_length();
    bool ordered = true;
    bool uniform = true;
    std::uint64_t dest_end = 0;
    std::uint64_t dest_min = UINT64_MAX;
    std::uint64_t dest_max = 0;
    std::uint64_t total = 0;
    std::uint64_t request_end = 0;
    const bool all = pairs.each([&](const LocalBuffer& l, const RemoteBlock& b, std::size_t k) {
        const std::uint64_t length = b.length;
        // One destination key for the overlap check below (a StridedSource's caller checked its ids instead).
        if (length == 0 || l.length != length || length > max_message || !l.in_region() ||
            !b.memory.contains(b.offset, length) || (Write && lists && b.memory.rkey != dest_key)) {
            return false;
        }
        const std::uint64_t address = b.memory.address + b.offset;
        const std::uint64_t dest = Write ? address : l.address;
        ordered = ordered && dest >= dest_end;
        dest_end = dest + length;
        uniform = uniform && length == unit;
        dest_min = std::min(dest_min, dest);
        dest_max = std::max(dest_max, dest);
        total += length;
        // Grow the current request while the remote side stays contiguous in
        // its region and the local side fits its pieces (as the general walk).
        const bool contiguous = k > 0 && b.memory.rkey == request->remote.rkey && address == request_end;
        bool grows = false;
        if (contiguous) {
            // The general walk would split this block at the message limit.
            if (request->remote.length < max_message && request->remote.length + length > max_message) return false;
            grows = request->remote.length + length <= max_message;
        }
        if (grows) {
            if (piece->lkey == l.lkey && piece->address + piece->length == l.address &&
                piece->length + length <= UINT32_MAX) {
                piece->length += static_cast<std::uint32_t>(length);
                piece->region_end = std::max(piece->region_end, l.region_end);
                sge->length = piece->length;
            } else if (request->piece_count < max_sge) {
                piece = ::new (pieces.at(pieces_made)) LocalBuffer(l);
                sge = ::new (sges.at(pieces_made)) ibv_sge{l.address, l.length, l.lkey};
                ++pieces_made;
                ++request->piece_count;
            } else {
                grows = false;
            }
        }
        if (!grows) {
            const auto index = static_cast<std::uint32_t>(k);
            request = ::new (requests.at(requests_made++)) TransferPlan::Request{
                {address, 0, b.memory.rkey}, static_cast<std::uint32_t>(pieces_made), 1, index, index, index};
            piece = ::new (pieces.at(pieces_made)) LocalBuffer(l);
            sge = ::new (sges.at(pieces_made)) ibv_sge{l.address, l.length, l.lkey};
            ++pieces_made;
        }
        request->remote.length += length;
        request->last_remote = static_cast<std::uint32_t>(k);
        request_end = address + length;
        return true;
    });
    if (!all) return FastPlan::general;
    requests.set_size(requests_made);
    pieces.set_size(pieces_made);
    sges.set_size(pieces_made);
    bytes = total;
    if constexpr (lists) {
        if (ordered) return FastPlan::planned;
        const std::span<const LocalBuffer> local = pairs.local;
        const std::span<const RemoteBlock> remote = pairs.remote;
        const std::uint64_t slots = (dest_max - dest_min) / unit + 1;
        if (uniform && slots / 64 <= n) {
            const bool one_each = std::has_single_bit(unit)
                                      ? one_per_slot<Write, true>(local, remote, dest_min, unit, slots)
                                      : one_per_slot<Write, false>(local, remote, dest_min, unit, slots);
            if (one_each) return FastPlan::planned;
        }
        // Out of order and not slots (or two blocks in one slot): the sort decides, and names them.
        std::vector<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::size_t>> ranges;
        ranges.reserve(n);
        for (std::size_t k = 0; k < n; ++k) {
            const std::uint64_t begin = destination<Write>(local, remote, k);
            ranges.emplace_back(dest_key, begin, begin + remote[k].length, k);
        }
        (void)find_overlap(ranges, Write ? "remote" : "local", status);
    }
    return FastPlan::planned;
}

} // namespace

TransferPlan make_transfer_plan(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, Status& status,
                                Planner planner) {
    const char* verb = "TransferPlan";
    if (local.empty() || remote.empty()) {
        status.fail(errc::invalid_argument, verb, "a transfer needs at least one local and one remote block");
        return {};
    }
    if (limits.max_sge == 0 || limits.max_message == 0) {
        status.fail(errc::invalid_argument, verb, "the limits allow no request (max_sge and max_message must be > 0)");
        return {};
    }
    if (local.size() > UINT32_MAX || remote.size() > UINT32_MAX) {
        status.fail(errc::invalid_argument, verb, "more than 2^32 blocks");
        return {};
    }
    // What one request may carry: the QP's limit, and what the posting path lowers at most.
    const std::uint32_t max_sge =
        std::min<std::uint32_t>(limits.max_sge, static_cast<std::uint32_t>(detail::max_sge_per_request));
    if (planner == Planner::best) {
        TransferPlan fast;
        const ListPairs pairs{local, remote};
        const FastPlan how = local.size() != remote.size() ? FastPlan::general
                             : direction == TransferDirection::write
                                 ? plan_pairs<true>(pairs, max_sge, limits.max_message, fast.requests_, fast.pieces_,
                                                    fast.sges_, fast.bytes_, status)
                                 : plan_pairs<false>(pairs, max_sge, limits.max_message, fast.requests_, fast.pieces_,
                                                     fast.sges_, fast.bytes_, status);
        if (how == FastPlan::planned) {
            if (!status.ok()) return {};
            fast.direction_ = direction;
            fast.local_blocks_ = local.size();
            fast.remote_blocks_ = remote.size();
            return fast;
        }
    }
    std::uint64_t local_total = 0;
    for (std::size_t i = 0; i < local.size(); ++i) {
        if (local[i].length == 0) {
            status.fail(errc::invalid_argument, verb,
                        "local block " + std::to_string(i) + " has length 0: leave it out of the list");
            return {};
        }
        if (!local[i].in_region() && local[i].region_begin == local[i].region_end) {
            status.fail(errc::local_range_outside_region, verb,
                        "local block " + std::to_string(i) + " (" + std::to_string(local[i].length) + " bytes at " +
                            detail::hex_address(local[i].address) +
                            ") is in a memory region that was closed (or never registered): it covers no bytes");
            return {};
        }
        if (!local[i].in_region()) {
            status.fail(errc::local_range_outside_region, verb,
                        "local block " + std::to_string(i) + " (" + std::to_string(local[i].length) + " bytes at " +
                            detail::hex_address(local[i].address) + ") lies outside its memory region (" +
                            detail::hex_address(local[i].region_begin) + " to " +
                            detail::hex_address(local[i].region_end) + ")");
            return {};
        }
        local_total += local[i].length;
    }
    std::uint64_t remote_total = 0;
    for (std::size_t j = 0; j < remote.size(); ++j) {
        const RemoteBlock& b = remote[j];
        if (b.length == 0) {
            status.fail(errc::invalid_argument, verb,
                        "remote block " + std::to_string(j) + " has length 0: leave it out of the list");
            return {};
        }
        if (!b.memory.contains(b.offset, b.length)) {
            status.fail(errc::remote_range_outside_region, verb,
                        "remote block " + std::to_string(j) + " (" + std::to_string(b.length) + " bytes at offset " +
                            std::to_string(b.offset) + ") lies outside its remote region of " +
                            std::to_string(b.memory.length) + " bytes (rkey " + detail::hex_address(b.memory.rkey) +
                            ")");
            return {};
        }
        if (b.length > UINT64_MAX - remote_total) {
            status.fail(errc::invalid_argument, verb,
                        "remote block " + std::to_string(j) + ": the remote blocks add up to more than 2^64 bytes");
            return {};
        }
        remote_total += b.length;
    }
    if (local_total != remote_total) {
        status.fail(errc::invalid_argument, verb,
                    "the local blocks hold " + std::to_string(local_total) + " bytes and the remote blocks " +
                        std::to_string(remote_total) + ": both lists must describe the same bytes");
        return {};
    }
    // The destination side must not name a byte twice.
    std::vector<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::size_t>> ranges;
    if (direction == TransferDirection::write) {
        ranges.reserve(remote.size());
        for (std::size_t j = 0; j < remote.size(); ++j) {
            std::uint64_t begin = remote[j].memory.address + remote[j].offset;
            ranges.emplace_back(remote[j].memory.rkey, begin, begin + remote[j].length, j);
        }
        if (find_overlap(ranges, "remote", status)) return {};
    } else {
        ranges.reserve(local.size());
        for (std::size_t i = 0; i < local.size(); ++i) {
            // Keyed by address alone: two registrations of the same bytes are still the same bytes.
            ranges.emplace_back(0, local[i].address, local[i].address + local[i].length, i);
        }
        if (find_overlap(ranges, "local", status)) return {};
    }

    // Walk both lists together. A request grows while the remote side stays
    // contiguous in one region (neighbouring blocks coalesce), the message
    // limit allows, and the local side fits in max_sge pieces (contiguous
    // local blocks of one region share a piece).
    std::vector<TransferPlan::Request> out;
    std::vector<LocalBuffer> pieces;
    out.reserve(remote.size());
    pieces.reserve(std::max(local.size(), remote.size()));
    std::size_t i = 0;
    std::uint64_t i_off = 0;
    std::size_t j = 0;
    std::uint64_t j_off = 0;
    auto remote_address = [&](std::size_t k) { return remote[k].memory.address + remote[k].offset; };
    while (j < remote.size()) {
        TransferPlan::Request r;
        r.remote.address = remote_address(j) + j_off;
        r.remote.rkey = remote[j].memory.rkey;
        r.first_piece = static_cast<std::uint32_t>(pieces.size());
        r.first_local = static_cast<std::uint32_t>(i);
        r.first_remote = static_cast<std::uint32_t>(j);
        for (;;) {
            const LocalBuffer& l = local[i];
            std::uint64_t address = l.address + i_off;
            std::uint64_t n =
                std::min({remote[j].length - j_off, l.length - i_off, limits.max_message - r.remote.length});
            // Contiguous with the last piece in the same region: grow it (a piece is one ibv_sge, < 2^32 bytes).
            bool extends = r.piece_count > 0 && pieces.back().lkey == l.lkey &&
                           pieces.back().address + pieces.back().length == address &&
                           pieces.back().length + n <= UINT32_MAX;
            if (!extends && r.piece_count == max_sge) break;
            if (extends) {
                pieces.back().length += static_cast<std::uint32_t>(n);
                pieces.back().region_end = std::max(pieces.back().region_end, l.region_end);
            } else {
                pieces.push_back(
                    LocalBuffer{address, static_cast<std::uint32_t>(n), l.lkey, l.region_begin, l.region_end});
                ++r.piece_count;
            }
            r.remote.length += n;
            r.last_remote = static_cast<std::uint32_t>(j);
            i_off += n;
            j_off += n;
            if (i_off == l.length) {
                ++i;
                i_off = 0;
            }
            if (r.remote.length == limits.max_message) {
                if (j_off == remote[j].length) {
                    ++j;
                    j_off = 0;
                }
                break;
            }
            if (j_off == remote[j].length) {
                std::uint64_t end = remote_address(j) + remote[j].length;
                std::uint32_t rkey = remote[j].memory.rkey;
                ++j;
                j_off = 0;
                if (j == remote.size() || remote[j].memory.rkey != rkey || remote_address(j) != end) break;
            }
        }
        out.push_back(r);
    }
    TransferPlan result;
    result.sges_ = PlanArray<ibv_sge>(pieces.size());
    for (std::size_t k = 0; k < pieces.size(); ++k) {
        ::new (result.sges_.at(k)) ibv_sge{pieces[k].address, pieces[k].length, pieces[k].lkey};
    }
    result.sges_.set_size(pieces.size());
    result.direction_ = direction;
    result.requests_ = PlanArray<TransferPlan::Request>(out);
    result.pieces_ = PlanArray<LocalBuffer>(pieces);
    result.bytes_ = local_total;
    result.local_blocks_ = local.size();
    result.remote_blocks_ = remote.size();
    return result;
}

TransferPlan make_strided_plan(TransferDirection direction, const StridedPairs& pairs, const TransferLimits& limits,
                               bool& general) {
    general = false;
    Status unused; // the caller checked what could fail but a pair the walk sends to the general planner
    TransferPlan plan;
    const std::uint32_t max_sge =
        std::min<std::uint32_t>(limits.max_sge, static_cast<std::uint32_t>(detail::max_sge_per_request));
    const StridedSource source{pairs};
    const std::size_t n = source.size();
    if (n == 0 || n > UINT32_MAX || max_sge == 0 || limits.max_message == 0) {
        general = true;
        return {};
    }
    const FastPlan how = direction == TransferDirection::write
                             ? plan_pairs<true>(source, max_sge, limits.max_message, plan.requests_, plan.pieces_,
                                                plan.sges_, plan.bytes_, unused)
                             : plan_pairs<false>(source, max_sge, limits.max_message, plan.requests_, plan.pieces_,
                                                 plan.sges_, plan.bytes_, unused);
    if (how != FastPlan::planned) {
        general = true;
        return {};
    }
    plan.direction_ = direction;
    plan.local_blocks_ = n;
    plan.remote_blocks_ = n;
    return plan;
}

} // namespace detail

TransferPlan::TransferPlan(TransferDirection direction, std::span<const LocalBuffer> local,
                           std::span<const RemoteBlock> remote, const TransferLimits& limits)
    : TransferPlan(detail::or_throw(
          [&](detail::Status& s) { return detail::make_transfer_plan(direction, local, remote, limits, s); })) {}

TransferPlan TransferPlan::create(TransferDirection direction, std::span<const LocalBuffer> local,
                                  std::span<const RemoteBlock> remote, const TransferLimits& limits,
                                  std::error_code& ec) {
    return detail::or_code(
        ec, [&](detail::Status& s) { return detail::make_transfer_plan(direction, local, remote, limits, s); });
}

TransferPlan TransferPlan::create(TransferDirection direction, std::span<const LocalBuffer> local,
                                  std::span<const RemoteBlock> remote, const TransferLimits& limits,
                                  std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        return detail::make_transfer_plan(direction, local, remote, limits, s);
    });
}

WorkRequest TransferPlan::work_request(std::size_t i) const noexcept {
    const Request& r = requests_[i];
    std::span<const LocalBuffer> local(pieces_.data() + r.first_piece, r.piece_count);
    return direction_ == TransferDirection::write ? WorkRequest::write(local, r.remote, 0)
                                                  : WorkRequest::read(local, r.remote, 0);
}

std::string TransferPlan::blocks_of(std::size_t i) const {
    const Request& r = requests_[i];
    std::string text = r.first_remote == r.last_remote
                           ? "remote block " + std::to_string(r.first_remote)
                           : "remote blocks " + std::to_string(r.first_remote) + " to " + std::to_string(r.last_remote);
    return text + " (local block " + std::to_string(r.first_local) + " onwards; request " + std::to_string(i) + " of " +
           std::to_string(requests_.size()) + ")";
}

} // namespace gpuverbs
