// The rig's fault injector (tests/softroce/setup-rxe, passed as
// $GPUVERBS_TEST_FAULTS inside the VM): link and wire faults, device removal,
// and the second wire of the multi-rail tests.
#pragma once

#include "rig.hpp"

#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <utility>

namespace gpuverbs::test {

/// Runs `setup-rxe WHAT`; its exit status (-1 when it did not exit).
inline int fault(const std::string& what) {
    const std::string command = env_or("GPUVERBS_TEST_FAULTS") + " " + what;
    // NOLINTNEXTLINE(cert-env33-c,concurrency-mt-unsafe): the rig's own script, fixed arguments
    const int rc = std::system(command.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline bool faults_available() {
    return !env_or("GPUVERBS_TEST_FAULTS").empty();
}

/// Heals a fault (or takes a topology down) when the test ends, however it ends.
class Heal {
public:
    explicit Heal(std::string what) : what_(std::move(what)) {}
    Heal(const Heal&) = delete;
    Heal& operator=(const Heal&) = delete;
    ~Heal() {
        if (!what_.empty()) (void)fault(what_);
    }
    int now() { return fault(std::exchange(what_, {})); }

private:
    std::string what_;
};

} // namespace gpuverbs::test
