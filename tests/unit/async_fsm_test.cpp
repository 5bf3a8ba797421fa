// The asynchronous layer's bookkeeping as a pure state machine, without a
// device (as Boost.Redis tests its exec_fsm): ordering under back-pressure,
// retry when slots free, cancellation of waiting and posted operations, abort
// of a queue pair's operations and of everything at shutdown.
#include "gpuverbs/detail/async/async_fsm.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace gpuverbs::detail;

namespace {

// A queue pair stand-in: two work queues with a number of free slots each.
struct FakeQp {
    int send_room = 0;
    int receive_room = 0;
    AsyncWorkQueue send{};
    AsyncWorkQueue receive{};
};
FakeQp with_room(int send, int receive = 0) {
    FakeQp q;
    q.send_room = send;
    q.receive_room = receive;
    return q;
}

struct FakeOp : AsyncOpLinks {
    FakeQp* qp = nullptr;
    bool is_receive = false;
    int id = 0;
};

FakeOp op(FakeQp& qp, int id, bool receive = false) {
    FakeOp o;
    o.qp = &qp;
    o.queue = receive ? &qp.receive : &qp.send;
    o.owner = &qp;
    o.is_receive = receive;
    o.id = id;
    return o;
}

int& room(AsyncOpLinks* l) {
    auto* o = static_cast<FakeOp*>(l);
    return o->is_receive ? o->qp->receive_room : o->qp->send_room;
}

// The driver's part: submit, and post at once when the machine says so (taking a slot).
AsyncFsm::Submit submit(AsyncFsm& fsm, FakeOp& o) {
    const AsyncFsm::Submit s = fsm.submit(&o, room(&o) > 0);
    if (s == AsyncFsm::Submit::post) {
        --room(&o);
        fsm.posted(&o);
    }
    return s;
}

// Slots freed: post what may go now, in the order the machine gives; returns their ids.
std::vector<int> post_ready(AsyncFsm& fsm) {
    std::vector<int> ids;
    fsm.begin_pass();
    while (AsyncOpLinks* l = fsm.next_ready([](AsyncOpLinks* x) { return room(x) > 0; })) {
        --room(l);
        fsm.posted(l);
        ids.push_back(static_cast<FakeOp*>(l)->id);
    }
    return ids;
}

std::vector<int> ids_of(OpList list) {
    std::vector<int> ids;
    while (AsyncOpLinks* l = list.pop_front()) ids.push_back(static_cast<FakeOp*>(l)->id);
    return ids;
}

} // namespace

TEST_SUITE("the asynchronous state machine") {
    TEST_CASE("an operation whose queue has room is posted at once and finished by its completion") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1);
        CHECK(submit(fsm, a) == AsyncFsm::Submit::post);
        CHECK(a.state == OpState::posted);
        CHECK(fsm.outstanding() == 1);
        CHECK(fsm.finished(&a));
        CHECK(a.state == OpState::done);
        CHECK(fsm.outstanding() == 0);
        CHECK(fsm.counters().finished == 1);
    }

    TEST_CASE("a transfer's rail with nothing in flight and no room waits again, behind the waiting ones") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp rail = op(qp, 1), b = op(qp, 2);
        CHECK(submit(fsm, rail) == AsyncFsm::Submit::post);
        CHECK(submit(fsm, b) == AsyncFsm::Submit::wait);
        // The rail's chain completed; other operations hold the queue: it waits again.
        fsm.wait_again(&rail);
        CHECK(rail.state == OpState::waiting);
        CHECK(fsm.outstanding() == 2);
        CHECK(fsm.waiting_count() == 2);
        CHECK(qp.send.waiting == 2);
        qp.send_room = 2;
        CHECK(post_ready(fsm) == std::vector<int>{2, 1}); // in the order they now wait
        // Released with its queue pair while live: aborted once, like any operation.
        CHECK(ids_of(fsm.release(&qp)) == std::vector<int>{2, 1});
        CHECK(fsm.outstanding() == 0);
    }

    TEST_CASE("under back-pressure operations wait and are posted in submission order as slots free") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1), b = op(qp, 2), c = op(qp, 3);
        CHECK(submit(fsm, a) == AsyncFsm::Submit::post);
        CHECK(submit(fsm, b) == AsyncFsm::Submit::wait);
        CHECK(submit(fsm, c) == AsyncFsm::Submit::wait);
        CHECK(post_ready(fsm).empty()); // still no room
        fsm.finished(&a);
        qp.send_room = 1;
        CHECK(post_ready(fsm) == std::vector<int>{2});
        fsm.finished(&b);
        qp.send_room = 2;
        CHECK(post_ready(fsm) == std::vector<int>{3});
        CHECK(fsm.counters().waited == 2);
    }

    TEST_CASE("a new operation does not overtake waiting ones of its queue, even when a slot is free") {
        AsyncFsm fsm;
        FakeQp qp = with_room(0);
        FakeOp a = op(qp, 1), b = op(qp, 2);
        CHECK(submit(fsm, a) == AsyncFsm::Submit::wait);
        qp.send_room = 1; // a slot freed, but the driver has not retried yet
        CHECK(submit(fsm, b) == AsyncFsm::Submit::wait);
        CHECK(post_ready(fsm) == std::vector<int>{1});
    }

    TEST_CASE("a full send queue does not hold back receives of the same queue pair, nor other queue pairs") {
        AsyncFsm fsm;
        FakeQp p = with_room(0, 1), q = with_room(1);
        FakeOp send_p = op(p, 1), recv_p = op(p, 2, true), send_q = op(q, 3);
        CHECK(submit(fsm, send_p) == AsyncFsm::Submit::wait);
        CHECK(submit(fsm, recv_p) == AsyncFsm::Submit::post);
        CHECK(submit(fsm, send_q) == AsyncFsm::Submit::post);
    }

    TEST_CASE("when slots free for one queue only, only its waiting operations go, in order") {
        AsyncFsm fsm;
        FakeQp p, q;
        FakeOp p1 = op(p, 1), q1 = op(q, 2), p2 = op(p, 3), q2 = op(q, 4);
        for (FakeOp* o : {&p1, &q1, &p2, &q2}) CHECK(submit(fsm, *o) == AsyncFsm::Submit::wait);
        q.send_room = 2;
        CHECK(post_ready(fsm) == std::vector<int>{2, 4});
        p.send_room = 1;
        CHECK(post_ready(fsm) == std::vector<int>{1});
        p.send_room = 1;
        CHECK(post_ready(fsm) == std::vector<int>{3});
    }

    TEST_CASE("cancelling a waiting operation takes it out; the ones behind it move up") {
        AsyncFsm fsm;
        FakeQp qp = with_room(0);
        FakeOp a = op(qp, 1), b = op(qp, 2);
        submit(fsm, a);
        submit(fsm, b);
        CHECK(fsm.cancel(&a));
        CHECK(a.state == OpState::done);
        CHECK(qp.send.waiting == 1);
        qp.send_room = 1;
        CHECK(post_ready(fsm) == std::vector<int>{2});
        CHECK(fsm.counters().cancelled == 1);
    }

    TEST_CASE("a posted operation cannot be cancelled: it stays until its completion") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1);
        submit(fsm, a);
        CHECK_FALSE(fsm.cancel(&a));
        CHECK(a.state == OpState::posted);
        CHECK(fsm.finished(&a));
    }

    TEST_CASE("a cancellation after the operation finished changes nothing") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1);
        submit(fsm, a);
        fsm.finished(&a);
        CHECK_FALSE(fsm.cancel(&a));
        CHECK(fsm.counters().cancelled == 0);
    }

    TEST_CASE("releasing a queue pair aborts its posted and waiting operations and leaves the others") {
        AsyncFsm fsm;
        FakeQp p = with_room(1), q = with_room(1);
        FakeOp p_posted = op(p, 1), p_waiting = op(p, 2), q_posted = op(q, 3), p_recv = op(p, 4, true);
        submit(fsm, p_posted);
        submit(fsm, p_waiting);
        submit(fsm, q_posted);
        submit(fsm, p_recv); // no receive room: waits
        CHECK(ids_of(fsm.release(&p)) == std::vector<int>{1, 2, 4});
        CHECK(p.send.waiting == 0);
        CHECK(p.receive.waiting == 0);
        CHECK(fsm.outstanding() == 1);
        CHECK(fsm.finished(&q_posted));
        CHECK(fsm.counters().aborted == 3);
    }

    TEST_CASE("a completion of an operation already aborted is ignored") {
        AsyncFsm fsm;
        FakeQp p = with_room(1);
        FakeOp a = op(p, 1);
        submit(fsm, a);
        CHECK(ids_of(fsm.release(&p)) == std::vector<int>{1});
        CHECK_FALSE(fsm.finished(&a));
        CHECK(fsm.counters().finished == 0);
    }

    TEST_CASE("shutdown aborts everything, posted first, and every later submission") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1), b = op(qp, 2), c = op(qp, 3);
        submit(fsm, a);
        submit(fsm, b);
        CHECK(ids_of(fsm.shutdown()) == std::vector<int>{1, 2});
        CHECK(fsm.outstanding() == 0);
        CHECK(qp.send.waiting == 0);
        CHECK(fsm.closed());
        CHECK(submit(fsm, c) == AsyncFsm::Submit::abort);
        CHECK(c.state == OpState::done);
    }

    TEST_CASE("a refused post leaves the operation done and the machine empty") {
        AsyncFsm fsm;
        FakeQp qp = with_room(1);
        FakeOp a = op(qp, 1);
        REQUIRE(fsm.submit(&a, true) == AsyncFsm::Submit::post);
        fsm.post_failed(&a);
        CHECK(a.state == OpState::done);
        CHECK(fsm.outstanding() == 0);
        CHECK(fsm.counters().aborted == 1);
    }

    TEST_CASE("forty blocked queues do not hide a ready operation behind them") {
        AsyncFsm fsm;
        std::vector<FakeQp> qps(41);
        std::vector<FakeOp> ops;
        ops.reserve(82);
        for (int round = 0; round < 2; ++round) {
            for (int i = 0; i < 41; ++i) ops.push_back(op(qps[static_cast<std::size_t>(i)], round * 100 + i));
        }
        for (auto& o : ops) CHECK(submit(fsm, o) == AsyncFsm::Submit::wait);
        qps[40].send_room = 2; // only the last queue, behind forty full ones
        CHECK(post_ready(fsm) == std::vector<int>{40, 140});
        CHECK(fsm.waiting_count() == 80);
    }

    TEST_CASE("a cancellation between two retry passes leaves the next pass correct") {
        AsyncFsm fsm;
        FakeQp qp;
        FakeOp a = op(qp, 1), b = op(qp, 2);
        submit(fsm, a);
        submit(fsm, b);
        CHECK(post_ready(fsm).empty());
        CHECK(fsm.cancel(&a));
        qp.send_room = 1;
        CHECK(post_ready(fsm) == std::vector<int>{2});
    }
}
