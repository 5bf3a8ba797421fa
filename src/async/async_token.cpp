// to_asio_error (detail/async/async_token.hpp): a std::error_code as the
// Boost.System code an Asio handler receives.
#include "gpuverbs/detail/async/async_token.hpp"

#include <boost/asio/error.hpp>

#include <cerrno>
#include <system_error>

namespace gpuverbs::detail {

namespace asio = boost::asio;

boost::system::error_code to_asio_error(const std::error_code& ec) noexcept {
    if (!ec) return {};
    if (ec.category() == std::system_category()) {
        if (ec.value() == ECANCELED) return asio::error::operation_aborted;
        return {ec.value(), boost::system::system_category()};
    }
    // std::errc values as Boost's generic category (named "generic", as
    // std's is; equal to std::errc and boost::system::errc alike), not
    // wrapped: a wrapped category is named "std:unknown".
    if (ec.category() == std::generic_category()) return {ec.value(), boost::system::generic_category()};
    return boost::system::error_code(ec);
}

} // namespace gpuverbs::detail
