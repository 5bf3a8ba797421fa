#include "gpuverbs/error.hpp"

#include "gpuverbs/detail/async/async_token.hpp"

#include <boost/asio/error.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <string>

TEST_SUITE("error") {
    TEST_CASE("gpuverbs error codes belong to the gpuverbs category and read as sentences") {
        std::error_code ec = gpuverbs::errc::device_not_found;
        CHECK(std::string(ec.category().name()) == "gpuverbs");
        CHECK(ec.message() == "no RDMA device has this name");
        CHECK(std::error_code(gpuverbs::errc::no_gpu_driver).message().find("libcuda.so.1") != std::string::npos);
    }

    TEST_CASE("gpuverbs error codes compare equal to the matching generic conditions") {
        CHECK(std::error_code(gpuverbs::errc::unsupported) == std::errc::operation_not_supported);
        CHECK(std::error_code(gpuverbs::errc::invalid_argument) == std::errc::invalid_argument);
        CHECK(std::error_code(gpuverbs::errc::device_not_found) == std::errc::no_such_device);
        CHECK(std::error_code(gpuverbs::errc::gid_not_found) != std::errc::no_such_device);
    }

    TEST_CASE("Error names the failing verb and the detail in what()") {
        gpuverbs::Error e(gpuverbs::errc::device_not_found, "ibv_open_device", "no RDMA device named 'x'");
        CHECK(std::string(e.what()) == "ibv_open_device: no RDMA device named 'x'");
        CHECK(e.verb() == "ibv_open_device");
        CHECK(e.code() == gpuverbs::errc::device_not_found);
    }

    TEST_CASE("Error without detail falls back to the code's message") {
        gpuverbs::Error e(std::error_code(EINVAL, std::system_category()), "ibv_modify_qp", "");
        CHECK(std::string(e.what()) == "ibv_modify_qp: " + std::error_code(EINVAL, std::system_category()).message());
    }

    TEST_CASE("an errno failure keeps the system error code and spells out the errno") {
        gpuverbs::detail::Status s;
        CHECK(s.ok());
        s.fail_errno(EFAULT, "ibv_reg_mr", "cannot register 4096 bytes");
        CHECK_FALSE(s.ok());
        CHECK(s.code == std::error_code(EFAULT, std::system_category()));
        CHECK(s.detail == "cannot register 4096 bytes: Bad address (errno 14)");
        try {
            s.raise();
            FAIL("raise() returned");
        } catch (const gpuverbs::Error& e) {
            CHECK(std::string(e.what()) == "ibv_reg_mr: cannot register 4096 bytes: Bad address (errno 14)");
            CHECK(e.code().value() == EFAULT);
        }
    }

    TEST_CASE("errno_text spells out an errno as its text and number") {
        CHECK(gpuverbs::detail::errno_text(EFAULT) == "Bad address (errno 14)");
        CHECK(gpuverbs::detail::errno_text(ENOMEM) ==
              std::error_code(ENOMEM, std::system_category()).message() + " (errno " + std::to_string(ENOMEM) + ")");
    }

    TEST_CASE("fail_errno's detail is what, a colon, and errno_text") {
        gpuverbs::detail::Status s;
        s.fail_errno(EINVAL, "ibv_create_qp", "cannot create an RC queue pair");
        CHECK(s.verb == "ibv_create_qp");
        CHECK(s.detail == "cannot create an RC queue pair: " + gpuverbs::detail::errno_text(EINVAL));
        CHECK(s.detail == "cannot create an RC queue pair: Invalid argument (errno 22)");
        gpuverbs::Diagnostics diag;
        s.report(diag);
        CHECK(diag.message() == "ibv_create_qp: cannot create an RC queue pair: Invalid argument (errno 22)");
    }

    TEST_CASE("an error reaches an Asio handler equal to what it was, named as it was") {
        using gpuverbs::detail::to_asio_error;
        // A deadline's std::errc::timed_out: Boost's generic category, never "std:unknown".
        const gpuverbs::async_error_code timed_out = to_asio_error(std::make_error_code(std::errc::timed_out));
        CHECK(timed_out == std::errc::timed_out);
        CHECK(timed_out == boost::system::errc::timed_out);
        CHECK(std::string(timed_out.category().name()) == "generic");
        CHECK(std::error_code(timed_out) == std::errc::timed_out);
        // ECANCELED is Asio's operation_aborted; another errno keeps its value.
        CHECK(to_asio_error(std::error_code(ECANCELED, std::system_category())) ==
              boost::asio::error::operation_aborted);
        CHECK(to_asio_error(std::error_code(EIO, std::system_category())).value() == EIO);
        // The library's own codes keep their category's words and compare equal.
        const gpuverbs::async_error_code refused = to_asio_error(gpuverbs::errc::invalid_argument);
        CHECK(std::error_code(refused) == gpuverbs::errc::invalid_argument);
        CHECK(refused.message() == std::error_code(gpuverbs::errc::invalid_argument).message());
        CHECK_FALSE(to_asio_error(std::error_code()));
    }

    TEST_CASE("refused_locally is the condition of every local refusal, and of nothing else") {
        using gpuverbs::condition;
        using gpuverbs::errc;
        const errc refused[] = {errc::local_range_outside_region,
                                errc::remote_range_outside_region,
                                errc::inline_too_large,
                                errc::too_many_sges,
                                errc::send_queue_full,
                                errc::receive_queue_full,
                                errc::misaligned_atomic,
                                errc::batch_full,
                                errc::receives_through_srq,
                                errc::reads_not_granted,
                                errc::no_executor,
                                errc::async_needs_one_cq};
        int count = 0;
        for (int v = 1; v < 200; ++v) {
            const std::error_code ec(v, gpuverbs::gpuverbs_category());
            if (ec.message().starts_with("unknown gpuverbs error")) continue;
            const bool listed =
                std::find(std::begin(refused), std::end(refused), static_cast<errc>(v)) != std::end(refused);
            CAPTURE(ec.message());
            CHECK((ec == condition::refused_locally) == listed);
            count += listed ? 1 : 0;
        }
        CHECK(count == static_cast<int>(std::size(refused)));
        // The codes keep their std::errc equivalences beside it.
        CHECK(std::error_code(errc::too_many_sges) == std::errc::invalid_argument);
        // Another category's code is never refused locally, whatever its value.
        CHECK(std::error_code(static_cast<int>(errc::too_many_sges), std::system_category()) !=
              condition::refused_locally);
        CHECK(std::string(gpuverbs::condition_category().name()) == "gpuverbs condition");
        CHECK(std::error_condition(condition::refused_locally).message().starts_with("refused locally"));
    }
}
