"""Every operation from Python on real Soft-RoCE devices, synchronous and on
asyncio, verified byte for byte; many operations on one loop; cancellation;
the errors, in the library's words."""

from __future__ import annotations

import asyncio
import struct
import time

import numpy as np
import pytest

import gpuverbs as gv

RW = gv.Access.local_write | gv.Access.remote_write
ALL = RW | gv.Access.remote_read | gv.Access.remote_atomic


def pattern(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 131 + seed) % 251).astype(np.uint8)


def test_write_and_read_move_every_byte(pair):
    src = pattern(1 << 20, 3)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    back = np.zeros(1 << 20, dtype=np.uint8)
    rs = pair.a.pd.register(src, gv.Access.local_write)
    rd = pair.b.pd.register(dst, ALL)
    rb = pair.a.pd.register(back, gv.Access.local_write)
    assert pair.qp_a.write(rs.slice(4096, 65536), rd.remote(), 8192).wait() == 65536
    assert (dst[8192:8192 + 65536] == src[4096:4096 + 65536]).all()
    assert (dst[:8192] == 0).all() and (dst[8192 + 65536:] == 0).all()
    assert pair.qp_a.write(rs, rd.remote()).wait() == 1 << 20
    assert pair.qp_a.read(rb, rd.remote()).wait() == 1 << 20
    assert (back == src).all()


def test_send_receive_and_immediates(pair):
    msg = pattern(3000, 9)
    inbox = np.zeros(4096, dtype=np.uint8)
    rin = pair.b.pd.register(inbox, RW)
    rmsg = pair.a.pd.register(msg, gv.Access.local_write)
    got = pair.qp_b.receive(rin)
    assert pair.qp_a.send(rmsg).wait() == 3000
    r = got.wait()
    assert (r.bytes, r.immediate) == (3000, None)
    assert (inbox[:3000] == msg).all()

    got = pair.qp_b.receive(rin)
    pair.qp_a.send_with_imm(rmsg.slice(0, 100), 0xDEADBEEF).wait()
    r = got.wait()
    assert (r.bytes, r.immediate) == (100, 0xDEADBEEF)

    got = pair.qp_b.receive(rin.slice(0, 0))
    target = np.zeros(4096, dtype=np.uint8)
    rt = pair.b.pd.register(target, RW)
    pair.qp_a.write_with_imm(rmsg.slice(0, 512), rt.remote(), 1024, 77).wait()
    r = got.wait()
    assert r.immediate == 77  # bytes: the write's length on rxe (the wc byte_len)
    assert (target[1024:1536] == msg[:512]).all()


def test_atomics_hand_back_the_old_value(pair):
    counter = np.zeros(2, dtype=np.uint64)
    counter[0] = 40
    rc = pair.b.pd.register(counter, ALL)
    result = np.zeros(1, dtype=np.uint64)
    rr = pair.a.pd.register(result, gv.Access.local_write)
    assert pair.qp_a.fetch_add(rr, rc.remote(), 0, 2).wait() == 40
    assert counter[0] == 42 and result[0] == 40
    assert pair.qp_a.compare_swap(rr, rc.remote(), 0, 42, 7).wait() == 42
    assert counter[0] == 7
    assert pair.qp_a.compare_swap(rr, rc.remote(), 0, 1, 9).wait() == 7
    assert counter[0] == 7


def test_awaited_operations_complete_on_the_running_loop(pair):
    src = pattern(65536, 1)
    dst = np.zeros(65536, dtype=np.uint8)
    rs = pair.a.pd.register(src, gv.Access.local_write)
    rd = pair.b.pd.register(dst, ALL)

    async def main():
        assert await pair.qp_a.write(rs, rd.remote()) == 65536
        back = np.zeros(65536, dtype=np.uint8)
        assert await pair.qp_a.read(pair.a.pd.register(back, gv.Access.local_write), rd.remote()) == 65536
        return back

    back = asyncio.run(main())
    assert (dst == src).all() and (back == src).all()
    stats = pair.a.cq.statistics
    assert stats["wakeups"] > 0, "completions must arrive through the completion channel, not a busy poll"


def test_many_concurrent_operations_on_one_loop(pair):
    n, size = 400, 4096
    src = pattern(n * size, 5)
    dst = np.zeros(n * size, dtype=np.uint8)
    inbox = np.zeros(n * 64, dtype=np.uint8)
    rs = pair.a.pd.register(src, gv.Access.local_write)
    rd = pair.b.pd.register(dst, RW)
    rin = pair.b.pd.register(inbox, RW)

    async def main():
        receives = [pair.qp_b.receive(rin.slice(i * 64, 64)) for i in range(n)]
        writes = [pair.qp_a.write(rs.slice(i * size, size), rd.remote(), i * size) for i in range(n)]
        sends = [pair.qp_a.send_with_imm(rs.slice(i * 64, 64), i) for i in range(n)]
        results = await asyncio.gather(*writes, *sends)
        got = await asyncio.gather(*receives)
        return results, got

    results, got = asyncio.run(main())
    assert results == [size] * n + [64] * n
    assert sorted(r.immediate for r in got) == list(range(n))
    assert (dst == src).all()


def test_a_task_cancelled_before_its_receive_arrives_leaves_it_posted_and_the_memory_held(pair):
    inbox = np.zeros(256, dtype=np.uint8)
    rin = pair.b.pd.register(inbox, RW)
    msg = pair.a.pd.register(pattern(256, 2), gv.Access.local_write)

    async def main():
        op = pair.qp_b.receive(rin)
        task = asyncio.ensure_future(op)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not op.done  # posted: the device cannot be recalled, it completes
        await pair.qp_a.send(msg)
        for _ in range(200):
            if op.done:
                break
            await asyncio.sleep(0.01)
        return op

    op = asyncio.run(main())
    assert op.done and op.result().bytes == 256
    assert (inbox == pattern(256, 2)).all()


def test_operations_waiting_for_room_are_aborted_by_cancellation(context, sides):
    from conftest import connect_pair

    a, b = sides
    qp_a, qp_b = connect_pair(context, a, b, max_recv_wr=4)
    rin = b.pd.register(np.zeros(4096, dtype=np.uint8), RW)

    async def main():
        ops = [qp_b.receive(rin.slice(i * 8, 8)) for i in range(8)]  # 4 posted, 4 waiting for room
        tasks = [asyncio.ensure_future(op) for op in ops]
        await asyncio.sleep(0.05)
        for t in tasks[4:]:
            t.cancel()
        await asyncio.sleep(0.05)
        return ops

    ops = asyncio.run(main())
    waiting = ops[4:]
    for op in waiting:
        assert op.done
        with pytest.raises(gv.Aborted, match="async_receive"):
            op.result()
    assert qp_b.outstanding_receives == 4
    qp_b.close()
    for op in ops[:4]:
        with pytest.raises(gv.Aborted):
            op.wait(timeout=10)


def test_refused_requests_and_failed_completions_raise_the_librarys_words(pair):
    src = pair.a.pd.register(np.zeros(64, dtype=np.uint8), gv.Access.local_write)
    dst = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)
    with pytest.raises(gv.RequestRefused) as caught:
        pair.qp_a.write(src, dst.remote(), 32).wait()
    assert caught.value.code == gv.Errc.remote_range_outside_region
    assert "the remote range is not inside the remote memory it came from; nothing was posted" in str(caught.value)

    result = pair.a.pd.register(np.zeros(4, dtype=np.uint8), gv.Access.local_write)
    with pytest.raises(gv.RequestRefused) as caught:
        pair.qp_a.fetch_add(result, dst.remote(), 0, 1).wait()
    assert caught.value.code == gv.Errc.misaligned_atomic

    no_rights = gv.RemoteMemory(dst.remote().address, 64, dst.rkey + 1)
    assert pair.qp_a.failure is None
    with pytest.raises(gv.CompletionError) as caught:
        pair.qp_a.write(src, no_rights).wait(timeout=10)
    assert caught.value.category == "work completion"
    assert caught.value.verb == "async_write"
    # The queue pair says why it no longer works, and since when.
    failure = pair.qp_a.failure
    assert failure is not None and failure["cause"] == "completion_failed", failure
    assert "remote access error" in failure["status"], failure
    assert 0 <= time.monotonic() - failure["since"] < 10, failure
    assert "a work completion failed" in failure["description"], failure

    with pytest.raises(ValueError, match=r"remote_offset must not be negative \(got -1\)"):
        pair.qp_a.write(src, dst.remote(), -1)
    with pytest.raises(ValueError, match=r"immediate must be a 32-bit unsigned value"):
        pair.qp_a.send_with_imm(src, 1 << 40)
    with pytest.raises(TypeError, match=r"local must be a gpuverbs.MemoryRegion or a LocalBuffer"):
        pair.qp_a.write(b"bytes", dst.remote())


def test_an_awaited_failure_raises_in_the_task(pair):
    src = pair.a.pd.register(np.zeros(64, dtype=np.uint8), gv.Access.local_write)
    dst = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)

    async def main():
        await pair.qp_a.write(src, dst.remote(), 60)

    with pytest.raises(gv.RequestRefused, match="nothing was posted"):
        asyncio.run(main())


def test_closing_a_queue_pair_aborts_what_it_holds(pair):
    rin = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)
    op = pair.qp_b.receive(rin)
    pair.qp_b.close()
    pair.qp_b.close()
    with pytest.raises(gv.Aborted):
        op.wait(timeout=10)
    with pytest.raises(ValueError, match="the QueuePair is closed"):
        pair.qp_b.receive(rin)


def test_wait_with_a_timeout_says_the_operation_is_still_in_flight(pair):
    rin = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)
    op = pair.qp_b.receive(rin)
    with pytest.raises(gv.TimeoutError, match="still in flight"):
        op.wait(timeout=0.05)
    pair.qp_a.send(pair.a.pd.register(struct.pack("<Q", 5) * 8, gv.Access.none)).wait()
    assert op.wait(timeout=10).bytes == 64


def test_closing_a_queue_pair_wakes_the_task_awaiting_it(pair):
    rin = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)

    async def main():
        waiting = asyncio.ensure_future(pair.qp_b.receive(rin))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        pair.qp_b.close()  # nothing completes on the wire: the loop must still learn of the abort
        with pytest.raises(gv.Aborted):
            await asyncio.wait_for(waiting, 10)

    asyncio.run(main())


def test_an_operation_is_awaited_by_one_task_only(pair):
    rin = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)

    async def main():
        op = pair.qp_b.receive(rin)
        first = asyncio.ensure_future(op)
        await asyncio.sleep(0.01)
        with pytest.raises(ValueError, match="already awaited by another task"):
            await op
        await pair.qp_a.send(pair.a.pd.register(np.ones(64, dtype=np.uint8), gv.Access.local_write))
        return (await first).bytes

    assert asyncio.run(main()) == 64


def test_a_completion_reached_by_another_threads_wait_is_handed_to_the_loop(pair):
    import threading

    rin = pair.b.pd.register(np.zeros(64, dtype=np.uint8), RW)
    src = pair.a.pd.register(np.ones(64, dtype=np.uint8), gv.Access.local_write)

    async def main():
        op = pair.qp_b.receive(rin)
        waiting = asyncio.ensure_future(op)
        await asyncio.sleep(0.01)
        # Another thread drives the same context: the receive's handler runs there.
        t = threading.Thread(target=lambda: pair.qp_a.send(src).wait(timeout=10))
        t.start()
        await asyncio.to_thread(t.join)
        return (await asyncio.wait_for(waiting, 10)).bytes

    assert asyncio.run(main()) == 64
