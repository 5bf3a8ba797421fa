// One end of an rdma_cm connection for the tests: the connection, a PD, a CQ
// and 64 KiB of registered memory on the device the connection manager chose.
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
        : conn(std::move(c)), pd(conn.device()), cq(conn.device(), 256), mr(pd, memory, access_all) {}
    QueuePair& qp() { return conn.qp(); }
};

} // namespace gpuverbs::test

#endif
