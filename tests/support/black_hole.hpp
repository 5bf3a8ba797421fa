// A listener on loopback that answers no SYN: backlog 0, never accepting, its
// accept queue filled at once. The kernel then drops every new SYN and a
// connect waits for the kernel's own retries (about two minutes): only the
// caller's deadline can end it. For the connect tests' attacks.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gpuverbs::test {

class BlackHole {
public:
    BlackHole() {
        hole_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in where{};
        where.sin_family = AF_INET;
        where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof where;
        if (hole_ < 0 || ::bind(hole_, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0 ||
            ::listen(hole_, 0) != 0 || ::getsockname(hole_, reinterpret_cast<sockaddr*>(&where), &length) != 0) {
            close_all();
            throw std::runtime_error("BlackHole: cannot listen on loopback");
        }
        port_ = ntohs(where.sin_port);
        for (int i = 0; i < 4; ++i) { // fill its accept queue: later SYNs are dropped
            const int f = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            (void)::connect(f, reinterpret_cast<sockaddr*>(&where), sizeof where);
            fillers_.push_back(f);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    BlackHole(const BlackHole&) = delete;
    BlackHole& operator=(const BlackHole&) = delete;
    ~BlackHole() { close_all(); }
    [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

private:
    void close_all() noexcept {
        for (int f : fillers_) ::close(f);
        fillers_.clear();
        if (hole_ >= 0) ::close(hole_);
        hole_ = -1;
    }
    int hole_ = -1;
    std::uint16_t port_ = 0;
    std::vector<int> fillers_;
};

} // namespace gpuverbs::test
