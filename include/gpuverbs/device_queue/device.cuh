// The kernel-side API of the device queue (issue 37): what a CUDA kernel
// calls to put bytes to a peer, signal it, and wait, through the ring
// (ring.hpp) that the host proxy drains onto our rails. Compiled only by
// nvcc; the library builds without it.
//
//   __global__ void produce(gpuverbs::device_queue::QueueView q, ...) {
//       ... write the block into window 3 at `offset` ...
//       using namespace gpuverbs::device;
//       if (put_signal(q, peer, /*dst*/ 5, offset, /*src*/ 3, offset, bytes,
//                      /*signal*/ 6, slot * 8, 1, SignalOp::add, 1'000'000) != WaitResult::done) { ... }
//   }
//
// Buffers are named by window ids the host registered (the kernel never sees
// an rkey): the proxy resolves a window on whichever rail is healthy. Every
// call that may wait takes a timeout in nanoseconds (the GPU's global timer;
// no_timeout, UINT64_MAX, for none: timeouts saturate, never wrap) and returns
// a WaitResult: done, timed_out, peer_failed, queue_closed or refused (the
// proxy refused a request and closed the queue) — never a hang.
#pragma once

#include "gpuverbs/device_queue/ring.hpp"

#include <cooperative_groups.h>

namespace gpuverbs::device {

using device_queue::QueueView;
using device_queue::Request;
using device_queue::SignalOp;
using device_queue::WaitResult;

/// A queue from its four addresses, as a kernel started from Python receives
/// them (gpuverbs.DeviceQueue.view: slots, producer, proxy, log2_capacity).
__host__ __device__ inline QueueView queue_view(unsigned long long slots, unsigned long long producer,
                                                unsigned long long proxy, unsigned int log2_capacity) {
    QueueView q;
    q.slots = reinterpret_cast<device_queue::Descriptor*>(slots);
    q.producer = reinterpret_cast<device_queue::ProducerWords*>(producer);
    q.proxy = reinterpret_cast<device_queue::ProxyWords*>(proxy);
    q.log2_capacity = log2_capacity;
    return q;
}

using device_queue::no_timeout;

/// Pushes `r`, reserving for every lane of the warp that pushes at the same
/// time in one step (one ticket per warp, not per thread); in a ring smaller
/// than the pushing lanes, each lane takes its own ticket. Tickets are served
/// in order: the push waits only for the reader to take and complete the
/// positions ahead of it. `timeout_ns` no_timeout (UINT64_MAX) waits until
/// done or the queue fails; a push into a closed or failed queue returns its
/// code at once (and never reaches the peer); one that does not end done
/// leaves nothing the reader waits on. `position`: where the request went
/// (for quiet_until).
__device__ inline WaitResult push(const QueueView& q, const Request& r, std::uint64_t timeout_ns,
                                  std::uint64_t* position = nullptr) {
    namespace cg = cooperative_groups;
    const cg::coalesced_group lanes = cg::coalesced_threads();
    const std::uint64_t deadline = device_queue::deadline_after(timeout_ns);
    if (lanes.num_threads() > q.capacity()) { // a ring smaller than the warp: a ticket each
        std::uint64_t mine = 0;
        const WaitResult got = device_queue::reserve(q, 1, deadline, mine);
        if (got != WaitResult::done) return got;
        device_queue::write(q, mine, r);
        if (position != nullptr) *position = mine;
        return WaitResult::done;
    }
    std::uint64_t first = 0;
    auto result = static_cast<std::uint32_t>(WaitResult::done);
    if (lanes.thread_rank() == 0) {
        result = static_cast<std::uint32_t>(
            device_queue::reserve(q, static_cast<std::uint32_t>(lanes.num_threads()), deadline, first));
    }
    first = lanes.shfl(first, 0);
    result = lanes.shfl(result, 0);
    if (result != static_cast<std::uint32_t>(WaitResult::done)) return static_cast<WaitResult>(result);
    const std::uint64_t mine = first + lanes.thread_rank();
    device_queue::write(q, mine, r);
    if (position != nullptr) *position = mine;
    return WaitResult::done;
}

/// Makes this thread's earlier writes (the bytes a put sends) visible to the
/// NIC before the descriptor that sends them: a system-scope fence. put and
/// put_signal call it unless told the caller already did (one fence for a
/// warp's many puts).
__device__ inline void fence_data() {
    __threadfence_system();
}

namespace detail {
__device__ inline Request put_request(std::uint16_t peer, std::uint16_t dst_window, std::uint64_t dst_offset,
                                      std::uint16_t src_window, std::uint64_t src_offset, std::uint64_t bytes) {
    Request r;
    r.op = device_queue::Op::put;
    r.peer = peer;
    r.dst_window = dst_window;
    r.dst_offset = dst_offset;
    r.src_window = src_window;
    r.src_offset = src_offset;
    r.bytes = bytes;
    return r;
}
} // namespace detail

/// Writes `bytes` of local window `src_window` at `src_offset` to the peer's
/// window `dst_window` at `dst_offset`. Returns once the request is in the
/// ring (the source may be reused after quiet()).
__device__ inline WaitResult put(const QueueView& q, std::uint16_t peer, std::uint16_t dst_window,
                                 std::uint64_t dst_offset, std::uint16_t src_window, std::uint64_t src_offset,
                                 std::uint64_t bytes, std::uint64_t timeout_ns, bool data_fenced = false) {
    if (!data_fenced) fence_data();
    return push(q, detail::put_request(peer, dst_window, dst_offset, src_window, src_offset, bytes), timeout_ns);
}

/// A put, then a signal (set or add `value` at the peer's `signal_window` +
/// `signal_offset`), which the peer sees only after the put's bytes.
__device__ inline WaitResult put_signal(const QueueView& q, std::uint16_t peer, std::uint16_t dst_window,
                                        std::uint64_t dst_offset, std::uint16_t src_window, std::uint64_t src_offset,
                                        std::uint64_t bytes, std::uint16_t signal_window, std::uint64_t signal_offset,
                                        std::uint64_t value, SignalOp op, std::uint64_t timeout_ns,
                                        bool data_fenced = false) {
    if (!data_fenced) fence_data();
    Request r = detail::put_request(peer, dst_window, dst_offset, src_window, src_offset, bytes);
    r.op = device_queue::Op::put_signal;
    r.signal_window = signal_window;
    r.signal_offset = signal_offset;
    r.signal_value = value;
    r.signal_op = op;
    return push(q, r, timeout_ns);
}

/// A signal alone, ordered after this queue's earlier puts to the peer.
__device__ inline WaitResult signal(const QueueView& q, std::uint16_t peer, std::uint16_t signal_window,
                                    std::uint64_t signal_offset, std::uint64_t value, SignalOp op,
                                    std::uint64_t timeout_ns) {
    Request r;
    r.op = device_queue::Op::signal;
    r.peer = peer;
    r.signal_window = signal_window;
    r.signal_offset = signal_offset;
    r.signal_value = value;
    r.signal_op = op;
    return push(q, r, timeout_ns);
}

/// Orders the peer's view: puts pushed after it land after those before it.
__device__ inline WaitResult fence(const QueueView& q, std::uint16_t peer, std::uint64_t timeout_ns) {
    Request r;
    r.op = device_queue::Op::fence;
    r.peer = peer;
    return push(q, r, timeout_ns);
}

/// Waits until every position reserved so far in the queue completed — by
/// any thread of any kernel, including tickets still waiting for a slot (and
/// those whose producer gave up, once skipped): their sources may be reused.
/// For the requests of this thread alone, keep push's `position` and call
/// quiet_until.
__device__ inline WaitResult quiet(const QueueView& q, std::uint64_t timeout_ns) {
    return device_queue::quiet(q, device_queue::deadline_after(timeout_ns));
}

/// Waits until every request up to and including `position` (from push)
/// completed: this thread's own requests, without waiting for later ones.
__device__ inline WaitResult quiet_until(const QueueView& q, std::uint64_t position, std::uint64_t timeout_ns) {
    return device_queue::quiet_until(q, position, device_queue::deadline_after(timeout_ns));
}

/// Waits until the local word `signal` (where a peer's signals land) reaches `value`.
__device__ inline WaitResult wait_signal(const QueueView& q, std::uint64_t* signal, std::uint64_t value,
                                         std::uint64_t timeout_ns) {
    return device_queue::wait_signal(q, signal, value, device_queue::deadline_after(timeout_ns));
}

} // namespace gpuverbs::device
