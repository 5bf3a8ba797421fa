// The data path of a connected queue pair: every operation in three forms —
// synchronous (post), batched (batch() → SendBatch) and asynchronous
// (async_post) — all carrying one WorkRequest through one lowering
// (detail/data_path/posting_path.hpp), so they check and support the same things.
// The post_* and async_* functions are one-line shorthands for the common
// requests. QueuePair (queue_pair.hpp) inherits this; what runs per
// operation is in detail/data_path/posting_path.hpp and detail/data_path/completion_path.hpp.
//
// Synchronous and batched forms: noexcept; no allocation; a check that fails
// means nothing was posted (should the provider refuse a request in the middle
// of a SendBatch or post_receives, the ones before it were posted and are
// accounted for). Asynchronous forms: declared here, compiled only where
// <gpuverbs/async.hpp> is included (it holds the engine; a program using only
// the synchronous path compiles none of Asio). See async.hpp for the rules
// every async_* follows (completion signature, lifetimes, executor,
// cancellation, thread safety).
//
// Thread safety: one thread may post while another polls the CQ; posting from
// two threads on one QueuePair needs the caller's lock.
#pragma once

#include "gpuverbs/async_types.hpp"
#include "gpuverbs/data_path/send_batch.hpp"
#include "gpuverbs/data_path/work_request.hpp"
#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"
#include "gpuverbs/verbs/completion.hpp"
#include "gpuverbs/verbs/memory_region.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <system_error>

namespace gpuverbs::detail {
struct access; // detail/access.hpp: how the library reaches an object's core
} // namespace gpuverbs::detail

namespace gpuverbs {

namespace detail {
/// The token async_* use when the caller gives none; <gpuverbs/async.hpp>
/// makes it the executor's default token (default_token_t).
struct default_async_token;
template <class>
inline constexpr bool async_engine_missing = false;
/// The asynchronous forms' engine entry, specialised by detail/async/async_forms.hpp
/// (included by <gpuverbs/async.hpp>). Reaching this primary template means the
/// program called an async_* without including it.
template <class Token, class Enable = void>
struct AsyncForms {
    static_assert(async_engine_missing<Token>,
                  "gpuverbs: QueuePair's async_* forms need #include <gpuverbs/async.hpp> (the asynchronous engine)");
};
/// A completion token for signature `Sig` (boost::asio::completion_token_for, or the default token).
template <class Token, class Sig>
concept async_token_for = AsyncForms<std::decay_t<Token>>::template accepts<Sig>;
} // namespace detail

/// The operations of a connected queue pair. Not used on its own: QueuePair is one.
class DataPath {
public:
    // --- synchronous -------------------------------------------------------

    /// Posts one request after every local check (range, remote range,
    /// inline size, SGE count, atomic alignment, queue depth).
    GPUVERBS_HOT std::error_code post(const WorkRequest& request) noexcept { return detail::post(*core_, request); }

    /// RDMA write of `src` to `dst` at `dst_offset`.
    GPUVERBS_HOT std::error_code post_write(const LocalBuffer& src, const RemoteMemory& dst,
                                            std::uint64_t dst_offset = 0, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::write(src, dst, dst_offset).options(options));
    }
    /// … gathering from several local buffers.
    GPUVERBS_HOT std::error_code post_write(std::span<const LocalBuffer> src, const RemoteMemory& dst,
                                            std::uint64_t dst_offset = 0, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::write(src, dst, dst_offset).options(options));
    }
    /// RDMA write that also consumes a receive at the peer, handing it `immediate`.
    GPUVERBS_HOT std::error_code post_write_with_imm(const LocalBuffer& src, const RemoteMemory& dst,
                                                     std::uint64_t dst_offset, std::uint32_t immediate,
                                                     const SendOptions& options = {}) noexcept {
        return post(WorkRequest::write_with_imm(src, dst, dst_offset, immediate).options(options));
    }
    /// RDMA read of `src` at `src_offset` into `dst`.
    GPUVERBS_HOT std::error_code post_read(const LocalBuffer& dst, const RemoteMemory& src,
                                           std::uint64_t src_offset = 0, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::read(dst, src, src_offset).options(options));
    }
    /// … scattering into several local buffers.
    GPUVERBS_HOT std::error_code post_read(std::span<const LocalBuffer> dst, const RemoteMemory& src,
                                           std::uint64_t src_offset = 0, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::read(dst, src, src_offset).options(options));
    }
    /// Send of `src` (consumes a receive at the peer).
    GPUVERBS_HOT std::error_code post_send(const LocalBuffer& src, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::send(src).options(options));
    }
    /// … gathering from several local buffers.
    GPUVERBS_HOT std::error_code post_send(std::span<const LocalBuffer> src, const SendOptions& options = {}) noexcept {
        return post(WorkRequest::send(src).options(options));
    }
    /// A send that also delivers `immediate` (host byte order) to the receiver's completion.
    GPUVERBS_HOT std::error_code post_send_with_imm(const LocalBuffer& src, std::uint32_t immediate,
                                                    const SendOptions& options = {}) noexcept {
        return post(WorkRequest::send_with_imm(src, immediate).options(options));
    }
    /// Atomically adds `add` to the 8-byte word at `target`+`offset`; the old value lands in `result`.
    GPUVERBS_HOT std::error_code post_fetch_add(const LocalBuffer& result, const RemoteMemory& target,
                                                std::uint64_t offset, std::uint64_t add,
                                                const SendOptions& options = {}) noexcept {
        return post(WorkRequest::fetch_add(result, target, offset, add).options(options));
    }
    /// Atomically replaces the word with `swap` if it equals `compare`; the old value lands in `result`.
    GPUVERBS_HOT std::error_code post_compare_swap(const LocalBuffer& result, const RemoteMemory& target,
                                                   std::uint64_t offset, std::uint64_t compare, std::uint64_t swap,
                                                   const SendOptions& options = {}) noexcept {
        return post(WorkRequest::compare_swap(result, target, offset, compare, swap).options(options));
    }
    /// A receive for the peer's next send or write-with-immediate.
    /// errc::receives_through_srq when the QP takes its receives from a SharedReceiveQueue.
    GPUVERBS_HOT std::error_code post_receive(const LocalBuffer& dst, std::uint64_t context = 0) noexcept {
        return post_receive(std::span<const LocalBuffer>(&dst, 1), context);
    }
    /// … scattering into several local buffers.
    GPUVERBS_HOT std::error_code post_receive(std::span<const LocalBuffer> dst, std::uint64_t context = 0) noexcept {
        detail::ReceiveTarget target{};
        if (std::error_code ec = detail::receive_target(*core_, target)) return ec;
        return detail::post_receive(target, dst, context);
    }
    /// One receive per buffer, up to 32, with one doorbell (as a receiver
    /// reposting after a batch of completions does); their contexts are
    /// first_context, first_context + 1, …. All or none: errc::batch_full for
    /// more than 32, receive_queue_full without room for all, and every
    /// buffer's range checked first.
    GPUVERBS_HOT std::error_code post_receives(std::span<const LocalBuffer> buffers,
                                               std::uint64_t first_context = 0) noexcept {
        detail::ReceiveTarget target{};
        if (std::error_code ec = detail::receive_target(*core_, target)) return ec;
        return detail::post_receives(target, buffers, first_context);
    }

    // --- batched -----------------------------------------------------------

    using SendBatch = gpuverbs::SendBatch;
    /// A batch of send-side requests posted with one doorbell; see SendBatch.
    SendBatch batch() noexcept { return SendBatch(*core_); }

    // --- asynchronous (the CQ must be bound to an executor; see async.hpp) ---

    using executor_type = boost::asio::any_io_executor;
    /// The executor of the QP's completion queue (empty if it is not bound).
    [[nodiscard]] executor_type get_executor() const noexcept;

    /// Any send-side request, with every option and check of post().
    /// Completion signature: void(boost::system::error_code, std::size_t bytes).
    /// The request is always signaled (its completion completes the handler).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_post(const WorkRequest& request, Token&& token = Token()) {
        return detail::AsyncForms<std::decay_t<Token>>::template send<detail::ResultKind::bytes>(
            core_, std::forward<Token>(token), request);
    }
    /// RDMA write. void(boost::system::error_code, std::size_t bytes).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_write(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset = 0,
                     Token&& token = Token()) {
        return async_post(WorkRequest::write(src, dst, dst_offset), std::forward<Token>(token));
    }
    /// RDMA write with immediate. void(boost::system::error_code, std::size_t bytes).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_write_with_imm(const LocalBuffer& src, const RemoteMemory& dst, std::uint64_t dst_offset,
                              std::uint32_t immediate, Token&& token = Token()) {
        return async_post(WorkRequest::write_with_imm(src, dst, dst_offset, immediate), std::forward<Token>(token));
    }
    /// RDMA read. void(boost::system::error_code, std::size_t bytes).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_read(const LocalBuffer& dst, const RemoteMemory& src, std::uint64_t src_offset = 0,
                    Token&& token = Token()) {
        return async_post(WorkRequest::read(dst, src, src_offset), std::forward<Token>(token));
    }
    /// Send. void(boost::system::error_code, std::size_t bytes).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_send(const LocalBuffer& src, Token&& token = Token()) {
        return async_post(WorkRequest::send(src), std::forward<Token>(token));
    }
    /// Send with immediate. void(boost::system::error_code, std::size_t bytes).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::size_t)>
    auto async_send_with_imm(const LocalBuffer& src, std::uint32_t immediate, Token&& token = Token()) {
        return async_post(WorkRequest::send_with_imm(src, immediate), std::forward<Token>(token));
    }
    /// Fetch-and-add; hands back the old value. void(boost::system::error_code, std::uint64_t).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::uint64_t)>
    auto async_fetch_add(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset, std::uint64_t add,
                         Token&& token = Token()) {
        return detail::AsyncForms<std::decay_t<Token>>::template send<detail::ResultKind::old_value>(
            core_, std::forward<Token>(token), WorkRequest::fetch_add(result, target, offset, add));
    }
    /// Compare-and-swap; hands back the old value. void(boost::system::error_code, std::uint64_t).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, std::uint64_t)>
    auto async_compare_swap(const LocalBuffer& result, const RemoteMemory& target, std::uint64_t offset,
                            std::uint64_t compare, std::uint64_t swap, Token&& token = Token()) {
        return detail::AsyncForms<std::decay_t<Token>>::template send<detail::ResultKind::old_value>(
            core_, std::forward<Token>(token), WorkRequest::compare_swap(result, target, offset, compare, swap));
    }
    /// Receive (a send or a write with immediate from the peer), with the
    /// same checks as post_receive. void(boost::system::error_code, gpuverbs::Received).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, Received)>
    auto async_receive(const LocalBuffer& dst, Token&& token = Token()) {
        return detail::AsyncForms<std::decay_t<Token>>::receive(core_, std::forward<Token>(token), dst);
    }
    /// … scattering into several local buffers (the list is copied when the operation is initiated).
    template <class Token = detail::default_async_token>
    requires detail::async_token_for<Token, void(async_error_code, Received)>
    auto async_receive(std::span<const LocalBuffer> dst, Token&& token = Token()) {
        return detail::AsyncForms<std::decay_t<Token>>::receive(core_, std::forward<Token>(token), dst);
    }

protected:
    DataPath() noexcept = default;
    explicit DataPath(std::shared_ptr<detail::QpCore> core) noexcept : core_(std::move(core)) {}
    DataPath(DataPath&&) noexcept = default;
    DataPath& operator=(DataPath&&) noexcept = default;
    ~DataPath() = default;

    std::shared_ptr<detail::QpCore> core_;

private:
    friend struct detail::access;
};

} // namespace gpuverbs
