// Addresses for rdma_cm: IPv4, IPv6 and host names through rdma_getaddrinfo.
#include "cm_state.hpp"

#if GPUVERBS_HAVE_RDMACM

#include <netdb.h>

#include <cerrno>
#include <cstring>

namespace gpuverbs::detail {

bool cm_address(const std::string& node, std::uint16_t port, bool passive, sockaddr_storage& out, const char* verb,
                Status& status) {
    out = sockaddr_storage{};
    if (node.empty()) {
        status.fail(errc::invalid_argument, verb, "no address given (use \"0.0.0.0\" or \"::\" for every address)");
        return false;
    }
    rdma_addrinfo hints{};
    hints.ai_port_space = RDMA_PS_TCP;
    if (passive) hints.ai_flags = RAI_PASSIVE;
    rdma_addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    errno = 0;
    const int rc = rdma_getaddrinfo(node.c_str(), service.c_str(), &hints, &found);
    if (rc != 0 || found == nullptr) {
        // librdmacm returns -1 with errno, or a getaddrinfo code, depending on where it failed.
        std::string why = rc > 0 || rc < -1 ? gai_strerror(rc) : errno_text(last_errno(EINVAL));
        status.fail(errc::invalid_argument, verb,
                    "'" + node + "' is not an IP address or a host name this machine can resolve (" + why + ")");
        if (found != nullptr) rdma_freeaddrinfo(found);
        return false;
    }
    const sockaddr* a = passive ? found->ai_src_addr : found->ai_dst_addr;
    const socklen_t len = passive ? found->ai_src_len : found->ai_dst_len;
    if (a == nullptr || len == 0 || len > sizeof out) {
        rdma_freeaddrinfo(found);
        status.fail(errc::invalid_argument, verb, "rdma_getaddrinfo gave no address for '" + node + "'");
        return false;
    }
    std::memcpy(&out, a, len);
    rdma_freeaddrinfo(found);
    // The port, whatever rdma_getaddrinfo did with the service.
    if (out.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(out).sin_port = htons(port);
    if (out.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(out).sin6_port = htons(port);
    return true;
}

} // namespace gpuverbs::detail

#endif // GPUVERBS_HAVE_RDMACM
