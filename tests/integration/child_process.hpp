// A peer process for the two-process tests: an example binary of this build,
// started with posix_spawn, killed (SIGKILL) if still running at the end.
#pragma once

#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ; // NOLINT(readability-redundant-declaration): POSIX declares it nowhere else

namespace gpuverbs::test {

/// <build>/examples/NAME, next to this test binary's build directory.
inline std::string example_binary(const std::string& name) {
    auto self = std::filesystem::read_symlink("/proc/self/exe");
    return (self.parent_path().parent_path() / "examples" / name).string();
}

class ChildProcess {
public:
    explicit ChildProcess(std::vector<std::string> args) {
        std::vector<char*> argv;
        argv.reserve(args.size() + 1);
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        REQUIRE_MESSAGE(posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) == 0, argv[0]);
    }
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    ~ChildProcess() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            (void)wait();
        }
    }
    void kill() const { ::kill(pid_, SIGKILL); }
    /// waitpid with a deadline; the exit status (128 + signal when killed), or
    /// -1 if it had to be killed at the deadline.
    int wait(std::chrono::seconds limit = std::chrono::seconds(30)) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        int status = 0;
        while (waitpid(pid_, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
                pid_ = 0;
                return -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

private:
    pid_t pid_ = 0;
};

} // namespace gpuverbs::test
