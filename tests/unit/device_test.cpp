// Device logic that needs no RDMA device: conversions, formatting, the empty
// handle, and what opening a device says on a machine without the one asked for.
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/async.hpp"
#include "gpuverbs/detail/verbs/rdma_presence.hpp"
#include "gpuverbs/verbs/completion_queue.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"
#include "gpuverbs/verbs/shared_receive_queue.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <string>

using gpuverbs::Device;
using gpuverbs::errc;

TEST_SUITE("device") {
    TEST_CASE("port speed is lanes times the per-lane rate") {
        CHECK(gpuverbs::port_speed_gbps(1, 8) == doctest::Approx(10));     // 1X FDR10: what rxe on veth reports
        CHECK(gpuverbs::port_speed_gbps(2, 32) == doctest::Approx(100));   // 4X EDR
        CHECK(gpuverbs::port_speed_gbps(2, 64) == doctest::Approx(200));   // 4X HDR
        CHECK(gpuverbs::port_speed_gbps(2, 128) == doctest::Approx(400));  // 4X NDR
        CHECK(gpuverbs::port_speed_gbps(16, 128) == doctest::Approx(200)); // 2X NDR
        CHECK(gpuverbs::port_speed_gbps(8, 1) == doctest::Approx(30));     // 12X SDR
        CHECK(gpuverbs::port_speed_gbps(3, 8) == 0);
        CHECK(gpuverbs::port_speed_gbps(1, 3) == 0);
    }

    TEST_CASE("MTU codes convert to bytes") {
        CHECK(gpuverbs::mtu_bytes(gpuverbs::Mtu::mtu_256) == 256);
        CHECK(gpuverbs::mtu_bytes(gpuverbs::Mtu::mtu_1024) == 1024);
        CHECK(gpuverbs::mtu_bytes(gpuverbs::Mtu::mtu_4096) == 4096);
        CHECK(gpuverbs::mtu_bytes(static_cast<gpuverbs::Mtu>(0)) == 0);
        CHECK(gpuverbs::mtu_bytes(static_cast<gpuverbs::Mtu>(6)) == 0);
    }

    TEST_CASE("GUIDs print as four groups of four hex digits") {
        CHECK(gpuverbs::format_guid(0xe4784afffec3dd51ull) == "e478:4aff:fec3:dd51");
        CHECK(gpuverbs::format_guid(0) == "0000:0000:0000:0000");
    }

    TEST_CASE("enumerations print the names users see in ibv_devinfo") {
        CHECK(gpuverbs::to_string(gpuverbs::PortState::active) == "ACTIVE");
        CHECK(gpuverbs::to_string(gpuverbs::PortState::down) == "DOWN");
        CHECK(gpuverbs::to_string(gpuverbs::Transport::infiniband) == "InfiniBand");
        CHECK(gpuverbs::to_string(gpuverbs::NodeType::ca) == "CA");
    }

    TEST_CASE("an empty Device fails every query with invalid_argument and never crashes") {
        Device d;
        CHECK_FALSE(d);
        CHECK(d.native_handle() == nullptr);
        CHECK(d.name().empty());
        std::error_code ec;
        (void)d.query(ec);
        CHECK(ec == errc::invalid_argument);
        (void)d.query_port(1, ec);
        CHECK(ec == errc::invalid_argument);
        (void)d.gid_table(1, ec);
        CHECK(ec == errc::invalid_argument);
        CHECK_THROWS_AS((void)d.select_gid(1), gpuverbs::Error);
        try {
            (void)d.query();
        } catch (const gpuverbs::Error& e) {
            CHECK(std::string(e.what()).find("empty") != std::string::npos);
        }
    }

    TEST_CASE("progress() runs what a context has posted; called again from a handler it does not restart it") {
        boost::asio::io_context io(1);
        int ran = 0;
        std::size_t inner = 99;
        boost::asio::post(io, [&] {
            ++ran;
            inner = gpuverbs::progress(io); // inside its own poll: the CQs only (none here)
            boost::asio::post(io, [&] { ++ran; });
        });
        CHECK(gpuverbs::progress(io) == 2); // the poll runs the handler and the one it posted
        CHECK(ran == 2);
        CHECK(inner == 0);
        CHECK(gpuverbs::progress(io) == 0); // idle
        io.stop();
        boost::asio::post(io, [&] { ++ran; });
        CHECK(gpuverbs::progress(io) == 1); // a stopped context is restarted: progress() is the loop
        CHECK(ran == 3);
    }

    TEST_CASE("a CQ bound to an executor, a queue pair on an SRQ and a reset fail alike in the three forms") {
        using gpuverbs::Diagnostics;
        boost::asio::io_context io;
        const Device none;
        CHECK(gpuverbs::test::check_fails_alike(
                  errc::invalid_argument, [&] { return gpuverbs::CompletionQueue(none, 16, io.get_executor()); },
                  [&](std::error_code& ec) {
                      gpuverbs::CompletionQueue cq =
                          gpuverbs::CompletionQueue::create(none, 16, io.get_executor(), {}, ec);
                      CHECK_FALSE(cq);
                      return cq;
                  },
                  [&](std::error_code& ec, Diagnostics& d) {
                      return gpuverbs::CompletionQueue::create(none, 16, io.get_executor(), {}, ec, d);
                  }) == "ibv_create_comp_channel: the Device is empty");
        const boost::asio::any_io_executor no_executor;
        CHECK(gpuverbs::test::check_fails_alike(
                  errc::invalid_argument, [&] { return gpuverbs::CompletionQueue(none, 16, no_executor); },
                  [&](std::error_code& ec) { return gpuverbs::CompletionQueue::create(none, 16, no_executor, {}, ec); },
                  [&](std::error_code& ec, Diagnostics& d) {
                      return gpuverbs::CompletionQueue::create(none, 16, no_executor, {}, ec, d);
                  }) == "CompletionQueue: the executor is empty");
        // Polled: only an io_context (or a strand of one) can be advanced by gpuverbs::progress.
        boost::asio::thread_pool pool(1);
        const gpuverbs::AsyncOptions polled{.mode = gpuverbs::CompletionMode::polled};
        std::error_code polled_ec;
        gpuverbs::Diagnostics polled_d;
        CHECK_FALSE(gpuverbs::CompletionQueue::create(none, 16, pool.get_executor(), polled, polled_ec, polled_d));
        CHECK(polled_ec == errc::invalid_argument);
        CHECK(polled_d.message() ==
              "CompletionQueue: CompletionMode::polled needs an io_context's executor, or a strand of one "
              "(gpuverbs::progress(io_context) advances it); this executor is another kind");
        pool.join();
        // … an io_context's executor and a strand of it pass that check (then the empty device refuses).
        (void)gpuverbs::CompletionQueue::create(none, 16, io.get_executor(), polled, polled_ec, polled_d);
        CHECK(polled_d.message() == "ibv_create_comp_channel: the Device is empty");
        (void)gpuverbs::CompletionQueue::create(none, 16, boost::asio::make_strand(io), polled, polled_ec, polled_d);
        CHECK(polled_d.message() == "ibv_create_comp_channel: the Device is empty");

        const gpuverbs::ProtectionDomain pd;
        const gpuverbs::CompletionQueue cq;
        const gpuverbs::SharedReceiveQueue srq;
        const auto [code, what] = gpuverbs::test::check_forms_agree(
            [&] { return gpuverbs::PreparedQueuePair(pd, cq, cq, srq); },
            [&](std::error_code& ec) {
                gpuverbs::PreparedQueuePair qp = gpuverbs::PreparedQueuePair::create(pd, cq, cq, srq, {}, ec);
                CHECK_FALSE(qp);
                return qp;
            },
            [&](std::error_code& ec, Diagnostics& d) {
                return gpuverbs::PreparedQueuePair::create(pd, cq, cq, srq, {}, ec, d);
            });
        CHECK(code == errc::invalid_argument);
        CHECK_MESSAGE(what.find("empty") != std::string::npos, what);
        (void)gpuverbs::test::check_forms_agree(
            [&] { return gpuverbs::PreparedQueuePair(pd, cq, cq); },
            [&](std::error_code& ec) { return gpuverbs::PreparedQueuePair::create(pd, cq, cq, {}, ec); },
            [&](std::error_code& ec, Diagnostics& d) {
                return gpuverbs::PreparedQueuePair::create(pd, cq, cq, {}, ec, d);
            });

        gpuverbs::QueuePair empty;
        CHECK(empty.state() == gpuverbs::QpState::unknown); // nothing to ask: not a failure
        std::error_code ec = errc::invalid_argument;
        CHECK(empty.state(ec) == gpuverbs::QpState::unknown);
        CHECK_FALSE(ec);
        CHECK(gpuverbs::test::check_fails_alike(
                  errc::invalid_argument, [&] { return std::move(empty).reset(); },
                  [&](std::error_code& e) {
                      gpuverbs::PreparedQueuePair p = std::move(empty).reset(e);
                      CHECK_FALSE(p);
                      return p;
                  },
                  [&](std::error_code& e, Diagnostics& d) { return std::move(empty).reset(e, d); }) ==
              "ibv_modify_qp: the QueuePair is empty");
    }

    TEST_CASE("the error_code form of open keeps the exception's words in Diagnostics") {
        std::string thrown;
        try {
            (void)Device::open("gpuverbs_no_such_device");
        } catch (const gpuverbs::Error& e) {
            thrown = e.what();
        }
        REQUIRE_FALSE(thrown.empty());
        std::error_code ec;
        gpuverbs::Diagnostics diag;
        Device d = Device::open("gpuverbs_no_such_device", ec, diag);
        CHECK_FALSE(d);
        CHECK(ec);
        CHECK(diag.message() == thrown);
        CHECK(diag.verb() == thrown.substr(0, thrown.find(':')));
        CHECK(diag.message() == diag.verb() + ": " + diag.detail());
        // open_first: the same words as its exception (no devices here, or the first one opens).
        std::error_code first_ec;
        gpuverbs::Diagnostics first_diag;
        Device first = Device::open_first(first_ec, first_diag);
        if (first_ec) {
            try {
                (void)Device::open_first();
                FAIL("open_first threw nothing where its error_code form failed");
            } catch (const gpuverbs::Error& e) {
                CHECK(first_diag.message() == e.what());
            }
        } else {
            CHECK(first);
            CHECK(first_diag.message().empty());
        }
    }

    TEST_CASE("opening a device that does not exist says which devices do, or why there are none") {
        std::vector<gpuverbs::DeviceInfo> devices = Device::list();
        std::error_code ec;
        Device d = Device::open("gpuverbs_no_such_device", ec);
        CHECK_FALSE(d);
        try {
            (void)Device::open("gpuverbs_no_such_device");
            FAIL("open did not throw");
        } catch (const gpuverbs::Error& e) {
            std::string what = e.what();
            if (devices.empty()) {
                // This machine (like CI's) has no RDMA: the error must say so and what to do.
                CHECK(ec == errc::no_rdma_device);
                CHECK(e.code() == errc::no_rdma_device);
                CHECK(what.find("no RDMA device") != std::string::npos);
                CHECK(what.find("rdma link add") != std::string::npos);
            } else {
                CHECK(ec == errc::device_not_found);
                CHECK(what.find("no RDMA device named 'gpuverbs_no_such_device'; devices present: " +
                                devices[0].name) != std::string::npos);
            }
        }
    }
}
