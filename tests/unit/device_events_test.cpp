// The decision logic of DeviceEvents with injected kernel records: which type
// and element each ibv_event_type becomes, how the object is named, and what
// describe() tells the user. The same translation runs on real events in
// tests/integration/fault_test.cpp (port, SRQ limit, device removal).
#include "gpuverbs/verbs/device_events.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>

#include <cstring>

using namespace gpuverbs;

namespace {
ibv_async_event record(ibv_event_type type) {
    ibv_async_event e{};
    e.event_type = type;
    return e;
}
} // namespace

TEST_SUITE("device events") {
    TEST_CASE("port events carry the port number") {
        detail::EventSubjects subjects;
        for (auto [native, type] : {std::pair{IBV_EVENT_PORT_ACTIVE, DeviceEventType::port_active},
                                    std::pair{IBV_EVENT_PORT_ERR, DeviceEventType::port_error},
                                    std::pair{IBV_EVENT_GID_CHANGE, DeviceEventType::gid_change},
                                    std::pair{IBV_EVENT_LID_CHANGE, DeviceEventType::lid_change},
                                    std::pair{IBV_EVENT_PKEY_CHANGE, DeviceEventType::pkey_change},
                                    std::pair{IBV_EVENT_SM_CHANGE, DeviceEventType::sm_change},
                                    std::pair{IBV_EVENT_CLIENT_REREGISTER, DeviceEventType::client_reregister}}) {
            ibv_async_event e = record(native);
            e.element.port_num = 2;
            DeviceEvent out = detail::translate_event(e, "mlx5_0", subjects);
            CHECK(out.type == type);
            CHECK(out.element == EventElement::port);
            CHECK(out.port == 2);
            CHECK(out.device == "mlx5_0");
            CHECK(out.native_type == static_cast<int>(native));
            CHECK_FALSE(out.device_lost());
        }
    }

    TEST_CASE("queue pair events name the QP by id and number; an unknown QP has id 0") {
        detail::EventSubjects subjects;
        ibv_qp qp{};
        qp.qp_num = 0x1234;
        ibv_qp stranger{};
        stranger.qp_num = 0x99;
        subjects.add(&qp, 42);
        for (auto [native, type] : {std::pair{IBV_EVENT_QP_FATAL, DeviceEventType::qp_fatal},
                                    std::pair{IBV_EVENT_QP_REQ_ERR, DeviceEventType::qp_request_error},
                                    std::pair{IBV_EVENT_QP_ACCESS_ERR, DeviceEventType::qp_access_error},
                                    std::pair{IBV_EVENT_QP_LAST_WQE_REACHED, DeviceEventType::qp_last_wqe_reached},
                                    std::pair{IBV_EVENT_COMM_EST, DeviceEventType::communication_established},
                                    std::pair{IBV_EVENT_SQ_DRAINED, DeviceEventType::send_queue_drained},
                                    std::pair{IBV_EVENT_PATH_MIG, DeviceEventType::path_migrated},
                                    std::pair{IBV_EVENT_PATH_MIG_ERR, DeviceEventType::path_migration_error}}) {
            ibv_async_event e = record(native);
            e.element.qp = &qp;
            DeviceEvent out = detail::translate_event(e, "rxe0", subjects);
            CHECK(out.type == type);
            CHECK(out.element == EventElement::queue_pair);
            CHECK(out.object == 42);
            CHECK(out.qp_num == 0x1234);
            e.element.qp = &stranger;
            out = detail::translate_event(e, "rxe0", subjects);
            CHECK(out.object == 0);
            CHECK(out.qp_num == 0x99);
        }
        ibv_async_event e = record(IBV_EVENT_QP_FATAL);
        e.element.qp = &qp;
        const std::string text = detail::translate_event(e, "rxe0", subjects).describe();
        CHECK(text.find("rxe0 QueuePair 42 (QP number 4660): qp_fatal") == 0);
        CHECK(text.find("reset and reconnect it, or destroy it") != std::string::npos);
        // Removed from the subjects (destroyed): no longer named.
        subjects.remove(&qp, 41); // another object's id: kept
        CHECK(detail::translate_event(e, "rxe0", subjects).object == 42);
        subjects.remove(&qp, 42);
        CHECK(detail::translate_event(e, "rxe0", subjects).object == 0);
    }

    TEST_CASE("SRQ and CQ events name their object") {
        detail::EventSubjects subjects;
        ibv_srq srq{};
        ibv_cq cq{};
        subjects.add(&srq, 7);
        subjects.add(&cq, 8);
        ibv_async_event e = record(IBV_EVENT_SRQ_LIMIT_REACHED);
        e.element.srq = &srq;
        DeviceEvent out = detail::translate_event(e, "rxe1", subjects);
        CHECK(out.type == DeviceEventType::srq_limit_reached);
        CHECK(out.element == EventElement::shared_receive_queue);
        CHECK(out.object == 7);
        CHECK(out.describe().find("post more receives, then arm the limit again") != std::string::npos);
        e = record(IBV_EVENT_SRQ_ERR);
        e.element.srq = &srq;
        CHECK(detail::translate_event(e, "rxe1", subjects).type == DeviceEventType::srq_error);
        e = record(IBV_EVENT_CQ_ERR);
        e.element.cq = &cq;
        out = detail::translate_event(e, "rxe1", subjects);
        CHECK(out.type == DeviceEventType::cq_error);
        CHECK(out.element == EventElement::completion_queue);
        CHECK(out.object == 8);
    }

    TEST_CASE("device fatal is a lost device; an unknown type is reported as unknown with its number") {
        detail::EventSubjects subjects;
        DeviceEvent fatal = detail::translate_event(record(IBV_EVENT_DEVICE_FATAL), "mlx5_1", subjects);
        CHECK(fatal.type == DeviceEventType::device_fatal);
        CHECK(fatal.element == EventElement::device);
        CHECK(fatal.device_lost());
        CHECK(fatal.describe().find("destroy its QueuePairs, CQs, MRs, PD and Device") != std::string::npos);
        // A number ibv_event_type does not list (a newer kernel's), written as the kernel would: raw bytes.
        ibv_async_event newer{};
        const int raw = 99;
        std::memcpy(&newer.event_type, &raw, sizeof raw);
        DeviceEvent odd = detail::translate_event(newer, "mlx5_1", subjects);
        CHECK(odd.type == DeviceEventType::unknown);
        CHECK(odd.native_type == 99);
        CHECK(odd.describe() == "mlx5_1: unknown (event type 99)");
        CHECK(to_string(DeviceEventType::unknown) == "unknown");
        CHECK(to_string(DeviceEventType::device_removed) == "device_removed");
    }

    TEST_CASE("an event concerns no object that is empty, even when its id is unknown (0)") {
        DeviceEvent e;
        e.element = EventElement::queue_pair;
        e.object = 0;
        CHECK_FALSE(e.concerns(QueuePair{}));
        CHECK_FALSE(e.concerns(SharedReceiveQueue{}));
        CHECK_FALSE(e.concerns(CompletionQueue{}));
    }

    TEST_CASE("an empty DeviceEvents refuses every call with a clear error, async_wait included") {
        DeviceEvents empty;
        std::error_code ec;
        CHECK_FALSE(empty.poll(ec));
        CHECK(ec == errc::invalid_argument);
        CHECK_THROWS_WITH(empty.wait_for(std::chrono::milliseconds(1)), doctest::Contains("the DeviceEvents is empty"));
        boost::asio::io_context io;
        boost::system::error_code got;
        int calls = 0;
        empty.async_wait(boost::asio::bind_executor(io, [&](boost::system::error_code e, const DeviceEvent&) {
            got = e;
            ++calls;
        }));
        CHECK(calls == 0); // never inside the initiating call
        io.run_for(std::chrono::seconds(2));
        CHECK(calls == 1);
        CHECK(got == boost::system::error_code(make_error_code(errc::invalid_argument)));
        Device none;
        CHECK_THROWS_WITH(DeviceEvents{none}, doctest::Contains("the Device is empty"));
    }
}
