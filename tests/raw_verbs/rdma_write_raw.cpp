// The program examples/02_rdma_write.cpp is, written with raw ibverbs and
// POSIX sockets: the same command line, the same protocol (one RDMA write
// stream, then a zero-byte write with immediate), the same checks. It exists
// to measure what gpuverbs saves (docs/raw-verbs-comparison.md) and as the
// raw-verbs baseline for benchmarks. Every call is checked, as correct raw
// verbs code must; the rig runs it like the example.
//
// A single-threaded program, as raw verbs examples are: strerror and exit are
// what such code uses.
// NOLINTBEGIN(concurrency-mt-unsafe)
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Args {
    bool server = true;
    std::string host, device;
    int port = 18515;
    std::size_t size = 8 << 20;
    unsigned iterations = 8;
};

// What each side sends the other, in network byte order.
struct Wire {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t mtu, pad;
    uint8_t gid[16];
    uint64_t addr;
    uint32_t rkey;
    uint64_t length;
} __attribute__((packed));

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "%s failed: %s\n", what, std::strerror(errno));
    std::exit(1);
}

std::byte pattern(std::size_t i) {
    return std::byte(i % 251);
}

uint64_t htonll(uint64_t v) {
    return (uint64_t(htonl(uint32_t(v))) << 32) | htonl(uint32_t(v >> 32));
}
uint64_t ntohll(uint64_t v) {
    return htonll(v);
}

bool full_io(int fd, void* buf, std::size_t n, bool write_it) {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
        ssize_t r = write_it ? ::write(fd, p, n) : ::read(fd, p, n);
        if (r <= 0) return false;
        p += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

int tcp_exchange(const Args& a, const Wire& ours, Wire& theirs) {
    int fd = -1;
    if (a.server) {
        int listener = ::socket(AF_INET, SOCK_STREAM, 0);
        if (listener < 0) die("socket");
        int one = 1;
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(a.port));
        if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("bind");
        if (::listen(listener, 1) != 0) die("listen");
        fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) die("accept");
        ::close(listener);
    } else {
        addrinfo hints{}, *res = nullptr;
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &res) != 0 || res == nullptr) {
            std::fprintf(stderr, "cannot resolve %s\n", a.host.c_str());
            std::exit(1);
        }
        for (int attempt = 0; attempt < 500; ++attempt) { // the server may not listen yet
            fd = ::socket(AF_INET, SOCK_STREAM, 0);
            if (fd < 0) die("socket");
            if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
            ::close(fd);
            fd = -1;
            usleep(20000);
        }
        freeaddrinfo(res);
        if (fd < 0) die("connect");
    }
    if (!full_io(fd, const_cast<Wire*>(&ours), sizeof ours, true) || !full_io(fd, &theirs, sizeof theirs, false)) {
        std::fprintf(stderr, "the peer closed the connection during the exchange\n");
        std::exit(1);
    }
    return fd;
}

ibv_wc wait_one(ibv_cq* cq) {
    ibv_wc wc{};
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
    }
    if (n < 0) die("ibv_poll_cq");
    if (wc.status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "work request failed: %s\n", ibv_wc_status_str(wc.status));
        std::exit(1);
    }
    return wc;
}

int run(const Args& a) {
    // Devices: find the one asked for (or the first).
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    if (list == nullptr || count == 0) {
        std::fprintf(stderr, "no RDMA devices\n");
        return 1;
    }
    ibv_device* chosen = nullptr;
    for (int i = 0; i < count; ++i) {
        if (a.device.empty() || a.device == ibv_get_device_name(list[i])) {
            chosen = list[i];
            break;
        }
    }
    if (chosen == nullptr) {
        std::fprintf(stderr, "no RDMA device named %s\n", a.device.c_str());
        return 1;
    }
    ibv_context* ctx = ibv_open_device(chosen);
    if (ctx == nullptr) die("ibv_open_device");
    ibv_free_device_list(list);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    if (pd == nullptr) die("ibv_alloc_pd");
    ibv_cq* cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    if (cq == nullptr) die("ibv_create_cq");
    std::vector<std::byte> buffer(a.size);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    ibv_mr* mr = ibv_reg_mr(pd, buffer.data(), buffer.size(), access);
    if (mr == nullptr) die("ibv_reg_mr");

    // The QP, and the port's attributes and a RoCE v2 IPv4 GID to address it.
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &init);
    if (qp == nullptr) die("ibv_create_qp");
    ibv_port_attr port{};
    if (ibv_query_port(ctx, 1, &port) != 0) die("ibv_query_port");
    int gid_index = -1;
    ibv_gid gid{};
    for (int i = 0; i < port.gid_tbl_len && gid_index < 0; ++i) {
        ibv_gid_entry entry{};
        if (ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(i), &entry, 0) != 0) continue;
        const uint8_t* g = entry.gid.raw;
        bool v4 = std::all_of(g, g + 10, [](uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
        if (entry.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
            gid_index = i;
            gid = entry.gid;
        }
    }
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET && gid_index < 0) {
        std::fprintf(stderr, "no RoCE v2 IPv4 GID on port 1\n");
        return 1;
    }
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        die("ibv_modify_qp(INIT)");
    }

    // Exchange QP number, PSN, LID, GID, MTU and the buffer's address and key.
    std::mt19937 rng{std::random_device{}()};
    uint32_t psn = rng() & 0xffffff;
    Wire ours{}, theirs{};
    ours.qpn = htonl(qp->qp_num);
    ours.psn = htonl(psn);
    ours.lid = htons(port.lid);
    ours.mtu = port.active_mtu;
    std::memcpy(ours.gid, gid.raw, 16);
    ours.addr = htonll(reinterpret_cast<uintptr_t>(buffer.data()));
    ours.rkey = htonl(mr->rkey);
    ours.length = htonll(buffer.size());
    int fd = tcp_exchange(a, ours, theirs);

    // INIT -> RTR -> RTS.
    attr = {};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(port.active_mtu, theirs.mtu));
    attr.dest_qp_num = ntohl(theirs.qpn);
    attr.rq_psn = ntohl(theirs.psn);
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.port_num = 1;
    attr.ah_attr.dlid = ntohs(theirs.lid);
    if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
        attr.ah_attr.is_global = 1;
        std::memcpy(attr.ah_attr.grh.dgid.raw, theirs.gid, 16);
        attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
        attr.ah_attr.grh.hop_limit = 64;
    }
    if (ibv_modify_qp(qp, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
        die("ibv_modify_qp(RTR)");
    }
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = psn;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &attr,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        die("ibv_modify_qp(RTS)");
    }
    std::printf("%s: %s QP 0x%x connected to QP 0x%x\n", a.server ? "server" : "client",
                ibv_get_device_name(ctx->device), qp->qp_num, ntohl(theirs.qpn));

    int rc = 0;
    if (a.server) {
        ibv_sge sge{reinterpret_cast<uintptr_t>(buffer.data()), 0, mr->lkey};
        ibv_recv_wr wr{}, *bad = nullptr;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (ibv_post_recv(qp, &wr, &bad) != 0) die("ibv_post_recv");
        ibv_wc wc = wait_one(cq);
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < buffer.size(); ++i) mismatches += buffer[i] != pattern(i) ? 1 : 0;
        std::printf("server: %u writes of %zu bytes arrived; %s\n", ntohl(wc.imm_data), buffer.size(),
                    mismatches == 0 ? "every byte verified" : "MISMATCH");
        rc = mismatches == 0 ? 0 : 1;
    } else {
        if (ntohll(theirs.length) != buffer.size()) {
            std::fprintf(stderr, "client: the server's buffer size differs from ours\n");
            return 1;
        }
        for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = pattern(i);
        ibv_sge sge{reinterpret_cast<uintptr_t>(buffer.data()), static_cast<uint32_t>(buffer.size()), mr->lkey};
        ibv_send_wr wr{}, *bad = nullptr;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = ntohll(theirs.addr);
        wr.wr.rdma.rkey = ntohl(theirs.rkey);
        auto start = std::chrono::steady_clock::now();
        unsigned posted = 0, completed = 0;
        while (completed < a.iterations) {
            while (posted < a.iterations && posted - completed < 32) {
                if (ibv_post_send(qp, &wr, &bad) != 0) die("ibv_post_send");
                ++posted;
            }
            wait_one(cq);
            ++completed;
        }
        sge.length = 0;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(a.iterations);
        if (ibv_post_send(qp, &wr, &bad) != 0) die("ibv_post_send");
        wait_one(cq);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double mib = double(a.size) * a.iterations / (1 << 20);
        std::printf("client: wrote %.1f MiB in %.3f s (%.1f MiB/s) with RDMA write\n", mib, seconds, mib / seconds);
    }

    // Tear down in reverse order, checking each step.
    ::close(fd);
    if (ibv_destroy_qp(qp) != 0) die("ibv_destroy_qp");
    if (ibv_dereg_mr(mr) != 0) die("ibv_dereg_mr");
    if (ibv_destroy_cq(cq) != 0) die("ibv_destroy_cq");
    if (ibv_dealloc_pd(pd) != 0) die("ibv_dealloc_pd");
    if (ibv_close_device(ctx) != 0) die("ibv_close_device");
    return rc;
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || (args[0] != "server" && args[0] != "client") || (args[0] == "client" && args.size() < 2)) {
        std::fprintf(stderr, "usage: %s server|client HOST [--device D] [--port P] [--size B] [--iterations N]\n",
                     argv[0]);
        return 2;
    }
    a.server = args[0] == "server";
    std::size_t i = 1;
    if (!a.server) a.host = args[i++];
    for (; i + 1 < args.size(); i += 2) {
        const char* v = args[i + 1].c_str();
        if (args[i] == "--device")
            a.device = v;
        else if (args[i] == "--port")
            a.port = std::atoi(v);
        else if (args[i] == "--size")
            a.size = std::strtoull(v, nullptr, 10);
        else if (args[i] == "--iterations")
            a.iterations = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
    }
    return run(a);
}
// NOLINTEND(concurrency-mt-unsafe)
