// The device queue's host proxy (include/gpuverbs/device_queue/proxy.hpp says what it promises).
#include "gpuverbs/device_queue/proxy.hpp"

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/data_path/work_request.hpp"

#include <algorithm>
#include <array>

namespace gpuverbs {

namespace dq = device_queue;
using Clock = std::chrono::steady_clock;

namespace {

/// Signals that add land as fetch-and-add; their old values go to scratch
/// words, one per slot (the slot's request is the only one using it until its
/// credit returns).
constexpr std::size_t scratch_words_per_slot = 1;

/// A signaled request's context: its descriptor's position, and above it how
/// many descriptors (ending at that position) its completion covers.
constexpr unsigned count_shift = 48;
constexpr std::uint64_t position_mask = (std::uint64_t{1} << count_shift) - 1;

/// Work requests a descriptor becomes.
std::size_t requests_of(const dq::Request& r) {
    return r.op == dq::Op::put_signal ? 2 : (r.op == dq::Op::fence ? 0 : 1);
}

std::string words_of(const dq::Request& r) {
    return "peer " + std::to_string(r.peer) + ", source window " + std::to_string(r.src_window) + " at " +
           std::to_string(r.src_offset) + ", destination window " + std::to_string(r.dst_window) + " at " +
           std::to_string(r.dst_offset) + ", " + std::to_string(r.bytes) + " bytes";
}

} // namespace

DeviceQueueProxy::DeviceQueueProxy(const dq::QueueView& queue, const ProtectionDomain& pd, CompletionQueue& cq,
                                   const DeviceQueueProxyOptions& options)
    : queue_(queue),
      reader_(queue),
      options_(options),
      cq_(&cq),
      scratch_(queue.capacity() * scratch_words_per_slot),
      scratch_region_(pd, std::as_writable_bytes(std::span(scratch_)), Access::local_write),
      done_(queue.capacity()),
      posted_(queue.capacity()),
      peer_of_(queue.capacity()) {
    if (options_.batch == 0) options_.batch = 1;
}

DeviceQueueProxy::~DeviceQueueProxy() {
    close();
}

void DeviceQueueProxy::add_window(std::uint16_t id, const MemoryRegion& region) {
    if (windows_.size() <= id) windows_.resize(std::size_t{id} + 1);
    windows_[id] = &region;
}

void DeviceQueueProxy::add_peer(std::uint16_t peer, QueuePair& qp, const RemoteWindows& windows) {
    if (peers_.size() <= peer) peers_.resize(std::size_t{peer} + 1);
    Peer& p = peers_[peer];
    p.qp = &qp;
    p.windows.clear();
    for (const auto& [id, memory] : windows) {
        if (p.windows.size() <= id) p.windows.resize(std::size_t{id} + 1);
        p.windows[id] = memory;
    }
}

DeviceQueueProxy::Peer* DeviceQueueProxy::peer(std::uint16_t id) noexcept {
    return id < peers_.size() && peers_[id].qp != nullptr ? &peers_[id] : nullptr;
}

const MemoryRegion* DeviceQueueProxy::window(std::uint16_t id) const noexcept {
    return id < windows_.size() ? windows_[id] : nullptr;
}

const RemoteMemory* DeviceQueueProxy::Peer::window(std::uint16_t id) const noexcept {
    return id < windows.size() && windows[id] ? &*windows[id] : nullptr;
}

void DeviceQueueProxy::close() noexcept {
    if (!failed_) fail(dq::QueueError::closed, "the proxy closed the queue");
}

void DeviceQueueProxy::fail(dq::QueueError error, std::string words) noexcept {
    if (failed_) return;
    failed_ = true;
    failure_ = std::move(words);
    reader_.fail(error);
}

void DeviceQueueProxy::reap() {
    std::array<Completion, 64> got;
    std::error_code ec;
    for (;;) {
        const std::size_t n = cq_->poll(got, ec);
        for (std::size_t i = 0; i < n; ++i) {
            const Completion& c = got[i];
            if (!c.ok()) {
                fail(dq::QueueError::peer_failed, "the request at position " +
                                                      std::to_string(c.context & position_mask) +
                                                      " failed: " + std::error_code(c.status).message());
                continue;
            }
            // The chain's signaled request covers its descriptors: `count` positions ending at this one.
            const std::uint64_t position = c.context & position_mask;
            const std::uint64_t count = std::max<std::uint64_t>(c.context >> count_shift, 1);
            for (std::uint64_t k = 0; k < count; ++k) done_[(position - k) & (queue_.capacity() - 1)] = 1;
        }
        if (ec) fail(dq::QueueError::peer_failed, "polling the completion queue failed: " + ec.message());
        if (n < got.size()) break;
    }
    // Credits in order: a slot goes back only when every one before it did.
    const std::uint64_t before = credit_;
    while (credit_ < reader_.taken() && done_[credit_ & (queue_.capacity() - 1)] != 0) {
        done_[credit_ & (queue_.capacity() - 1)] = 0;
        ++credit_;
    }
    if (credit_ != before) {
        counters_.completed += credit_ - before;
        reader_.complete(credit_);
    }
    const std::size_t oldest = credit_ & (queue_.capacity() - 1);
    if (credit_ < reader_.taken() && now_ - posted_[oldest] > options_.request_timeout) {
        // The provider may never complete it (rxe with retry_count 7 retries forever): move the queue pair
        // to error so that its requests flush, and say why.
        if (Peer* stuck = peer(peer_of_[oldest])) (void)stuck->qp->force_error();
        fail(dq::QueueError::peer_failed, "the request at position " + std::to_string(credit_) + " to peer " +
                                              std::to_string(peer_of_[oldest]) + " did not complete within " +
                                              std::to_string(options_.request_timeout.count()) +
                                              " ms: the peer or the link is gone");
    }
}

bool DeviceQueueProxy::take_and_post() {
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
        if (r.op == dq::Op::fence) { // no request of its own: the next one to the peer waits for those before
            to->fence_next = true;
            const std::uint64_t position = reader_.taken();
            done_[position & (queue_.capacity() - 1)] = 1;
            posted_[position & (queue_.capacity() - 1)] = now_;
            reader_.advance();
            ++counters_.descriptors;
            ++taken;
            continue;
        }
        // A chain of this peer's descriptors, one doorbell; only its last request is signaled, and its
        // completion covers them all (a queue pair completes in order; a failure completes on its own).
        const std::uint64_t first = reader_.taken();
        const std::uint64_t room = to->qp->capabilities().max_send_wr - to->qp->outstanding_sends();
        SendBatch chain = to->qp->batch();
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
            if (!add(r, *to, chain, last ? position - first + 1 : 0)) break;
            in_chain += needs;
            ++taken;
            if (last) break;
            r = next;
        }
        if (in_chain > 0) {
            if (const std::error_code ec = chain.post()) {
                fail(dq::QueueError::peer_failed,
                     "posting to peer " + std::to_string(r.peer) + "'s queue pair failed: " + ec.message());
                return false;
            }
            ++counters_.chains;
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
    const dq::Decoded d = reader_.peek(r, ahead);
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

bool DeviceQueueProxy::add(const dq::Request& r, Peer& to, SendBatch& chain, std::uint64_t covers) {
    const std::uint64_t position = reader_.taken();
    const std::size_t slot = position & (queue_.capacity() - 1);
    // Every request carries its descriptor's position (a failure completes with it); the chain's last
    // is signaled and carries how many descriptors its completion covers.
    SendOptions own;
    own.context = position;
    own.signaled = false;
    own.fence = to.fence_next;
    SendOptions last = own;
    if (covers > 0) {
        last.signaled = true;
        last.context = position | (covers << count_shift);
    }
    std::error_code ec;
    if (r.op == dq::Op::put || r.op == dq::Op::put_signal) {
        const MemoryRegion* src = window(r.src_window);
        const RemoteMemory* dst = to.window(r.dst_window);
        if (src == nullptr || dst == nullptr || r.bytes > UINT32_MAX || r.src_offset > src->length() ||
            r.bytes > src->length() - r.src_offset) {
            fail(dq::QueueError::refused,
                 "a put names a window it has not, or a range outside it (" + words_of(r) + ")");
            return false;
        }
        ec = chain.add(WorkRequest::write(src->slice(r.src_offset, r.bytes), *dst, r.dst_offset)
                           .options(r.op == dq::Op::put ? last : own));
        own.fence = false;
    }
    if (!ec && (r.op == dq::Op::signal || r.op == dq::Op::put_signal)) {
        const RemoteMemory* sig = to.window(r.signal_window);
        if (sig == nullptr) {
            fail(dq::QueueError::refused, "a signal names window " + std::to_string(r.signal_window) + ", which peer " +
                                              std::to_string(r.peer) + " has not (" + words_of(r) + ")");
            return false;
        }
        const LocalBuffer word = scratch_region_.slice(slot * scratch_words_per_slot * sizeof(std::uint64_t), 8);
        if (r.signal_op == dq::SignalOp::add) {
            ec = chain.add(WorkRequest::fetch_add(word, *sig, r.signal_offset, r.signal_value).options(last));
        } else {
            // Set: an inline 8-byte write (the value is copied when posted).
            scratch_[slot * scratch_words_per_slot] = r.signal_value;
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
    reader_.advance();
    ++counters_.descriptors;
    counters_.requests += requests_of(r);
    return true;
}

std::size_t DeviceQueueProxy::progress() {
    if (failed_) return 0;
    ++counters_.passes;
    now_ = Clock::now(); // one clock read per pass: the posted times and the timeout's check
    const std::uint64_t completed = counters_.completed;
    reap();
    if (failed_) return 0;
    const std::uint64_t before = reader_.taken();
    (void)take_and_post();
    const auto taken = static_cast<std::size_t>(reader_.taken() - before);
    if (taken == 0 && counters_.completed == completed) ++counters_.idle_passes;
    return taken;
}

} // namespace gpuverbs
