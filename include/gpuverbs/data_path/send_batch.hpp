// SendBatch: send-side work requests gathered and posted with one doorbell
// (one ibv_post_send over a linked chain).
//
//   auto batch = qp.batch();
//   for (auto& block : blocks) batch.add(gpuverbs::WorkRequest::write(block.src, peer, block.offset).unsignaled());
//   batch.add(gpuverbs::WorkRequest::send(notice));       // the last one signaled
//   if (auto ec = batch.post()) ...
#pragma once

#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"

#include <array>
#include <cstddef>
#include <system_error>

namespace gpuverbs {

class QueuePair;

/// A guard over a batch of requests for one QueuePair: requests not posted
/// when it is destroyed are discarded, never half-posted. add() makes exactly
/// the checks QueuePair::post makes (one lowering) and leaves the batch
/// unchanged on error; post() checks the send queue has room for all of them,
/// else posts none. Lives on the stack: neither copyable nor movable (its
/// requests point into it). Thread safety: as QueuePair's posting.
class SendBatch {
public:
    static constexpr std::size_t max_requests = 32;
    static constexpr std::size_t max_sges = 64;

    explicit SendBatch(detail::QpCore& qp) noexcept : qp_(&qp) {}
    SendBatch(const SendBatch&) = delete;
    SendBatch& operator=(const SendBatch&) = delete;
    ~SendBatch() = default;

    /// Adds one request (errc::batch_full when it holds max_requests or
    /// max_sges entries; any check of the posting path otherwise).
    GPUVERBS_HOT std::error_code add(const WorkRequest& r) noexcept {
        if (count_ == max_requests || sges_used_ + r.local().size() > max_sges) return errc::batch_full;
        if (std::error_code ec = detail::lower(r, qp_->caps(), wrs_[count_], &sges_[sges_used_])) return ec;
        contexts_[count_] = r.send_options().context;
        opcodes_[count_] = r.opcode();
        sges_used_ += r.local().size();
        ++count_;
        return detail::no_error();
    }

    // Shorthands, as QueuePair's post_*.
    GPUVERBS_HOT std::error_code write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                                       const SendOptions& options = {}) noexcept {
        return add(WorkRequest::write(src, dst, dst_offset).options(options));
    }
    GPUVERBS_HOT std::error_code write(std::span<const LocalBuffer> src, const RemoteMemory& dst,
                                       std::uint64_t dst_offset = 0, const SendOptions& options = {}) noexcept {
        return add(WorkRequest::write(src, dst, dst_offset).options(options));
    }
    GPUVERBS_HOT std::error_code write_with_imm(const LocalBuffer& src, const RemoteMemory& dst,
                                                std::uint64_t dst_offset, std::uint32_t immediate,
                                                const SendOptions& options = {}) noexcept {
        return add(WorkRequest::write_with_imm(src, dst, dst_offset, immediate).options(options));
    }
    GPUVERBS_HOT std::error_code read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                                      const SendOptions& options = {}) noexcept {
        return add(WorkRequest::read(dst, src, src_offset).options(options));
    }
    GPUVERBS_HOT std::error_code send(const LocalBuffer& src, const SendOptions& options = {}) noexcept {
        return add(WorkRequest::send(src).options(options));
    }
    GPUVERBS_HOT std::error_code send_with_imm(const LocalBuffer& src, std::uint32_t immediate,
                                               const SendOptions& options = {}) noexcept {
        return add(WorkRequest::send_with_imm(src, immediate).options(options));
    }
    GPUVERBS_HOT std::error_code fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                                           std::uint64_t add_value, const SendOptions& options = {}) noexcept {
        return add(WorkRequest::fetch_add(result, target, offset, add_value).options(options));
    }
    GPUVERBS_HOT std::error_code compare_swap(const LocalBuffer& result, const RemoteMemory& target,
                                              std::uint64_t offset, std::uint64_t compare, std::uint64_t swap,
                                              const SendOptions& options = {}) noexcept {
        return add(WorkRequest::compare_swap(result, target, offset, compare, swap).options(options));
    }

    [[nodiscard]] std::size_t size() const noexcept { return count_; }
    [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
    /// Drops the requests gathered so far.
    void clear() noexcept {
        count_ = 0;
        sges_used_ = 0;
    }

    /// Posts every gathered request with one doorbell and empties the batch.
    /// On errc::send_queue_full nothing is posted and the batch is kept.
    GPUVERBS_HOT std::error_code post() noexcept {
        if (count_ == 0) return detail::no_error();
        detail::SubmitChain<ibv_send_wr> chain(*qp_);
        if (!chain.reserve(static_cast<std::uint32_t>(count_))) return errc::send_queue_full;
        chain.push_array(wrs_.data(), static_cast<std::uint32_t>(count_), contexts_.data(), opcodes_.data());
        const std::error_code ec = chain.submit(); // a chain taken in part is accounted for up to the refusal
        clear();
        return ec;
    }

private:
    detail::QpCore* qp_;
    std::size_t count_ = 0;
    std::size_t sges_used_ = 0;
    std::array<ibv_send_wr, max_requests> wrs_;
    std::array<ibv_sge, max_sges + detail::max_sge_per_request> sges_;
    std::array<std::uint64_t, max_requests> contexts_;
    std::array<Opcode, max_requests> opcodes_;
};

} // namespace gpuverbs
