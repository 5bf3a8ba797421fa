// What a connection asks for and agrees on: pure rules, unit-tested with
// injected device limits and peer requests beside the rig's real connections.
#include "cm_state.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <algorithm>

namespace gpuverbs {

CmPrivateDataLimits detail::cm_private_data_limits(bool iwarp) noexcept {
    // InfiniBand CM messages carry 92 (REQ), 196 (REP) and 148 (REJ) bytes of
    // private data; rdma_cm keeps 36 of the request's for its own header.
    // iWARP's MPA carries 512 bytes in each direction.
    if (iwarp) return {512, 512, 512};
    return {56, 196, 148};
}

std::string detail::cm_reject_reason(int reason) {
    // The InfiniBand CM's REJ reasons (IBA 12.6.7.2), which RoCE's CM uses too.
    switch (reason) {
        case 1: return "no QP available";
        case 3: return "no resources";
        case 4: return "timeout";
        case 5: return "unsupported request";
        case 6: return "invalid communication id";
        case 7: return "invalid communication instance";
        case 8: return "invalid service id";
        case 9: return "invalid transport type";
        case 10: return "stale connection";
        case 12: return "invalid GID";
        case 13: return "invalid LID";
        case 14: return "invalid service level";
        case 15: return "invalid traffic class";
        case 16: return "invalid hop limit";
        case 17: return "invalid packet rate";
        case 24: return "port redirect";
        case 26: return "invalid MTU";
        case 27: return "insufficient responder resources";
        case 28: return "consumer defined";
        case 29: return "invalid RNR retry count";
        case 30: return "duplicate local communication id";
        case 31: return "invalid class version";
        case 32: return "invalid flow label";
        case 33: return "invalid alternate flow label";
        default: return "reason " + std::to_string(reason);
    }
}

CmParameters detail::cm_negotiate(const CmOptions& ours, const CmDeviceLimits& device, const CmParameters* peer) {
    CmParameters agreed;
    // We answer at most as many reads as the peer will issue, and issue at most as
    // many as it will answer; neither side beyond its device.
    agreed.responder_resources = std::min(ours.responder_resources, device.max_responder_resources);
    agreed.initiator_depth = std::min(ours.initiator_depth, device.max_initiator_depth);
    if (peer != nullptr) {
        agreed.responder_resources = std::min(agreed.responder_resources, peer->initiator_depth);
        agreed.initiator_depth = std::min(agreed.initiator_depth, peer->responder_resources);
    }
    agreed.retry_count = ours.retry_count;
    agreed.rnr_retry_count = ours.rnr_retry_count;
    agreed.min_rnr_timer = ours.min_rnr_timer;
    agreed.flow_control = ours.flow_control;
    return agreed;
}

bool detail::cm_check_request(std::string_view step, const CmOptions& options, std::size_t private_data,
                              const CmPrivateDataLimits& limits, Status& status) {
    const std::string verb = "rdma_" + std::string(step);
    auto refuse = [&](const std::string& what) {
        status.fail(errc::invalid_argument, verb, what + "; nothing was sent");
        return false;
    };
    if (options.retry_count > 7) {
        return refuse("retry_count " + std::to_string(options.retry_count) + " is out of range (0-7)");
    }
    if (options.rnr_retry_count > 7) {
        return refuse("rnr_retry_count " + std::to_string(options.rnr_retry_count) +
                      " is out of range (0-6 retries, 7 = retry forever)");
    }
    if (options.min_rnr_timer > 31) {
        return refuse("min_rnr_timer " + std::to_string(options.min_rnr_timer) +
                      " is out of range (0-31, the InfiniBand encoding: 12 = 0.64 ms)");
    }
    const std::size_t limit = step == "connect" ? limits.connect : step == "accept" ? limits.accept : limits.reject;
    if (private_data > limit) {
        const char* message = step == "connect"  ? "a connection request"
                              : step == "accept" ? "an accept"
                                                 : "a rejection";
        return refuse("private data of " + std::to_string(private_data) + " bytes does not fit " + message +
                      ": this transport carries at most " + std::to_string(limit) + " bytes in one");
    }
    return true;
}

} // namespace gpuverbs

#endif // GPUVERBS_HAVE_RDMACM
