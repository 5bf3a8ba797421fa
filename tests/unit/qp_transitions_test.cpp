// The attributes of INIT, RTR and RTS, computed without a device.
#include "gpuverbs/detail/verbs/qp_transitions.hpp"

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
        o.rnr_retry_count = 3;
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

    TEST_CASE("0.1's ConnectOptions::rnr_retry, when a program sets it, is the count RTS and rdma_cm use") {
        ConnectOptions o;
        o.rnr_retry_count = 3;
        CHECK(detail::rts_transition(0, roce_port(), o).attr.rnr_retry == 3); // the old name unset
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        o.rnr_retry = 5; // deprecated: tests/compat/api_0_1.cpp checks that it warns
#pragma GCC diagnostic pop
        CHECK(detail::rts_transition(0, roce_port(), o).attr.rnr_retry == 5);
        CHECK(detail::cm_connect_parameters(roce_port(), o).rnr_retry_count == 5);
    }

    TEST_CASE("RESET sets only the state") {
        auto t = detail::reset_transition();
        CHECK(t.attr.qp_state == IBV_QPS_RESET);
        CHECK(t.mask == IBV_QP_STATE);
    }

    TEST_CASE("changing the access flags in INIT sets only the flags, without local ones") {
        auto t = detail::access_transition(Access::remote_read | Access::local_write);
        CHECK(t.mask == IBV_QP_ACCESS_FLAGS);
        CHECK(t.attr.qp_access_flags == IBV_ACCESS_REMOTE_READ);
        CHECK(detail::describe(t) == "access_flags=0x4");
    }

    TEST_CASE("UD INIT names the port and the Q_Key, and no access flags") {
        auto t = detail::ud_init_transition(roce_port(), 0x11111111);
        CHECK(t.attr.qp_state == IBV_QPS_INIT);
        CHECK(t.attr.pkey_index == 0);
        CHECK(t.attr.port_num == 1);
        CHECK(t.attr.qkey == 0x11111111u);
        CHECK(t.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
        CHECK(detail::describe(t) == "port=1 qkey=0x11111111");
    }

    TEST_CASE("UD RTR sets only the state: a datagram QP has no peer") {
        auto t = detail::ud_rtr_transition();
        CHECK(t.attr.qp_state == IBV_QPS_RTR);
        CHECK(t.mask == IBV_QP_STATE);
    }

    TEST_CASE("UD RTS sets our PSN, cut to 24 bits, and nothing about retries") {
        auto t = detail::ud_rts_transition(0x1abcdef0);
        CHECK(t.attr.qp_state == IBV_QPS_RTS);
        CHECK(t.attr.sq_psn == 0xbcdef0u);
        CHECK(t.mask == (IBV_QP_STATE | IBV_QP_SQ_PSN));
        CHECK(detail::describe(t) == "sq_psn=0xbcdef0");
    }

    TEST_CASE("rdma_cm's connect parameters are the values RTR and RTS would use") {
        LocalPort p = roce_port(); // device: 128 as initiator, 8 as target
        auto defaults = detail::cm_connect_parameters(p, {});
        CHECK(defaults.responder_resources == 8);
        CHECK(defaults.initiator_depth == 16);
        CHECK(defaults.retry_count == 6);     // finite on every provider (7 is "forever" on rxe)
        CHECK(defaults.rnr_retry_count == 7); // receives cannot be posted before connect (queue_pair_types.hpp)

        ConnectOptions o;
        o.retry_count = 99;
        o.rnr_retry_count = 3;
        o.max_rd_atomic = 4;
        o.max_dest_rd_atomic = 200;
        auto chosen = detail::cm_connect_parameters(p, o);
        detail::Status status;
        auto rtr = detail::rtr_transition(p, roce_remote(), o, status);
        REQUIRE(status.ok());
        auto rts = detail::rts_transition(0, p, o);
        CHECK(chosen.responder_resources == rtr.attr.max_dest_rd_atomic);
        CHECK(chosen.responder_resources == 8);
        CHECK(chosen.initiator_depth == rts.attr.max_rd_atomic);
        CHECK(chosen.initiator_depth == 4);
        CHECK(chosen.retry_count == rts.attr.retry_cnt);
        CHECK(chosen.rnr_retry_count == rts.attr.rnr_retry);

        LocalPort unknown; // a device that could not be queried: one outstanding read each way
        unknown.device_max_rd_atomic = 0;
        unknown.device_max_dest_rd_atomic = 0;
        auto minimal = detail::cm_connect_parameters(unknown, {});
        CHECK(minimal.responder_resources == 1);
        CHECK(minimal.initiator_depth == 1);
    }
}
