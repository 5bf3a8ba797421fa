// The engine behind DataPath's async_* (data_path.hpp declares them): the
// specialisation of detail::AsyncForms that turns a token into an operation
// through asio::async_initiate and the named initiations of async_op.hpp.
// Included by <gpuverbs/async.hpp> only, after default_token_t.
#pragma once

#include "gpuverbs/data_path/data_path.hpp"
#include "gpuverbs/detail/async/async_driver.hpp"
#include "gpuverbs/detail/async/async_op.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>

#include <memory>
#include <span>
#include <type_traits>

namespace gpuverbs::detail {

/// The token of an async_* called without one: the executor's default token.
struct default_async_token {};

template <class Token>
struct AsyncForms<Token, void> {
    static constexpr bool is_default = std::is_same_v<Token, default_async_token>;

    template <class Sig>
    static constexpr bool accepts = is_default || boost::asio::completion_token_for<Token, Sig>;

    /// async_initiate with `token`, or with the executor's default token.
    template <class Sig, class Initiation, class T, class... Args>
    static auto initiate(Initiation&& initiation, T&& token, Args&&... args) {
        if constexpr (is_default) {
            default_token_t<boost::asio::any_io_executor> fallback;
            return boost::asio::async_initiate<decltype(fallback), Sig>(std::forward<Initiation>(initiation), fallback,
                                                                        std::forward<Args>(args)...);
        } else {
            return boost::asio::async_initiate<T, Sig>(std::forward<Initiation>(initiation), token,
                                                       std::forward<Args>(args)...);
        }
    }

    template <ResultKind K, class T>
    static auto send(const std::shared_ptr<QpCore>& core, T&& token, const WorkRequest& request) {
        using Sig = void(async_error_code, typename ResultOf<K>::type);
        return initiate<Sig>(InitiateSend<K>(core), std::forward<T>(token), request);
    }

    /// `buffers` is a LocalBuffer (kept by value until a deferred operation
    /// is launched) or a span (copied when the operation is initiated).
    template <class T, class Buffers>
    static auto receive(const std::shared_ptr<QpCore>& core, T&& token, const Buffers& buffers) {
        using Sig = void(async_error_code, Received);
        return initiate<Sig>(InitiateReceive(core), std::forward<T>(token), buffers);
    }
};

} // namespace gpuverbs::detail
