// The device queue's host proxy (include/gpuverbs/device_queue/proxy.hpp says what it promises).
#include "gpuverbs/device_queue/proxy.hpp"

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/access.hpp"
#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/detail/transfers/transfer_fsm.hpp"
#include "gpuverbs/error.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <bit>

namespace gpuverbs {

namespace dq = device_queue;
using Clock = std::chrono::steady_clock;

namespace {

/// Signals that add land as fetch-and-add; their old values go to scratch
/// words, one per slot (the slot's request is the only one using it until its
/// credit returns).
constexpr std::size_t scratch_words_per_slot = 1;

/// A request's context: its descriptor's position; above it, on a signaled
/// request, how many descriptors (ending at that position) its completion
/// covers (at most SendBatch::max_requests); at the top, its rail's id (a
/// queue pair's number is unique only on its own device).
constexpr unsigned count_shift = 48;
constexpr std::uint64_t position_mask = (std::uint64_t{1} << count_shift) - 1;
constexpr std::uint64_t count_mask = 0x3f;
constexpr unsigned rail_shift = 54;
constexpr std::size_t max_rails = std::size_t{1} << (64 - rail_shift);
static_assert(SendBatch::max_requests <= count_mask);

/// Work requests a descriptor becomes, by op (decode admits put to fence only).
constexpr std::array<std::uint8_t, 5> requests_by_op = {0, 1, 2, 1, 0};
std::size_t requests_of(const dq::Request& r) {
    return requests_by_op[static_cast<std::size_t>(r.op)];
}

bool adds(const dq::Request& r) {
    return (r.op == dq::Op::signal || r.op == dq::Op::put_signal) && r.signal_op == dq::SignalOp::add;
}

std::string words_of(const dq::Request& r) {
    return "peer " + std::to_string(r.peer) + ", source window " + std::to_string(r.src_window) + " at " +
           std::to_string(r.src_offset) + ", destination window " + std::to_string(r.dst_window) + " at " +
           std::to_string(r.dst_offset) + ", " + std::to_string(r.bytes) + " bytes";
}

} // namespace

DeviceQueueProxy::DeviceQueueProxy(const dq::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                                   const DeviceQueueProxyOptions& options, detail::Status* status)
    : queue_(queue), reader_(queue), options_(options), slots_(queue.capacity()) {
    if (options_.batch == 0) options_.batch = 1;
    detail::Status thrown; // the throwing form's (status null): a refusal throws, and the queue is left alone
    (void)add_device_impl(pd, cq, status != nullptr ? *status : thrown);
    thrown.check();
}

DeviceQueueProxy::DeviceQueueProxy(const dq::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                                   const DeviceQueueProxyOptions& options)
    : DeviceQueueProxy(queue, pd, cq, options, nullptr) {}

DeviceQueueProxy DeviceQueueProxy::create(const dq::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                                          const DeviceQueueProxyOptions& options, std::error_code& ec) {
    detail::Status status;
    DeviceQueueProxy proxy(queue, pd, cq, options, &status);
    ec = status.code;
    return proxy;
}

DeviceQueueProxy DeviceQueueProxy::create(const dq::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                                          const DeviceQueueProxyOptions& options, std::error_code& ec,
                                          Diagnostics& diagnostics) {
    detail::Status status;
    DeviceQueueProxy proxy(queue, pd, cq, options, &status);
    ec = status.code;
    status.report(diagnostics);
    return proxy;
}

DeviceQueueProxy::~DeviceQueueProxy() {
    // An empty proxy (create() failed, or moved from) never had the queue.
    if (!locals_.empty()) close();
}

bool DeviceQueueProxy::add_device_impl(const ProtectionDomain& pd, CompletionQueue& cq, detail::Status& status) {
    for (const auto& l : locals_) {
        if (l->pd == pd.native_handle()) {
            if (std::find(cqs_.begin(), cqs_.end(), &cq) == cqs_.end()) cqs_.push_back(&cq);
            return true;
        }
    }
    auto l = std::make_unique<Local>();
    l->pd = pd.native_handle();
    l->cq = &cq;
    l->scratch.resize(queue_.capacity() * scratch_words_per_slot);
    std::error_code ec;
    Diagnostics why;
    l->scratch_region = MemoryRegion::create(pd, l->scratch.data(), l->scratch.size() * sizeof(std::uint64_t),
                                             Access::local_write, ec, why);
    if (ec) {
        status.fail(ec, "DeviceQueueProxy", "registering its scratch words: " + why.message());
        return false;
    }
    if (std::find(cqs_.begin(), cqs_.end(), &cq) == cqs_.end()) cqs_.push_back(&cq);
    locals_.push_back(std::move(l));
    return true;
}

bool DeviceQueueProxy::add_window_impl(std::uint16_t id, const MemoryRegion& region, detail::Status& status) {
    for (const auto& l : locals_) {
        if (region.native_handle() != nullptr && l->pd == region.native_handle()->pd) {
            if (l->windows.size() <= id) l->windows.resize(std::size_t{id} + 1);
            l->windows[id] = Local::Window{region.iova(), region.length(), region.lkey(), true};
            return true;
        }
    }
    status.fail(errc::invalid_argument, "DeviceQueueProxy::add_window",
                "window " + std::to_string(id) +
                    " is registered in a protection domain the proxy has not: give its device to the "
                    "constructor or to add_device() first");
    return false;
}

DeviceQueueProxy::Local* DeviceQueueProxy::local_of(const QueuePair& qp, const char* verb, detail::Status& status) {
    if (qp.native_handle() != nullptr) {
        for (const auto& l : locals_) {
            if (l->pd == qp.native_handle()->pd) return l.get();
        }
    }
    status.fail(errc::invalid_argument, verb,
                qp ? "the queue pair's protection domain is not one the proxy has: give its device to the "
                     "constructor or to add_device() first"
                   : "the queue pair is empty");
    return nullptr;
}

bool DeviceQueueProxy::make_rail(QueuePair& qp, std::uint16_t peer, const RemoteWindows& windows, const char* verb,
                                 Rail& rail, detail::Status& status) {
    rail.qp = &qp;
    rail.local = local_of(qp, verb, status);
    if (rail.local == nullptr) return false;
    rail.core = detail::access::core(static_cast<const DataPath&>(qp));
    if (qp.capabilities().max_send_wr < 2) {
        status.fail(errc::invalid_argument, verb,
                    "the queue pair's send queue holds " + std::to_string(qp.capabilities().max_send_wr) +
                        " request: a put_signal is two (QueuePairOptions::max_send_wr)");
        return false;
    }
    if (rail_ids_.size() == max_rails) {
        status.fail(errc::invalid_argument, verb, "the proxy has " + std::to_string(max_rails) + " rails already");
        return false;
    }
    rail.id_bits = static_cast<std::uint64_t>(rail_ids_.size()) << rail_shift;
    const std::size_t index = peer < peers_.size() ? peers_[peer].rails.size() : 0;
    rail_ids_.emplace_back(peer, static_cast<std::uint8_t>(index));
    for (const auto& [id, memory] : windows) {
        if (rail.windows.size() <= id) rail.windows.resize(std::size_t{id} + 1);
        rail.windows[id] = Rail::Window{memory, true};
    }
    return true;
}

bool DeviceQueueProxy::add_peer_impl(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows,
                                     detail::Status& status) {
    if (this->peer(peer) != nullptr) {
        status.fail(errc::invalid_argument, "DeviceQueueProxy::add_peer",
                    "peer " + std::to_string(peer) + " was added before: add_rail() gives it another rail");
        return false;
    }
    Rail rail;
    if (!make_rail(qp, peer, windows, "DeviceQueueProxy::add_peer", rail, status)) return false;
    if (peers_.size() <= peer) peers_.resize(std::size_t{peer} + 1);
    peers_[peer].rails.push_back(std::move(rail));
    return true;
}

bool DeviceQueueProxy::add_rail_impl(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows,
                                     detail::Status& status) {
    if (this->peer(peer) == nullptr) {
        status.fail(errc::invalid_argument, "DeviceQueueProxy::add_rail",
                    "peer " + std::to_string(peer) + " was not added: add_peer() gives its first rail");
        return false;
    }
    if (peers_[peer].rails.size() >= unposted) {
        status.fail(errc::invalid_argument, "DeviceQueueProxy::add_rail",
                    "peer " + std::to_string(peer) + " has " + std::to_string(unposted) + " rails already");
        return false;
    }
    Rail rail;
    if (!make_rail(qp, peer, windows, "DeviceQueueProxy::add_rail", rail, status)) return false;
    peers_[peer].rails.push_back(std::move(rail));
    return true;
}

// The three forms of each add_*: throwing, error_code, error_code with the words.
void DeviceQueueProxy::add_device(const ProtectionDomain& pd, CompletionQueue& cq) {
    (void)detail::or_throw([&](detail::Status& s) { return add_device_impl(pd, cq, s); });
}
void DeviceQueueProxy::add_device(const ProtectionDomain& pd, CompletionQueue& cq, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_device_impl(pd, cq, s); });
}
void DeviceQueueProxy::add_device(const ProtectionDomain& pd, CompletionQueue& cq, std::error_code& ec,
                                  Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics, [&](detail::Status& s) { return add_device_impl(pd, cq, s); });
}
void DeviceQueueProxy::add_window(std::uint16_t id, const MemoryRegion& region) {
    (void)detail::or_throw([&](detail::Status& s) { return add_window_impl(id, region, s); });
}
void DeviceQueueProxy::add_window(std::uint16_t id, const MemoryRegion& region, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_window_impl(id, region, s); });
}
void DeviceQueueProxy::add_window(std::uint16_t id, const MemoryRegion& region, std::error_code& ec,
                                  Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics, [&](detail::Status& s) { return add_window_impl(id, region, s); });
}
void DeviceQueueProxy::add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows) {
    (void)detail::or_throw([&](detail::Status& s) { return add_peer_impl(peer, qp, windows, s); });
}
void DeviceQueueProxy::add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_peer_impl(peer, qp, windows, s); });
}
void DeviceQueueProxy::add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec,
                                Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics, [&](detail::Status& s) { return add_peer_impl(peer, qp, windows, s); });
}
void DeviceQueueProxy::add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows) {
    (void)detail::or_throw([&](detail::Status& s) { return add_rail_impl(peer, qp, windows, s); });
}
void DeviceQueueProxy::add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_rail_impl(peer, qp, windows, s); });
}
void DeviceQueueProxy::add_rail(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows, std::error_code& ec,
                                Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics, [&](detail::Status& s) { return add_rail_impl(peer, qp, windows, s); });
}

std::vector<DeviceQueueRailState> DeviceQueueProxy::rails() const {
    std::vector<DeviceQueueRailState> out;
    for (std::size_t p = 0; p < peers_.size(); ++p) {
        for (std::size_t k = 0; k < peers_[p].rails.size(); ++k) {
            const Rail& r = peers_[p].rails[k];
            out.push_back(DeviceQueueRailState{static_cast<std::uint16_t>(p), static_cast<std::uint32_t>(k),
                                               r.qp->qp_num(), k == peers_[p].active && !r.failed, r.failed,
                                               r.failure});
        }
    }
    return out;
}

DeviceQueueProxy::Peer* DeviceQueueProxy::peer(std::uint16_t id) noexcept {
    return id < peers_.size() && !peers_[id].rails.empty() ? &peers_[id] : nullptr;
}

void DeviceQueueProxy::close() noexcept {
    if (!failed_) fail(dq::QueueError::closed, "the proxy closed the queue");
}

void DeviceQueueProxy::fail(dq::QueueError error, std::string words) noexcept {
    if (failed_) return;
    failed_ = true;
    error_ = error;
    failure_ = std::move(words);
    reader_.fail(error);
}

void DeviceQueueProxy::count_chain(std::size_t descriptors) noexcept {
    ++counters_.chains;
    counters_.chained += descriptors;
    ++counters_.chain_lengths[std::min<std::size_t>(std::bit_width(descriptors - 1), 7)];
}

void DeviceQueueProxy::on_completion(const Completion& c) {
    const std::uint64_t position = c.context & position_mask;
    const std::uint64_t id = c.context >> rail_shift;
    if (id >= rail_ids_.size()) return; // not a request of ours
    const auto [peer_id, rail] = rail_ids_[id];
    if (!c.ok()) {
        Rail& r = peers_[peer_id].rails[rail];
        if (r.failed) return; // its flushes, after the failure that counted
        const std::string words = "the request at position " + std::to_string(position) + " to peer " +
                                  std::to_string(peer_id) + " (rail " + std::to_string(rail) +
                                  ") failed: " + c.status.message();
        const auto kind = detail::classify_stream_failure(c.status.code(), c.status.raw(), false, false);
        if (kind == detail::StreamFailure::request) {
            fail(dq::QueueError::refused, words + " (as wrong on any rail)");
        } else {
            fail_rail(peer_id, rail, words);
        }
        return;
    }
    // The chain's signaled request covers its descriptors: `count` positions ending at this one.
    const std::uint64_t count = std::max<std::uint64_t>((c.context >> count_shift) & count_mask, 1);
    const std::size_t mask = queue_.capacity() - 1;
    const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(now_ - slots_[position & mask].posted);
    std::size_t bucket = 0;
    for (std::int64_t bound = 10'000; bucket < 6 && took.count() > bound; bound *= 10) ++bucket;
    ++counters_.completion_times[bucket];
    counters_.completion_seconds += static_cast<double>(took.count()) * 1e-9;
    // In order (no rail ever failed, its first position the next credit): the credit moves at once,
    // with no per-slot mark (reap() then takes the marks of fences and skipped positions after it).
    if (!any_rail_failed_ && position + 1 - count == credit_) {
        credit_ = position + 1;
        return;
    }
    for (std::uint64_t k = 0; k < count; ++k) {
        const std::uint64_t at = position - k;
        const std::size_t slot = at & mask;
        if (any_rail_failed_ &&
            (at < credit_ || at >= reader_.taken() || slots_[slot].peer != peer_id || slots_[slot].rail != rail)) {
            continue; // moved to another rail (or long done): not this completion's
        }
        slots_[slot].done = 1;
    }
}

bool DeviceQueueProxy::draining() noexcept {
    bool still = false;
    for (Peer& p : peers_) {
        for (Rail& r : p.rails) {
            if (!r.draining) continue;
            if (r.qp->outstanding_sends() == 0 || now_ - r.failed_at > options_.request_timeout) {
                r.draining = false;
            } else {
                still = true;
            }
        }
    }
    any_draining_ = still;
    return still;
}

void DeviceQueueProxy::reap() {
    const std::uint64_t before = credit_;
    for (CompletionQueue* cq : cqs_) {
        std::error_code ec;
        for (;;) {
            const std::size_t n = cq->poll(reaped_, ec);
            for (std::size_t i = 0; i < n && !failed_; ++i) on_completion(reaped_[i]);
            if (ec) fail(dq::QueueError::peer_failed, "polling a completion queue failed: " + ec.message());
            if (n < reaped_.size() || failed_) break;
        }
    }
    // Credits in order: a slot goes back only when every one before it did, and none while a failed
    // rail's requests may still be read from their sources or be in flight (once a rail failed,
    // on_completion only marks slots: the credit moves here).
    if (!any_draining_ || !draining()) {
        while (credit_ < reader_.taken() && slots_[credit_ & (queue_.capacity() - 1)].done != 0) {
            slots_[credit_ & (queue_.capacity() - 1)].done = 0;
            ++credit_;
        }
    }
    if (credit_ != before) {
        counters_.completed += credit_ - before;
        reader_.complete(credit_);
    }
}

void DeviceQueueProxy::check_timeout() {
    const std::size_t oldest = credit_ & (queue_.capacity() - 1);
    // (A completed slot waits only for a failed rail's flushes, themselves bounded.)
    if (credit_ >= reader_.taken() || slots_[oldest].done != 0 ||
        now_ - slots_[oldest].posted <= options_.request_timeout)
        return;
    // The provider may never complete it (rxe with retry_count 7 retries forever): the rail goes to error
    // so that its requests flush, and the peer's go on its next rail. One waiting to be posted again
    // for as long blames the rail that had no room for it.
    const std::uint16_t peer_id = slots_[oldest].peer;
    const std::size_t rail = slots_[oldest].rail == unposted ? peers_[peer_id].active : slots_[oldest].rail;
    fail_rail(peer_id, rail,
              "the request at position " + std::to_string(credit_) + " to peer " + std::to_string(peer_id) + " (rail " +
                  std::to_string(rail) + ") did not complete within " +
                  std::to_string(options_.request_timeout.count()) + " ms: the peer or the link is gone");
}

void DeviceQueueProxy::fail_rail(std::uint16_t peer_id, std::size_t rail, std::string words) {
    Peer& p = peers_[peer_id];
    Rail& r = p.rails[rail];
    if (r.failed || failed_) return;
    r.failed = true;
    r.failure = std::move(words);
    r.draining = true;
    r.failed_at = now_;
    any_draining_ = true;
    any_rail_failed_ = true;
    ++counters_.rail_failures;
    (void)r.qp->force_error();    // its requests flush; nothing is left retrying on the wire
    if (rail != p.active) return; // a standby rail: none of the peer's requests is on it
    std::size_t next = rail;
    for (std::size_t k = 1; k <= p.rails.size(); ++k) {
        const std::size_t candidate = (rail + k) % p.rails.size();
        if (!p.rails[candidate].failed) {
            next = candidate;
            break;
        }
    }
    if (next == rail) {
        std::string all = "every rail to peer " + std::to_string(peer_id) + " failed:";
        for (std::size_t k = 0; k < p.rails.size(); ++k)
            all += " rail " + std::to_string(k) + ": " + p.rails[k].failure + ";";
        all.pop_back();
        fail(dq::QueueError::peer_failed, std::move(all));
        return;
    }
    // The peer's requests not known to have completed go again on the next rail, in order.
    p.active = next;
    p.retry.clear();
    const std::size_t mask = queue_.capacity() - 1;
    for (std::uint64_t at = credit_; at < reader_.taken(); ++at) {
        const std::size_t slot = at & mask;
        if (slots_[slot].done != 0 || slots_[slot].peer != peer_id) continue;
        dq::Request r2;
        const dq::Decoded d = reader_.peek(r2, at - reader_.taken()); // a slot is not rewritten before its credit
        if (d != dq::Decoded::complete) {
            fail(dq::QueueError::refused,
                 "the descriptor at position " + std::to_string(at) + " changed before its credit returned");
            return;
        }
        if (adds(r2) && slots_[slot].rail != unposted) {
            fail(dq::QueueError::peer_failed,
                 r.failure + "; a signal that adds was in flight on it (position " + std::to_string(at) +
                     "): it may have landed or not, and posting it again could count it twice (signals that "
                     "set fail over)");
            return;
        }
        slots_[slot].rail = unposted;
        slots_[slot].posted = now_; // its bound starts again
        p.retry.push_back(at);
    }
    any_retry_ = any_retry_ || !p.retry.empty();
}

// Inlined where chains are made: a put is lowered here, straight from its descriptor, with the checks
// the posting path makes for a write of one local range; a signal goes through add_signal().
GPUVERBS_HOT bool DeviceQueueProxy::add(const dq::Request& r, std::uint64_t position, Peer& to, std::uint64_t covers) {
    const std::size_t slot = position & (queue_.capacity() - 1);
    Rail& rail = to.rails[to.active];
    // Every request carries its descriptor's position (a failure completes with it); the chain's last
    // is signaled and carries how many descriptors its completion covers.
    const std::uint64_t context = position | rail.id_bits;
    const std::uint64_t last_context = covers > 0 ? context | (covers << count_shift) : context;
    if (r.op == dq::Op::put || r.op == dq::Op::put_signal) [[likely]] {
        const std::vector<Local::Window>& windows = rail.local->windows;
        const Local::Window* src = r.src_window < windows.size() ? &windows[r.src_window] : nullptr;
        const RemoteMemory* dst = rail.window(r.dst_window);
        if (src == nullptr || !src->present || dst == nullptr || r.bytes > UINT32_MAX || r.src_offset > src->length ||
            r.bytes > src->length - r.src_offset || !dst->contains(r.dst_offset, r.bytes)) [[unlikely]] {
            fail(dq::QueueError::refused, "a put names a window it has not, or a range outside it (" + words_of(r) +
                                              ", rail " + std::to_string(to.active) + ")");
            return false;
        }
        const bool alone = r.op == dq::Op::put;
        const std::uint32_t n = chain_.count++;
        ibv_sge& sge = chain_.sges[n];
        sge.addr = src->iova + r.src_offset;
        sge.length = static_cast<std::uint32_t>(r.bytes);
        sge.lkey = src->lkey;
        ibv_send_wr& wr = chain_.wrs[n];
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags =
            (to.fence_next ? unsigned{IBV_SEND_FENCE} : 0U) | (alone && covers > 0 ? unsigned{IBV_SEND_SIGNALED} : 0U);
        wr.wr.rdma.remote_addr = dst->address + r.dst_offset;
        wr.wr.rdma.rkey = dst->rkey;
        chain_.contexts[n] = alone ? last_context : context;
        chain_.opcodes[n] = Opcode::write;
        if (!alone && !add_signal(r, slot, rail, last_context, covers > 0, to.fence_next)) return false;
    } else if (!add_signal(r, slot, rail, last_context, covers > 0, to.fence_next)) {
        return false;
    }
    to.fence_next = false;
    Slot& s = slots_[slot];
    s.posted = now_;
    s.peer = r.peer;
    s.rail = static_cast<std::uint8_t>(to.active);
    return true;
}

GPUVERBS_HOT std::uint32_t DeviceQueueProxy::take_puts(Rail& rail, std::uint16_t peer, std::uint64_t limit,
                                                       std::uint32_t most) {
    // Everything the loop reads is a local: the stores into the chain cannot make the compiler read it again.
    const std::uint32_t k0 = chain_.count;
    if (k0 >= limit) return 0;
    const dq::QueueView& q = reader_.view();
    dq::Descriptor* const ring = q.slots;
    const std::uint32_t log2 = q.log2_capacity;
    const std::uint64_t mask = q.capacity() - 1;
    const std::uint64_t put_bits = dq::put_to(peer);
    const std::uint64_t first = reader_.taken();
    const std::uint64_t end = first + std::min<std::uint64_t>(most, limit - k0);
    const std::vector<Local::Window>& sources = rail.local->windows;
    ibv_send_wr* const wrs = chain_.wrs.data() + k0;
    ibv_sge* const sges = chain_.sges.data() + k0;
    std::uint32_t windows = UINT32_MAX; // the windows these are for (none yet)
    std::uint64_t src_iova = 0, src_length = 0, dst_address = 0, dst_length = 0;
    std::uint32_t lkey = 0, rkey = 0;
    std::uint64_t s = dq::stamp(first, log2); // the lap's: it changes at slot 0
    std::uint64_t at = first;
    for (dq::PutFields f; at < end; ++at) {
        if ((at & mask) == 0) s = dq::stamp(at, log2);
        std::uint64_t* w = ring[at & mask].word;
        const std::uint64_t words[dq::descriptor_words] = {
            dq::detail::load_relaxed(w + 0), dq::detail::load_relaxed(w + 1), dq::detail::load_relaxed(w + 2),
            dq::detail::load_relaxed(w + 3), dq::detail::load_relaxed(w + 4), dq::detail::load_relaxed(w + 5),
            dq::detail::load_relaxed(w + 6), dq::detail::load_relaxed(w + 7)};
        if (!dq::decode_put(words, at, s, put_bits, f)) break;
        std::atomic_thread_fence(std::memory_order_acquire);
        if (f.windows != windows) {
            const bool has_src = f.src_window() < sources.size() && sources[f.src_window()].present;
            const RemoteMemory* dst = rail.window(f.dst_window());
            if (!has_src || dst == nullptr) break;
            const Local::Window& src = sources[f.src_window()];
            src_iova = src.iova;
            src_length = src.length;
            lkey = src.lkey;
            dst_address = dst->address;
            dst_length = dst->length;
            rkey = dst->rkey;
            windows = f.windows;
        }
        // Offsets and lengths carry 56 bits: their sums cannot wrap.
        if (f.bytes > UINT32_MAX || f.src_offset + f.bytes > src_length || f.dst_offset + f.bytes > dst_length) break;
        const std::uint64_t k = at - first;
        ibv_sge& sge = sges[k];
        sge.addr = src_iova + f.src_offset;
        sge.length = static_cast<std::uint32_t>(f.bytes);
        sge.lkey = lkey;
        ibv_send_wr& wr = wrs[k];
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = 0;
        wr.wr.rdma.remote_addr = dst_address + f.dst_offset;
        wr.wr.rdma.rkey = rkey;
    }
    // What each taken put's request and slot record, in a loop of their own (fewer live values above).
    const auto n = static_cast<std::uint32_t>(at - first);
    const std::uint64_t id_bits = rail.id_bits;
    const Clock::time_point now = now_;
    const auto active = static_cast<std::uint8_t>(peers_[peer].active);
    std::uint64_t* const contexts = chain_.contexts.data() + k0;
    Opcode* const opcodes = chain_.opcodes.data() + k0;
    Slot* const slots = slots_.data();
    for (std::uint32_t k = 0; k < n; ++k) {
        contexts[k] = (first + k) | id_bits;
        opcodes[k] = Opcode::write;
        Slot& slot = slots[(first + k) & mask];
        slot.posted = now;
        slot.peer = peer;
        slot.rail = active;
    }
    chain_.count = k0 + n;
    reader_.advance(n);
    return n;
}

bool DeviceQueueProxy::add_signal(const dq::Request& r, std::size_t slot, Rail& rail, std::uint64_t context,
                                  bool signaled, bool fence) {
    const RemoteMemory* sig = rail.window(r.signal_window);
    if (sig == nullptr) {
        fail(dq::QueueError::refused, "a signal names window " + std::to_string(r.signal_window) + ", which peer " +
                                          std::to_string(r.peer) + " has not (" + words_of(r) + ")");
        return false;
    }
    Local& local = *rail.local;
    SendOptions o;
    o.context = context;
    o.signaled = signaled;
    o.fence = fence;
    const LocalBuffer word = local.scratch_region.slice(slot * scratch_words_per_slot * sizeof(std::uint64_t), 8);
    WorkRequest w = WorkRequest::fetch_add(word, *sig, r.signal_offset, r.signal_value);
    if (r.signal_op == dq::SignalOp::set) {
        // Set: an inline 8-byte write (the value is copied when posted).
        local.scratch[slot * scratch_words_per_slot] = r.signal_value;
        o.inline_data = true;
        w = WorkRequest::write(word, *sig, r.signal_offset);
    }
    w.options(o);
    const std::uint32_t n = chain_.count;
    if (const std::error_code ec = detail::lower(w, rail.core->caps(), chain_.wrs[n], &chain_.sges[n])) {
        fail(dq::QueueError::refused,
             "the proxy could not make a request of a descriptor (" + words_of(r) + "): " + ec.message());
        return false;
    }
    chain_.contexts[n] = o.context;
    chain_.opcodes[n] = w.opcode();
    ++chain_.count;
    return true;
}

void DeviceQueueProxy::post_retries() {
    bool left = false;
    for (std::size_t id = 0; id < peers_.size() && !failed_; ++id) {
        Peer& p = peers_[id];
        if (p.retry.empty()) continue;
        Rail& rail = p.rails[p.active];
        const std::uint64_t room = rail.core->send.capacity() - rail.core->send.outstanding();
        chain_.count = 0;
        std::size_t descriptors = 0;
        while (!p.retry.empty()) {
            const std::uint64_t at = p.retry.front();
            dq::Request r;
            (void)reader_.peek(r, at - reader_.taken()); // complete: fail_rail checked it
            const std::size_t needs = requests_of(r);
            if (chain_.count + needs > room || chain_.count + needs > SendBatch::max_requests) break;
            // Each on its own completion: the retried positions are not consecutive.
            if (!add(r, at, p, 1)) return;
            ++descriptors;
            p.retry.pop_front();
        }
        if (chain_.count > 0) {
            counters_.reposted += descriptors;
            counters_.requests += chain_.count;
            if (const std::error_code ec = post_chain(rail)) {
                // A refused chain may have gone in part (the provider takes a prefix): its requests count as
                // in flight on the failed rail (an add among them is not posted again).
                fail_rail(static_cast<std::uint16_t>(id), p.active,
                          "posting to peer " + std::to_string(id) + " (rail " + std::to_string(p.active) +
                              ") was refused: " + ec.message());
                left = true; // fail_rail refilled the list for the next rail
                continue;
            }
            count_chain(descriptors);
        }
        left = left || !p.retry.empty();
    }
    any_retry_ = left;
}

bool DeviceQueueProxy::take_and_post() {
    if (any_retry_) {
        post_retries();
        if (failed_) return false;
    }
    dq::Request r;
    bool have = false; // r holds the next position's descriptor, complete
    std::uint32_t taken = 0;
    while (taken < options_.batch && !failed_) {
        if (!have && !next(r)) break;
        have = false;
        Peer* to = peer(r.peer);
        if (to == nullptr) {
            fail(dq::QueueError::refused,
                 "a request names peer " + std::to_string(r.peer) + ", which has no queue pair (" + words_of(r) + ")");
            break;
        }
        if (!to->retry.empty()) break; // the peer's earlier requests go first (next pass)
        const std::uint64_t first = reader_.taken();
        if (r.op == dq::Op::fence) { // no request of its own: the next one to the peer waits for those before
            to->fence_next = true;
            Slot& slot = slots_[first & (queue_.capacity() - 1)];
            slot.done = 1;
            slot.posted = now_;
            slot.peer = r.peer;
            reader_.advance();
            ++counters_.descriptors;
            ++taken;
            continue;
        }
        // A chain of this peer's descriptors, one doorbell: each is taken, then the next one read; the
        // chain ends at one that is not complete, is another peer's or a fence, or does not fit. Only its
        // last request is signaled, and its completion covers them all (a queue pair completes in order;
        // a failure completes on its own).
        Rail& rail = to->rails[to->active];
        const std::uint16_t peer_id = r.peer;
        const std::uint64_t room = rail.core->send.capacity() - rail.core->send.outstanding();
        if (requests_of(r) > room) {
            ++counters_.queue_full; // nothing more this pass: the send queue is full
            break;
        }
        const std::uint64_t limit = std::min<std::uint64_t>(room, SendBatch::max_requests);
        chain_.count = 0;
        for (;;) {
            // A put starts a run of them, taken straight from their words (the common case, cheaply);
            // anything else, or a put that take_puts refuses (add() says why), goes through add().
            const std::uint32_t run =
                r.op == dq::Op::put && !to->fence_next ? take_puts(rail, peer_id, limit, options_.batch - taken) : 0;
            if (run > 0) {
                taken += run;
            } else {
                if (!add(r, reader_.taken(), *to, 0)) return false; // refused: the queue failed
                reader_.advance();
                ++taken;
            }
            if (taken == options_.batch) break;
            if (reader_.peek(r, 0) != dq::Decoded::complete) break; // (a skipped one: next pass)
            if (r.peer != peer_id || r.op == dq::Op::fence || chain_.count + requests_of(r) > limit) {
                have = true;
                break;
            }
        }
        const std::uint64_t descriptors = reader_.taken() - first;
        counters_.descriptors += descriptors;
        counters_.requests += chain_.count;
        // The chain's last request: signaled, its context saying how many descriptors its completion covers.
        const std::uint32_t last = chain_.count - 1;
        chain_.wrs[last].send_flags |= IBV_SEND_SIGNALED;
        chain_.contexts[last] |= descriptors << count_shift;
        if (const std::error_code ec = post_chain(rail)) {
            // Its queue pair is in error (the provider's, or ours): a path failure; the chain's
            // descriptors (perhaps taken in part) go on the next rail with the peer's other unfinished ones.
            const std::size_t failed_rail = to->active;
            fail_rail(peer_id, failed_rail,
                      "posting to peer " + std::to_string(peer_id) + " (rail " + std::to_string(failed_rail) +
                          ") was refused: " + ec.message());
            return !failed_;
        }
        count_chain(static_cast<std::size_t>(descriptors));
    }
    return !failed_;
}

bool DeviceQueueProxy::next(dq::Request& r) {
    dq::Decoded d = reader_.peek(r, 0);
    // Positions whose producers gave up: taken with no request, completed as soon as those before them
    // (a look-ahead stops at one: the chain ends there, the next pass skips it).
    while (d == dq::Decoded::skipped) {
        const std::size_t slot = reader_.taken() & (queue_.capacity() - 1);
        slots_[slot].done = 1;
        slots_[slot].posted = now_;
        reader_.skip();
        ++counters_.skipped;
        d = reader_.peek(r, 0);
    }
    if (d == dq::Decoded::corrupt) {
        fail(dq::QueueError::refused, "the descriptor at position " + std::to_string(reader_.taken()) +
                                          " is corrupt (stamped for its lap, yet not what a producer writes)");
    }
    return d == dq::Decoded::complete;
}

std::error_code DeviceQueueProxy::post_chain(Rail& rail) noexcept {
    detail::SubmitChain<ibv_send_wr> submit(*rail.core);
    const std::uint32_t n = chain_.count;
    chain_.count = 0;
    if (!submit.reserve(n)) return errc::send_queue_full; // room was checked: not reached
    submit.push_array(chain_.wrs.data(), n, chain_.contexts.data(), chain_.opcodes.data());
    return submit.submit(); // a chain taken in part is accounted for up to the refusal
}

std::size_t DeviceQueueProxy::progress() {
    if (failed_) return 0;
    ++counters_.passes;
    now_ = Clock::now(); // one clock read per pass: the posted times and the timeout's check
    const std::uint64_t completed = counters_.completed;
    reap();
    if (!failed_) check_timeout();
    if (failed_) return 0;
    if (reader_.taken() - credit_ == queue_.capacity()) ++counters_.ring_full;
    const std::uint64_t before = reader_.taken();
    (void)take_and_post();
    const auto taken = static_cast<std::size_t>(reader_.taken() - before);
    if (taken == 0 && counters_.completed == completed) ++counters_.idle_passes;
    return taken;
}

} // namespace gpuverbs
