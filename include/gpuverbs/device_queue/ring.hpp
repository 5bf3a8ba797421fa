// The device queue's ring (issue 37): how a producer — a GPU thread, or a CPU
// thread in the rig's tests — hands requests (put, put_signal, signal, fence)
// to the host proxy that posts them on our rails. One header for both
// compilers: nvcc compiles the producer into kernels, the host compiler the
// proxy's reader and a CPU producer, so both halves agree on every byte
// (tests/unit/device_queue_ring_test.cpp checks the layout; the GPU half's
// test compiles this same file).
//
// The protocol, and why (docs/gpu-initiated.md has the fences in full):
//
// - 64-byte descriptors in host memory the GPU reaches through a mapping
//   (cudaHostAlloc ... Mapped). A GPU store to it is a posted PCIe write: the
//   producer never waits for it, and the proxy reads it from its own cache.
// - Eight 8-byte words, each stamped in its top byte with the lap that wrote
//   it: an aligned 8-byte store arrives whole, so a descriptor whose eight
//   stamps all name the reader's lap (and whose last word holds the position
//   itself) is complete. No fence and no separate sequence store between a
//   descriptor's words: the stamps make a torn or stale descriptor visible to
//   the reader, which waits for it to complete. (A fence is still needed
//   between the data a put sends and its descriptor: gpuverbs::device::put
//   issues it; see the document.)
// - Reservation by ticket (issue 50): one fetch-and-add on a counter next to
//   the producers (GPU memory for a kernel) gives a producer its positions —
//   a warp's for all its active lanes at once — and it waits until its slots
//   are free. Tickets are served in the order they were taken, so no producer
//   starves however many push: a push waits only for the reader to take and
//   complete the positions ahead of it.
// - A ticket whose push gives up (its deadline, or the queue failed) leaves no
//   hole: the producer marks each of its positions cancelled in host memory
//   (one byte per position, in a table after the proxy's words), and the
//   reader, finding a position's descriptor not written, takes a cancelled
//   one as skipped (Decoded::skipped) and returns its credit like any other.
// - Credits: the reader's proxy stores how many positions have completed (the
//   request's source may be reused then) into host memory; producers keep the
//   last value they saw next to the counter (credit_seen) and read the host
//   word across PCIe rarely (reserve() says when), so a ring that keeps up
//   costs no read of host memory per push.
// - An error word in host memory, written by the proxy (a peer failed, the
//   queue closed or refused a request), and its copy in the producers' words
//   (RingReader::fail writes both; for a GPU queue through the view's
//   ProducerErrorSink): every push reads the copy, so a push into a closed or
//   failed queue returns that code at once, and every wait reads the host
//   word, so none outlives the queue.
// - Deadlines are absolute nanoseconds on the producer's clock; no_deadline
//   (UINT64_MAX) never passes, and deadline_after() saturates instead of
//   wrapping, so a timeout of UINT64_MAX means "no timeout".
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GPUVERBS_HOST_DEVICE __host__ __device__
#else
#define GPUVERBS_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#include <cuda/atomic>
#else
#include <atomic>
#include <chrono>
#include <thread>
#endif

namespace gpuverbs::device_queue {

/// What a descriptor asks the proxy to do.
enum class Op : std::uint8_t {
    put = 1,        ///< write bytes of a local window to a peer's window
    put_signal = 2, ///< a put, then the signal, ordered after the put's bytes at the peer
    signal = 3,     ///< set or add to a 64-bit word of a peer's window
    fence = 4,      ///< later puts to the peer are ordered after earlier ones (IBV_SEND_FENCE)
};

/// How a signal changes its word at the peer.
enum class SignalOp : std::uint8_t { set = 0, add = 1 };

/// How a push or a bounded wait ended. A push that does not end done has
/// reserved nothing the reader waits on (its positions are skipped).
enum class WaitResult : std::uint32_t {
    done = 0,
    timed_out = 1,    ///< its deadline passed first
    peer_failed = 2,  ///< the proxy reported the peer (every rail to it) failed
    queue_closed = 3, ///< the proxy closed the queue
    refused = 4, ///< the proxy refused a request (an unknown peer or window, a range outside it) and closed the queue
};

/// A deadline that never passes: a wait with it ends only done or with the queue's error.
inline constexpr std::uint64_t no_deadline = ~std::uint64_t{0};
/// A timeout that never ends (the device.cuh calls' `timeout_ns`).
inline constexpr std::uint64_t no_timeout = ~std::uint64_t{0};

/// The error word's values (written by the proxy, read by every wait).
enum class QueueError : std::uint32_t { none = 0, peer_failed = 2, closed = 3, refused = 4 };

/// One request, unpacked. Windows are small ids the host registered (the
/// producer never sees an rkey), offsets and lengths are bytes.
struct Request {
    Op op = Op::put;
    SignalOp signal_op = SignalOp::set;
    std::uint16_t peer = 0;
    std::uint16_t src_window = 0;
    std::uint16_t dst_window = 0;
    std::uint16_t signal_window = 0;
    std::uint64_t src_offset = 0;
    std::uint64_t dst_offset = 0;
    std::uint64_t bytes = 0;
    std::uint64_t signal_offset = 0;
    std::uint64_t signal_value = 0;
};

inline constexpr std::size_t descriptor_bytes = 64;
inline constexpr std::size_t descriptor_words = 8;
/// Offsets, lengths and signal values carry 56 bits (the top byte is the stamp).
inline constexpr std::uint64_t payload_mask = (std::uint64_t{1} << 56) - 1;
/// A queue holds 2^0 to 2^max_log2_capacity slots (DeviceQueue checks; any
/// size works for any number of producers: a warp larger than the ring takes
/// a ticket per lane).
inline constexpr std::uint32_t max_log2_capacity = 20;

struct alignas(descriptor_bytes) Descriptor {
    std::uint64_t word[descriptor_words];
};
static_assert(sizeof(Descriptor) == descriptor_bytes);

/// The stamp of every word written in `position`'s lap: never 0 (zeroed
/// memory is no descriptor), and different from the lap before it.
GPUVERBS_HOST_DEVICE constexpr std::uint64_t stamp(std::uint64_t position, std::uint32_t log2_capacity) {
    return ((((position >> log2_capacity) & 0x7f) | 0x80)) << 56;
}

/// The eight words of `r` at `position`.
GPUVERBS_HOST_DEVICE constexpr void encode(const Request& r, std::uint64_t position, std::uint32_t log2_capacity,
                                           std::uint64_t (&out)[descriptor_words]) {
    const std::uint64_t s = stamp(position, log2_capacity);
    out[0] = s | (std::uint64_t{static_cast<std::uint8_t>(r.op)} << 48) |
             (std::uint64_t{static_cast<std::uint8_t>(r.signal_op)} << 40) | (std::uint64_t{r.peer} << 16) |
             std::uint64_t{r.signal_window};
    out[1] = s | (std::uint64_t{r.src_window} << 16) | std::uint64_t{r.dst_window};
    out[2] = s | (r.src_offset & payload_mask);
    out[3] = s | (r.dst_offset & payload_mask);
    out[4] = s | (r.bytes & payload_mask);
    out[5] = s | (r.signal_offset & payload_mask);
    out[6] = s | (r.signal_value & payload_mask);
    out[7] = s | (position & payload_mask);
}

/// What a reader makes of eight words it read at `position`.
enum class Decoded : std::uint8_t {
    complete,   ///< every word carries this lap's stamp and the position: `out` is the request
    incomplete, ///< some word is still the previous lap's (not written yet, or in flight)
    corrupt,    ///< stamped for this lap, yet not what a producer writes (the position or the op is wrong)
    skipped,    ///< not written, and its producer gave up (RingReader): no request; its credit returns as any
};

GPUVERBS_HOST_DEVICE constexpr Decoded decode(const std::uint64_t (&in)[descriptor_words], std::uint64_t position,
                                              std::uint32_t log2_capacity, Request& out) {
    const std::uint64_t s = stamp(position, log2_capacity);
    // One test for all eight stamps, written out (the reader runs this per descriptor; as a loop, -O2
    // left it rolled at 48 instructions).
    const std::uint64_t differ =
        (in[0] ^ s) | (in[1] ^ s) | (in[2] ^ s) | (in[3] ^ s) | (in[4] ^ s) | (in[5] ^ s) | (in[6] ^ s) | (in[7] ^ s);
    if ((differ & ~payload_mask) != 0) return Decoded::incomplete;
    if ((in[7] & payload_mask) != (position & payload_mask)) return Decoded::corrupt;
    const auto op = static_cast<std::uint8_t>(in[0] >> 48);
    if (op < static_cast<std::uint8_t>(Op::put) || op > static_cast<std::uint8_t>(Op::fence)) return Decoded::corrupt;
    out.op = static_cast<Op>(op);
    out.signal_op = static_cast<SignalOp>((in[0] >> 40) & 0xff);
    out.peer = static_cast<std::uint16_t>(in[0] >> 16);
    out.signal_window = static_cast<std::uint16_t>(in[0]);
    out.src_window = static_cast<std::uint16_t>(in[1] >> 16);
    out.dst_window = static_cast<std::uint16_t>(in[1]);
    out.src_offset = in[2] & payload_mask;
    out.dst_offset = in[3] & payload_mask;
    out.bytes = in[4] & payload_mask;
    out.signal_offset = in[5] & payload_mask;
    out.signal_value = in[6] & payload_mask;
    return Decoded::complete;
}

/// The producers' words: where a kernel pushes, in GPU memory (or host memory
/// for a CPU producer). Apart from the proxy's words: their cache lines never
/// bounce between the producers and the reader.
struct alignas(128) ProducerWords {
    std::uint64_t reserved = 0;    ///< tickets taken so far: positions handed out, in order
    std::uint64_t credit_seen = 0; ///< the highest credit a producer read (quiet's shortcut)
    /// The proxy's error word, copied where every push reads it without
    /// crossing PCIe: RingReader::fail writes it (for a GPU queue through the
    /// view's ProducerErrorSink, a copy beside the running kernels).
    alignas(64) std::uint32_t error = 0;
};

/// The proxy's words, in host memory the producers reach through a mapping.
struct alignas(128) ProxyWords {
    std::uint64_t credit = 0; ///< positions whose requests completed: slots below credit + capacity are free
    std::uint32_t error = 0;  ///< QueueError
    std::uint32_t reserved_ = 0;
};

/// How the reader reaches the producers' copy of the error word where the
/// host cannot store (GPU memory): the queue's owner writes it. DeviceQueue
/// copies it on a CUDA stream of its own, which runs beside the kernels that
/// wait on it.
struct ProducerErrorSink {
    void (*write)(const ProducerErrorSink& self, std::uint32_t error) noexcept = nullptr;
};

/// Positions the cancel table tells apart: a position and one this many later
/// share a mark, so at most this many positions may lie between the reader
/// and the furthest ticket taken (the ring's slots and every producer waiting
/// for one: 2^19 covers every thread a GPU holds at once).
GPUVERBS_HOST_DEVICE constexpr std::uint64_t cancel_marks(std::uint32_t log2_capacity) {
    const std::uint64_t four_laps = std::uint64_t{4} << log2_capacity;
    return four_laps > (std::uint64_t{1} << 19) ? four_laps : (std::uint64_t{1} << 19);
}
/// The alignment a queue's host memory needs (the proxy's words'; a page,
/// as cudaHostAlloc gives, is more than enough).
inline constexpr std::size_t host_alignment = alignof(ProxyWords);
/// Where the proxy's words start: after the slots, on their alignment (a
/// one-slot ring's 64 bytes leave a gap).
GPUVERBS_HOST_DEVICE constexpr std::size_t proxy_offset(std::uint32_t log2_capacity) {
    const std::size_t slots = (std::size_t{1} << log2_capacity) * descriptor_bytes;
    return (slots + host_alignment - 1) / host_alignment * host_alignment;
}
/// The host memory of a queue of 2^log2_capacity slots: the slots, the
/// proxy's words, the cancel table (zeroed: no descriptor, no credit, no
/// error, nothing cancelled), starting on host_alignment. layout() says where
/// each is.
GPUVERBS_HOST_DEVICE constexpr std::size_t host_bytes(std::uint32_t log2_capacity) {
    return proxy_offset(log2_capacity) + sizeof(ProxyWords) + static_cast<std::size_t>(cancel_marks(log2_capacity));
}

/// A queue as a producer and the reader see it: plain pointers, copied by
/// value into a kernel's arguments. The memory is the owner's (the host
/// DeviceQueue, or a test): host_bytes() of host memory laid out by layout(),
/// and the producers' words. The cancel table follows the proxy's words.
struct QueueView {
    Descriptor* slots = nullptr;       ///< 2^log2_capacity descriptors (host memory, mapped)
    ProducerWords* producer = nullptr; ///< next to the producers
    ProxyWords* proxy = nullptr;       ///< host memory, mapped
    std::uint32_t log2_capacity = 0;
    /// The reader's side of a GPU queue (producer null): how fail() reaches
    /// the producers' error word. Null in a kernel's view.
    const ProducerErrorSink* producer_error = nullptr;

    [[nodiscard]] GPUVERBS_HOST_DEVICE constexpr std::uint64_t capacity() const {
        return std::uint64_t{1} << log2_capacity;
    }
    /// One byte per position modulo cancel_marks(): 1 while that position's
    /// producer gave up and the reader has not skipped it yet.
    [[nodiscard]] GPUVERBS_HOST_DEVICE std::uint8_t* cancels() const {
        return reinterpret_cast<std::uint8_t*>(proxy + 1); // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    }
    [[nodiscard]] GPUVERBS_HOST_DEVICE std::uint8_t* cancel_of(std::uint64_t position) const {
        return cancels() + (position & (cancel_marks(log2_capacity) - 1));
    }
};

/// The view of `host_bytes(log2_capacity)` bytes at `host` (aligned on
/// host_alignment; the producers' words apart): slots first, then the
/// proxy's words and the cancel table.
GPUVERBS_HOST_DEVICE inline QueueView layout(void* host, ProducerWords* producer, std::uint32_t log2_capacity) {
    QueueView q;
    auto* bytes = static_cast<unsigned char*>(host);
    q.slots = reinterpret_cast<Descriptor*>(bytes); // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    q.proxy = reinterpret_cast<ProxyWords*>(
        bytes + proxy_offset(log2_capacity)); // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    q.producer = producer;
    q.log2_capacity = log2_capacity;
    return q;
}

// --- memory access, per compiler ------------------------------------------------
//
// The GPU side uses system-scope atomics (the proxy is another agent across
// PCIe); the host side std::atomic_ref. Relaxed where the stamps carry the
// ordering; acquire/release where a word publishes other memory (credits: the
// source may be reused; the error word).
namespace detail {

#if defined(__CUDA_ARCH__)
template <class T>
__device__ inline T load_acquire(T* p) {
    return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}
template <class T>
__device__ inline T load_relaxed(T* p) {
    return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(cuda::memory_order_relaxed);
}
template <class T>
__device__ inline void store_relaxed(T* p, T v) {
    cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_relaxed);
}
/// The producers' counter is only ever touched by GPU threads: device scope.
__device__ inline std::uint64_t take_tickets(std::uint64_t* p, std::uint64_t count) {
    return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>(*p).fetch_add(count, cuda::memory_order_relaxed);
}
/// A cancel mark: a byte of host memory only this position's producer writes (a posted PCIe write).
__device__ inline void mark_cancelled(std::uint8_t* mark) {
    *reinterpret_cast<volatile std::uint8_t*>(mark) = 1;
}
template <class T>
__device__ inline T load_producer(T* p) {
    return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).load(cuda::memory_order_relaxed);
}
/// Fire and forget: atomicMax with its result unused compiles to a reduction
/// (RED), which the thread does not wait for; fetch_max would cost a round
/// trip to L2 at the end of every wait.
__device__ inline void raise_credit_seen(std::uint64_t* p, std::uint64_t v) {
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
    (void)atomicMax(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
/// Nanoseconds on the GPU's global timer (the deadlines' clock on the GPU).
__device__ inline std::uint64_t now_ns() {
    std::uint64_t t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ inline void pause() {
    __nanosleep(64);
}
#else
template <class T>
inline T load_acquire(T* p) {
    return std::atomic_ref<T>(*p).load(std::memory_order_acquire);
}
template <class T>
inline T load_relaxed(T* p) {
    return std::atomic_ref<T>(*p).load(std::memory_order_relaxed);
}
template <class T>
inline void store_relaxed(T* p, T v) {
    std::atomic_ref<T>(*p).store(v, std::memory_order_relaxed);
}
inline std::uint64_t take_tickets(std::uint64_t* p, std::uint64_t count) {
    return std::atomic_ref<std::uint64_t>(*p).fetch_add(count, std::memory_order_relaxed);
}
inline void mark_cancelled(std::uint8_t* mark) {
    std::atomic_ref<std::uint8_t>(*mark).store(1, std::memory_order_release);
}
template <class T>
inline T load_producer(T* p) {
    return std::atomic_ref<T>(*p).load(std::memory_order_relaxed);
}
inline void raise_credit_seen(std::uint64_t* p, std::uint64_t v) {
    std::atomic_ref<std::uint64_t> seen(*p);
    std::uint64_t now = seen.load(std::memory_order_relaxed);
    while (now < v && !seen.compare_exchange_weak(now, v, std::memory_order_relaxed)) {
    }
}
/// Nanoseconds on the host's steady clock (the deadlines' clock on the host).
inline std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
}
/// A CPU producer that waits gives its core away: more producers than cores
/// (the rig's tests) must not starve the reader they wait for.
inline void pause() {
    std::this_thread::yield();
}
#endif

} // namespace detail

// --- the producer ---------------------------------------------------------------

/// The error word as a wait's result (done while there is none).
GPUVERBS_HOST_DEVICE inline WaitResult queue_state(const QueueView& q) {
    const std::uint32_t e = detail::load_acquire(&q.proxy->error);
    if (e == static_cast<std::uint32_t>(QueueError::peer_failed)) return WaitResult::peer_failed;
    if (e == static_cast<std::uint32_t>(QueueError::closed)) return WaitResult::queue_closed;
    if (e == static_cast<std::uint32_t>(QueueError::refused)) return WaitResult::refused;
    return WaitResult::done;
}

namespace detail {
/// The proxy's credit and error words in one read: on the GPU each read of
/// host memory is a PCIe round trip (1.2 us on the lent H100), so a wait
/// reads both in one 16-byte load rather than paying two.
GPUVERBS_HOST_DEVICE inline void load_credit_and_error(ProxyWords* w, std::uint64_t& credit, std::uint32_t& error) {
#if defined(__CUDA_ARCH__)
    std::uint64_t second = 0;
    asm volatile("ld.volatile.v2.u64 {%0, %1}, [%2];" : "=l"(credit), "=l"(second) : "l"(w) : "memory");
    error = static_cast<std::uint32_t>(second); // little-endian: the error word is the low half
#else
    credit = load_acquire(&w->credit); // the slot a producer writes next: after the reader's reads of it
    error = load_relaxed(&w->error);
#endif
}
static_assert(offsetof(ProxyWords, credit) == 0 && offsetof(ProxyWords, error) == 8);
} // namespace detail

/// The deadline `timeout_ns` from now, saturating: no_timeout (or any
/// timeout that would pass the clock's end) gives no_deadline.
GPUVERBS_HOST_DEVICE inline std::uint64_t deadline_after(std::uint64_t timeout_ns) {
    const std::uint64_t now = detail::now_ns();
    return timeout_ns >= no_deadline - now ? no_deadline : now + timeout_ns;
}

/// The error word as a wait's result, from a value read.
GPUVERBS_HOST_DEVICE constexpr WaitResult result_of(std::uint32_t error) {
    if (error == static_cast<std::uint32_t>(QueueError::peer_failed)) return WaitResult::peer_failed;
    if (error == static_cast<std::uint32_t>(QueueError::closed)) return WaitResult::queue_closed;
    if (error == static_cast<std::uint32_t>(QueueError::refused)) return WaitResult::refused;
    return WaitResult::done;
}

/// Marks `count` positions from `first` cancelled: the reader skips them.
GPUVERBS_HOST_DEVICE inline void cancel(const QueueView& q, std::uint64_t first, std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) detail::mark_cancelled(q.cancel_of(first + i));
}

/// Takes `count` consecutive positions (a ticket: served in the order taken)
/// and waits until their slots are free: done with the first in `first`, or
/// why not by `deadline_ns` — the queue's error at once, even with free
/// slots, or timed_out — and then the positions are marked cancelled, so the
/// reader never waits on them. `count` must not exceed the capacity (a
/// warp's reservation in a smaller ring is split: device.cuh's push).
///
/// What it reads, for a kernel: with free slots, the producers' words alone
/// (GPU memory: the ticket's add, credit_seen and the error's copy), except
/// the one ticket that crosses the middle of what credit_seen leaves free,
/// which reads the proxy's credit across PCIe and raises credit_seen, so the
/// tickets behind it find it fresh. A ticket that must wait reads the proxy's
/// credit (one read, with the error) only while it is next in line; those
/// behind it read credit_seen, and the proxy's word only once credit_seen
/// stood still for 20 µs (the ticket ahead gave up). A GPU serves reads of one
/// host word one after the other (about 1 µs each on the lent H200s): a read
/// per push, or per waiting warp, is what capped the rate.
GPUVERBS_HOST_DEVICE inline WaitResult reserve(const QueueView& q, std::uint32_t count, std::uint64_t deadline_ns,
                                               std::uint64_t& first) {
    std::uint32_t error = detail::load_producer(&q.producer->error);
    first = detail::take_tickets(&q.producer->reserved, count);
    std::uint64_t seen = detail::load_producer(&q.producer->credit_seen);
    // A closed or failed queue takes nothing more, free slots or not.
    if (error != 0) {
        cancel(q, first, count);
        return result_of(error);
    }
    if (first + count <= seen + q.capacity()) {
        const std::uint64_t middle = seen + q.capacity() / 2;
        if (first <= middle && middle < first + count) {
            std::uint64_t credit = 0;
            detail::load_credit_and_error(q.proxy, credit, error);
            if (credit > seen) detail::raise_credit_seen(&q.producer->credit_seen, credit);
            if (error != 0) { // the copy had not arrived yet
                cancel(q, first, count);
                return result_of(error);
            }
        }
        return WaitResult::done;
    }
    std::uint64_t still_since = 0; // when credit_seen was last seen to move (0: not looked yet)
    for (std::uint32_t i = 0;; ++i) {
        // The clock only now and then: the reads are the pause (PCIe round trips on a GPU).
        const bool look_at_clock = (i & 7) == 7;
        const std::uint64_t now = look_at_clock ? detail::now_ns() : 0;
        if (look_at_clock && now >= deadline_ns) {
            cancel(q, first, count);
            return WaitResult::timed_out;
        }
        const bool next_in_line = first <= seen + q.capacity();
        bool ask_proxy = next_in_line;
        if (look_at_clock && !next_in_line) {
            if (still_since == 0) still_since = now;
            ask_proxy = now - still_since >= 20'000;
        }
        if (ask_proxy) {
            std::uint64_t credit = 0;
            detail::load_credit_and_error(q.proxy, credit, error);
            if (error != 0) {
                cancel(q, first, count);
                return result_of(error);
            }
            if (credit > seen) {
                // No acquire: the slot's next write depends on this read, and no GPU or CPU makes a store
                // visible before the load that decides it (the reader read the slot before the credit).
                detail::raise_credit_seen(&q.producer->credit_seen, credit);
                if (first + count <= credit + q.capacity()) return WaitResult::done;
                seen = credit;
            }
            still_since = 0;
#if !defined(__CUDA_ARCH__)
            detail::pause(); // a CPU reads the word at once: it gives its core away (the reader may need it)
#endif
        } else {
            detail::pause();
        }
        error = detail::load_producer(&q.producer->error);
        if (error != 0) {
            cancel(q, first, count);
            return result_of(error);
        }
        const std::uint64_t now_seen = detail::load_producer(&q.producer->credit_seen);
        if (now_seen != seen) {
            seen = now_seen;
            still_since = 0;
            if (first + count <= seen + q.capacity()) return WaitResult::done;
        }
    }
}

/// Writes `r` into its reserved slot. The stamps publish it: no fence here
/// (see the file's comment for the one a put's data needs).
GPUVERBS_HOST_DEVICE inline void write(const QueueView& q, std::uint64_t position, const Request& r) {
    std::uint64_t words[descriptor_words];
    encode(r, position, q.log2_capacity, words);
    std::uint64_t* slot = q.slots[position & (q.capacity() - 1)].word;
    for (std::size_t i = 0; i < descriptor_words; ++i) detail::store_relaxed(slot + i, words[i]);
}

/// Reserves one slot and writes `r` there; `position` tells where (for quiet_until).
GPUVERBS_HOST_DEVICE inline WaitResult push(const QueueView& q, const Request& r, std::uint64_t deadline_ns,
                                            std::uint64_t& position) {
    const WaitResult got = reserve(q, 1, deadline_ns, position);
    if (got == WaitResult::done) write(q, position, r);
    return got;
}

/// Waits until every request up to and including `position` completed (its
/// source may be reused), or why not by `deadline_ns`.
GPUVERBS_HOST_DEVICE inline WaitResult quiet_until(const QueueView& q, std::uint64_t position,
                                                   std::uint64_t deadline_ns) {
#if defined(__CUDA_ARCH__)
    for (std::uint32_t i = 1;; ++i) {
        std::uint64_t credit = 0;
        std::uint32_t error = 0;
        detail::load_credit_and_error(q.proxy, credit, error);
        if (credit > position) {
            cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
            detail::raise_credit_seen(&q.producer->credit_seen, credit);
            return WaitResult::done;
        }
        if (error != 0) return queue_state(q);
        // Reads back to back (naps between them measured no better: benchmarks/device_queue_bench
        // compares the ways); the clock only now and then.
        if (i % 8 == 0 && detail::now_ns() >= deadline_ns) return WaitResult::timed_out;
    }
#else
    for (;;) {
        const std::uint64_t credit = detail::load_acquire(&q.proxy->credit);
        if (credit > position) {
            detail::raise_credit_seen(&q.producer->credit_seen, credit);
            return WaitResult::done;
        }
        if (const WaitResult state = queue_state(q); state != WaitResult::done) return state;
        if (detail::now_ns() >= deadline_ns) return WaitResult::timed_out;
        detail::pause();
    }
#endif
}

/// Waits until every request reserved so far (by any producer) completed.
GPUVERBS_HOST_DEVICE inline WaitResult quiet(const QueueView& q, std::uint64_t deadline_ns) {
    const std::uint64_t reserved = detail::load_producer(&q.producer->reserved);
    if (reserved == 0) return queue_state(q);
    return quiet_until(q, reserved - 1, deadline_ns);
}

/// Waits until the 64-bit word at `signal` (local memory a peer's signals
/// land in) reaches at least `value`, or why not by `deadline_ns`.
GPUVERBS_HOST_DEVICE inline WaitResult wait_signal(const QueueView& q, std::uint64_t* signal, std::uint64_t value,
                                                   std::uint64_t deadline_ns) {
    for (;;) {
#if defined(__CUDA_ARCH__)
        // The signal is local memory (fast to poll); the error word is across PCIe: read it once per 64 polls.
        for (int i = 0; i < 64; ++i) {
            if (detail::load_acquire(signal) >= value) return WaitResult::done;
        }
#endif
        if (detail::load_acquire(signal) >= value) return WaitResult::done;
        if (const WaitResult state = queue_state(q); state != WaitResult::done) return state;
        if (detail::now_ns() >= deadline_ns) return WaitResult::timed_out;
        detail::pause();
    }
}

// --- the reader (the proxy's side) ------------------------------------------------

#if !defined(__CUDA_ARCH__)
/// The fields of a plain put (decode_put): what its write needs.
struct PutFields {
    std::uint32_t windows = 0; ///< src_window << 16 | dst_window (equal for puts between the same windows)
    std::uint64_t src_offset = 0;
    std::uint64_t dst_offset = 0;
    std::uint64_t bytes = 0;
    [[nodiscard]] std::uint16_t src_window() const noexcept { return static_cast<std::uint16_t>(windows >> 16); }
    [[nodiscard]] std::uint16_t dst_window() const noexcept { return static_cast<std::uint16_t>(windows); }
};

/// The op (bits 48-55) and peer (bits 16-31) of a descriptor's word 0, and
/// their value in a put to `peer`.
inline constexpr std::uint64_t op_and_peer_bits = (std::uint64_t{0xff} << 48) | (std::uint64_t{0xffff} << 16);
constexpr std::uint64_t put_to(std::uint16_t peer) {
    return (std::uint64_t{static_cast<std::uint8_t>(Op::put)} << 48) | (std::uint64_t{peer} << 16);
}

/// Whether the eight words at `position` (whose lap's stamp is `s`) are a
/// complete put (Op::put) to the peer of `put_bits` (put_to(peer)):
/// decode()'s checks for that one shape, and only the fields a put needs
/// (the proxy's hot path: a run of puts to one peer). False for anything
/// else — not complete, corrupt, another op or peer — which decode() then
/// says what it is.
[[gnu::always_inline]] inline bool decode_put(const std::uint64_t (&in)[descriptor_words], std::uint64_t position,
                                              std::uint64_t s, std::uint64_t put_bits, PutFields& out) {
    const std::uint64_t differ =
        (in[0] ^ s) | (in[1] ^ s) | (in[2] ^ s) | (in[3] ^ s) | (in[4] ^ s) | (in[5] ^ s) | (in[6] ^ s) | (in[7] ^ s);
    if ((differ & ~payload_mask) != 0 || ((in[7] ^ position) & payload_mask) != 0) return false;
    if ((in[0] & op_and_peer_bits) != put_bits) return false;
    out.windows = static_cast<std::uint32_t>(in[1]);
    out.src_offset = in[2] & payload_mask;
    out.dst_offset = in[3] & payload_mask;
    out.bytes = in[4] & payload_mask;
    return true;
}

/// Takes descriptors in order from one queue. One thread per reader. It
/// returns credits only as `complete` says: the proxy calls it once the
/// requests below a position have completed.
class RingReader {
public:
    explicit RingReader(const QueueView& q) noexcept : q_(q) {}

    /// The next request if its descriptor is complete: Decoded::complete (and
    /// `out`), skipped (its producer gave up: taken, with no request; return
    /// its credit as any other's), incomplete (nothing yet, or still in
    /// flight), or corrupt (a descriptor no producer wrote: the queue cannot
    /// go on).
    Decoded try_take(Request& out) noexcept {
        const Decoded d = peek(out);
        if (d == Decoded::complete) ++next_;
        if (d == Decoded::skipped) skip();
        return d;
    }
    /// The request `ahead` after the next, without taking it (the proxy looks
    /// before it knows there is room to post it, and one further to know
    /// whether a chain ends). Ahead of the next, a slot may hold the last lap's
    /// descriptor (incomplete) while the producers have not come round.
    [[gnu::always_inline]] Decoded peek(Request& out, std::uint64_t ahead = 0) const noexcept {
        const std::uint64_t at = next_ + ahead;
        std::uint64_t* slot = q_.slots[at & (q_.capacity() - 1)].word;
        // Written out, as decode's test (a rolled loop of atomic loads cost 40 instructions).
        std::uint64_t words[descriptor_words] = {detail::load_relaxed(slot + 0), detail::load_relaxed(slot + 1),
                                                 detail::load_relaxed(slot + 2), detail::load_relaxed(slot + 3),
                                                 detail::load_relaxed(slot + 4), detail::load_relaxed(slot + 5),
                                                 detail::load_relaxed(slot + 6), detail::load_relaxed(slot + 7)};
        const Decoded d = decode(words, at, q_.log2_capacity, out);
        if (d == Decoded::complete) std::atomic_thread_fence(std::memory_order_acquire);
        // Not written: written later, or never (its producer gave up and marked it). A mark counts
        // only once the position's slot is free (below credit + capacity): before that, the slot still
        // holds the lap before, whose request may be in flight.
        if (d == Decoded::incomplete && at < credit_ + q_.capacity() && detail::load_relaxed(q_.cancel_of(at)) != 0)
            return Decoded::skipped;
        return d;
    }
    /// The queue it reads (the proxy's hot path reads a run of puts' words
    /// itself, with decode_put, then takes them with advance(n)).
    [[nodiscard]] const QueueView& view() const noexcept { return q_; }
    /// Takes the request peek() returned complete (or `n` of them, each complete).
    void advance(std::uint64_t n = 1) noexcept { next_ += n; }
    /// Takes the position peek() returned skipped (its mark is cleared for the position that shares it).
    void skip() noexcept {
        detail::store_relaxed(q_.cancel_of(next_), std::uint8_t{0});
        ++next_;
    }
    /// Positions taken so far.
    [[nodiscard]] std::uint64_t taken() const noexcept { return next_; }
    /// Every request below `position` completed: their slots go back to the producers.
    void complete(std::uint64_t position) noexcept {
        credit_ = position;
        std::atomic_ref<std::uint64_t>(q_.proxy->credit).store(position, std::memory_order_release);
    }
    /// Tells every producer's wait that the queue ends (QueueError).
    void fail(QueueError e) noexcept { // NOLINT(readability-make-member-function-const): writes the queue
        std::atomic_ref<std::uint32_t>(q_.proxy->error).store(static_cast<std::uint32_t>(e), std::memory_order_release);
        if (q_.producer != nullptr) {
            std::atomic_ref<std::uint32_t>(q_.producer->error)
                .store(static_cast<std::uint32_t>(e), std::memory_order_release);
        } else if (q_.producer_error != nullptr) {
            q_.producer_error->write(*q_.producer_error, static_cast<std::uint32_t>(e));
        }
    }

private:
    QueueView q_;
    std::uint64_t next_ = 0;
    std::uint64_t credit_ = 0; ///< what complete() returned last
};
#endif

} // namespace gpuverbs::device_queue
