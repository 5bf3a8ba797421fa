// Context (binding.hpp): the event loop a Python program's operations complete
// on: an epoll set of completion channels and an eventfd to wake it.
#include "binding.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
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
    timer_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    event.data.fd = timer_;
    if (timer_ < 0 || ::epoll_ctl(epoll_, EPOLL_CTL_ADD, timer_, &event) != 0) {
        const int err = errno;
        if (timer_ >= 0) ::close(timer_);
        ::close(wake_);
        ::close(epoll_);
        throw Error({err, std::system_category()}, timer_ < 0 ? "timerfd_create" : "epoll_ctl",
                    "for the Python context's timers");
    }
}

Context::~Context() {
    if (timer_ >= 0) ::close(timer_);
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

void Context::awaited(int change) noexcept { // NOLINT(readability-make-member-function-const): arms the timerfd
    const std::size_t before = awaited_;
    awaited_ = change > 0 ? awaited_ + 1 : (awaited_ > 0 ? awaited_ - 1 : 0);
    if ((before == 0) == (awaited_ == 0)) return;
    itimerspec spec{};
    if (awaited_ > 0) {
        const auto ns = std::chrono::nanoseconds(timer_period).count();
        spec.it_interval.tv_sec = spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
        spec.it_interval.tv_nsec = spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    }
    (void)::timerfd_settime(timer_, 0, &spec, nullptr); // all zero: disarmed
}

std::size_t Context::poll() {
    if (polled_) return progress();
    std::uint64_t woken = 0;
    (void)!::read(wake_, &woken, sizeof woken);
    (void)!::read(timer_, &woken, sizeof woken); // a timer period passed: the io_context's timers run below
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
