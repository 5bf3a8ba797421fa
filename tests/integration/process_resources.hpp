// What this test process holds in the kernel's RDMA stack, for tests that
// check nothing is left behind or that a bound holds.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace gpuverbs::test {

/// Memory regions this process has registered, on any device (rdma resource
/// show mr): -1 without the tool (nothing is printed then, not a count).
inline int registered_regions() {
    const std::string command = "command -v rdma >/dev/null && rdma resource show mr pid " +
                                std::to_string(::getpid()) + " 2>/dev/null | wc -l";
    // NOLINTNEXTLINE(cert-env33-c,concurrency-mt-unsafe): a fixed command line, for a measurement
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return -1;
    int lines = -1;
    if (std::fscanf(pipe, "%d", &lines) != 1) lines = -1;
    ::pclose(pipe);
    return lines;
}

} // namespace gpuverbs::test
