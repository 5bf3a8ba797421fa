// The device queue's host proxy (include/gpuverbs/device_queue/proxy.hpp says what it promises).
#include "gpuverbs/device_queue/proxy.hpp"

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/data_path/work_request.hpp"
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

/// Work requests a descriptor becomes.
std::size_t requests_of(const dq::Request& r) {
    return r.op == dq::Op::put_signal ? 2 : (r.op == dq::Op::fence ? 0 : 1);
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
    : queue_(queue),
      reader_(queue),
      options_(options),
      done_(queue.capacity()),
      posted_(queue.capacity()),
      peer_of_(queue.capacity()),
      rail_of_(queue.capacity()) {
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
            l->windows[id] = &region;
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
        rail.windows[id] = memory;
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

const RemoteMemory* DeviceQueueProxy::Rail::window(std::uint16_t id) const noexcept {
    return id < windows.size() && windows[id] ? &*windows[id] : nullptr;
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
    const auto took = now_ - posted_[position & mask];
    const double seconds = std::chrono::duration<double>(took).count();
    std::size_t bucket = 0;
    for (double bound = 1e-5; bucket < 6 && seconds > bound; bound *= 10) ++bucket;
    ++counters_.completion_times[bucket];
    counters_.completion_seconds += seconds;
    for (std::uint64_t k = 0; k < count; ++k) {
        const std::uint64_t at = position - k;
        const std::size_t slot = at & mask;
        if (any_rail_failed_ &&
            (at < credit_ || at >= reader_.taken() || peer_of_[slot] != peer_id || rail_of_[slot] != rail)) {
            continue; // moved to another rail (or long done): not this completion's
        }
        done_[slot] = 1;
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
    std::array<Completion, 64> got;
    for (CompletionQueue* cq : cqs_) {
        std::error_code ec;
        for (;;) {
            const std::size_t n = cq->poll(got, ec);
            for (std::size_t i = 0; i < n && !failed_; ++i) on_completion(got[i]);
            if (ec) fail(dq::QueueError::peer_failed, "polling a completion queue failed: " + ec.message());
            if (n < got.size() || failed_) break;
        }
    }
    // Credits in order: a slot goes back only when every one before it did, and none while a failed
    // rail's requests may still be read from their sources or be in flight.
    if (any_draining_ && draining()) return;
    const std::uint64_t before = credit_;
    while (credit_ < reader_.taken() && done_[credit_ & (queue_.capacity() - 1)] != 0) {
        done_[credit_ & (queue_.capacity() - 1)] = 0;
        ++credit_;
    }
    if (credit_ != before) {
        counters_.completed += credit_ - before;
        reader_.complete(credit_);
    }
}

void DeviceQueueProxy::check_timeout() {
    const std::size_t oldest = credit_ & (queue_.capacity() - 1);
    // (A completed slot waits only for a failed rail's flushes, themselves bounded.)
    if (credit_ >= reader_.taken() || done_[oldest] != 0 || now_ - posted_[oldest] <= options_.request_timeout) return;
    // The provider may never complete it (rxe with retry_count 7 retries forever): the rail goes to error
    // so that its requests flush, and the peer's go on its next rail. One waiting to be posted again
    // for as long blames the rail that had no room for it.
    const std::uint16_t peer_id = peer_of_[oldest];
    const std::size_t rail = rail_of_[oldest] == unposted ? peers_[peer_id].active : rail_of_[oldest];
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
        if (done_[slot] != 0 || peer_of_[slot] != peer_id) continue;
        dq::Request r2;
        const dq::Decoded d = reader_.peek(r2, at - reader_.taken()); // a slot is not rewritten before its credit
        if (d != dq::Decoded::complete) {
            fail(dq::QueueError::refused,
                 "the descriptor at position " + std::to_string(at) + " changed before its credit returned");
            return;
        }
        if (adds(r2) && rail_of_[slot] != unposted) {
            fail(dq::QueueError::peer_failed,
                 r.failure + "; a signal that adds was in flight on it (position " + std::to_string(at) +
                     "): it may have landed or not, and posting it again could count it twice (signals that "
                     "set fail over)");
            return;
        }
        rail_of_[slot] = unposted;
        posted_[slot] = now_; // its bound starts again
        p.retry.push_back(at);
    }
    any_retry_ = any_retry_ || !p.retry.empty();
}

void DeviceQueueProxy::post_retries() {
    bool left = false;
    for (std::size_t id = 0; id < peers_.size() && !failed_; ++id) {
        Peer& p = peers_[id];
        if (p.retry.empty()) continue;
        Rail& rail = p.rails[p.active];
        const std::uint64_t room = rail.qp->capabilities().max_send_wr - rail.qp->outstanding_sends();
        SendBatch chain = rail.qp->batch();
        std::size_t in_chain = 0;
        std::size_t descriptors = 0;
        while (!p.retry.empty()) {
            const std::uint64_t at = p.retry.front();
            dq::Request r;
            (void)reader_.peek(r, at - reader_.taken());
            const std::size_t needs = requests_of(r);
            if (in_chain + needs > room || in_chain + needs > SendBatch::max_requests) break;
            // Each on its own completion: the retried positions are not consecutive.
            if (!add(r, at, p, chain, 1)) return;
            in_chain += needs;
            ++descriptors;
            p.retry.pop_front();
        }
        if (in_chain > 0) {
            counters_.reposted += descriptors;
            if (const std::error_code ec = chain.post()) {
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
    std::uint32_t taken = 0;
    while (taken < options_.batch && !failed_) {
        dq::Request r;
        if (!peek(r, 0)) break;
        Peer* to = peer(r.peer);
        if (to == nullptr) {
            fail(dq::QueueError::refused,
                 "a request names peer " + std::to_string(r.peer) + ", which has no queue pair (" + words_of(r) + ")");
            break;
        }
        if (!to->retry.empty()) break; // the peer's earlier requests go first (next pass)
        if (r.op == dq::Op::fence) {   // no request of its own: the next one to the peer waits for those before
            to->fence_next = true;
            const std::uint64_t position = reader_.taken();
            done_[position & (queue_.capacity() - 1)] = 1;
            posted_[position & (queue_.capacity() - 1)] = now_;
            peer_of_[position & (queue_.capacity() - 1)] = r.peer;
            reader_.advance();
            ++counters_.descriptors;
            ++taken;
            continue;
        }
        // A chain of this peer's descriptors, one doorbell; only its last request is signaled, and its
        // completion covers them all (a queue pair completes in order; a failure completes on its own).
        Rail& rail = to->rails[to->active];
        const std::uint64_t first = reader_.taken();
        const std::uint64_t room = rail.qp->capabilities().max_send_wr - rail.qp->outstanding_sends();
        SendBatch chain = rail.qp->batch();
        std::size_t in_chain = 0;
        for (;;) {
            const std::size_t needs = requests_of(r);
            if (in_chain + needs > room) { // only for a chain's first: the look-ahead below ends it before
                ++counters_.queue_full;
                taken = options_.batch; // nothing more this pass: the send queue is full
                break;
            }
            dq::Request next;
            const bool last = taken + 1 >= options_.batch || !peek(next, 1) || next.peer != r.peer ||
                              next.op == dq::Op::fence ||
                              in_chain + needs + requests_of(next) > SendBatch::max_requests ||
                              in_chain + needs + requests_of(next) > room;
            const std::uint64_t position = reader_.taken();
            if (!add(r, position, *to, chain, last ? position - first + 1 : 0)) break;
            reader_.advance();
            ++counters_.descriptors;
            in_chain += needs;
            ++taken;
            if (last) break;
            r = next;
        }
        if (failed_) return false; // a descriptor of the chain was refused: nothing more goes
        if (in_chain > 0) {
            if (const std::error_code ec = chain.post()) {
                // Its queue pair is in error (the provider's, or ours): a path failure; the chain's
                // descriptors (perhaps taken in part) go on the next rail with the peer's other unfinished ones.
                const std::size_t failed_rail = to->active;
                fail_rail(r.peer, failed_rail,
                          "posting to peer " + std::to_string(r.peer) + " (rail " + std::to_string(failed_rail) +
                              ") was refused: " + ec.message());
                return !failed_;
            }
            count_chain(static_cast<std::size_t>(reader_.taken() - first));
        }
    }
    return !failed_;
}

bool DeviceQueueProxy::peek(dq::Request& r, std::uint64_t ahead) {
    // The descriptor a chain's look-ahead decoded is the next chain's first: not decoded twice.
    const std::uint64_t at = reader_.taken() + ahead;
    if (looked_ahead_ && looked_at_ == at) {
        r = look_;
        return true;
    }
    dq::Decoded d = reader_.peek(r, ahead);
    // Positions whose producers gave up: taken with no request, completed as soon as those before them
    // (a look-ahead stops at one: the chain ends there, the next pass skips it).
    while (d == dq::Decoded::skipped && ahead == 0) {
        const std::size_t slot = reader_.taken() & (queue_.capacity() - 1);
        done_[slot] = 1;
        posted_[slot] = now_;
        reader_.skip();
        ++counters_.skipped;
        d = reader_.peek(r, 0);
    }
    if (d == dq::Decoded::complete && ahead > 0) {
        look_ = r;
        looked_at_ = at;
        looked_ahead_ = true;
    }
    if (d == dq::Decoded::corrupt && ahead == 0) {
        fail(dq::QueueError::refused, "the descriptor at position " + std::to_string(reader_.taken()) +
                                          " is corrupt (stamped for its lap, yet not what a producer writes)");
    }
    return d == dq::Decoded::complete;
}

bool DeviceQueueProxy::add(const dq::Request& r, std::uint64_t position, Peer& to, SendBatch& chain,
                           std::uint64_t covers) {
    const std::size_t slot = position & (queue_.capacity() - 1);
    Rail& rail = to.rails[to.active];
    Local& local = *rail.local;
    // Every request carries its descriptor's position (a failure completes with it); the chain's last
    // is signaled and carries how many descriptors its completion covers.
    SendOptions own;
    own.context = position | rail.id_bits;
    own.signaled = false;
    own.fence = to.fence_next;
    SendOptions last = own;
    if (covers > 0) {
        last.signaled = true;
        last.context = position | (covers << count_shift) | rail.id_bits;
    }
    std::error_code ec;
    if (r.op == dq::Op::put || r.op == dq::Op::put_signal) {
        const MemoryRegion* src = r.src_window < local.windows.size() ? local.windows[r.src_window] : nullptr;
        const RemoteMemory* dst = rail.window(r.dst_window);
        if (src == nullptr || dst == nullptr || r.bytes > UINT32_MAX || r.src_offset > src->length() ||
            r.bytes > src->length() - r.src_offset) {
            fail(dq::QueueError::refused, "a put names a window it has not, or a range outside it (" + words_of(r) +
                                              ", rail " + std::to_string(to.active) + ")");
            return false;
        }
        ec = chain.add(WorkRequest::write(src->slice(r.src_offset, r.bytes), *dst, r.dst_offset)
                           .options(r.op == dq::Op::put ? last : own));
        own.fence = false;
    }
    if (!ec && (r.op == dq::Op::signal || r.op == dq::Op::put_signal)) {
        const RemoteMemory* sig = rail.window(r.signal_window);
        if (sig == nullptr) {
            fail(dq::QueueError::refused, "a signal names window " + std::to_string(r.signal_window) + ", which peer " +
                                              std::to_string(r.peer) + " has not (" + words_of(r) + ")");
            return false;
        }
        const LocalBuffer word = local.scratch_region.slice(slot * scratch_words_per_slot * sizeof(std::uint64_t), 8);
        if (r.signal_op == dq::SignalOp::add) {
            ec = chain.add(WorkRequest::fetch_add(word, *sig, r.signal_offset, r.signal_value).options(last));
        } else {
            // Set: an inline 8-byte write (the value is copied when posted).
            local.scratch[slot * scratch_words_per_slot] = r.signal_value;
            SendOptions s = last;
            s.inline_data = true;
            ec = chain.add(WorkRequest::write(word, *sig, r.signal_offset).options(s));
        }
    }
    if (ec) {
        fail(dq::QueueError::refused,
             "the proxy could not make a request of a descriptor (" + words_of(r) + "): " + ec.message());
        return false;
    }
    to.fence_next = false;
    posted_[slot] = now_;
    peer_of_[slot] = r.peer;
    rail_of_[slot] = static_cast<std::uint8_t>(to.active);
    counters_.requests += requests_of(r);
    return true;
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
