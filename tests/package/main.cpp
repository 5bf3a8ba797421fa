// Uses the installed headers and library; prints what the check looks for.
#include <gpuverbs/gpuverbs.hpp>

#include <chrono>
#include <cstdio>

int main() {
    std::error_code ec;
    auto devices = gpuverbs::Device::list(ec);
    std::printf("gpuverbs %s, %zu RDMA device(s), CUDA %s", gpuverbs::version_string, devices.size(),
                gpuverbs::built_with_cuda() ? "compiled in" : "not compiled in");
    // What the installed <gpuverbs/config.hpp> says the build has; with
    // librdmacm, the connector links (an address resolution that must fail).
#if GPUVERBS_HAVE_RDMACM
    std::error_code cm_ec;
    (void)gpuverbs::cm_resolve("256.0.0.1", 1, std::chrono::milliseconds(10), "", cm_ec);
    std::printf(", rdma_cm %s", cm_ec ? "linked" : "resolved an impossible address");
#else
    std::printf(", rdma_cm not in this build");
#endif
    std::printf(", PMIx %d, hiredis %d, MPI %d\n", GPUVERBS_HAVE_PMIX, GPUVERBS_HAVE_HIREDIS, GPUVERBS_HAVE_MPI);
    return ec ? 1 : 0;
}
