"""Bounds kept by the library from Python's asyncio loop, without the
program calling Context.poll(): the library's own timers (the liveness
watch, a transfer's deadline, the notification's bound) run on the loop
because the context's descriptor also wakes it while operations are awaited.
GPUVERBS_BOUNDS_RUNS=N repeats each case N times (the 20-in-a-row check)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

import numpy as np
import pytest

import gpuverbs as gv

RUNS = int(os.environ.get("GPUVERBS_BOUNDS_RUNS", "1"))
EVERYTHING = gv.Access.remote_write | gv.Access.remote_read | gv.Access.remote_atomic


def connected(sides: Any, **options: int) -> tuple[Any, Any]:
    """A queue pair per side, connected with ``options`` (timeout, retry counts)."""
    a, b = sides
    pa = gv.PreparedQueuePair(a.pd, a.cq)
    pb = gv.PreparedQueuePair(b.pd, b.cq)
    ea, eb = pa.endpoint, pb.endpoint
    return (pa.connect(eb, remote_access=int(EVERYTHING), **options),
            pb.connect(ea, remote_access=int(EVERYTHING), **options))


@pytest.mark.parametrize("run", range(RUNS))
def test_an_awaited_write_only_the_watch_can_end_ends_without_poll(sides, run):
    # retry_count 7: Soft-RoCE retries for ever, so only the library's watch ends the write.
    qp_a, qp_b = connected(sides, timeout=12, retry_count=7)
    a, b = sides
    src = a.pd.register(np.ones(4096, dtype=np.uint8), gv.Access.local_write)
    dst = b.pd.register(np.zeros(4096, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    target = dst.remote()
    qp_b.close()  # the peer is gone: nothing answers

    async def main() -> tuple[BaseException, float]:
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(qp_a.write(src.slice(0, 4096), target), 30)
        except gv.Error as e:
            return e, time.monotonic() - t0
        raise AssertionError("the write to a destroyed queue pair succeeded")

    error, took = asyncio.run(main())
    assert qp_a.failure is not None and qp_a.failure["cause"] == "stalled", qp_a.failure
    # The stall bound (2 x 8 x 16.8 ms + 0.5 s), two ticks, the flush grace, and a second for the rig.
    assert took < 2 * 8 * 0.0168 + 0.5 + 0.1 + 0.25 + 1.0, (took, str(error))


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("bound", ["timeout", "notification_timeout", "cancel"])
def test_an_awaited_transfer_whose_notification_is_never_taken_ends_at_its_bound(sides, bound, run):
    # rnr_retry_count 7 and retry_count 7: nothing in the provider ends the wait for the peer's receive.
    qp_a, _qp_b = connected(sides, retry_count=7, rnr_retry_count=7)
    a, b = sides
    src = a.pd.register(np.ones(8192, dtype=np.uint8), gv.Access.local_write)
    dst = b.pd.register(np.zeros(8192, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    plan = gv.TransferPlan("write", gv.LocalBlocks(src, [0, 4096], 4096),
                           gv.RemoteBlocks(dst.remote(), [0, 4096], 4096), qp_a)

    async def main() -> tuple[BaseException, float]:
        t0 = time.monotonic()
        if bound == "timeout":
            op = gv.transfer(qp_a, plan, notify=5, timeout=1.0, notification_timeout=0)
        elif bound == "notification_timeout":
            op = gv.transfer(qp_a, plan, notify=5, notification_timeout=1.0)
        else:
            op = gv.transfer(qp_a, plan, notify=5, notification_timeout=0)
        task = asyncio.ensure_future(op)
        if bound == "cancel":
            await asyncio.sleep(1.0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            # The task is cancelled at once; the operation ends as the library ends it.
            while not op.done and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.01)
            try:
                op.result()
            except gv.Error as e:
                return e, time.monotonic() - t0
            raise AssertionError("the cancelled transfer succeeded")
        try:
            await asyncio.wait_for(task, 30)
        except gv.Error as e:
            return e, time.monotonic() - t0
        raise AssertionError("a transfer whose notification nobody took succeeded")

    error, took = asyncio.run(main())
    assert "before the peer took the notification" in str(error), str(error)
    if bound == "cancel":
        assert isinstance(error, gv.Aborted), repr(error)
    else:
        assert isinstance(error, gv.TimeoutError), repr(error)
    assert qp_a.failure is not None and qp_a.failure["cause"] == "notification_not_taken", qp_a.failure
    assert took < 1.0 + 0.1 + 0.25 + 1.0, took  # the bound, two ticks, the flush grace, a second for the rig


def fault(what: str) -> None:
    injector = os.environ.get("GPUVERBS_TEST_FAULTS", "")
    if not injector:
        pytest.skip("needs the rig's fault injector (GPUVERBS_TEST_FAULTS)")
    subprocess.run([injector, *what.split()], check=True, capture_output=True)


@pytest.mark.parametrize("run", range(RUNS))
def test_an_awaited_receive_the_provider_never_completes_ends_without_poll(sides, run):
    # A write with a key the peer never gave: both queue pairs go to ERROR; rxe then never
    # completes a receive posted on b's. Only the watch ends it: 2 ticks + the flush grace.
    qp_a, qp_b = connected(sides)
    a, b = sides
    src = a.pd.register(np.ones(4096, dtype=np.uint8), gv.Access.local_write)
    dst = b.pd.register(np.zeros(4096, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    wrong = gv.RemoteMemory(dst.remote().address, dst.length, dst.rkey ^ 0x00A5A500)

    async def main() -> float:
        with pytest.raises(gv.Error):
            await asyncio.wait_for(qp_a.write(src.slice(0, 4096), wrong), 30)
        t0 = time.monotonic()
        with pytest.raises(gv.Error) as caught:
            await asyncio.wait_for(qp_b.receive(dst.slice(0, 64)), 30)
        assert caught.value.code == gv.Errc.queue_pair_in_error, repr(caught.value)
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert took < 2 * 0.05 + 0.25 + 1.0, took


@pytest.mark.parametrize("run", range(RUNS))
def test_an_awaited_transfer_whose_only_link_goes_down_ends_without_poll(sides, run):
    # 32 MiB over one rail, its link down ~0.3 s in: the port is seen down twice (3 ticks) + the grace.
    qp_a, _qp_b = connected(sides)
    a, b = sides
    size = 32 << 20
    src = a.pd.register(np.ones(size, dtype=np.uint8), gv.Access.local_write)
    dst = b.pd.register(np.zeros(size, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    plan = gv.TransferPlan("write", gv.LocalBlocks(src, np.arange(512, dtype=np.uint64) * 65536, 65536),
                           gv.RemoteBlocks(dst.remote(), np.arange(512, dtype=np.uint64) * 65536, 65536), qp_a)

    async def main() -> tuple[BaseException, float]:
        op = gv.transfer(qp_a, plan, notify=3)
        await asyncio.sleep(0.3)
        if op.done:
            pytest.skip("the transfer ended before the fault (the rig was fast): nothing to judge")
        fault("link-down")
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(op, 30)
        except gv.Error as e:
            return e, time.monotonic() - t0
        finally:
            fault("link-up")
        raise AssertionError("the transfer succeeded over a link that was down")

    error, took = asyncio.run(main())
    assert took < 3 * 0.05 + 0.25 + 1.0, (took, str(error))
