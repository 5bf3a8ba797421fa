// A peer process for the two-process and many-peers tests: an example binary
// of this build (or a launcher), started with posix_spawn, killed (SIGKILL)
// if still running at the end; its output may go to a file, or its stdin and
// stdout may be pipes the test talks through line by line.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
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
    struct Output {
        std::string file; ///< stdout and stderr go to this file
    };
    struct Pipes {}; ///< stdin and stdout are pipes: write_line(), read_line()

    explicit ChildProcess(std::vector<std::string> args) { spawn(args, nullptr); }
    ChildProcess(std::vector<std::string> args, const Output& output) {
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, output.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        spawn(args, &actions);
        posix_spawn_file_actions_destroy(&actions);
    }
    ChildProcess(std::vector<std::string> args, Pipes /*pipes*/) {
        int to_child[2];
        int from_child[2];
        // A child that died must fail the test with its message, not kill it with SIGPIPE.
        ::signal(SIGPIPE, SIG_IGN);
        REQUIRE(pipe2(to_child, O_CLOEXEC) == 0);
        REQUIRE(pipe2(from_child, O_CLOEXEC) == 0);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
        posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
        spawn(args, &actions);
        posix_spawn_file_actions_destroy(&actions);
        ::close(to_child[0]);
        ::close(from_child[1]);
        stdin_ = to_child[1];
        stdout_ = from_child[0];
    }
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    ~ChildProcess() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            (void)wait();
        }
        if (stdin_ >= 0) ::close(stdin_);
        if (stdout_ >= 0) ::close(stdout_);
    }
    void kill() const {
        if (pid_ > 0) ::kill(pid_, SIGKILL);
    }
    /// Sends one line to the child's stdin (Pipes).
    void write_line(const std::string& line) const {
        std::string text = line + "\n";
        REQUIRE(::write(stdin_, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    }
    /// The child's next stdout line (Pipes), or nothing by the deadline or at its end.
    std::optional<std::string> read_line(std::chrono::steady_clock::time_point deadline) {
        for (;;) {
            if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
                std::string line = buffered_.substr(0, nl);
                buffered_.erase(0, nl + 1);
                return line;
            }
            auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) return std::nullopt;
            pollfd in{stdout_, POLLIN, 0};
            if (::poll(&in, 1, static_cast<int>(left.count())) != 1) return std::nullopt;
            char chunk[512];
            ssize_t n = ::read(stdout_, chunk, sizeof chunk);
            if (n <= 0) return std::nullopt;
            buffered_.append(chunk, static_cast<std::size_t>(n));
        }
    }
    /// Reads lines until one starts with `prefix` (returned), skipping others
    /// into `skipped`; nothing by the deadline.
    std::optional<std::string> read_until(const std::string& prefix, std::chrono::steady_clock::time_point deadline,
                                          std::string* skipped = nullptr) {
        while (auto line = read_line(deadline)) {
            if (line->rfind(prefix, 0) == 0) return line;
            if (skipped != nullptr) *skipped += *line + "\n";
        }
        return std::nullopt;
    }
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
    void spawn(std::vector<std::string>& args, const posix_spawn_file_actions_t* actions) {
        std::vector<char*> argv;
        argv.reserve(args.size() + 1);
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        REQUIRE_MESSAGE(posix_spawnp(&pid_, argv[0], actions, nullptr, argv.data(), environ) == 0, argv[0]);
    }

    int stdin_ = -1;
    int stdout_ = -1;
    std::string buffered_;

private:
    pid_t pid_ = 0;
};

} // namespace gpuverbs::test
