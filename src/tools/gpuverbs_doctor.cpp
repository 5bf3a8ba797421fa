// gpuverbs-doctor: is this machine ready for GPUDirect RDMA, and if not, what
// to do. A thin command over gpuverbs::diagnose().
//
//   gpuverbs-doctor [--json] [--sys-root DIR] [--proc-root DIR] [--no-live] [--kernel-release R]
//
// Exit status: 0 when nothing is worse than unknown, 1 with warnings, 2 with
// failures, 64 for bad arguments, 70 when the doctor itself fails (a bug, no memory).
#include "command_line.hpp"

#include <gpuverbs/gpu/doctor.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>

static int main_body(int argc, char** argv) {
    gpuverbs::DoctorOptions options;
    bool json = false;
    tools::CommandLine cli("gpuverbs-doctor", "Checks this machine for GPUDirect RDMA; see docs/doctor.md.", 64);
    cli.usage({{"[options]", "the readiness checklist, each answer explained, with what to do"}});
    cli.app.add_flag("--json", json, "the report as JSON, for programs (schema gpuverbs-doctor/1)");
    cli.app.add_option("--sys-root", options.sys_root, "read sysfs from DIR (a fixture tree)")->type_name("DIR");
    cli.app.add_option("--proc-root", options.proc_root, "read procfs from DIR (a fixture tree)")->type_name("DIR");
    cli.app.add_flag_callback(
        "--no-live", [&] { options.live = false; }, "skip libibverbs and libcuda: read only the trees");
    cli.app.add_option("--kernel-release", options.kernel_release, "use R instead of uname -r")->type_name("R");
    cli.app.footer(
        "Exit status: 0 when no check is worse than unknown, 1 when the worst is a warning,\n"
        "2 when something fails, 64 for bad arguments, 70 when the doctor itself fails.");
    if (auto status = cli.parse(argc, argv)) return *status;

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

int main(int argc, char** argv) {
    return tools::run_main("gpuverbs-doctor", 70, [&] { return main_body(argc, argv); });
}
