#include "gpuverbs/verbs/completion.hpp"

#include <string>
#include <string_view>

namespace gpuverbs {

std::string_view to_string(Opcode op) noexcept {
    switch (op) {
        case Opcode::unknown: return "unknown";
        case Opcode::send: return "send";
        case Opcode::send_with_imm: return "send with immediate";
        case Opcode::write: return "RDMA write";
        case Opcode::write_with_imm: return "RDMA write with immediate";
        case Opcode::read: return "RDMA read";
        case Opcode::compare_swap: return "compare-and-swap";
        case Opcode::fetch_add: return "fetch-and-add";
        case Opcode::receive: return "receive";
        case Opcode::receive_with_imm: return "receive (write with immediate)";
    }
    return "unknown";
}

namespace {

class WcCategory final : public std::error_category {
public:
    const char* name() const noexcept override { return "work completion"; }

    /// rdma-core's name of the status, then what it means; said once where
    /// the meaning starts with the name ("remote access error: the peer …").
    std::string message(int value) const override {
        const std::string_view name = ibv_wc_status_str(static_cast<ibv_wc_status>(value));
        const std::string_view said = meaning(value);
        if (said.starts_with(name)) return std::string(said);
        return std::string(name) + ": " + std::string(said);
    }

private:
    static const char* meaning(int value) noexcept {
        switch (static_cast<ibv_wc_status>(value)) {
            case IBV_WC_SUCCESS: return "the operation completed";
            case IBV_WC_LOC_LEN_ERR:
                return "local length error: a received message is longer than the posted receive buffer, or a "
                       "request is longer than the port allows";
            case IBV_WC_LOC_QP_OP_ERR:
                return "local QP operation error: the request is inconsistent with the queue pair (e.g. inline "
                       "data too long, or an operation its type does not support); Soft-RoCE also reports a "
                       "received message longer than the posted receive buffer this way, and fails requests this "
                       "way at once when its port's link is down (DeviceEvents reports port_error)";
            case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
            case IBV_WC_LOC_PROT_ERR:
                return "local protection error: a local buffer is not inside a memory region of this protection "
                       "domain with the needed access (wrong lkey, or a receive into a region without local_write)";
            case IBV_WC_WR_FLUSH_ERR:
                return "flushed: the queue pair went into the error state (an earlier request failed, the peer "
                       "disconnected, or it was moved to error) before this request ran";
            case IBV_WC_MW_BIND_ERR: return "memory window bind error";
            case IBV_WC_BAD_RESP_ERR: return "bad response: the peer answered with an unexpected transport response";
            case IBV_WC_LOC_ACCESS_ERR:
                return "local access error: a protection error on a local buffer during an RDMA read or atomic "
                       "response";
            case IBV_WC_REM_INV_REQ_ERR:
                return "remote invalid request: the peer rejected the request (e.g. a message longer than its "
                       "receive buffer, a bad length, or an operation its queue pair does not grant: a gpuverbs "
                       "queue pair grants only the remote access of the regions it advertised, see "
                       "PreparedQueuePair::advertise and ConnectOptions::remote_access)";
            case IBV_WC_REM_ACCESS_ERR:
                return "remote access error: the peer refused the access (wrong rkey, an address outside the "
                       "remote region, or the region or the peer's queue pair lacks the remote access the "
                       "operation needs: a gpuverbs queue pair grants only what it advertised)";
            case IBV_WC_REM_OP_ERR:
                return "remote operation error: the peer could not complete the operation (e.g. its receive "
                       "queue or memory failed)";
            case IBV_WC_RETRY_EXC_ERR:
                return "transport retry counter exceeded: the peer is unreachable, no answer within "
                       "(retry_count + 1) x the ACK timeout of ConnectOptions (the peer is gone, its QP is not "
                       "ready, or the link or path is down)";
            case IBV_WC_RNR_RETRY_EXC_ERR:
                return "receiver-not-ready retries exceeded: the peer had no receive posted for our send";
            case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation";
            case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
            case IBV_WC_REM_ABORT_ERR: return "remote aborted the operation";
            case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
            case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
            case IBV_WC_FATAL_ERR: return "fatal error in the device";
            case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout";
            case IBV_WC_GENERAL_ERR: return "general error reported by the device";
            case IBV_WC_TM_ERR: return "tag matching error";
            case IBV_WC_TM_RNDV_INCOMPLETE: return "tag matching rendezvous incomplete";
        }
        return "unknown work completion status";
    }
};

} // namespace

const std::error_category& wc_category() noexcept {
    static const WcCategory category;
    return category;
}

} // namespace gpuverbs
