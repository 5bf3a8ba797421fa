// The attributes of INIT, RTR and RTS, computed without a device.
#include "gpuverbs/detail/qp_transitions.hpp"

#include <doctest/doctest.h>

using namespace gpuverbs;
using gpuverbs::detail::LocalPort;

namespace {

LocalPort roce_port() {
    LocalPort p;
    p.port = 1;
    p.gid_index = 3;
    p.link_layer = LinkLayer::ethernet;
    p.active_mtu = Mtu::mtu_4096;
    p.device_max_rd_atomic = 128;
    p.device_max_dest_rd_atomic = 8;
    return p;
}

Endpoint roce_remote() {
    Endpoint e;
    e.qp_num = 0x1234;
    e.psn = 0xabcdef;
    e.gid = *Gid::parse("::ffff:10.0.0.2");
    e.mtu = Mtu::mtu_1024;
    e.link_layer = LinkLayer::ethernet;
    return e;
}

} // namespace

TEST_SUITE("queue pair transitions") {
    TEST_CASE("INIT names the port and the remote access") {
        auto t = detail::init_transition(roce_port(), Access::remote_write | Access::local_write);
        CHECK(t.attr.qp_state == IBV_QPS_INIT);
        CHECK(t.attr.port_num == 1);
        CHECK(t.attr.qp_access_flags == IBV_ACCESS_REMOTE_WRITE); // local_write is not a QP flag
        CHECK(t.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    }

    TEST_CASE("RTR on RoCE uses the smaller MTU, the remote QP and PSN, and a global route to its GID") {
        detail::Status status;
        auto t = detail::rtr_transition(roce_port(), roce_remote(), {}, status);
        REQUIRE(status.ok());
        CHECK(t.attr.qp_state == IBV_QPS_RTR);
        CHECK(t.attr.path_mtu == IBV_MTU_1024);
        CHECK(t.attr.dest_qp_num == 0x1234);
        CHECK(t.attr.rq_psn == 0xabcdef);
        CHECK(t.attr.max_dest_rd_atomic == 8);
        CHECK(t.attr.ah_attr.is_global == 1);
        CHECK(t.attr.ah_attr.grh.sgid_index == 3);
        CHECK(Gid::from_native(t.attr.ah_attr.grh.dgid) == roce_remote().gid);
        CHECK(t.attr.ah_attr.port_num == 1);
        CHECK(detail::describe(t).find("path_mtu=1024 dest_qp_num=0x1234") != std::string::npos);
    }

    TEST_CASE("RTR on InfiniBand addresses the LID without a global route") {
        LocalPort ib = roce_port();
        ib.link_layer = LinkLayer::infiniband;
        Endpoint e = roce_remote();
        e.link_layer = LinkLayer::infiniband;
        e.lid = 17;
        detail::Status status;
        auto t = detail::rtr_transition(ib, e, {}, status);
        REQUIRE(status.ok());
        CHECK(t.attr.ah_attr.dlid == 17);
        CHECK(t.attr.ah_attr.is_global == 0);
    }

    TEST_CASE("RTR refuses endpoints that cannot work, naming the problem") {
        auto refused = [](LocalPort local, Endpoint remote, ConnectOptions options, const char* words) {
            detail::Status status;
            (void)detail::rtr_transition(local, remote, options, status);
            CHECK_FALSE(status.ok());
            CHECK_MESSAGE(status.detail.find(words) != std::string::npos, status.detail);
            return status.code;
        };
        Endpoint zero_qp = roce_remote();
        zero_qp.qp_num = 0;
        CHECK(refused(roce_port(), zero_qp, {}, "not a valid QP number") == errc::invalid_endpoint);
        Endpoint no_gid = roce_remote();
        no_gid.gid = Gid{};
        CHECK(refused(roce_port(), no_gid, {}, "has no GID") == errc::invalid_endpoint);
        Endpoint ib = roce_remote();
        ib.link_layer = LinkLayer::infiniband;
        CHECK(refused(roce_port(), ib, {}, "same link layer") == errc::invalid_endpoint);
        LocalPort ib_local = roce_port();
        ib_local.link_layer = LinkLayer::infiniband;
        Endpoint lid0 = roce_remote();
        lid0.link_layer = LinkLayer::infiniband;
        lid0.gid = Gid{};
        CHECK(refused(ib_local, lid0, {}, "subnet manager") == errc::invalid_endpoint);
        ConnectOptions too_big;
        too_big.path_mtu = Mtu::mtu_4096;
        CHECK(refused(roce_port(), roce_remote(), too_big, "path MTU 4096 is larger") == errc::invalid_argument);
    }

    TEST_CASE("RTS takes our PSN and the retry settings, clamped to what verbs allows") {
        ConnectOptions o;
        o.retry_count = 99;
        o.rnr_retry = 3;
        o.timeout = 40;
        o.max_rd_atomic = 200;
        auto t = detail::rts_transition(0x1fffffff, roce_port(), o);
        CHECK(t.attr.qp_state == IBV_QPS_RTS);
        CHECK(t.attr.sq_psn == 0xffffff);
        CHECK(t.attr.retry_cnt == 7);
        CHECK(t.attr.rnr_retry == 3);
        CHECK(t.attr.timeout == 31);
        CHECK(t.attr.max_rd_atomic == 16); // device allows 128; verbs users cap at 16
    }
}
