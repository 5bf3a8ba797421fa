// TransferPlan (transfer.hpp): check two block lists, coalesce neighbours,
// cut into work requests.
#include "gpuverbs/transfers/transfer.hpp"
#include "gpuverbs/detail/access.hpp"

#include "gpuverbs/detail/data_path/posting_path.hpp"

#include "text.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <tuple>
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

/// The plan of the common shapes in one pass: block k of one list pairs with
/// block k of the other (equal lengths, none longer than a message), the
/// destination side under one key. Every check the general walk makes is made
/// here per block while the requests are written, into storage sized once
/// for the worst case (no growth, no per-block call). The overlap check needs
/// no sort when the destination blocks come in order, or are of one size at
/// multiples of it (a pool's slots). Anything else — or a block that fails a
/// check, so that the general walk names it — answers `general`. `planned`
/// with `status` failed means the destination blocks overlap.
template <bool Write>
FastPlan plan_pairs(std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote, std::uint32_t max_sge,
                    std::uint64_t max_message, PlanArray<TransferPlan::Request>& requests,
                    PlanArray<LocalBuffer>& pieces, PlanArray<ibv_sge>& sges, std::uint64_t& bytes, Status& status) {
    const std::size_t n = local.size();
    if (n != remote.size()) return FastPlan::general;
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
    const std::uint32_t dest_key = Write ? remote[0].memory.rkey : 0;
    const std::uint64_t unit = remote[0].length;
    bool ordered = true;
    bool uniform = true;
    std::uint64_t dest_end = 0;
    std::uint64_t dest_min = UINT64_MAX;
    std::uint64_t dest_max = 0;
    std::uint64_t total = 0;
    std::uint64_t request_end = 0;
    for (std::size_t k = 0; k < n; ++k) {
        const LocalBuffer& l = local[k];
        const RemoteBlock& b = remote[k];
        const std::uint64_t length = b.length;
        if (length == 0 || l.length != length || length > max_message || !l.in_region() ||
            !b.memory.contains(b.offset, length) || (Write && b.memory.rkey != dest_key)) {
            return FastPlan::general;
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
            if (request->remote.length < max_message && request->remote.length + length > max_message) {
                return FastPlan::general;
            }
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
    }
    requests.set_size(requests_made);
    pieces.set_size(pieces_made);
    sges.set_size(pieces_made);
    bytes = total;
    if (ordered) return FastPlan::planned;
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
        const FastPlan how = direction == TransferDirection::write
                                 ? plan_pairs<true>(local, remote, max_sge, limits.max_message, fast.requests_,
                                                    fast.pieces_, fast.sges_, fast.bytes_, status)
                                 : plan_pairs<false>(local, remote, max_sge, limits.max_message, fast.requests_,
                                                     fast.pieces_, fast.sges_, fast.bytes_, status);
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

// --- transfers over rails: striping and the job --------------------------------

namespace gpuverbs::detail {

Stripes stripe(const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
               std::span<const std::uint64_t> weights) {
    // The rails with a weight share [first, end); one without gets an empty
    // range where it stands. All weights zero: equal shares.
    const auto requests = plan.requests();
    const std::size_t rails = weights.size();
    Stripes out;
    out.bounds.assign(rails + 1, end);
    out.bounds[0] = first;
    out.bytes.assign(rails, 0);
    if (rails == 0) return out;
    std::uint64_t total = 0; // the whole plan's is known; a part's is summed
    if (first == 0 && end == requests.size()) {
        total = plan.bytes();
    } else {
        for (std::uint32_t i = first; i < end; ++i) total += requests[i].remote.length;
    }
    bool any = false;
    for (std::uint64_t w : weights) any = any || w > 0;
    auto weight = [&](std::size_t k) -> std::uint64_t { return any ? weights[k] : 1; };
    __extension__ typedef unsigned __int128 Wide; // NOLINT(modernize-use-using): total x weight needs 128 bits
    Wide sum_weights = 0;
    for (std::size_t k = 0; k < rails; ++k) sum_weights += weight(k);
    // Rail k ends after the request that brings the running total to its
    // cumulative share; at most one boundary per request, so no rail with a
    // weight is left empty before a busy one.
    std::uint32_t i = first;
    std::uint64_t sum = 0, at_bound = 0;
    Wide cumulative = 0;
    std::size_t last = rails; // the last rail with a weight takes the rest
    while (last > 0 && weight(last - 1) == 0) --last;
    for (std::size_t k = 0; k < rails; ++k) {
        out.bounds[k] = i;
        if (weight(k) == 0) continue; // empty: [i, i)
        cumulative += weight(k);
        if (k + 1 == last) {
            i = end;
            sum = total;
        } else {
            const auto target = static_cast<std::uint64_t>(total * cumulative / sum_weights);
            while (i < end) {
                sum += requests[i].remote.length;
                ++i;
                if (sum >= target) break;
            }
        }
        out.bytes[k] = sum - at_bound;
        at_bound = sum;
    }
    out.bounds[rails] = end; // a rail without weight starts where the next one does: empty
    return out;
}

Stripes stripe(const TransferPlan& plan, std::size_t rails) {
    const std::vector<std::uint64_t> equal(rails, 1);
    return stripe(plan, 0, static_cast<std::uint32_t>(plan.requests().size()), equal);
}

std::vector<BoundRail> bind_rails(std::span<const TransferRail> rails) {
    std::vector<BoundRail> out;
    out.reserve(rails.size());
    for (const TransferRail& r : rails) {
        BoundRail b;
        if (r.qp != nullptr && *r.qp) {
            b.qp = access::core(static_cast<const DataPath&>(*r.qp));
            b.given = true;
        }
        b.local_keys = r.local_keys;
        b.remote_keys = r.remote_keys;
        out.push_back(std::move(b));
    }
    return out;
}

bool TransferJobBase::setup(std::span<const BoundRail> bound, const TransferPlan& plan, const TransferOptions& options,
                            std::error_code& ec, std::string& why) {
    plan_ = &plan;
    notify_ = options.notify;
    failed_blocks_ = options.failed_blocks;
    rail_bytes_ = options.rail_bytes;
    report_ = options.report;
    deadline_at_ = options.deadline;
    auto refuse = [&](std::error_code code, std::string text) {
        ec = code;
        why = std::move(text);
        return false;
    };
    // The queue pairs, held for the set-up; the streams then refer to them
    // as every asynchronous operation does (a QP destroyed later aborts them).
    std::vector<LockedRail> rails(bound.size());
    for (std::size_t k = 0; k < bound.size(); ++k) rails[k] = {bound[k].qp.lock(), &bound[k]};
    if (rails.empty()) return refuse(errc::invalid_argument, "a transfer needs at least one rail");
    if (plan.requests().empty()) return refuse(errc::invalid_argument, "an empty plan");
    if (options.doorbell_batch == 0 || options.doorbell_batch > max_transfer_chain) {
        return refuse(errc::invalid_argument, "doorbell_batch must be 1 to " + std::to_string(max_transfer_chain));
    }
    if (!options.rail_bytes.empty() && options.rail_bytes.size() != rails.size()) {
        return refuse(errc::invalid_argument, "rail_bytes has " + std::to_string(options.rail_bytes.size()) +
                                                  " entries for " + std::to_string(rails.size()) + " rails");
    }
    for (std::size_t k = 0; k < rails.size(); ++k) {
        if (!bound[k].given) {
            return refuse(errc::invalid_argument, "rail " + std::to_string(k) + " has no queue pair");
        }
        if (!rails[k].qp) {
            return refuse(aborted_error(),
                          "rail " + std::to_string(k) + "'s queue pair was destroyed before the transfer started");
        }
        if (std::error_code refusal = async_refusal(rails[k].qp.get())) {
            return refuse(refusal, "rail " + std::to_string(k) + ": " +
                                       (refusal == errc::no_executor ? "the QP's CQ has no executor"
                                                                     : "the QP cannot run asynchronous operations"));
        }
    }
    for (std::size_t k = 1; k < rails.size(); ++k) {
        if (rails[k].qp->pd() != rails[0].qp->pd() &&
            (rails[k].rail->local_keys.empty() || rails[k].rail->remote_keys.empty())) {
            return refuse(errc::invalid_argument,
                          "rail " + std::to_string(k) +
                              "'s queue pair is on another protection domain than rail 0's, whose keys the plan "
                              "holds: give the same memory's keys on that rail (TransferRail::local and ::remote)");
        }
    }
    if (!options.rail_weights.empty() && options.rail_weights.size() != rails.size()) {
        return refuse(errc::invalid_argument, "rail_weights has " + std::to_string(options.rail_weights.size()) +
                                                  " entries for " + std::to_string(rails.size()) + " rails");
    }
    for (std::uint64_t& b : rail_bytes_) b = 0;
    const std::vector<std::uint64_t> equal(options.rail_weights.empty() ? rails.size() : 0, 1);
    const Stripes stripes =
        stripe(plan, 0, static_cast<std::uint32_t>(plan.requests().size()),
               options.rail_weights.empty() ? std::span<const std::uint64_t>(equal) : options.rail_weights);
    rail_count_ = rails.size();
    rails_ = std::make_unique<RailStream[]>(rail_count_);
    for (std::size_t k = 0; k < rail_count_; ++k) {
        RailStream& r = rails_[k];
        r.fn = &TransferJobBase::rail_done;
        r.job = this;
        r.index = k;
        std::string text;
        if (std::error_code e =
                r.setup(*rails[k].qp, plan, stripes.bounds[k], stripes.bounds[k + 1], stripes.bytes[k],
                        rails[k].rail->local_keys, rails[k].rail->remote_keys, options.doorbell_batch, text)) {
            return refuse(e, "rail " + std::to_string(k) + ": " + text);
        }
        r.driver = rails[k].qp->send_cq()->driver();
    }
    executor_ = rails_[0].driver->executor();
    chain_ = options.doorbell_batch;
    failover_ = options.failover && rail_count_ > 1;
    if (failover_) {
        bound_.assign(bound.begin(), bound.end());
        usable_.resize(rail_count_);
    }
    if (rail_count_ > 1 || report_ != nullptr) outcomes_.resize(rail_count_);
    return true;
}

/// The deadline's timer and the job it may stop. The timer's handler holds
/// this (not the job, which finishes without waiting for the timer): under
/// its lock the job is either still there, and may be pinned open, or gone.
struct TransferJobBase::Deadline {
    Deadline(const boost::asio::any_io_executor& executor, TransferJobBase* j) : timer(executor), job(j) {}
    std::mutex mutex;
    boost::asio::steady_timer timer;
    TransferJobBase* job;
};

/// What the machine asks while it decides, answered under the job's lock:
/// a rail is usable when its queue pair is alive and accepts asynchronous
/// operations (then held in usable_ until its streams are submitted).
class TransferJobBase::Probe final : public TransferFsm::Rails {
public:
    explicit Probe(TransferJobBase& job) noexcept : job_(job) {}
    bool usable(std::size_t rail) override {
        std::shared_ptr<QpCore>& qp = job_.usable_[rail];
        qp = job_.bound_[rail].qp.lock();
        return qp && !async_refusal(qp.get());
    }
    bool reaches_notification(std::size_t rail) override {
        return job_.rails_[rail].reaches_remote(job_.plan_->requests().back().remote.rkey);
    }
    void stripe(std::uint32_t first, std::uint32_t end, std::span<const std::uint64_t> weights,
                std::span<std::uint32_t> bounds) override {
        job_.stripes_ = detail::stripe(*job_.plan_, first, end, weights);
        std::copy(job_.stripes_.bounds.begin(), job_.stripes_.bounds.end(), bounds.begin());
    }

private:
    TransferJobBase& job_;
};

void TransferJobBase::start() {
    // The rails with requests (by weight, an empty one may sit between
    // two). Counted before the first submit, and the last one found: once it
    // is submitted the job may already be gone (finished on another thread,
    // or refused at once), so nothing of `this` is read after it.
    RailStream* const rails = rails_.get();
    std::size_t n = 0, last = 0;
    {
        std::lock_guard lock(mutex_);
        std::vector<std::uint32_t> bounds(rail_count_ + 1);
        for (std::size_t k = 0; k < rail_count_; ++k) bounds[k] = rails[k].first();
        bounds[rail_count_] = rails[rail_count_ - 1].end();
        // Started first: a rail refused at once must not finish the job while others are still to start.
        Probe probe(*this);
        fsm_.start(bounds, failover_, notify_.has_value(), probe); // submit them (setup refused an empty plan)
        for (std::size_t k = 0; k < rail_count_; ++k) {
            if (!fsm_.streams()[k].running) continue;
            ++n;
            last = k;
        }
        started_at_ = std::chrono::steady_clock::now();
    }
    if (deadline_at_) {
        // Started before the rails: a deadline that passes while they are
        // submitted stops those not yet submitted as they are.
        deadline_ = std::make_shared<Deadline>(executor_, this);
        std::lock_guard hold(deadline_->mutex); // its handler and the finish wait until the wait is started
        deadline_->timer.expires_at(*deadline_at_);
        deadline_->timer.async_wait([d = deadline_](const boost::system::error_code& ec) {
            if (ec) return; // cancelled: the transfer finished first
            TransferJobBase* job = nullptr;
            {
                std::lock_guard lock(d->mutex);
                job = d->job;
                if (job == nullptr || !job->pin(std::make_error_code(std::errc::timed_out))) return;
            }
            job->stop_pinned();
        });
    }
    for (std::size_t k = 0; k <= last && n > 0; ++k) {
        if (rails[k].first() < rails[k].end()) rails[k].driver->submit(&rails[k]); // rails[last] goes last
    }
}

bool TransferJobBase::pin(std::error_code reason) {
    std::lock_guard lock(mutex_);
    // Finishing (nothing running), notifying (every block landed; the
    // notification ends as it ends), destroyed, or stopped already: nothing to do.
    if (!fsm_.stoppable()) return false;
    // The words first: if they cannot be allocated, nothing has changed.
    if (!fsm_.error() && failed_blocks_ != nullptr) {
        *failed_blocks_ = reason == std::errc::timed_out
                              ? "the deadline passed before every block had moved (nothing more was posted)"
                              : "the transfer was cancelled (nothing more was posted)";
    }
    fsm_.stop(reason); // taken (stoppable): held open until stop_pinned() has stopped every stream
    return true;
}

// Only std::bad_alloc (the words of the reason) can escape: termination rather than a lost stop.
// NOLINTNEXTLINE(bugprone-exception-escape)
void TransferJobBase::stop(std::error_code reason) noexcept {
    if (pin(reason)) stop_pinned();
}

// NOLINTNEXTLINE(bugprone-exception-escape): as finished_one
void TransferJobBase::stop_pinned() noexcept {
    // Each stream stops under its driver's lock; a waiting one finishes here
    // (finished_one), never the job: the pin holds it open. The streams are
    // listed under the lock (takeovers add to them).
    std::vector<RailStream*> streams;
    {
        std::lock_guard lock(mutex_);
        // Not those that finished: their queue pair (and driver) may be gone since.
        const auto all = fsm_.streams();
        for (std::uint32_t id = 0; id < all.size(); ++id) {
            if (all[id].running) streams.push_back(&stream(id));
        }
    }
    for (RailStream* s : streams) s->driver->stop_stream(*s);
    std::unique_lock lock(mutex_);
    Probe probe(*this);
    const TransferFsm::Action a = fsm_.unpin(probe);
    explain(a.why, {});
    perform(lock, a);
}

// Only std::bad_alloc (the words of an error, the handler's post) can escape;
// an operation cannot complete without them, so termination is the answer.
// NOLINTNEXTLINE(bugprone-exception-escape)
void TransferJobBase::rail_done(AsyncOpBase* op, AsyncOpBase::How how, std::error_code ec) noexcept {
    auto* rail = static_cast<RailStream*>(op);
    rail->job->finished_one(*rail, how, ec);
}

void summarize_blocks(const TransferPlan& plan, TransferReport& r) {
    const auto requests = plan.requests();
    r.requests.resize(requests.size(), BlockState::not_posted); // one state per request, whatever was given
    // A block takes the state of its requests: all landed, none posted, or else uncertain.
    constexpr std::uint8_t unseen = 0xff;
    std::vector<std::uint8_t> seen(plan.remote_blocks(), unseen);
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const auto s = static_cast<std::uint8_t>(r.requests[i]);
        for (std::uint32_t b = requests[i].first_remote; b <= requests[i].last_remote; ++b) {
            std::uint8_t& v = seen[b];
            v = v == unseen || v == s ? s : static_cast<std::uint8_t>(BlockState::uncertain);
        }
    }
    r.remote_blocks.resize(seen.size());
    r.landed = r.not_posted = r.uncertain = 0;
    for (std::size_t b = 0; b < seen.size(); ++b) {
        const auto s = seen[b] == unseen ? BlockState::uncertain : static_cast<BlockState>(seen[b]);
        r.remote_blocks[b] = s;
        (s == BlockState::landed ? r.landed : s == BlockState::not_posted ? r.not_posted : r.uncertain) += 1;
    }
}

void TransferJobBase::fill_report() const {
    // A request's state over every stream that carried it (the machine's), per rail what the machine decided.
    const std::size_t n = plan_->requests().size();
    std::vector<RequestState> states(n);
    fsm_.request_states(states);
    TransferReport& r = *report_;
    r.requests.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        r.requests[i] = states[i] == RequestState::landed      ? BlockState::landed
                        : states[i] == RequestState::uncertain ? BlockState::uncertain
                                                               : BlockState::not_posted;
    }
    summarize_blocks(*plan_, r);
    r.rails = outcomes_;
    const auto rails = fsm_.rails();
    for (std::size_t k = 0; k < r.rails.size() && k < rails.size(); ++k) {
        r.rails[k].error = rails[k].error;
        r.rails[k].taken_over = rails[k].taken_over;
        r.rails[k].took_over = rails[k].took_over;
    }
}

RailStream& TransferJobBase::stream(std::uint32_t id) const noexcept {
    return id < rail_count_ ? rails_[id] : *extra_[id - rail_count_];
}

std::uint32_t TransferJobBase::stream_id(const RailStream& s) const noexcept {
    if (s.index < rail_count_ && &rails_[s.index] == &s) return static_cast<std::uint32_t>(s.index);
    std::size_t i = 0; // a takeover: few, and only after a failure
    while (extra_[i].get() != &s) ++i;
    return static_cast<std::uint32_t>(rail_count_ + i);
}

bool TransferJobBase::make_takeover(const TransferFsm::Action& action, Holds& hold) {
    std::vector<std::unique_ptr<RailStream>> made;
    for (std::uint32_t id = action.first_stream; id < action.end_stream; ++id) {
        const TransferFsm::Stream& t = fsm_.streams()[id];
        QpCore& qp = *usable_[t.rail]; // the machine asked: alive and usable
        auto s = std::make_unique<RailStream>();
        s->fn = &TransferJobBase::rail_done;
        s->job = this;
        s->index = t.rail;
        std::string why;
        if (s->setup(qp, *plan_, t.first, t.end, stripes_.bytes[t.rail], bound_[t.rail].local_keys,
                     bound_[t.rail].remote_keys, chain_, why)) {
            return false; // a key it cannot translate: checked at the start only for its own share
        }
        s->driver = qp.send_cq()->driver();
        made.push_back(std::move(s));
    }
    for (auto& s : made) { // kept once every stream could be made, in the machine's order
        hold.push_back(usable_[s->index]);
        extra_.push_back(std::move(s));
    }
    return true;
}

void TransferJobBase::finished_one(RailStream& rail, AsyncOpBase::How how, std::error_code ec) {
    const std::size_t k = rail.index;
    Holds hold; // the takeovers' queue pairs, alive until submitted
    std::unique_lock lock(mutex_);
    // Every completion, an abort's too, comes after its driver released its
    // lock (async_driver.hpp): takeovers are submitted from here directly.
    std::error_code e = rail.error();
    if (!e && rail.failure) e = *rail.failure;
    if (!e) e = ec;
    const std::uint64_t moved = rail.bytes();
    bytes_ += moved;
    if (!rail_bytes_.empty()) rail_bytes_[k] += moved;
    if (!outcomes_.empty()) {
        outcomes_[k].bytes += moved;
        outcomes_[k].busy = std::chrono::steady_clock::now() - started_at_;
    }
    std::string text;
    if (e) {
        const bool stopping = fsm_.phase() == TransferFsm::Phase::stopping;
        if (rail.notification_failed()) {
            text = "the notification after the last block";
        } else if (rail.failed()) {
            text = plan_->blocks_of(rail.failed_request());
        } else if (!stopping && e == aborted_error()) {
            text = "its queue pair or completion queue was destroyed";
        } else {
            text = "the transfer was stopped (" + e.message() + ")";
        }
        if (rail_count_ > 1) text += " on rail " + std::to_string(k);
    }
    TransferFsm::StreamEnd end;
    end.stream = stream_id(rail);
    end.landed_end = rail.landed_end();
    end.posted_end = rail.posted_end();
    end.error = e;
    end.failure = classify_stream_failure(e, rail.wc_status(), rail.post_refused(), rail.notification_failed());
    end.own_failure = rail.failed();
    end.destroyed = how == AsyncOpBase::How::destroy;
    Probe probe(*this);
    TransferFsm::Action a = fsm_.stream_finished(end, probe);
    if (a.kind == TransferFsm::Action::Kind::make_streams) a = fsm_.takeover_made(make_takeover(a, hold), probe);
    // A rail that failed while the transfer was stopping failed all the same (its group should know).
    if (a.record_failure && !outcomes_.empty()) outcomes_[k].failure = e.message() + ": " + text;
    explain(a.why, std::move(text));
    perform(lock, a); // `hold` outlives the submissions
}

void TransferJobBase::explain(TransferFsm::Why why, std::string text) {
    if (failed_blocks_ == nullptr) return;
    switch (why) {
        case TransferFsm::Why::none:
        case TransferFsm::Why::stopped: return; // pin() wrote them before the stop was taken
        case TransferFsm::Why::stream_failed: *failed_blocks_ = std::move(text); return;
        case TransferFsm::Why::every_rail_failed: {
            // No rail was left to take its requests: name every rail that failed, and why.
            std::string all = "every rail failed:";
            const auto rails = fsm_.rails();
            for (std::size_t j = 0; j < rail_count_; ++j) {
                if (rails[j].error) all += " rail " + std::to_string(j) + ": " + outcomes_[j].failure + ";";
            }
            all.pop_back();
            *failed_blocks_ = std::move(all);
            return;
        }
        case TransferFsm::Why::no_rail_for_notification:
            *failed_blocks_ =
                "every block landed, but no rail that has not failed reaches the notification's "
                "remote region (give its key on another rail: TransferRail::remote)";
            return;
    }
}

void TransferJobBase::submit_stream(RailStream* s) {
    // Never under a driver's lock: every completion, aborts included, reaches
    // the job after the driver released it, so a takeover may go to any driver.
    s->driver->submit(s);
}

void TransferJobBase::perform(std::unique_lock<std::mutex>& lock, const TransferFsm::Action& action) {
    using Kind = TransferFsm::Action::Kind;
    // The queue pairs the machine looked at are not held past this event, but those about to be submitted to.
    // They are let go after the job's lock (the last reference destroys a
    // queue pair, which waits for its CQ's pollers: never under our lock).
    std::shared_ptr<QpCore> notify_qp;
    if (action.kind == Kind::notify && failover_) notify_qp = std::move(usable_[action.rail]);
    Holds released(usable_.size());
    released.swap(usable_);
    switch (action.kind) {
        case Kind::wait:
        case Kind::make_streams: // answered in finished_one
        case Kind::stop_streams: // performed by stop_pinned
            lock.unlock();
            return;
        case Kind::submit: {
            // Listed under the lock; once the last is submitted the job may be gone.
            std::vector<RailStream*> streams;
            const auto all = fsm_.streams();
            for (std::uint32_t id = action.first_stream; id < action.end_stream; ++id) {
                if (all[id].running) streams.push_back(&stream(id));
            }
            lock.unlock();
            for (RailStream* s : streams) submit_stream(s);
            return;
        }
        case Kind::notify: {
            // On the first rail that has not failed and reaches the plan's last remote block.
            RailStream* notify = &rails_[action.rail];
            const std::uint32_t immediate = *notify_;
            lock.unlock();
            notify->reset_for_resubmit();
            notify->arm_notification(immediate);
            submit_stream(notify);
            return;
        }
        case Kind::finish: break;
    }
    error_ = fsm_.error();
    const bool destroy = fsm_.destroyed();
    lock.unlock();
    if (deadline_) {
        // The timer's handler finds no job from here on; a pending wait ends
        // early (not while the execution context is being destroyed: its
        // services are shutting down, and the wait is destroyed with them).
        std::lock_guard held(deadline_->mutex);
        deadline_->job = nullptr;
        if (!destroy) deadline_->timer.cancel();
    }
    if (!destroy && report_ != nullptr) fill_report();
    finish_(this, destroy);
}

} // namespace gpuverbs::detail
