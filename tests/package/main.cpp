// Uses the installed headers and library; prints what the check looks for.
#include <gpuverbs/gpuverbs.hpp>

#include <cstdio>

int main() {
    std::error_code ec;
    auto devices = gpuverbs::Device::list(ec);
    std::printf("gpuverbs %s, %zu RDMA device(s), CUDA %s\n", gpuverbs::version_string, devices.size(),
                gpuverbs::built_with_cuda() ? "compiled in" : "not compiled in");
    return ec ? 1 : 0;
}
