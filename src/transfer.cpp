// TransferPlan (transfer.hpp): check two block lists, coalesce neighbours,
// cut into work requests.
#include "gpuverbs/transfer.hpp"

#include "gpuverbs/detail/posting_path.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <tuple>
#include <utility>

namespace gpuverbs {

namespace {

std::string hex(std::uint64_t v) {
    char text[24];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
    return text;
}

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
                            std::to_string(std::max(index_a, index_b)) + " overlap (bytes " + hex(begin_b) + " to " +
                            hex(std::min(end_a, end_b)) +
                            (std::string(side) == "remote" ? " of rkey " + hex(key_a) : std::string()) +
                            "): both would be written, and which lands last is undefined");
            return true;
        }
    }
    return false;
}

} // namespace

namespace detail {

TransferPlan make_transfer_plan(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, Status& status) {
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
                            hex(local[i].address) + ") lies outside its memory region (" + hex(local[i].region_begin) +
                            " to " + hex(local[i].region_end) + ")");
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
                            std::to_string(b.memory.length) + " bytes (rkey " + hex(b.memory.rkey) + ")");
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

    // What one request may carry: the QP's limit, and what the posting path lowers at most.
    const std::uint32_t max_sge =
        std::min<std::uint32_t>(limits.max_sge, static_cast<std::uint32_t>(detail::max_sge_per_request));
    // Walk both lists together. A request grows while the remote side stays
    // contiguous in one region (neighbouring blocks coalesce), the message
    // limit allows, and the local side fits in max_sge pieces (contiguous
    // local blocks of one region share a piece).
    std::vector<TransferPlan::Request> out;
    std::vector<LocalBuffer> pieces;
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
    result.sges_.reserve(pieces.size());
    for (const LocalBuffer& piece : pieces) result.sges_.push_back(ibv_sge{piece.address, piece.length, piece.lkey});
    result.direction_ = direction;
    result.requests_ = std::move(out);
    result.pieces_ = std::move(pieces);
    result.bytes_ = local_total;
    result.local_blocks_ = local.size();
    result.remote_blocks_ = remote.size();
    return result;
}

} // namespace detail

TransferPlan TransferPlan::make(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits) {
    return detail::or_throw(
        [&](detail::Status& s) { return detail::make_transfer_plan(direction, local, remote, limits, s); });
}

TransferPlan TransferPlan::make(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec,
                                Diagnostics& diagnostics) {
    detail::Status status;
    TransferPlan plan = detail::make_transfer_plan(direction, local, remote, limits, status);
    status.report(diagnostics);
    ec = status.code;
    return plan;
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

// --- the engine: one stream per rail -----------------------------------------

namespace gpuverbs::detail {

namespace {
std::string key_hex(std::uint32_t key) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", key);
    return text;
}
const KeyMap* find_key(std::span<const KeyMap> keys, std::uint32_t plan_key) noexcept {
    for (const KeyMap& k : keys) {
        if (k.plan_key == plan_key) return &k;
    }
    return nullptr;
}
} // namespace

std::error_code RailStream::setup(QpCore& core, const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
                                  std::uint64_t bytes, std::span<const KeyMap> local_keys,
                                  std::span<const KeyMap> remote_keys, std::uint32_t chain, std::string& why) {
    qp = &core;
    owner = &core;
    queue = &core.async_send;
    streaming = true;
    opcode = plan.direction() == TransferDirection::write ? Opcode::write : Opcode::read;
    opcode_ = plan.direction() == TransferDirection::write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    plan_ = &plan;
    first_ = next_ = done_until_ = first;
    end_ = end;
    total_bytes_ = bytes;
    chain_ = std::min({chain, max_transfer_chain, core.send.capacity()});
    const auto requests = plan.requests();
    const std::span<const ibv_sge> pieces = plan.native_pieces();
    // Scatter/gather: the plan's own, or a copy with this rail's keys.
    sges_ = pieces.data();
    if (!local_keys.empty() && first < end) {
        const std::uint32_t p0 = requests[first].first_piece;
        const std::uint32_t p1 = requests[end - 1].first_piece + requests[end - 1].piece_count;
        own_sges_.reset(new ibv_sge[p1 - p0]);
        std::copy(pieces.begin() + p0, pieces.begin() + p1, own_sges_.get());
        // Then only the keys: most transfers name one region, so the first map entry usually matches.
        const KeyMap first_key = local_keys.front();
        for (ibv_sge* sge = own_sges_.get(); sge != own_sges_.get() + (p1 - p0); ++sge) {
            if (sge->lkey == first_key.plan_key) {
                sge->lkey = first_key.rail_key;
                continue;
            }
            const KeyMap* k = find_key(local_keys, sge->lkey);
            if (k == nullptr) {
                why = "the rail has no key for the local region with lkey " + key_hex(sge->lkey) +
                      " (TransferRail::local(region in the plan, the same memory on this rail))";
                return errc::invalid_argument;
            }
            sge->lkey = k->rail_key;
        }
        sges_ = own_sges_.get() - p0; // indexed by the plan's piece numbers
    }
    if (!remote_keys.empty()) {
        remote_keys_.assign(remote_keys.begin(), remote_keys.end());
        for (std::uint32_t i = first; i < end; ++i) {
            if (find_key(remote_keys, requests[i].remote.rkey) == nullptr) {
                why = "the rail has no key for the remote region with rkey " + key_hex(requests[i].remote.rkey) +
                      " (TransferRail::remote(region in the plan, the same memory on this rail))";
                return errc::invalid_argument;
            }
        }
    }
    // At most one chain per request, and never more chains than the queue holds requests.
    ring_size_ = std::max<std::uint32_t>(1, std::min<std::uint32_t>(core.send.capacity(), end - first + 1));
    ring_ = std::make_unique<Chain[]>(ring_size_);
    return {};
}

std::uint32_t RailStream::rkey_slow(std::uint32_t plan_key) const noexcept {
    const KeyMap* k = find_key(remote_keys_, plan_key);
    return k != nullptr ? k->rail_key : plan_key; // every key was checked in setup
}

void RailStream::arm_notification(std::uint32_t immediate) noexcept {
    notify_ = true;
    counted_ = bytes(); // its blocks' bytes were reported when the rail finished them
    immediate_ = immediate;
    opcode = Opcode::write_with_imm;
}

void RailStream::reset_for_resubmit() noexcept {
    state = OpState::fresh;
    prev = next = nullptr;
    failure.reset();
}

void RailStream::post_some() noexcept {
    WorkQueueState& q = qp->send;
    const auto context = reinterpret_cast<std::uintptr_t>(static_cast<AsyncOpBase*>(this));
    const std::uint32_t tag = qp->send_tag();
    const auto requests = plan_->requests();
    std::array<ibv_send_wr, max_transfer_chain> wrs;
    for (;;) {
        const std::uint32_t n = needs();
        if (n == 0 || chains_in_flight_ == ring_size_ || !q.has_room_for(n)) return;
        const std::uint64_t base = q.posted();
        if (notify_) {
            // The notification: zero bytes to the last remote byte the plan names.
            const TransferPlan::Request& last = requests.back();
            ibv_send_wr& wr = wrs[0];
            q.record(0, context, Opcode::write_with_imm);
            wr.wr_id = WrId::encode(QueueKind::send, tag, q.slot(0));
            wr.sg_list = nullptr;
            wr.num_sge = 0;
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(immediate_);
            wr.wr.rdma.remote_addr = last.remote.address + last.remote.length - 1;
            wr.wr.rdma.rkey = rkey_of(last.remote.rkey);
        } else {
            // The hot loop: what a raw loop writes per request, plus the slot
            // that leads a completion (or an error) back here.
            q.record_run(n, context, opcode);
            const std::uint64_t id = WrId::encode(QueueKind::send, tag, 0);
            const std::uint32_t mask = q.mask();
            const TransferPlan::Request* r = requests.data() + next_;
            const bool translate = !remote_keys_.empty();
            const ibv_wr_opcode op = opcode_;
            ibv_sge* const sges = const_cast<ibv_sge*>(sges_); // verbs only reads a request's list
            for (std::uint32_t k = 0; k < n; ++k, ++r) {
                ibv_send_wr& wr = wrs[k];
                wr.wr_id = id | (static_cast<std::uint32_t>(base + k) & mask);
                wr.next = &wrs[k + 1];
                wr.sg_list = sges + r->first_piece;
                wr.num_sge = static_cast<int>(r->piece_count);
                wr.opcode = op;
                wr.send_flags = 0;
                wr.wr.rdma.remote_addr = r->remote.address;
                wr.wr.rdma.rkey = translate ? rkey_of(r->remote.rkey) : r->remote.rkey;
            }
        }
        wrs[n - 1].next = nullptr;
        wrs[n - 1].send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        const int rc = ibv_post_send(qp->qp(), wrs.data(), &bad);
        if (rc != 0) {
            // The provider refused a request it was given room for. Those before
            // it went out unsignaled: their completions are left without an owner.
            const auto posted = static_cast<std::uint32_t>(bad - wrs.data());
            q.commit(posted);
            q.forget_last(posted);
            post_error_ = std::error_code(rc, std::system_category());
            failed_request_ = notify_ ? static_cast<std::uint32_t>(requests.size()) : next_ + posted;
            return;
        }
        q.commit(n);
        Chain& c = ring_[(ring_head_ + chains_in_flight_) % ring_size_];
        c = Chain{base + 1, base + n, notify_ ? static_cast<std::uint32_t>(requests.size()) : next_, notify_ ? 0 : n};
        ++chains_in_flight_;
        if (notify_) {
            notify_ = false;
            next_ = end_; // nothing after it
        } else {
            next_ += n;
        }
    }
}

void RailStream::completed(const ibv_wc& wc, std::uint64_t sequence) noexcept {
    // Completions come in order: this one belongs to the oldest chain in flight.
    const Chain& c = ring_[ring_head_];
    if (wc.status != IBV_WC_SUCCESS && wc_error_ == IBV_WC_SUCCESS && !post_error_) {
        wc_error_ = wc.status;
        failed_request_ = c.first_request + static_cast<std::uint32_t>(sequence - c.first_sequence);
    }
    if (sequence != c.last_sequence) return; // an unsignaled request that failed; its chain's end follows
    if (wc.status == IBV_WC_SUCCESS && !failed() && c.count > 0) done_until_ = c.first_request + c.count;
    ring_head_ = (ring_head_ + 1) % ring_size_;
    --chains_in_flight_;
}

std::uint64_t RailStream::bytes() const noexcept {
    // The requests of every chain that completed before the first error (summed once, not per request).
    std::uint64_t total = total_bytes_;
    if (done_until_ != end_) {
        total = 0;
        const auto requests = plan_->requests();
        for (std::uint32_t i = first_; i < done_until_; ++i) total += requests[i].remote.length;
    }
    return total - counted_;
}

std::error_code RailStream::error() const noexcept {
    if (post_error_) return post_error_;
    if (wc_error_ != IBV_WC_SUCCESS) return make_wc_error(wc_error_);
    return {};
}

Stripes stripe(const TransferPlan& plan, std::size_t rails) {
    // Boundaries: rail k runs [bounds[k], bounds[k + 1]).
    const auto requests = plan.requests();
    Stripes out;
    out.bounds.assign(rails + 1, static_cast<std::uint32_t>(requests.size()));
    out.bounds[0] = 0;
    out.bytes.assign(rails, 0);
    if (rails == 0) return out;
    out.bytes[0] = plan.bytes();
    if (rails == 1) return out;
    // Rail k starts after the request that brings the running total to k shares.
    const std::uint64_t total = plan.bytes();
    auto share = [&](std::size_t k) {
        return total / rails * k + total % rails * k / rails; // no overflow for any total
    };
    std::size_t k = 1;
    std::uint64_t target = share(1);
    std::uint64_t sum = 0;
    std::uint64_t at_bound = 0;
    const std::uint32_t n = static_cast<std::uint32_t>(requests.size());
    const TransferPlan::Request* r = requests.data();
    for (std::uint32_t i = 0; i < n && k < rails; ++i) {
        sum += r[i].remote.length;
        if (sum >= target) { // at most one boundary per request: no empty rail before a busy one
            out.bounds[k] = i + 1;
            out.bytes[k - 1] = sum - at_bound;
            at_bound = sum;
            target = share(++k);
        }
    }
    for (; k <= rails; ++k) { // the rails after the last boundary: the rest, then nothing
        out.bytes[k - 1] = total - at_bound;
        at_bound = total;
    }
    return out;
}

bool TransferJobBase::setup(std::span<const TransferRail> rails, const TransferPlan& plan,
                            const TransferOptions& options, std::error_code& ec, std::string& why) {
    plan_ = &plan;
    notify_ = options.notify;
    failed_blocks_ = options.failed_blocks;
    rail_bytes_ = options.rail_bytes;
    auto refuse = [&](std::error_code code, std::string text) {
        ec = code;
        why = std::move(text);
        return false;
    };
    if (rails.empty()) return refuse(errc::invalid_argument, "a transfer needs at least one rail");
    if (plan.requests().empty()) return refuse(errc::invalid_argument, "an empty plan");
    if (options.notify && plan.direction() == TransferDirection::read) {
        return refuse(errc::invalid_argument, "a read needs no notification: the reader knows when it is done");
    }
    if (options.doorbell_batch == 0 || options.doorbell_batch > max_transfer_chain) {
        return refuse(errc::invalid_argument, "doorbell_batch must be 1 to " + std::to_string(max_transfer_chain));
    }
    if (!options.rail_bytes.empty() && options.rail_bytes.size() != rails.size()) {
        return refuse(errc::invalid_argument, "rail_bytes has " + std::to_string(options.rail_bytes.size()) +
                                                  " entries for " + std::to_string(rails.size()) + " rails");
    }
    for (std::size_t k = 0; k < rails.size(); ++k) {
        if (rails[k].qp == nullptr || !*rails[k].qp) {
            return refuse(errc::invalid_argument, "rail " + std::to_string(k) + " has no queue pair");
        }
        if (std::error_code refusal = async_refusal(&core_of(*rails[k].qp))) {
            return refuse(refusal, "rail " + std::to_string(k) + ": " +
                                       (refusal == errc::no_executor ? "the QP's CQ has no executor"
                                                                     : "the QP cannot run asynchronous operations"));
        }
    }
    for (std::size_t k = 1; k < rails.size(); ++k) {
        if (core_of(*rails[k].qp).pd() != core_of(*rails[0].qp).pd() && rails[k].local_keys.empty()) {
            return refuse(errc::invalid_argument,
                          "rail " + std::to_string(k) +
                              "'s queue pair is on another protection domain than rail 0's, whose keys the plan "
                              "holds: give the same memory's keys on that rail (TransferRail::local and ::remote)");
        }
    }
    for (std::uint64_t& b : rail_bytes_) b = 0;
    const Stripes stripes = stripe(plan, rails.size());
    rail_count_ = rails.size();
    rails_ = std::make_unique<RailStream[]>(rail_count_);
    for (std::size_t k = 0; k < rail_count_; ++k) {
        RailStream& r = rails_[k];
        r.fn = &TransferJobBase::rail_done;
        r.job = this;
        r.index = k;
        std::string text;
        if (std::error_code e =
                r.setup(core_of(*rails[k].qp), plan, stripes.bounds[k], stripes.bounds[k + 1], stripes.bytes[k],
                        rails[k].local_keys, rails[k].remote_keys, options.doorbell_batch, text)) {
            return refuse(e, "rail " + std::to_string(k) + ": " + text);
        }
        r.driver = core_of(*rails[k].qp).send_cq()->driver();
    }
    return true;
}

void TransferJobBase::start() noexcept {
    {
        std::lock_guard lock(mutex_);
        for (std::size_t k = 0; k < rail_count_; ++k) {
            if (rails_[k].first() < rails_[k].end()) ++running_;
        }
    }
    // Counted first: a rail refused at once must not finish the job while others are still to start.
    for (std::size_t k = 0; k < rail_count_; ++k) {
        RailStream& r = rails_[k];
        if (r.first() < r.end()) r.driver->submit(&r);
    }
}

// Only std::bad_alloc (the words of an error, the handler's post) can escape;
// an operation cannot complete without them, so termination is the answer.
// NOLINTNEXTLINE(bugprone-exception-escape)
void TransferJobBase::rail_done(AsyncOpBase* op, AsyncOpBase::How how, std::error_code ec) noexcept {
    auto* rail = static_cast<RailStream*>(op);
    rail->job->finished_one(*rail, how, ec);
}

void TransferJobBase::finished_one(RailStream& rail, AsyncOpBase::How how, std::error_code ec) {
    const std::size_t k = rail.index;
    bool finish = false;
    bool destroy = false;
    RailStream* notify = nullptr;
    {
        std::lock_guard lock(mutex_);
        if (how == AsyncOpBase::How::destroy) destroyed_ = true;
        std::error_code e = rail.error();
        if (!e && rail.failure) e = *rail.failure;
        if (!e) e = ec;
        if (e && !error_) {
            error_ = e;
            if (failed_blocks_ != nullptr) {
                const std::uint32_t failed = rail.failed_request();
                std::string text = !rail.failed() ? std::string("the transfer was stopped (") + e.message() + ")"
                                   : failed >= plan_->requests().size()
                                       ? std::string("the notification after the last block")
                                       : plan_->blocks_of(failed);
                if (rail_count_ > 1) text += " on rail " + std::to_string(k);
                *failed_blocks_ = std::move(text);
            }
        }
        const std::uint64_t moved = rail.bytes();
        bytes_ += moved;
        if (!rail_bytes_.empty()) rail_bytes_[k] += moved;
        if (--running_ == 0) {
            if (!destroyed_ && !error_ && notify_ && !notified_) {
                notified_ = true;
                running_ = 1;
                notify = &rails_[0];
            } else {
                finish = true;
                destroy = destroyed_;
            }
        }
    }
    if (notify != nullptr) {
        notify->reset_for_resubmit();
        notify->arm_notification(*notify_);
        notify->driver->submit(notify);
        return;
    }
    if (finish) finish_(this, destroy);
}

} // namespace gpuverbs::detail
