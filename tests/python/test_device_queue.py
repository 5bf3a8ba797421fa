"""gpuverbs.DeviceQueue without a GPU: a host queue carries a producer
thread's requests to the reader (take / complete), its waits end with the
reader's word, bad arguments are refused in words, and the kernel headers a
Python-compiled kernel includes are in the package. (On the GPU machine,
tests/python/gpu/test_gpu.py pushes from a CuPy kernel.)"""

from __future__ import annotations

import os
import threading

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
