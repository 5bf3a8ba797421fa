// Context (binding.hpp): the event loop a Python program's operations complete
// on: an epoll set of completion channels and an eventfd to wake it.
#include "binding.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace gpuverbs::python {

Context::Context(bool polled)
    : polled_(polled), epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (epoll_ < 0 || wake_ < 0) {
        const int err = errno;
        const char* verb = epoll_ < 0 ? "epoll_create1" : "eventfd";
        if (wake_ >= 0) ::close(wake_);
        if (epoll_ >= 0) ::close(epoll_);
        throw Error({err, std::system_category()}, verb, "for the Python context");
    }
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wake_;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &event) != 0) {
        const int err = errno;
        ::close(wake_);
        ::close(epoll_);
        throw Error({err, std::system_category()}, "epoll_ctl", "for the Python context");
    }
}

Context::~Context() {
    if (wake_ >= 0) ::close(wake_);
    if (epoll_ >= 0) ::close(epoll_);
}

void Context::wake() noexcept { // NOLINT(readability-make-member-function-const): signals the eventfd
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
}

void Context::watch(int fd) { // NOLINT(readability-make-member-function-const): changes the epoll set
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event) != 0 && errno != EEXIST) {
        throw Error({errno, std::system_category()}, "epoll_ctl", "watching a completion channel");
    }
}

void Context::unwatch(int fd) noexcept { // NOLINT(readability-make-member-function-const): changes the epoll set
    (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
}

std::size_t Context::poll() {
    if (polled_) return progress();
    std::uint64_t woken = 0;
    (void)!::read(wake_, &woken, sizeof woken);
    if (io_.stopped()) io_.restart();
    return io_.poll();
}

std::size_t Context::run_one_for(std::chrono::microseconds timeout) {
    if (polled_) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        std::size_t ran = 0;
        while ((ran = progress()) == 0 && std::chrono::steady_clock::now() < until) {
        }
        return ran;
    }
    if (io_.stopped()) io_.restart();
    return io_.run_one_for(timeout);
}

} // namespace gpuverbs::python
