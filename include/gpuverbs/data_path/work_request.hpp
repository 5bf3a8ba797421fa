// WorkRequest: one send-side operation as a plain value — what to do, with
// which local buffers, to which remote memory, with which options. Every form
// of an operation carries this one value: QueuePair::post (and the post_*
// shorthands), SendBatch::add, QueuePair::async_post (and the async_*
// shorthands). One function lowers it to the verbs request and makes every
// local check (detail/data_path/posting_path.hpp), so the forms cannot drift apart.
//
//   qp.post(gpuverbs::WorkRequest::write(src, peer_memory, 4096).context(7).inline_data());
//   batch.add(gpuverbs::WorkRequest::send(header).unsignaled());
//   co_await qp.async_post(gpuverbs::WorkRequest::write(gather_list, peer_memory), asio::use_awaitable);
#pragma once

#include "gpuverbs/verbs/completion.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include "gpuverbs/detail/hot.hpp"

#include <cstdint>
#include <span>

namespace gpuverbs {

/// A buffer that is not in any memory region, for inline sends and writes
/// only (SendOptions::inline_data): the payload is copied when posted.
inline LocalBuffer unregistered(std::span<const std::byte> bytes) noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(bytes.data());
    return LocalBuffer{a, static_cast<std::uint32_t>(bytes.size()), 0, a, a + bytes.size()};
}

/// One send-side work request. Made by the named factories below and refined
/// with the option setters; a plain value (no allocation, nothing owned).
///
/// Lifetimes: a request made from one LocalBuffer holds a copy of it. A
/// request made from a list (scatter/gather) refers to the caller's list,
/// which must live until the request is posted (for async_post: until the
/// operation is initiated, which for deferred tokens is when it is awaited).
/// The memory itself must stay valid until the operation completes.
class WorkRequest {
public:
    // --- factories ----------------------------------------------------------

    /// RDMA write of `src` to `dst` at `dst_offset`.
    static WorkRequest write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0) noexcept {
        return {Opcode::write, src, &dst, dst_offset};
    }
    /// … gathering from several local buffers (the list is referred to, not copied).
    static WorkRequest write(std::span<const LocalBuffer> src, const RemoteMemory& dst,
                             std::uint64_t dst_offset = 0) noexcept {
        return {Opcode::write, src, &dst, dst_offset};
    }
    /// RDMA write that also consumes a receive at the peer, handing it `immediate`.
    static WorkRequest write_with_imm(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset,
                                      std::uint32_t immediate) noexcept {
        WorkRequest r{Opcode::write_with_imm, src, &dst, dst_offset};
        r.immediate_ = immediate;
        return r;
    }
    /// RDMA read of `src` at `src_offset` into `dst`.
    static WorkRequest read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0) noexcept {
        return {Opcode::read, dst, &src, src_offset};
    }
    /// … scattering into several local buffers.
    static WorkRequest read(std::span<const LocalBuffer> dst, const RemoteMemory& src,
                            std::uint64_t src_offset = 0) noexcept {
        return {Opcode::read, dst, &src, src_offset};
    }
    /// Send of `src`, consuming one receive at the peer.
    static WorkRequest send(const LocalBuffer& src) noexcept { return {Opcode::send, src, nullptr, 0}; }
    /// … gathering from several local buffers.
    static WorkRequest send(std::span<const LocalBuffer> src) noexcept { return {Opcode::send, src, nullptr, 0}; }
    /// Send that also hands the peer `immediate`.
    static WorkRequest send_with_imm(const LocalBuffer& src, std::uint32_t immediate) noexcept {
        WorkRequest r{Opcode::send_with_imm, src, nullptr, 0};
        r.immediate_ = immediate;
        return r;
    }
    /// Atomically adds `add` to the 8-byte word at `target`+`offset`; the old
    /// value lands in `result` (8 bytes, 8-byte aligned; byte order is the
    /// peer's host order on all common NICs).
    static WorkRequest fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                 std::uint64_t add) noexcept {
        WorkRequest r{Opcode::fetch_add, result, &target, offset};
        r.compare_add_ = add;
        return r;
    }
    /// Atomically replaces the word with `swap` if it equals `compare`; the old value lands in `result`.
    static WorkRequest compare_swap(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                    std::uint64_t compare, std::uint64_t swap) noexcept {
        WorkRequest r{Opcode::compare_swap, result, &target, offset};
        r.compare_add_ = compare;
        r.swap_ = swap;
        return r;
    }

    // --- options (each returns the request, so they chain) -----------------

    /// All options at once.
    WorkRequest& options(const SendOptions& o) noexcept {
        options_ = o;
        return *this;
    }
    /// Handed back in the Completion (the synchronous and batch forms).
    WorkRequest& context(std::uint64_t c) noexcept {
        options_.context = c;
        return *this;
    }
    /// No completion for this request: it is finished when a later signaled
    /// one completes (signal at least once per send-queue depth).
    WorkRequest& unsignaled() noexcept {
        options_.signaled = false;
        return *this;
    }
    /// Copy the payload into the request (up to the QP's max_inline_data).
    WorkRequest& inline_data() noexcept {
        options_.inline_data = true;
        return *this;
    }
    /// Wait for earlier reads and atomics to finish before this one starts.
    WorkRequest& fence() noexcept {
        options_.fence = true;
        return *this;
    }
    /// Wake the peer's solicited-only waiters (sends, writes with immediate).
    WorkRequest& solicited() noexcept {
        options_.solicited = true;
        return *this;
    }

    // --- what it says -------------------------------------------------------

    [[nodiscard]] Opcode opcode() const noexcept { return opcode_; }
    /// The local buffers: gathered from (writes, sends) or scattered into (reads, atomics' result).
    [[nodiscard]] std::span<const LocalBuffer> local() const noexcept {
        return list_ != nullptr ? std::span<const LocalBuffer>(list_, list_size_)
                                : std::span<const LocalBuffer>(&single_, 1);
    }
    /// The remote memory (writes, reads, atomics); empty for sends.
    [[nodiscard]] const RemoteMemory& remote() const noexcept { return remote_; }
    [[nodiscard]] std::uint64_t remote_offset() const noexcept { return remote_offset_; }
    [[nodiscard]] std::uint32_t immediate() const noexcept { return immediate_; }
    [[nodiscard]] std::uint64_t compare_add() const noexcept { return compare_add_; }
    [[nodiscard]] std::uint64_t swap_value() const noexcept { return swap_; }
    [[nodiscard]] const SendOptions& send_options() const noexcept { return options_; }

private:
    WorkRequest(Opcode op, const LocalBuffer& one, const RemoteMemory* remote, std::uint64_t offset) noexcept
        : opcode_(op), single_(one), remote_(remote != nullptr ? *remote : RemoteMemory{}), remote_offset_(offset) {}
    WorkRequest(Opcode op, std::span<const LocalBuffer> list, const RemoteMemory* remote, std::uint64_t offset) noexcept
        : opcode_(op),
          // An empty list must not read as "one buffer": a default span has no data pointer.
          list_(list.data() != nullptr ? list.data() : &no_buffer_),
          list_size_(list.size()),
          remote_(remote != nullptr ? *remote : RemoteMemory{}),
          remote_offset_(offset) {}

    Opcode opcode_;
    static constexpr LocalBuffer no_buffer_{};
    LocalBuffer single_{};
    const LocalBuffer* list_ = nullptr; ///< the caller's list; nullptr: single_ is the one buffer
    std::size_t list_size_ = 0;
    RemoteMemory remote_;
    std::uint64_t remote_offset_ = 0;
    std::uint64_t compare_add_ = 0;
    std::uint64_t swap_ = 0;
    std::uint32_t immediate_ = 0;
    SendOptions options_{};
};

} // namespace gpuverbs
