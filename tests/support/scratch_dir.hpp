// A fresh temporary directory for one test, removed when it goes out of scope.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

namespace gpuverbs::test {

struct ScratchDir {
    std::filesystem::path path;

    /// `prefix` names what it is for, e.g. "sysfs"; each one gets its own directory.
    explicit ScratchDir(const std::string& prefix = "scratch") {
        static std::atomic<int> serial{0};
        path = std::filesystem::temp_directory_path() /
               ("gpuverbs-" + prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(serial++));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }

    /// Creates `relative` (and its directories) holding `text`.
    void write(const std::string& relative, const std::string& text) const {
        std::filesystem::create_directories((path / relative).parent_path());
        std::ofstream(path / relative) << text;
    }
};

} // namespace gpuverbs::test
