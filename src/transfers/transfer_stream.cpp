// RailStream (detail/transfers/transfer_stream.hpp): one rail of a block-list transfer
// as the async driver runs it — chains posted, completions attributed,
// refills. Beside the driver: every build of the driver links it.
#include "gpuverbs/detail/transfers/transfer_stream.hpp"

#include "gpuverbs/transfers/transfer.hpp"

#include "text.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdio>

namespace gpuverbs::detail {

namespace {
const KeyMap* find_key(std::span<const KeyMap> keys, std::uint32_t plan_key) noexcept {
    for (const KeyMap& k : keys) {
        if (k.plan_key == plan_key) return &k;
    }
    return nullptr;
}
// The rail's behaviour in the driver (OpBehaviour, async_driver.hpp).
bool rail_has_room(const AsyncOpBase& op) noexcept {
    return op.qp->send.has_room_for(static_cast<const RailStream&>(op).needs());
}
std::error_code rail_post(AsyncOpBase& op) noexcept {
    // Posts what fits; a stream that could post nothing and has nothing in flight failed.
    auto& s = static_cast<RailStream&>(op);
    s.post_some();
    if (!s.finished()) return no_error();
    if (s.error()) return s.error();
    return s.stopped() ? aborted_error() : std::error_code(errc::invalid_argument);
}
Completed rail_completed(AsyncOpBase& op, const ibv_wc& wc, std::uint64_t sequence) noexcept {
    auto& s = static_cast<RailStream&>(op);
    if (s.state != OpState::posted) return Completed::still_posted; // aborted with its queue pair: leads nowhere
    s.completed(wc, sequence);
    // Refill from the room this completion freed; with nothing in flight and
    // no room (other operations hold the queue), wait again like any operation.
    if (!s.finished() && s.needs() > 0) {
        if (s.qp->send.has_room_for(s.needs())) {
            s.post_some();
        } else if (!s.in_flight()) {
            return Completed::wait_again;
        }
    }
    return s.finished() ? Completed::finished : Completed::still_posted;
}
void rail_abandon(AsyncOpBase& op, std::error_code ec) noexcept {
    static_cast<RailStream&>(op).abandon(ec);
}
void rail_stop(AsyncOpBase& op) noexcept {
    static_cast<RailStream&>(op).stop();
}
const OpBehaviour rail_behaviour{&rail_has_room, &rail_post, &rail_completed, &rail_abandon, &rail_stop};

} // namespace

std::error_code RailStream::setup(QpCore& core, const TransferPlan& plan, std::uint32_t first, std::uint32_t end,
                                  std::uint64_t bytes, std::span<const KeyMap> local_keys,
                                  std::span<const KeyMap> remote_keys, std::uint32_t chain, std::string& why) {
    qp = &core;
    owner = &core;
    queue = &core.async_send;
    behaviour = &rail_behaviour;
    opcode = plan.direction() == TransferDirection::write ? Opcode::write : Opcode::read;
    opcode_ = plan.direction() == TransferDirection::write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    if (opcode_ == IBV_WR_RDMA_READ && first < end && core.caps().max_rd_atomic == 0) {
        why = "its queue pair may have no RDMA read outstanding (initiator depth 0: the peer granted no reads)";
        return errc::reads_not_granted;
    }
    plan_ = &plan;
    total_bytes_ = bytes;
    chain = std::min({chain, max_transfer_chain, core.send.capacity()});
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
                why = "the rail has no key for the local region with lkey " + hex_address(sge->lkey) +
                      " (TransferRail::local(region in the plan, the same memory on this rail))";
                return errc::invalid_argument;
            }
            sge->lkey = k->rail_key;
        }
        sges_ = own_sges_.get();
        sge_offset_ = p0; // the plan's piece p is own_sges_[p - p0]
    }
    if (!remote_keys.empty()) {
        remote_keys_.assign(remote_keys.begin(), remote_keys.end());
        // The notification (on the first rail) goes to the plan's last remote byte.
        if (first == 0 && !requests.empty() && find_key(remote_keys, requests.back().remote.rkey) == nullptr) {
            why = "the rail has no key for the remote region with rkey " + hex_address(requests.back().remote.rkey) +
                  " (where the notification goes)";
            return errc::invalid_argument;
        }
        for (std::uint32_t i = first; i < end; ++i) {
            if (find_key(remote_keys, requests[i].remote.rkey) == nullptr) {
                why = "the rail has no key for the remote region with rkey " + hex_address(requests[i].remote.rkey) +
                      " (TransferRail::remote(region in the plan, the same memory on this rail))";
                return errc::invalid_argument;
            }
        }
    }
    // At most one chain per request (and the notification), never more chains than the queue holds requests.
    ledger_.start(first, end, chain, std::min<std::uint32_t>(core.send.capacity(), end - first + 1),
                  static_cast<std::uint32_t>(requests.size()));
    return {};
}

std::uint32_t RailStream::rkey_slow(std::uint32_t plan_key) const noexcept {
    const KeyMap* k = find_key(remote_keys_, plan_key);
    return k != nullptr ? k->rail_key : plan_key; // every key was checked in setup
}

void RailStream::arm_notification(std::uint32_t immediate, std::span<const std::byte> message) noexcept {
    counted_ = bytes(); // its blocks' bytes were reported when the rail finished them
    ledger_.arm_notification();
    immediate_ = immediate;
    message_ = message;
    opcode = message.empty() ? Opcode::write_with_imm : Opcode::send_with_imm;
}

void RailStream::reset_for_resubmit() noexcept {
    state = OpState::fresh;
    prev = next = nullptr;
    failure.reset();
}

void RailStream::post_some() noexcept {
    const auto context = reinterpret_cast<std::uintptr_t>(static_cast<AsyncOpBase*>(this));
    const auto requests = plan_->requests();
    std::array<ibv_send_wr, max_transfer_chain> wrs;
    for (;;) {
        const std::uint32_t n = needs();
        SubmitChain<ibv_send_wr> chain(*qp);
        if (n == 0 || !ledger_.ring_has_room() || !chain.reserve(n)) return;
        const std::uint64_t first_sequence = chain.next_sequence();
        const bool notify = ledger_.notification_next();
        if (notify && !message_.empty()) {
            // The notification with a message: a send with immediate, the bytes inline (setup checked the room).
            ibv_send_wr& wr = wrs[0];
            message_sge_.addr = reinterpret_cast<std::uintptr_t>(message_.data());
            message_sge_.length = static_cast<std::uint32_t>(message_.size());
            message_sge_.lkey = 0; // inline: the device never reads it through a key
            wr.sg_list = &message_sge_;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND_WITH_IMM;
            wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
            wr.imm_data = htonl(immediate_);
            chain.push(wr, context, Opcode::send_with_imm);
        } else if (notify) {
            // The notification: zero bytes to the last remote byte the plan names.
            const TransferPlan::Request& last = requests.back();
            ibv_send_wr& wr = wrs[0];
            wr.sg_list = nullptr;
            wr.num_sge = 0;
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.imm_data = htonl(immediate_);
            wr.wr.rdma.remote_addr = last.remote.address + last.remote.length - 1;
            wr.wr.rdma.rkey = rkey_of(last.remote.rkey);
            chain.push(wr, context, Opcode::write_with_imm);
        } else {
            // The hot loop: what a raw loop writes per request; the chain adds
            // the slots that lead a completion (or an error) back here.
            const TransferPlan::Request* r = requests.data() + ledger_.next();
            const bool translate = !remote_keys_.empty();
            const ibv_wr_opcode op = opcode_;
            ibv_sge* const sges = const_cast<ibv_sge*>(sges_); // verbs only reads a request's list
            const std::uint32_t first_piece = sge_offset_;
            for (std::uint32_t k = 0; k < n; ++k, ++r) {
                ibv_send_wr& wr = wrs[k];
                wr.sg_list = sges + (r->first_piece - first_piece);
                wr.num_sge = static_cast<int>(r->piece_count);
                wr.opcode = op;
                wr.send_flags = 0;
                wr.wr.rdma.remote_addr = r->remote.address;
                wr.wr.rdma.rkey = translate ? rkey_of(r->remote.rkey) : r->remote.rkey;
            }
            wrs[n - 1].send_flags = IBV_SEND_SIGNALED;
            chain.push_run(wrs.data(), n, context, opcode);
        }
        if (std::error_code ec = chain.submit()) {
            // The provider refused a request it was given room for. Those
            // before it went out unsignaled: close them with one signaled
            // zero-byte write so that this rail knows when they are done (and
            // stays alive until then); if even that is refused, their
            // completions are left without an owner.
            const std::uint32_t posted = chain.taken();
            ledger_.refused(ec, posted);
            if (posted == 0) return;
            ibv_send_wr close{};
            close.opcode = IBV_WR_RDMA_WRITE;
            close.send_flags = IBV_SEND_SIGNALED;
            close.wr.rdma.remote_addr = wrs[0].wr.rdma.remote_addr;
            close.wr.rdma.rkey = wrs[0].wr.rdma.rkey;
            SubmitChain<ibv_send_wr> closing(*qp);
            if (!closing.reserve(1)) {
                qp->send.forget_last(posted);
                return;
            }
            closing.push(close, context, Opcode::write);
            if (closing.submit()) {
                qp->send.forget_last(posted);
                return;
            }
            ledger_.closed(first_sequence, posted);
            return;
        }
        ledger_.posted(first_sequence);
    }
}

std::uint64_t RailStream::bytes() const noexcept {
    // The requests known to have completed without error (landed_end()), summed once, not per request.
    std::uint64_t total = total_bytes_;
    if (const std::uint32_t landed = landed_end(); landed != end()) {
        total = 0;
        const auto requests = plan_->requests();
        for (std::uint32_t i = first(); i < landed; ++i) total += requests[i].remote.length;
    }
    return total - counted_;
}

bool RailStream::reaches_remote(std::uint32_t plan_rkey) const noexcept {
    return remote_keys_.empty() || find_key(remote_keys_, plan_rkey) != nullptr;
}

} // namespace gpuverbs::detail
