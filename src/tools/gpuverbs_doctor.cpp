// gpuverbs-doctor: is this machine ready for GPUDirect RDMA, and if not, what
// to do. A thin command over gpuverbs::diagnose().
//
//   gpuverbs-doctor [--json] [--sys-root DIR] [--proc-root DIR] [--no-live] [--kernel-release R]
//
// Exit status: 0 when nothing is worse than unknown, 1 with warnings, 2 with
// failures, 64 for bad arguments.
#include <gpuverbs/doctor.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
    gpuverbs::DoctorOptions options;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "gpuverbs-doctor: %s needs a value\n", a.c_str());
                std::exit(64); // NOLINT(concurrency-mt-unsafe): single-threaded here
            }
            return argv[++i];
        };
        if (a == "--json") {
            json = true;
        } else if (a == "--sys-root") {
            options.sys_root = value();
        } else if (a == "--proc-root") {
            options.proc_root = value();
        } else if (a == "--no-live") {
            options.live = false;
        } else if (a == "--kernel-release") {
            options.kernel_release = value();
        } else if (a == "--help" || a == "-h") {
            std::printf(
                "usage: gpuverbs-doctor [--json] [--sys-root DIR] [--proc-root DIR] [--no-live] "
                "[--kernel-release R]\nChecks this machine for GPUDirect RDMA; see docs/doctor.md.\n");
            return 0;
        } else {
            std::fprintf(stderr, "gpuverbs-doctor: unknown argument '%s' (try --help)\n", a.c_str());
            return 64;
        }
    }
    gpuverbs::DoctorReport report = gpuverbs::diagnose(options);
    if (json) {
        std::fputs(gpuverbs::to_json(report).c_str(), stdout);
    } else {
        std::fputs(gpuverbs::format_report(report, ::isatty(STDOUT_FILENO) != 0).c_str(), stdout);
    }
    switch (report.worst()) {
        case gpuverbs::CheckStatus::fail: return 2;
        case gpuverbs::CheckStatus::warn: return 1;
        default: return 0;
    }
}
