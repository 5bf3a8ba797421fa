// What every public header with async_* functions needs, and no more: Asio's
// token machinery, gpuverbs' default token, and the one conversion of a
// gpuverbs error to Asio's error_code. The QueuePair engine is not here
// (detail/async/async_forms.hpp, through <gpuverbs/async.hpp>).
#pragma once

#include "gpuverbs/async_types.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/system/error_code.hpp>

#include <cerrno>
#include <system_error>
#include <type_traits>

namespace gpuverbs {

/// The completion token async_* use when none is given: the executor's
/// default, or asio::deferred when it has none (Boost 1.81's any_io_executor).
template <class Executor>
using default_token_t = std::conditional_t<std::is_void_v<boost::asio::default_completion_token_t<Executor>>,
                                           boost::asio::deferred_t, boost::asio::default_completion_token_t<Executor>>;

namespace detail {

/// Asio's error_code for what the driver reports: operation_aborted exactly
/// (users compare with boost::asio::error::operation_aborted), errno values in
/// Boost's system category, gpuverbs' and work-completion categories wrapped.
boost::system::error_code to_asio_error(const std::error_code& ec) noexcept;

/// Asio's operation_aborted as a std::error_code (ECANCELED, system category).
inline std::error_code aborted_error() noexcept {
    return {ECANCELED, std::system_category()};
}

} // namespace detail
} // namespace gpuverbs
