// One end of an rdma_cm connection for the tests: the connection, a PD, a CQ
// and 64 KiB of registered memory on the device the connection manager chose,
// advertised: the connection grants the peer what that memory allows.
#pragma once

#include "gpuverbs/connections/rdma_cm.hpp"

#include <vector>

#if GPUVERBS_HAVE_RDMACM

namespace gpuverbs::test {

struct CmEnd {
    CmConnection conn;
    ProtectionDomain pd;
    CompletionQueue cq;
    std::vector<std::byte> memory = std::vector<std::byte>(1 << 16);
    MemoryRegion mr;

    explicit CmEnd(CmConnection c)
        : conn(std::move(c)), pd(conn.device()), cq(conn.device(), 256), mr(pd, memory, access_all) {
        (void)conn.advertise(mr); // the peer may read, write and run atomics on it (what mr allows)
    }
    QueuePair& qp() { return conn.qp(); }
};

} // namespace gpuverbs::test

#endif
