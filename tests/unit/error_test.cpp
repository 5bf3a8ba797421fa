#include "gpuverbs/error.hpp"

#include <doctest/doctest.h>

#include <cerrno>
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
}
