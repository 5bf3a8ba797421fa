// The completion path without a device: work-completion statuses as error
// codes, the CQ's registry that a wr_id leads into (index and generation, so
// a destroyed QP's completions are recognised), and turning an ibv_wc into a
// Completion.
#include "gpuverbs/detail/data_path/completion_path.hpp"
#include "gpuverbs/detail/verbs/queue_cores.hpp"

#include <thread>

#include <doctest/doctest.h>

#include <arpa/inet.h>

using namespace gpuverbs;

TEST_SUITE("completions") {
    TEST_CASE("every work-completion status has a name and an explanation") {
        for (int s = IBV_WC_SUCCESS; s <= IBV_WC_TM_RNDV_INCOMPLETE; ++s) {
            std::error_code ec(s, wc_category());
            std::string m = ec.message();
            CAPTURE(m);
            const std::string name = ibv_wc_status_str(static_cast<ibv_wc_status>(s));
            CHECK(m.find(name) == 0);
            CHECK(m.find("unknown work completion status") == std::string::npos);
            // Its words once: never "remote access error: remote access error: …".
            CHECK(m.find(name, name.size()) == std::string::npos);
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
        Completion c;
        c.context = 77;
        detail::translate(wc, nullptr, c);
        CHECK(c.opcode == Opcode::unknown);
        CHECK(c.context == 0);
        CHECK(c.status == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        CHECK(c.qp_num == 9);
        CHECK_FALSE(c.ok());
    }

    TEST_CASE("immediate data comes back in host byte order on receives, and is cleared when absent") {
        detail::WorkQueueState q(4);
        q.record(0, 1, Opcode::receive);
        q.record(1, 2, Opcode::receive);
        q.commit(2);
        ibv_wc wc{};
        wc.wr_id = detail::WrId::encode(detail::QueueKind::receive, 0, 0);
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = IBV_WC_RECV;
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = htonl(0xa1b2c3d4);
        Completion c;
        detail::translate(wc, &q, c);
        CHECK(c.immediate == 0xa1b2c3d4u);
        wc.wr_id = detail::WrId::encode(detail::QueueKind::receive, 0, 1);
        wc.wc_flags = 0;
        detail::translate(wc, &q, c); // the same Completion reused by the next poll
        CHECK_FALSE(c.immediate.has_value());
    }

    TEST_CASE("the sender's own write-with-immediate completion carries no immediate, though rxe flags one") {
        detail::WorkQueueState q(2);
        q.record(0, 9, Opcode::write_with_imm);
        q.commit(1);
        ibv_wc wc{};
        wc.wr_id = detail::WrId::encode(detail::QueueKind::send, 0, 0);
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = IBV_WC_RDMA_WRITE;
        wc.wc_flags = IBV_WC_WITH_IMM; // as rxe reports it, with imm_data 0
        Completion c;
        detail::translate(wc, &q, c);
        CHECK(c.opcode == Opcode::write_with_imm);
        CHECK_FALSE(c.immediate.has_value());
        // A destroyed QP's completion: whose it was is unknown, so no immediate either.
        detail::translate(wc, nullptr, c);
        CHECK_FALSE(c.immediate.has_value());
    }

    TEST_CASE("a completion gives back the context and operation recorded in its slot, even on error") {
        detail::WorkQueueState q(4);
        q.record(0, 1001, Opcode::write);
        q.record(1, 1002, Opcode::read);
        q.commit(2);
        ibv_wc wc{};
        wc.wr_id = detail::WrId::encode(detail::QueueKind::send, detail::WrId::tag(3, 1), 1); // the second request
        wc.status = IBV_WC_REM_ACCESS_ERR;
        wc.opcode = IBV_WC_SEND; // undefined on errors: never used
        Completion c;
        detail::translate(wc, &q, c);
        CHECK(c.context == 1002);
        CHECK(c.opcode == Opcode::read);
        CHECK(c.status == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK(q.outstanding() == 0); // a later completion retires the earlier, unsignaled slot too
    }

    TEST_CASE("a successful status is the empty error code, equal to a default one") {
        ibv_wc wc{};
        wc.status = IBV_WC_SUCCESS;
        Completion c;
        c.status = CompletionStatus(IBV_WC_GENERAL_ERR);
        detail::translate(wc, nullptr, c);
        CHECK(c.ok());
        CHECK(c.status == std::error_code());
        CHECK(c.status.category() == std::system_category());
        CHECK_FALSE(static_cast<bool>(c.status));
    }

    TEST_CASE("a failed status keeps the device's value and becomes the work-completion error code on demand") {
        ibv_wc wc{};
        wc.status = IBV_WC_RETRY_EXC_ERR;
        Completion c;
        detail::translate(wc, nullptr, c);
        CHECK_FALSE(c.ok());
        CHECK(c.status.raw() == IBV_WC_RETRY_EXC_ERR);
        const std::error_code ec = c.status;
        CHECK(ec == make_wc_error(IBV_WC_RETRY_EXC_ERR));
        CHECK(ec.category() == wc_category());
        CHECK(c.status.value() == static_cast<int>(IBV_WC_RETRY_EXC_ERR));
        CHECK(c.status.message() == ec.message());
        CHECK(c.status == CompletionStatus(IBV_WC_RETRY_EXC_ERR));
        CHECK_FALSE(c.status == std::error_code());
    }

    TEST_CASE("a receive completed by a write with immediate is reported as receive_with_imm") {
        detail::WorkQueueState q(2);
        q.record(0, 5, Opcode::receive);
        q.commit(1);
        ibv_wc wc{};
        wc.wr_id = detail::WrId::encode(detail::QueueKind::receive, 0, 0);
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
        Completion c;
        detail::translate(wc, &q, c);
        CHECK(c.opcode == Opcode::receive_with_imm);
        CHECK(c.context == 5);
    }
}

TEST_SUITE("the completion queue's registry of queue pairs") {
    // The registry only stores and compares pointers: stand-ins need no device.
    detail::QpCore* fake(std::uintptr_t n) {
        return reinterpret_cast<detail::QpCore*>(n * 64); // NOLINT(performance-no-int-to-ptr)
    }

    TEST_CASE("a registered QP is found by the index and generation its wr_ids carry") {
        detail::QpRegistry r;
        const std::uint32_t a = r.add(fake(1)), b = r.add(fake(2));
        detail::QpRegistry::PollGuard guard(r);
        using detail::WrId;
        const auto id_a = WrId::encode(detail::QueueKind::send, a, 0),
                   id_b = WrId::encode(detail::QueueKind::send, b, 0);
        CHECK(r.find(WrId::index(id_a), WrId::generation(id_a)) == fake(1));
        CHECK(r.find(WrId::index(id_b), WrId::generation(id_b)) == fake(2));
        CHECK(r.find(WrId::index(id_a), WrId::generation(id_a) + 1) == nullptr);
        CHECK(r.find(4000, 1) == nullptr); // never registered
    }

    TEST_CASE("after a QP is removed, its completions find nothing, even once its index is reused") {
        detail::QpRegistry r;
        const std::uint32_t old_tag = r.add(fake(1));
        r.remove(old_tag);
        const std::uint32_t new_tag = r.add(fake(2));
        using detail::WrId;
        const auto stale = WrId::encode(detail::QueueKind::receive, old_tag, 7);
        const auto fresh = WrId::encode(detail::QueueKind::receive, new_tag, 7);
        CHECK(WrId::index(stale) == WrId::index(fresh)); // the index was reused
        detail::QpRegistry::PollGuard guard(r);
        CHECK(r.find(WrId::index(stale), WrId::generation(stale)) == nullptr);
        CHECK(r.find(WrId::index(fresh), WrId::generation(fresh)) == fake(2));
    }

    TEST_CASE("removing a QP waits for a poll in progress to finish") {
        detail::QpRegistry r;
        const std::uint32_t tag = r.add(fake(1));
        std::atomic<bool> removed{false};
        std::thread remover;
        {
            detail::QpRegistry::PollGuard guard(r);
            remover = std::thread([&] {
                r.remove(tag);
                removed = true;
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            CHECK_FALSE(removed.load()); // still polling: the QP must not go away yet
        }
        remover.join();
        CHECK(removed.load());
    }

    TEST_CASE("QPs beyond the first chunk get their own indices") {
        detail::QpRegistry r;
        std::vector<std::uint32_t> tags;
        for (std::uintptr_t i = 1; i <= 600; ++i) tags.push_back(r.add(fake(i)));
        detail::QpRegistry::PollGuard guard(r);
        for (std::uintptr_t i = 1; i <= 600; ++i) {
            const std::uint32_t t = tags[i - 1];
            CHECK(r.find(t & 0xffff, t >> 16) == fake(i));
        }
    }
}
