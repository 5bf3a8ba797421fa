// Unreliable datagrams: a UdQueuePair sends messages of up to one MTU to any
// peer's UD queue pair, named by an AddressHandle, its QP number and its Q_Key.
// No connection; delivery is not guaranteed; receives must leave room for the
// 40-byte global routing header the device writes in front of each message.
//
//   gpuverbs::UdQueuePair ud(pd, cq, cq);                       // ready at once
//   gpuverbs::AddressHandle to_peer(pd, ud, peer_endpoint);     // from the peer's ud.endpoint()
//   ud.post_send(mr.slice(0, n), to_peer, peer_endpoint.qp_num, peer_qkey);
//   ud.post_receive(mr.slice(0, gpuverbs::UdQueuePair::grh_size + max_message));
//
// Both are made like every set-up object: the constructor throws
// gpuverbs::Error, and create(…, std::error_code&) returns an empty object
// with the code instead.
#pragma once

#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <memory>
#include <optional>
#include <system_error>

namespace gpuverbs {

class UdQueuePair;

/// Where a datagram goes: the path to a peer's port (ibv_ah). Move-only.
class AddressHandle {
public:
    AddressHandle() noexcept = default;
    /// A handle from `local`'s port and GID to the port of `remote` (a peer's
    /// UdQueuePair::endpoint()). Throws gpuverbs::Error: errc::invalid_endpoint
    /// when `remote` has no GID to route by, or the errno of ibv_create_ah.
    AddressHandle(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote);
    /// The error_code form: an empty AddressHandle on failure.
    static AddressHandle create(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote,
                                std::error_code& ec);
    AddressHandle(AddressHandle&&) noexcept = default;
    AddressHandle& operator=(AddressHandle&&) noexcept = default;
    AddressHandle(const AddressHandle&) = delete;
    AddressHandle& operator=(const AddressHandle&) = delete;
    ~AddressHandle() = default;

    explicit operator bool() const noexcept { return ah_ != nullptr; }
    [[nodiscard]] ibv_ah* native_handle() const noexcept { return ah_.get(); }

private:
    static AddressHandle create_impl(const ProtectionDomain& pd, const UdQueuePair& local, const Endpoint& remote,
                                     detail::Status& status);

    std::shared_ptr<detail::PdCore> pd_; // declared first: destroyed after the ah
    std::shared_ptr<ibv_ah> ah_;
};

/// An unreliable-datagram queue pair, ready to send and receive once made.
class UdQueuePair {
public:
    /// Bytes of global routing header in front of every received datagram.
    static constexpr std::size_t grh_size = 40;
    /// The well-known qkey of many examples. No longer the default: a qkey
    /// anyone can guess lets any host on the fabric send us datagrams.
    static constexpr std::uint32_t default_qkey = 0x11111111;

    UdQueuePair() noexcept = default;
    /// Creates a UD queue pair and brings it to RTS, accepting datagrams that
    /// carry `qkey` (default: 31 bits from the system's random source; peers
    /// learn it from qkey() with the endpoint). Throws gpuverbs::Error, as
    /// PreparedQueuePair does.
    UdQueuePair(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                const QueuePairOptions& options = {}, std::optional<std::uint32_t> qkey = std::nullopt);
    /// The error_code forms (a random qkey unless given): an empty UdQueuePair on failure.
    static UdQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                              const CompletionQueue& recv_cq, const QueuePairOptions& options, std::error_code& ec);
    static UdQueuePair create(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                              const CompletionQueue& recv_cq, const QueuePairOptions& options, std::uint32_t qkey,
                              std::error_code& ec);
    UdQueuePair(UdQueuePair&&) noexcept = default;
    UdQueuePair& operator=(UdQueuePair&&) noexcept = default;
    UdQueuePair(const UdQueuePair&) = delete;
    UdQueuePair& operator=(const UdQueuePair&) = delete;
    ~UdQueuePair() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    /// What peers need to address this QP (with qkey()).
    [[nodiscard]] const Endpoint& endpoint() const noexcept { return local_; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return local_.qp_num; }
    [[nodiscard]] std::uint32_t qkey() const noexcept { return qkey_; }
    [[nodiscard]] std::uint8_t port() const noexcept { return port_.port; }
    [[nodiscard]] std::uint32_t gid_index() const noexcept { return port_.gid_index; }
    [[nodiscard]] const QueuePairCapabilities& capabilities() const noexcept { return core_->caps(); }

    /// Sends one datagram (at most the port's MTU; errc::invalid_argument if longer).
    std::error_code post_send(const LocalBuffer& src, const AddressHandle& to, std::uint32_t remote_qp_num,
                              std::uint32_t remote_qkey, const SendOptions& options = {}) noexcept {
        return post_datagram(WorkRequest::send(src).options(options), to, remote_qp_num, remote_qkey);
    }
    std::error_code post_send_with_imm(const LocalBuffer& src, const AddressHandle& to, std::uint32_t remote_qp_num,
                                       std::uint32_t remote_qkey, std::uint32_t immediate,
                                       const SendOptions& options = {}) noexcept {
        return post_datagram(WorkRequest::send_with_imm(src, immediate).options(options), to, remote_qp_num,
                             remote_qkey);
    }
    /// A receive of grh_size + the largest datagram expected; the payload
    /// starts grh_size bytes in, and Completion::byte_length includes the header.
    std::error_code post_receive(const LocalBuffer& dst, std::uint64_t context = 0) noexcept {
        detail::ReceiveTarget target{};
        if (std::error_code ec = detail::receive_target(*core_, target)) return ec;
        return detail::post_receive(target, {&dst, 1}, context);
    }

    /// Names this object in DeviceEvent (unique for the process's life; 0 when empty).
    [[nodiscard]] std::uint64_t id() const noexcept { return core_ ? core_->id() : 0; }
    [[nodiscard]] ibv_qp* native_handle() const noexcept { return core_ ? core_->qp() : nullptr; }

private:
    static UdQueuePair create_impl(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                   const CompletionQueue& recv_cq, const QueuePairOptions& options, std::uint32_t qkey,
                                   detail::Status& status);

    std::error_code post_datagram(const WorkRequest& r, const AddressHandle& to, std::uint32_t remote_qp_num,
                                  std::uint32_t remote_qkey) noexcept {
        if (!to) return errc::invalid_argument;
        ibv_send_wr wr;
        std::array<ibv_sge, detail::max_sge_per_request> sges;
        if (auto ec = detail::lower(r, core_->caps(), wr, sges.data())) return ec;
        if (r.local()[0].length > mtu_bytes(port_.active_mtu)) return errc::invalid_argument;
        wr.wr.ud.ah = to.native_handle();
        wr.wr.ud.remote_qpn = remote_qp_num;
        wr.wr.ud.remote_qkey = remote_qkey;
        return detail::submit_send(*core_, wr, r.send_options().context, r.opcode());
    }

    std::shared_ptr<detail::QpCore> core_;
    detail::LocalPort port_;
    Endpoint local_;
    std::uint32_t qkey_ = 0;
};

} // namespace gpuverbs
