"""gpuverbs.DeviceQueue without a GPU: a host queue carries a producer
thread's requests to the reader (take / complete), its waits end with the
reader's word, bad arguments are refused in words, and the kernel headers a
Python-compiled kernel includes are in the package. (On the GPU machine,
tests/python/gpu/test_gpu.py pushes from a CuPy kernel.)"""

from __future__ import annotations

import os
import threading
import time

import pytest

import gpuverbs as gv


def test_a_host_queue_carries_requests_from_a_producer_thread_to_the_reader():
    q = gv.DeviceQueue.on_host(4)  # 16 slots: 100 requests wrap it six times
    assert q.capacity == 16
    assert q.gpu == -1
    slots, producer, proxy, log2 = q.view
    assert slots and producer and proxy and log2 == 4
    results = []

    def produce():
        for i in range(100):
            results.append(q.push("put", peer=1, src_window=2, src_offset=i * 64, dst_window=3,
                                  dst_offset=i * 128, bytes=64, timeout=10.0))
        results.append(q.push("signal", peer=1, signal_window=4, signal_offset=8, signal_value=100,
                              signal_op="add", timeout=10.0))
        results.append(q.quiet(timeout=10.0))

    t = threading.Thread(target=produce)
    t.start()
    got = []
    while len(got) < 101:
        r = q.take()
        if r is None:
            continue
        got.append(r)
        q.complete(q.taken)  # done at once: the producer may reuse the slot
    t.join()
    assert results == ["done"] * 102
    for i, r in enumerate(got[:100]):
        assert r == {"position": i, "op": "put", "peer": 1, "src_window": 2, "src_offset": i * 64, "dst_window": 3,
                     "dst_offset": i * 128, "bytes": 64, "signal_window": 0, "signal_offset": 0,
                     "signal_value": 0, "signal_op": "set"}
    assert got[100]["op"] == "signal" and got[100]["signal_op"] == "add" and got[100]["signal_value"] == 100
    assert q.take() is None
    assert q.taken == 101


def test_a_failed_queue_ends_the_producers_waits_with_the_readers_word():
    for why, result in (("peer_failed", "peer_failed"), ("closed", "queue_closed"), ("refused", "refused")):
        q = gv.DeviceQueue.on_host(2)
        assert q.push("put", bytes=8) == "done"
        q.fail(why)
        assert q.quiet(timeout=5.0) == result


def test_a_full_ring_nobody_reads_times_out_and_leaves_no_hole():
    q = gv.DeviceQueue.on_host(1)
    assert q.push("put") == "done"
    assert q.push("put") == "done"
    assert q.push("put", timeout=0.05) == "timed_out"
    assert q.quiet(timeout=0.05) == "timed_out"
    assert q.take()["position"] == 0
    assert q.take()["position"] == 1
    # The push that timed out took position 2 and gave it up: the reader skips it once its slot is free.
    assert q.take() is None
    q.complete(q.taken)
    assert q.take() == {"position": 2, "op": "skipped"}
    assert q.take() is None
    q.complete(q.taken)
    assert q.push("put", timeout=1.0) == "done"
    assert q.take()["position"] == 3


def test_a_push_into_a_closed_queue_returns_its_code_at_once_even_with_free_slots():
    q = gv.DeviceQueue.on_host(4)
    q.fail("closed")
    assert q.push("put", timeout=30.0) == "queue_closed"
    assert q.take() == {"position": 0, "op": "skipped"}


def test_bad_arguments_are_refused_in_words():
    q = gv.DeviceQueue.on_host(3)
    with pytest.raises(ValueError, match="op is 'get': give 'put', 'put_signal', 'signal' or 'fence'"):
        q.push("get")
    with pytest.raises(ValueError, match="signal_op is 'mul': give 'set' or 'add'"):
        q.push("signal", signal_op="mul")
    with pytest.raises(ValueError, match="timeout is -1"):
        q.quiet(timeout=-1)
    with pytest.raises(ValueError, match=r"complete\(5\): only 0 requests were taken"):
        q.complete(5)
    with pytest.raises(ValueError, match="fail\\('broken'\\): give 'peer_failed', 'closed' or 'refused'"):
        q.fail("broken")
    with pytest.raises(gv.Error) as e:
        gv.DeviceQueue.on_host(21)
    assert e.value.code == gv.Errc.invalid_argument
    assert "a device queue holds 2^0 to 2^20 slots; 2^21 asked" in str(e.value)


def test_a_gpu_queue_without_a_gpu_is_refused_as_listing_gpus_is():
    try:
        gv.DeviceQueue.on_gpu(0, 10)
    except gv.Error as e:
        assert "libcuda.so.1" in str(e) or "no GPU" in str(e) or "without CUDA" in str(e), str(e)
    else:
        pytest.skip("this machine has a GPU: tests/python/gpu/test_gpu.py covers it")


def test_the_kernel_headers_are_in_the_package():
    include = gv.device_queue_include_dir()
    for header in ("device.cuh", "ring.hpp"):
        assert os.path.isfile(os.path.join(include, "gpuverbs", "device_queue", header))
    text = open(os.path.join(include, "gpuverbs", "device_queue", "device.cuh")).read()
    assert "queue_view(unsigned long long slots" in text


def test_the_packaged_kernel_headers_are_the_bytes_the_library_was_built_from():
    # The joint of the two halves: a kernel compiled from Python against the package's headers must push
    # exactly the descriptors the library's proxy decodes.
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
    if not os.path.isdir(os.path.join(repo, "gpuverbs", "device_queue")):
        pytest.skip("not run from a source tree")
    for header in ("device.cuh", "ring.hpp"):
        packaged = os.path.join(gv.device_queue_include_dir(), "gpuverbs", "device_queue", header)
        source = os.path.join(repo, "gpuverbs", "device_queue", header)
        with open(packaged, "rb") as a, open(source, "rb") as b:
            assert a.read() == b.read(), f"{header}: the package's copy differs from include/ (rebuild)"


# --- gpuverbs.DeviceQueueProxy: the NIC half, on the rig's two devices -------------------------

def _proxy_pair(pair, blocks, block):  # type: ignore[no-untyped-def]
    """A host queue, a proxy on side a posting to side b: source, destination and signal regions."""
    source = bytearray(os.urandom(blocks * block))
    dest = bytearray(blocks * block)
    signals = bytearray(64)
    src_region = pair.a.pd.register(source)
    dst_region = pair.b.pd.register(dest, gv.Access.local_write | gv.Access.remote_write)
    sig_region = pair.b.pd.register(signals, gv.Access.local_write | gv.Access.remote_write
                                    | gv.Access.remote_atomic)
    q = gv.DeviceQueue.on_host(6)  # 64 slots: the puts wrap it
    proxy = gv.DeviceQueueProxy(q, pair.a.pd, pair.a.cq)
    proxy.add_window(1, src_region)
    proxy.add_peer(0, pair.qp_a, {2: dst_region.remote(), 3: sig_region.remote()})
    return q, proxy, source, dest, signals, (src_region, dst_region, sig_region)


def test_a_proxy_driven_on_asyncio_posts_a_producer_threads_puts_and_signal_every_byte_checked(pair):
    import asyncio

    blocks, block = 256, 1024
    q, proxy, source, dest, signals, regions = _proxy_pair(pair, blocks, block)
    order = list(range(blocks))
    order.reverse()  # scattered: the last block first
    results = []

    def produce() -> None:
        for n, i in enumerate(order):
            results.append(q.push("put", peer=0, src_window=1, src_offset=i * block, dst_window=2,
                                  dst_offset=i * block, bytes=block, timeout=10.0))
        results.append(q.push("signal", peer=0, signal_window=3, signal_offset=8, signal_value=blocks,
                              signal_op="add", timeout=10.0))
        results.append(q.quiet(timeout=10.0))

    async def main() -> None:
        drive = asyncio.ensure_future(gv.async_drive(proxy))
        t = threading.Thread(target=produce)
        t.start()
        await asyncio.get_running_loop().run_in_executor(None, t.join)
        assert not drive.done()  # it drives until the queue ends
        proxy.close()
        await asyncio.wait_for(drive, 10.0)  # closed: it returns

    asyncio.run(main())
    assert results == ["done"] * (blocks + 2)
    assert dest == source
    assert int.from_bytes(signals[8:16], "little") == blocks
    c = proxy.counters
    assert c["descriptors"] == blocks + 1 and c["completed"] == blocks + 1
    assert 1 <= c["chains"] <= blocks + 1 and c["chained"] == blocks + 1
    assert proxy.error == "closed" and proxy.failure == "the proxy closed the queue"
    rails = proxy.rails
    assert [(r["peer"], r["rail"], r["active"], r["failed"]) for r in rails] == [(0, 0, True, False)]
    text = gv.PrometheusText()
    text.add_device_queue_proxy("kernels", proxy)
    import re

    assert re.search(rf'gpuverbs_device_queue_descriptors_total{{queue="kernels"}} {blocks + 1}(\.0)?\n', text.text())
    # One reader per queue: the proxy's.
    with pytest.raises(ValueError, match=r"a DeviceQueueProxy reads \(or read\) this queue"):
        q.take()
    assert q.push("put", peer=0, src_window=1, bytes=8) == "queue_closed"


def test_a_refused_request_fails_the_queue_and_async_drive_raises_the_proxys_words(pair):
    import asyncio

    q, proxy, _, _, _, regions = _proxy_pair(pair, 4, 1024)

    async def main() -> None:
        drive = asyncio.ensure_future(gv.async_drive(proxy, passes=8, idle_passes_before_nap=16, nap=0.001))
        assert await asyncio.get_running_loop().run_in_executor(
            None, lambda: q.push("put", peer=0, src_window=9, bytes=64, timeout=5.0)) == "done"
        with pytest.raises(gv.Error, match="window 9") as got:
            await asyncio.wait_for(drive, 10.0)
        assert got.value.code == gv.Errc.device_queue_failed

    asyncio.run(main())
    assert proxy.error == "refused"
    assert q.quiet(timeout=5.0) == "refused"


def test_a_cancelled_drive_closes_the_queue_and_bad_arguments_are_refused_in_words(pair):
    import asyncio

    q, proxy, _, _, _, regions = _proxy_pair(pair, 4, 1024)

    async def main() -> None:
        drive = asyncio.ensure_future(gv.async_drive(proxy))
        await asyncio.sleep(0.05)
        drive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drive

    asyncio.run(main())
    assert proxy.error == "closed"
    assert q.push("put", peer=0, src_window=1, bytes=8) == "queue_closed"
    with pytest.raises(gv.Error, match="peer 0"):
        proxy.add_peer(0, pair.qp_a, {})  # added before
    with pytest.raises(ValueError, match="request_timeout"):
        gv.DeviceQueueProxy(gv.DeviceQueue.on_host(4), pair.a.pd, pair.a.cq, request_timeout=-1.0)
    with pytest.raises(ValueError, match=r"a DeviceQueueProxy reads \(or read\) this queue"):
        gv.DeviceQueueProxy(q, pair.a.pd, pair.a.cq)
    with pytest.raises(ValueError, match="passes"):
        asyncio.run(gv.async_drive(proxy, passes=0))
    # What the proxy points at cannot be closed under it; once it is gone, they can.
    with pytest.raises(ValueError, match="a DeviceQueueProxy posts on it"):
        pair.qp_a.close()
    with pytest.raises(ValueError, match="a DeviceQueueProxy reads it as a window"):
        regions[0].close()
    del proxy
    import gc

    gc.collect()  # the refused async_drive's traceback held the proxy in a cycle
    regions[0].close()
    # A queue a reader already took from, or one that ended, gets no proxy: it reads from the start.
    taken = gv.DeviceQueue.on_host(4)
    assert taken.push("put", bytes=8) == "done"
    assert taken.take() is not None
    with pytest.raises(ValueError, match="take\\(\\) already read 1 requests"):
        gv.DeviceQueueProxy(taken, pair.a.pd, pair.a.cq)
    ended = gv.DeviceQueue.on_host(4)
    ended.fail("closed")
    with pytest.raises(ValueError, match="the queue has ended \\(queue_closed\\)"):
        gv.DeviceQueueProxy(ended, pair.a.pd, pair.a.cq)
    pair.qp_a.close()


def test_a_rail_whose_peer_queue_pair_is_destroyed_fails_over_to_the_next_and_every_byte_lands(pair):
    from conftest import connect_pair

    blocks, block = 256, 1024
    q, proxy, source, dest, signals, regions = _proxy_pair(pair, blocks, block)
    _, dst_region, sig_region = regions
    qp_a1, qp_b1 = connect_pair(pair.context, pair.a, pair.b)  # rail 1, on the same two devices
    proxy.add_rail(0, qp_a1, {2: dst_region.remote(), 3: sig_region.remote()})
    stop = threading.Event()

    def drive() -> None:  # a thread of its own, as the C++ proxy's
        while not stop.is_set() and proxy.error == "none":
            proxy.progress()

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        results = [q.push("put", peer=0, src_window=1, src_offset=i * block, dst_window=2, dst_offset=i * block,
                          bytes=block, timeout=10.0) for i in range(64)]
        results.append(q.quiet(timeout=10.0))
        pair.qp_b.close()  # rail 0's peer is gone: its requests never complete
        results += [q.push("put", peer=0, src_window=1, src_offset=i * block, dst_window=2, dst_offset=i * block,
                           bytes=block, timeout=10.0) for i in range(64, blocks)]
        results.append(q.push("signal", peer=0, signal_window=3, signal_offset=0, signal_value=7, signal_op="set",
                              timeout=10.0))
        started = time.monotonic()
        results.append(q.quiet(timeout=10.0))
        took = time.monotonic() - started
    finally:
        stop.set()
        driver.join()
    assert results == ["done"] * (blocks + 3), (results, proxy.failure)
    assert took < 6.0  # within the proxy's own bound (request_timeout 5 s), whatever the transport does
    assert dest == source
    assert int.from_bytes(signals[0:8], "little") == 7
    rails = proxy.rails
    assert [(r["rail"], r["active"], r["failed"]) for r in rails] == [(0, False, True), (1, True, False)]
    assert rails[0]["failure"] != ""
    assert proxy.counters["rail_failures"] == 1
    assert proxy.error == "none"
