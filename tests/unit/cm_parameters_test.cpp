// What an rdma_cm connection asks for and agrees on: the pure rules, with
// injected device limits and peer requests (the rig's tests run the same code
// against rdmacm-utils and read the agreed values back from the queue pairs).
#include "gpuverbs/connections/rdma_cm.hpp"

#include <doctest/doctest.h>

#include "build_has.hpp"

#if GPUVERBS_HAVE_RDMACM

using namespace gpuverbs;

TEST_SUITE("rdma_cm parameters") {
    TEST_CASE("read depths are the minimum of ours, the device's and the peer's, each direction crossed") {
        CmOptions ours;
        ours.responder_resources = 16;
        ours.initiator_depth = 8;
        const detail::CmDeviceLimits rxe{128, 128};
        CmParameters peer;
        peer.responder_resources = 4; // it answers 4 of our reads
        peer.initiator_depth = 32;    // it wants to issue 32
        const CmParameters agreed = detail::cm_negotiate(ours, rxe, &peer);
        CHECK(agreed.responder_resources == 16); // min(16, 128, its 32)
        CHECK(agreed.initiator_depth == 4);      // min(8, 128, its 4)

        const detail::CmDeviceLimits small{2, 1};
        const CmParameters clamped = detail::cm_negotiate(ours, small, &peer);
        CHECK(clamped.responder_resources == 2);
        CHECK(clamped.initiator_depth == 1);

        // A client asks before it knows the peer: ours and the device's only.
        CmOptions greedy;
        greedy.responder_resources = greedy.initiator_depth = 255;
        const CmParameters asked = detail::cm_negotiate(greedy, rxe, nullptr);
        CHECK(asked.responder_resources == 128);
        CHECK(asked.initiator_depth == 128);

        // A peer that will issue no reads gets no responder resources.
        peer.initiator_depth = 0;
        CHECK(detail::cm_negotiate(ours, rxe, &peer).responder_resources == 0);
    }

    TEST_CASE("retries, the RNR timer and flow control are ours, unchanged") {
        CmOptions ours;
        ours.retry_count = 5;
        ours.rnr_retry_count = 2;
        ours.min_rnr_timer = 20;
        ours.flow_control = false;
        const CmParameters p = detail::cm_negotiate(ours, {128, 128}, nullptr);
        CHECK(p.retry_count == 5);
        CHECK(p.rnr_retry_count == 2);
        CHECK(p.min_rnr_timer == 20);
        CHECK_FALSE(p.flow_control);
        // One default for every path: 7, the wait bounded by gpuverbs (AsyncOptions::receiver_wait).
        CHECK(CmOptions{}.rnr_retry_count == ConnectOptions{}.rnr_retry_count);
    }

    TEST_CASE("private data limits per transport, checked per step before anything is sent") {
        const CmPrivateDataLimits roce = detail::cm_private_data_limits(false);
        CHECK(roce.connect == 56);
        CHECK(roce.accept == 196);
        CHECK(roce.reject == 148);
        CHECK(detail::cm_private_data_limits(true).connect == 512);
        detail::Status ok;
        CHECK(detail::cm_check_request("connect", {}, 56, roce, ok));
        CHECK(ok.ok());
        detail::Status over;
        CHECK_FALSE(detail::cm_check_request("reject", {}, 149, roce, over));
        CHECK(over.code == errc::invalid_argument);
        CHECK(over.verb == "rdma_reject");
        CHECK(over.detail ==
              "private data of 149 bytes does not fit a rejection: this transport carries at most 148 bytes in one; "
              "nothing was sent");
    }

    TEST_CASE("retry counts and the RNR timer out of their encodings are refused, naming the value") {
        const CmPrivateDataLimits roce = detail::cm_private_data_limits(false);
        CmOptions o;
        o.retry_count = 8;
        detail::Status s1;
        CHECK_FALSE(detail::cm_check_request("connect", o, 0, roce, s1));
        CHECK(s1.detail == "retry_count 8 is out of range (0-7); nothing was sent");
        o = {};
        o.rnr_retry_count = 9;
        detail::Status s2;
        CHECK_FALSE(detail::cm_check_request("accept", o, 0, roce, s2));
        CHECK(s2.detail.find("rnr_retry_count 9 is out of range (0-6 retries, 7 = retry forever)") == 0);
        o = {};
        o.min_rnr_timer = 32;
        detail::Status s3;
        CHECK_FALSE(detail::cm_check_request("connect", o, 0, roce, s3));
        CHECK(s3.detail.find("min_rnr_timer 32 is out of range") == 0);
    }
}

#else

// Built without librdmacm: the suite is counted as skipped, and says why.
TEST_SUITE("rdma_cm parameters" * doctest::skip(!gpuverbs::test::build_has::rdmacm)) {
    TEST_CASE("skipped: this build has no librdmacm (GPUVERBS_WITH_RDMACM=OFF or librdmacm-dev missing)") {}
}

#endif
