// The device queue's host proxy (include/gpuverbs/device_queue/proxy.hpp says what it promises).
#include "gpuverbs/device_queue/proxy.hpp"

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/data_path/work_request.hpp"

#include <array>

namespace gpuverbs {

namespace dq = device_queue;
using Clock = std::chrono::steady_clock;

namespace {

/// Signals that add land as fetch-and-add; their old values go to scratch
/// words, one per slot (the slot's request is the only one using it until its
/// credit returns).
constexpr std::size_t scratch_words_per_slot = 1;

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
    windows_[id] = &region;
}

void DeviceQueueProxy::add_peer(std::uint16_t peer, QueuePair& qp, RemoteWindows windows) {
    Peer& p = peers_[peer];
    p.qp = &qp;
    p.windows = std::move(windows);
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
                fail(dq::QueueError::peer_failed, "the request at position " + std::to_string(c.context) +
                                                      " failed: " + std::error_code(c.status).message());
                continue;
            }
            done_[c.context & (queue_.capacity() - 1)] = 1;
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
    if (credit_ < reader_.taken() && Clock::now() - posted_[oldest] > options_.request_timeout) {
        // The provider may never complete it (rxe with retry_count 7 retries forever): move the queue pair
        // to error so that its requests flush, and say why.
        const auto peer = peers_.find(peer_of_[oldest]);
        if (peer != peers_.end()) (void)peer->second.qp->force_error();
        fail(dq::QueueError::peer_failed, "the request at position " + std::to_string(credit_) + " to peer " +
                                              std::to_string(peer_of_[oldest]) + " did not complete within " +
                                              std::to_string(options_.request_timeout.count()) +
                                              " ms: the peer or the link is gone");
    }
}

bool DeviceQueueProxy::take_and_post() {
    std::uint32_t taken = 0;
    // One chain per run of descriptors for the same peer: a peer change posts the chain so far.
    while (taken < options_.batch && !failed_) {
        dq::Request r;
        if (!peek(r)) break;
        const auto peer_at = peers_.find(r.peer);
        if (peer_at == peers_.end()) {
            fail(dq::QueueError::refused,
                 "a request names peer " + std::to_string(r.peer) + ", which has no queue pair (" + words_of(r) + ")");
            break;
        }
        Peer& peer = peer_at->second;
        SendBatch chain = peer.qp->batch();
        std::size_t in_chain = 0;
        bool more = true;
        while (more && taken < options_.batch && !failed_) {
            // Room for this descriptor's requests (two at most) in the send queue and the chain.
            const std::size_t needs = r.op == dq::Op::put_signal ? 2 : (r.op == dq::Op::fence ? 0 : 1);
            if (in_chain + needs > SendBatch::max_requests) break;
            if (peer.qp->outstanding_sends() + in_chain + needs > peer.qp->capabilities().max_send_wr) {
                ++counters_.queue_full;
                taken = options_.batch; // nothing more this pass: the send queue is full
                break;
            }
            if (!add(r, peer, chain)) break;
            in_chain += needs;
            ++taken;
            more = peek(r) && r.peer == peer_at->first;
        }
        if (in_chain > 0) {
            if (const std::error_code ec = chain.post()) {
                fail(dq::QueueError::peer_failed,
                     "posting to peer " + std::to_string(peer_at->first) + "'s queue pair failed: " + ec.message());
                return false;
            }
            ++counters_.chains;
        }
    }
    return !failed_;
}

bool DeviceQueueProxy::peek(dq::Request& r) {
    const dq::Decoded d = reader_.peek(r);
    if (d == dq::Decoded::corrupt) {
        fail(dq::QueueError::refused, "the descriptor at position " + std::to_string(reader_.taken()) +
                                          " is corrupt (stamped for its lap, yet not what a producer writes)");
    }
    return d == dq::Decoded::complete;
}

bool DeviceQueueProxy::add(const dq::Request& r, Peer& peer, SendBatch& chain) {
    const std::uint64_t position = reader_.taken();
    const std::size_t slot = position & (queue_.capacity() - 1);
    SendOptions last;
    last.context = position;
    last.fence = peer.fence_next;
    std::error_code ec;
    if (r.op == dq::Op::fence) {
        // No request of its own: the next one to the peer waits for the ones before it.
        peer.fence_next = true;
        done_[slot] = 1;
    }
    if (r.op == dq::Op::put || r.op == dq::Op::put_signal) {
        const auto src = windows_.find(r.src_window);
        const auto dst = peer.windows.find(r.dst_window);
        if (src == windows_.end() || dst == peer.windows.end() || r.bytes > UINT32_MAX ||
            r.src_offset > src->second->length() || r.bytes > src->second->length() - r.src_offset) {
            fail(dq::QueueError::refused,
                 "a put names a window it has not, or a range outside it (" + words_of(r) + ")");
            return false;
        }
        SendOptions put = last;
        if (r.op == dq::Op::put_signal) put.signaled = false; // the signal's completion covers it
        ec = chain.add(
            WorkRequest::write(src->second->slice(r.src_offset, r.bytes), dst->second, r.dst_offset).options(put));
        peer.fence_next = false;
    }
    if (!ec && (r.op == dq::Op::signal || r.op == dq::Op::put_signal)) {
        const auto sig = peer.windows.find(r.signal_window);
        if (sig == peer.windows.end()) {
            fail(dq::QueueError::refused, "a signal names window " + std::to_string(r.signal_window) + ", which peer " +
                                              std::to_string(r.peer) + " has not (" + words_of(r) + ")");
            return false;
        }
        SendOptions s = last;
        const LocalBuffer word = scratch_region_.slice(slot * scratch_words_per_slot * sizeof(std::uint64_t), 8);
        if (r.signal_op == dq::SignalOp::add) {
            ec = chain.add(WorkRequest::fetch_add(word, sig->second, r.signal_offset, r.signal_value).options(s));
        } else {
            // Set: an inline 8-byte write (the value is copied when posted).
            scratch_[slot * scratch_words_per_slot] = r.signal_value;
            s.inline_data = true;
            ec = chain.add(WorkRequest::write(word, sig->second, r.signal_offset).options(s));
        }
        peer.fence_next = false;
    }
    if (ec) {
        fail(dq::QueueError::refused,
             "the proxy could not make a request of a descriptor (" + words_of(r) + "): " + ec.message());
        return false;
    }
    posted_[slot] = Clock::now();
    peer_of_[slot] = r.peer;
    reader_.advance();
    ++counters_.descriptors;
    counters_.requests += r.op == dq::Op::put_signal ? 2 : (r.op == dq::Op::fence ? 0 : 1);
    return true;
}

std::size_t DeviceQueueProxy::progress() {
    if (failed_) return 0;
    reap();
    if (failed_) return 0;
    const std::uint64_t before = reader_.taken();
    (void)take_and_post();
    return static_cast<std::size_t>(reader_.taken() - before);
}

} // namespace gpuverbs
