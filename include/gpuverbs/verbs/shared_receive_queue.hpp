// SharedReceiveQueue: one pool of receives that many queue pairs draw from
// (ibv_srq), so a server with many peers need not post receives per peer.
//
//   gpuverbs::SharedReceiveQueue srq(pd, 1024);
//   gpuverbs::PreparedQueuePair prepared(pd, cq, cq, srq);
//   srq.post_receive(buffers.slice(i * size, size), i);
#pragma once

#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <memory>
#include <span>
#include <system_error>

namespace gpuverbs::detail {
struct access; // detail/access.hpp: how the library reaches an object's core
} // namespace gpuverbs::detail

namespace gpuverbs {

class SharedReceiveQueue {
public:
    SharedReceiveQueue() noexcept = default;
    /// An SRQ holding up to `max_wr` receives of up to `max_sge` entries each.
    SharedReceiveQueue(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge = 1);
    static SharedReceiveQueue create(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                     std::error_code& ec);

    SharedReceiveQueue(SharedReceiveQueue&&) noexcept = default;
    SharedReceiveQueue& operator=(SharedReceiveQueue&&) noexcept = default;
    SharedReceiveQueue(const SharedReceiveQueue&) = delete;
    SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;
    ~SharedReceiveQueue() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    [[nodiscard]] std::uint32_t capacity() const noexcept { return core_->receive.capacity(); }

    /// Posts a receive any attached QP may consume; the Completion carries `context`.
    std::error_code post_receive(const LocalBuffer& dst, std::uint64_t context = 0) noexcept {
        return post_receive(std::span<const LocalBuffer>(&dst, 1), context);
    }
    std::error_code post_receive(std::span<const LocalBuffer> dst, std::uint64_t context = 0) noexcept {
        return detail::post_receive(detail::receive_target(*core_), dst, context);
    }
    /// One receive per buffer, up to 32, with one doorbell (DataPath::post_receives).
    std::error_code post_receives(std::span<const LocalBuffer> buffers, std::uint64_t first_context = 0) noexcept {
        return detail::post_receives(detail::receive_target(*core_), buffers, first_context);
    }

    /// Names this object in DeviceEvent (unique for the process's life; 0 when empty).
    [[nodiscard]] std::uint64_t id() const noexcept { return core_ ? core_->id() : 0; }

    /// Arms the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): when fewer than
    /// `limit` receives remain posted, the device reports one
    /// DeviceEventType::srq_limit_reached naming this SRQ, so a receiver can
    /// refill before it runs dry. One-shot: arm again after refilling. 0
    /// disarms. Fails with errc::invalid_argument when `limit` is not below
    /// capacity(), and with the errno when the device refuses.
    void arm_limit(std::uint32_t limit);
    void arm_limit(std::uint32_t limit, std::error_code& ec);
    [[nodiscard]] ibv_srq* native_handle() const noexcept { return core_ ? core_->srq() : nullptr; }

private:
    friend struct detail::access;
    static SharedReceiveQueue create_impl(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                          detail::Status& status);
    void arm_limit_impl(std::uint32_t limit, detail::Status& status) const;
    std::shared_ptr<detail::SrqCore> core_;
};

} // namespace gpuverbs
