// CompletionQueue: where finished work requests are reported (ibv_cq), and
// CompletionChannel: the file descriptor that wakes a waiting thread.
//
//   gpuverbs::CompletionQueue cq(device, 1024);
//   std::array<gpuverbs::Completion, 16> done;
//   std::size_t n = cq.poll(done);          // non-blocking, batched
//   for (auto& c : std::span(done).first(n)) if (!c.ok()) report(c.status.message());
//
// Thread safety: poll() may run concurrently with posting on the queue pairs
// attached to this CQ; two threads must not poll the same CQ at once.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/detail/data_path/completion_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion.hpp"
#include "gpuverbs/verbs/device.hpp"

#include <chrono>
#include <memory>
#include <span>
#include <system_error>

namespace gpuverbs::detail {
struct access; // detail/access.hpp: how the library reaches an object's core
} // namespace gpuverbs::detail

namespace gpuverbs {

/// A completion event channel: one fd that becomes readable when a CQ attached
/// to it, and armed with request_notify(), gets a completion. Move-only.
class CompletionChannel {
public:
    CompletionChannel() noexcept = default;
    explicit CompletionChannel(const Device& device);
    static CompletionChannel create(const Device& device, std::error_code& ec);

    CompletionChannel(CompletionChannel&&) noexcept = default;
    CompletionChannel& operator=(CompletionChannel&&) noexcept = default;
    CompletionChannel(const CompletionChannel&) = delete;
    CompletionChannel& operator=(const CompletionChannel&) = delete;
    ~CompletionChannel() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    /// The file descriptor to wait on (non-blocking).
    [[nodiscard]] int fd() const noexcept { return core_ ? core_->channel()->fd : -1; }
    [[nodiscard]] ibv_comp_channel* native_handle() const noexcept { return core_ ? core_->channel() : nullptr; }

private:
    friend struct detail::access;
    friend class CompletionQueue;
    static CompletionChannel create_impl(const Device& device, detail::Status& status);
    std::shared_ptr<detail::ChannelCore> core_;
};

/// A completion queue. Move-only; queue pairs using it keep it alive.
class CompletionQueue {
public:
    CompletionQueue() noexcept = default;
    /// A CQ with room for at least `capacity` completions (throws gpuverbs::Error).
    CompletionQueue(const Device& device, int capacity);
    /// … attached to `channel`, so request_notify() + wait() can block for completions.
    CompletionQueue(const Device& device, int capacity, const CompletionChannel& channel);
    static CompletionQueue create(const Device& device, int capacity, const CompletionChannel* channel,
                                  std::error_code& ec);
    /// A CQ bound to `executor`: its completions go to the asynchronous
    /// operations of the queue pairs using it (QueuePair::async_*), waited for
    /// as `options.mode` says. It makes its own completion channel. Such a CQ
    /// serves asynchronous operations only: do not poll() it or post
    /// synchronously on its queue pairs.
    CompletionQueue(const Device& device, int capacity, const boost::asio::any_io_executor& executor,
                    const AsyncOptions& options = {});
    /// The same without throwing: an empty CompletionQueue with `ec` (and the words) set on failure.
    static CompletionQueue create(const Device& device, int capacity, const boost::asio::any_io_executor& executor,
                                  const AsyncOptions& options, std::error_code& ec);
    static CompletionQueue create(const Device& device, int capacity, const boost::asio::any_io_executor& executor,
                                  const AsyncOptions& options, std::error_code& ec, Diagnostics& diagnostics);

    CompletionQueue(CompletionQueue&& other) noexcept = default;
    CompletionQueue& operator=(CompletionQueue&& other) noexcept {
        if (this != &other) {
            release();
            core_ = std::move(other.core_);
        }
        return *this;
    }
    CompletionQueue(const CompletionQueue&) = delete;
    CompletionQueue& operator=(const CompletionQueue&) = delete;
    /// Outstanding asynchronous operations complete with operation_aborted.
    ~CompletionQueue() { release(); }

    using executor_type = boost::asio::any_io_executor;
    /// The executor the CQ is bound to (an empty executor if it is not).
    [[nodiscard]] executor_type get_executor() const noexcept;

    explicit operator bool() const noexcept { return core_ != nullptr; }

    /// What the asynchronous engine has done so far (zeros if the CQ is not bound to an executor).
    [[nodiscard]] AsyncStatistics async_statistics() const noexcept;

    /// Fills `out` with up to out.size() finished requests, oldest first, and
    /// returns how many. Never blocks, never allocates. On the (rare) failure
    /// of ibv_poll_cq, `ec` is set and the completions before it are returned.
    std::size_t poll(std::span<Completion> out, std::error_code& ec) noexcept {
        ec.clear();
        int n = detail::poll_into(*core_, out.data(), static_cast<int>(std::min<std::size_t>(out.size(), INT32_MAX)));
        if (n < 0) {
            ec.assign(-n, std::system_category());
            return 0;
        }
        return static_cast<std::size_t>(n);
    }
    /// poll() that throws gpuverbs::Error on failure.
    std::size_t poll(std::span<Completion> out) {
        int n = detail::poll_into(*core_, out.data(), static_cast<int>(std::min<std::size_t>(out.size(), INT32_MAX)));
        if (n < 0) throw_poll_error(-n);
        return static_cast<std::size_t>(n);
    }

    /// Arms the CQ: the next completion (or next solicited one) signals the channel.
    std::error_code request_notify(bool solicited_only = false) noexcept {
        int rc = ibv_req_notify_cq(core_->cq(), solicited_only ? 1 : 0);
        return rc == 0 ? std::error_code() : std::error_code(rc, std::system_category());
    }
    /// Blocks until the channel reports an event for this CQ or `timeout`
    /// passes (returns false). Re-arm with request_notify() and poll() after.
    /// Needs a CQ made with a CompletionChannel.
    bool wait(std::chrono::milliseconds timeout, std::error_code& ec) noexcept;
    bool wait(std::chrono::milliseconds timeout);

    [[nodiscard]] int capacity() const noexcept { return core_ ? core_->cq()->cqe : 0; }
    /// Names this object in DeviceEvent (unique for the process's life; 0 when empty).
    [[nodiscard]] std::uint64_t id() const noexcept { return core_ ? core_->id() : 0; }
    [[nodiscard]] ibv_cq* native_handle() const noexcept { return core_ ? core_->cq() : nullptr; }

private:
    friend struct detail::access;
    void release() noexcept;
    static CompletionQueue create_impl(const Device& device, int capacity, const CompletionChannel* channel,
                                       detail::Status& status);
    static CompletionQueue create_impl(const Device& device, int capacity, const boost::asio::any_io_executor& executor,
                                       const AsyncOptions& options, detail::Status& status);
    [[noreturn]] static void throw_poll_error(int err);
    std::shared_ptr<detail::CqCore> core_;
};

} // namespace gpuverbs
