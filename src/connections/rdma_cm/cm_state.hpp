// What a CmListener and a CmConnection hold: an rdma_cm id with its own event
// channel (CmIdCore), the connection's state (CmState) and its event reader
// (CmEventReader, the shared reader of src/events). Private to src/rdma_cm.
#pragma once

#include "gpuverbs/connections/rdma_cm.hpp"

#include "verbs/event_reader.hpp"

#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpuverbs::detail {

/// An rdma_cm id with its own event channel. Destroys, in order: the
/// connection (disconnect), the QP made on it, the id, the channel.
class CmIdCore {
public:
    CmIdCore(rdma_event_channel* channel, rdma_cm_id* id) noexcept : channel_(channel), id_(id) {}
    CmIdCore(const CmIdCore&) = delete;
    CmIdCore& operator=(const CmIdCore&) = delete;
    ~CmIdCore() {
        disconnect();
        if (id_->qp != nullptr) rdma_destroy_qp(id_);
        (void)rdma_destroy_id(id_);
        rdma_destroy_event_channel(channel_);
    }
    [[nodiscard]] rdma_cm_id* id() const noexcept { return id_; }
    [[nodiscard]] rdma_event_channel* channel() const noexcept { return channel_; }

    /// The connection is established: disconnect() has something to do.
    void mark_connected() noexcept { connected_.store(true); }
    [[nodiscard]] bool connected() const noexcept { return connected_.load(); }
    /// Once: moves the QP to the error state (its requests flush) and tells
    /// the peer (DREQ), or answers the peer's (DREP).
    void disconnect() noexcept {
        if (connected_.exchange(false)) (void)rdma_disconnect(id_);
    }

private:
    rdma_event_channel* channel_;
    rdma_cm_id* id_;
    std::atomic<bool> connected_{false};
};

/// The InfiniBand CM's reject reason for "the peer's program refused" (rdma_reject).
inline constexpr int cm_consumer_reject = 28;
/// The reject reason in words ("consumer defined", "invalid service ID", …).
std::string cm_reject_reason(int reason);

/// What the QpCore of a connection's queue pair keeps instead of the bare id:
/// when the queue pair goes, its QP is destroyed then — while its CQs are
/// still alive — whoever else still holds the id (the CmConnection, its
/// event reader).
struct CmQpOwner {
    std::shared_ptr<CmIdCore> id;
    explicit CmQpOwner(std::shared_ptr<CmIdCore> core) noexcept : id(std::move(core)) {}
    CmQpOwner(const CmQpOwner&) = delete;
    CmQpOwner& operator=(const CmQpOwner&) = delete;
    ~CmQpOwner() {
        if (!id) return;
        id->disconnect(); // the peer hears of it first, as when the id itself goes
        if (id->id()->qp != nullptr) rdma_destroy_qp(id->id());
    }
};

/// The typed form of an rdma_cm event after establishment (pure).
CmEvent translate_cm_event(int native_type, int status) noexcept;

/// An established connection's events, read from its channel. Holds the id
/// weakly: a pending async wait must not keep the queue pair alive after the
/// CmConnection is gone.
class CmEventReader final : public EventReader<CmEvent> {
public:
    explicit CmEventReader(const std::shared_ptr<CmIdCore>& id)
        : EventReader(id->channel()->fd, std::chrono::milliseconds(0), "an rdma_cm connection"), id_(id) {}
    std::optional<CmEvent> read(Status& status) override;

private:
    [[nodiscard]] bool exhausted() const noexcept override { return false; }
    std::weak_ptr<CmIdCore> id_;
};

/// A CmConnection's state, kept at one address so that references to its
/// queue pair survive moves of the connection.
class CmState {
public:
    CmState(std::shared_ptr<CmIdCore> core, bool is_incoming);
    CmState(const CmState&) = delete;
    CmState& operator=(const CmState&) = delete;
    ~CmState();

    std::shared_ptr<CmIdCore> id;
    Device device;
    bool incoming = false;
    bool established = false;
    CmParameters requested;           ///< the peer's request (server) or answer (client)
    std::vector<std::byte> peer_data; ///< the peer's private data
    QueuePair qp;
    bool qp_has_srq = false;
    Access advertised = Access::none; ///< CmConnection::advertise: what the peer is granted by default
    CmParameters agreed;
    std::optional<CmRejection> rejection;
    std::shared_ptr<CmEventReader> events;
};

// --- helpers shared by the listener and the connection ----------------------

using Clock = std::chrono::steady_clock;

/// errno after a failed librdmacm call, never 0 (which would read as success).
int last_errno(int fallback);
/// A new id on a new non-blocking channel; nullptr with `status` failed.
std::shared_ptr<CmIdCore> new_cm_id(Status& status);
rdma_event_channel* new_channel(Status& status);
/// Waits for the next event on `ch` until `deadline`; the caller acks it.
rdma_cm_event* next_event(rdma_event_channel* ch, Clock::time_point deadline, const std::string& waiting_for,
                          Status& status);
/// What a request or an answer carried (copied before the event is acked).
void copy_conn_param(const rdma_conn_param& param, CmParameters& into, std::vector<std::byte>& data);
/// `node` ("10.0.0.2", "fd00::2", "::", "0.0.0.0", a host name) and `port`
/// as a socket address, through rdma_getaddrinfo; `passive`: an address to
/// bind to. False with `status` failed (`verb` names the step).
bool cm_address(const std::string& node, std::uint16_t port, bool passive, sockaddr_storage& out, const char* verb,
                Status& status);
/// "10.0.0.1", "fd00::2" (empty for no address).
std::string address_text(const sockaddr* address);

} // namespace gpuverbs::detail
