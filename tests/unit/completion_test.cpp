// Work-completion statuses as error codes, and turning an ibv_wc into a Completion.
#include "gpuverbs/detail/queue_cores.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>

using namespace gpuverbs;

TEST_SUITE("completions") {
    TEST_CASE("every work-completion status has a name and an explanation") {
        for (int s = IBV_WC_SUCCESS; s <= IBV_WC_TM_RNDV_INCOMPLETE; ++s) {
            std::error_code ec(s, wc_category());
            std::string m = ec.message();
            CAPTURE(m);
            CHECK(m.find(ibv_wc_status_str(static_cast<ibv_wc_status>(s))) == 0);
            CHECK(m.find("unknown work completion status") == std::string::npos);
        }
        CHECK(std::string(wc_category().name()) == "work completion");
    }

    TEST_CASE("a remote access error says what the usual causes are") {
        std::string m = make_wc_error(IBV_WC_REM_ACCESS_ERR).message();
        CHECK(m.find("wrong rkey") != std::string::npos);
        CHECK(m.find("outside the remote region") != std::string::npos);
        CHECK_FALSE(make_wc_error(IBV_WC_SUCCESS));
    }

    TEST_CASE("an error completion for a destroyed QP keeps its status and reports an unknown operation") {
        ibv_wc wc{};
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.qp_num = 9;
        Completion c = detail::translate(wc, nullptr);
        CHECK(c.opcode == Opcode::unknown);
        CHECK(c.status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        CHECK(c.qp_num == 9);
        CHECK_FALSE(c.ok());
    }

    TEST_CASE("immediate data comes back in host byte order") {
        ibv_wc wc{};
        wc.status = IBV_WC_SUCCESS;
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = htonl(0xa1b2c3d4);
        Completion c = detail::translate(wc, nullptr);
        CHECK(c.immediate == 0xa1b2c3d4u);
    }
}
