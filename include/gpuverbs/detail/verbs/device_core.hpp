// The shared state behind a Device: the ibv_context and the device's name.
// Every object made from a Device holds a shared_ptr to its core, so the
// context outlives all of them whatever order the user destroys things in.
#pragma once

#include "gpuverbs/detail/verbs/event_subjects.hpp"

#include <infiniband/verbs.h>

#include <atomic>
#include <string>
#include <utility>

namespace gpuverbs::detail {

class DeviceCore {
public:
    /// `owned`: close the context when done; false for contexts another
    /// library owns (librdmacm's, which live as long as the process).
    DeviceCore(ibv_context* context, std::string name, bool owned = true) noexcept
        : context_(context), name_(std::move(name)), owned_(owned) {}
    DeviceCore(const DeviceCore&) = delete;
    DeviceCore& operator=(const DeviceCore&) = delete;
    ~DeviceCore() {
        // Nothing useful can be done if closing fails; the kernel reclaims it.
        if (context_ != nullptr && owned_) (void)ibv_close_device(context_);
    }

    [[nodiscard]] ibv_context* context() const noexcept { return context_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// The device's queue pairs, SRQs and CQs, for naming them in events.
    [[nodiscard]] EventSubjects& subjects() noexcept { return subjects_; }
    /// Set while a DeviceEvents reads this context's events (one reader at a time).
    std::atomic<bool> events_taken{false};
    /// DeviceEvents states that made the async descriptor non-blocking; the
    /// last one to go restores its flags.
    std::atomic<int> nonblocking_readers{0};

private:
    ibv_context* context_;
    std::string name_;
    bool owned_;
    EventSubjects subjects_;
};

} // namespace gpuverbs::detail
