// Checks gpuverbs' Prometheus text with a real parser: the Prometheus Python
// client's (Debian's python3-prometheus-client, run by /usr/bin/python3,
// which scripts/install-deps installs). Returns each sample's value by
// "name{sorted labels}", or an error in words.
#pragma once

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

namespace gpuverbs::test {

struct ParsedMetrics {
    std::map<std::string, double> samples;
    std::string error; ///< empty when the text parsed
};

inline ParsedMetrics parse_prometheus(const std::string& text) {
    ParsedMetrics out;
    char path[] = "/tmp/gpuverbs-metrics-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) {
        out.error = "mkstemp failed";
        return out;
    }
    ::close(fd);
    std::ofstream(path) << text;
    const std::string command =
        std::string("/usr/bin/python3 ") + GPUVERBS_TEST_SUPPORT_DIR + "/parse_prometheus.py " + path + " 2>&1";
    // NOLINTNEXTLINE(cert-env33-c): our own script, a fixed command line
    FILE* p = ::popen(command.c_str(), "r");
    std::string lines;
    if (p != nullptr) {
        char buffer[4096];
        while (std::fgets(buffer, sizeof buffer, p) != nullptr) lines += buffer;
    }
    const int rc = p != nullptr ? ::pclose(p) : -1;
    std::remove(path);
    if (rc != 0) {
        out.error = lines.empty() ? "the parser did not run (is python3-prometheus-client installed?)" : lines;
        return out;
    }
    std::size_t at = 0;
    while (at < lines.size()) {
        const std::size_t end = lines.find('\n', at);
        const std::string line = lines.substr(at, end - at);
        at = end == std::string::npos ? lines.size() : end + 1;
        const std::size_t space = line.rfind(' ');
        if (space == std::string::npos) continue;
        out.samples[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
    }
    return out;
}

} // namespace gpuverbs::test
