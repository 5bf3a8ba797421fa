// Planning a block-list transfer: two lists of blocks that describe the
// same bytes, checked and cut into the work requests to post. No Asio here:
// a program that only plans (or a test of the planner) compiles without the
// asynchronous engine (transfer.hpp adds it).
//
//   auto plan = gpuverbs::TransferPlan(gpuverbs::TransferDirection::write, mine, theirs, qp.capabilities());
//
// The two lists describe the same bytes in order, cut differently: any
// lengths on either side. TransferPlan checks them (no zero-length block,
// every block inside its region, equal totals, no two blocks writing the same
// bytes), coalesces neighbours (contiguous blocks of one region become one
// request) and cuts the result into work requests that respect the queue
// pair's scatter/gather limit and the message size. Errors name the block.
#pragma once

#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include "gpuverbs/detail/transfers/plan_array.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

namespace gpuverbs {

enum class TransferDirection : std::uint8_t {
    write, ///< local blocks → remote blocks (RDMA write)
    read,  ///< remote blocks → local blocks (RDMA read)
};

/// What bounds one work request of a transfer.
struct TransferLimits {
    /// Local pieces one request may gather or scatter (the QP's max_send_sge).
    std::uint32_t max_sge = 1;
    /// The largest message (RoCE and InfiniBand allow 2^31 bytes).
    std::uint64_t max_message = std::uint64_t{1} << 31;
};

class TransferPlan;
namespace detail {
/// How a plan is made: the one-pass planner for paired lists where it
/// applies (the default), or always the general walk (tests compare the two).
enum class Planner : std::uint8_t { best, general };
TransferPlan make_transfer_plan(TransferDirection direction, std::span<const LocalBuffer> local,
                                std::span<const RemoteBlock> remote, const TransferLimits& limits, Status& status,
                                Planner planner = Planner::best);

/// One layer half of a KvPool::plan: where block 0 lies on each side.
struct StridedSegment {
    std::uint64_t local_base = 0; ///< the local address of block 0
    std::uint32_t lkey = 0;
    std::uint64_t region_begin = 0; ///< the local region
    std::uint64_t region_end = 0;
    RemoteMemory remote;           ///< the peer's tensor
    std::uint64_t remote_base = 0; ///< block 0's offset in it
};
/// Pairs by stride, without lists: for each segment in order, pair i moves
/// `length` bytes between local_base + local_ids[i] x local_stride and
/// remote_base + remote_ids[i] x remote_stride. The caller has checked the
/// ids (inside their pools, no id twice on the destination side).
struct StridedPairs {
    std::span<const StridedSegment> segments;
    std::span<const std::uint32_t> local_ids;
    std::span<const std::uint32_t> remote_ids;
    std::uint64_t local_stride = 0;
    std::uint64_t remote_stride = 0;
    std::uint32_t length = 0;
};
/// The one-pass planner over `pairs`; `general` (and an empty plan) when a
/// pair needs the general walk (e.g. a block longer than a message): plan
/// from lists then, which names the problem.
TransferPlan make_strided_plan(TransferDirection direction, const StridedPairs& pairs, const TransferLimits& limits,
                               bool& general);
} // namespace detail

/// A checked, coalesced, chunked transfer: the work requests to post.
class TransferPlan {
public:
    /// One work request: a contiguous remote range and its local pieces.
    struct Request {
        RemoteMemory remote;           ///< the exact remote range (address, length, rkey)
        std::uint32_t first_piece = 0; ///< into pieces()
        std::uint32_t piece_count = 0;
        std::uint32_t first_local = 0;  ///< the local block where it starts (for messages)
        std::uint32_t first_remote = 0; ///< the remote block where it starts
        std::uint32_t last_remote = 0;  ///< the remote block where it ends
    };

    /// An empty plan (nothing to move).
    TransferPlan() = default;
    /// Checks and plans; throws gpuverbs::Error (errc::invalid_argument) naming the block.
    TransferPlan(TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
                 const TransferLimits& limits = {});
    /// … limits from a queue pair's capabilities (max_send_sge).
    TransferPlan(TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
                 const QueuePairCapabilities& caps)
        : TransferPlan(direction, local, remote, TransferLimits{caps.max_send_sge}) {}
    /// The error_code form: an empty plan on failure.
    static TransferPlan create(TransferDirection direction, std::span<const LocalBuffer> local,
                               std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec);
    /// … with the words the exception would carry kept in `diagnostics`.
    static TransferPlan create(TransferDirection direction, std::span<const LocalBuffer> local,
                               std::span<const RemoteBlock> remote, const TransferLimits& limits, std::error_code& ec,
                               Diagnostics& diagnostics);

    /// 0.1's names for the forms above, kept for one release.
    [[deprecated("use the TransferPlan constructor (it throws the same error)")]] static TransferPlan make(
        TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
        const TransferLimits& limits = {}) {
        return {direction, local, remote, limits};
    }
    [[deprecated("use the TransferPlan constructor (it throws the same error)")]] static TransferPlan make(
        TransferDirection direction, std::span<const LocalBuffer> local, std::span<const RemoteBlock> remote,
        const QueuePairCapabilities& caps) {
        return {direction, local, remote, caps};
    }
    [[deprecated("use TransferPlan::create")]] static TransferPlan make(TransferDirection direction,
                                                                        std::span<const LocalBuffer> local,
                                                                        std::span<const RemoteBlock> remote,
                                                                        const TransferLimits& limits,
                                                                        std::error_code& ec, Diagnostics& diagnostics) {
        return create(direction, local, remote, limits, ec, diagnostics);
    }

    [[nodiscard]] TransferDirection direction() const noexcept { return direction_; }
    [[nodiscard]] std::span<const Request> requests() const noexcept { return requests_.span(); }
    [[nodiscard]] std::span<const LocalBuffer> pieces() const noexcept { return pieces_.span(); }
    /// The pieces as the device reads them (one ibv_sge each, the plan's keys).
    [[nodiscard]] std::span<const ibv_sge> native_pieces() const noexcept { return sges_.span(); }
    [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
    [[nodiscard]] std::size_t local_blocks() const noexcept { return local_blocks_; }
    [[nodiscard]] std::size_t remote_blocks() const noexcept { return remote_blocks_; }
    /// The work request for request `i` (refers to this plan: keep it alive until posted).
    [[nodiscard]] WorkRequest work_request(std::size_t i) const noexcept;
    /// "remote block 17" or "remote blocks 17 to 19 (local block 4 onwards)", for request `i`.
    [[nodiscard]] std::string blocks_of(std::size_t i) const;

private:
    friend TransferPlan detail::make_transfer_plan(TransferDirection, std::span<const LocalBuffer>,
                                                   std::span<const RemoteBlock>, const TransferLimits&, detail::Status&,
                                                   detail::Planner);
    friend TransferPlan detail::make_strided_plan(TransferDirection, const detail::StridedPairs&, const TransferLimits&,
                                                  bool&);
    TransferDirection direction_ = TransferDirection::write;
    detail::PlanArray<Request> requests_;
    detail::PlanArray<LocalBuffer> pieces_;
    detail::PlanArray<ibv_sge> sges_;
    std::uint64_t bytes_ = 0;
    std::size_t local_blocks_ = 0;
    std::size_t remote_blocks_ = 0;
};

} // namespace gpuverbs
