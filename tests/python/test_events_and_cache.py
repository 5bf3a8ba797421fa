"""Device events awaited on the loop (a real link going down and up in the
rig), the registration cache, and children keeping their parents alive."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess

import numpy as np
import pytest

import gpuverbs as gv

RW = gv.Access.local_write | gv.Access.remote_write


def fault(what: str) -> None:
    injector = os.environ.get("GPUVERBS_TEST_FAULTS", "")
    if not injector:
        pytest.skip("needs the rig's fault injector (GPUVERBS_TEST_FAULTS)")
    subprocess.run([injector, *what.split()], check=True, capture_output=True)


def test_a_link_going_down_and_up_is_awaited_as_device_events(sides):
    a, _ = sides
    events = gv.DeviceEvents(a.device)
    assert events.poll() is None

    async def next_of(kind: str):
        while True:
            event = await events.wait_event(10)
            assert event is not None, f"no {kind} event within 10 s"
            if event["type"] == kind:
                return event

    async def main():
        fault("link-down")
        try:
            down = await next_of("port_error")
        finally:
            fault("link-up")
        up = await next_of("port_active")
        return down, up

    down, up = asyncio.run(main())
    assert down["element"] == "port" and down["device"] == a.device.name and down["port"] == 1
    assert "link is down" in down["description"]
    assert up["element"] == "port"


def test_waiting_for_a_device_event_times_out_with_none(sides):
    a, _ = sides
    events = gv.DeviceEvents(a.device)
    assert events.wait_event(0.2).wait() is None
    assert asyncio.run(_await(events.wait_event(0.2))) is None


async def _await(awaitable):
    return await awaitable


def test_the_registration_cache_reuses_a_covering_region_and_moves_the_right_bytes(pair):
    cache = gv.RegistrationCache(pair.b.pd)
    pool = np.zeros(1 << 20, dtype=np.uint8)
    whole = cache.get(pool, RW)
    part = cache.get(pool[4096:8192], RW)  # inside the registration already made: a hit
    stats = cache.statistics
    assert (stats["misses"], stats["hits"]) == (1, 1)
    assert part.rkey == whole.rkey and part.length == 4096 and part.address == pool.ctypes.data + 4096
    src = pair.a.pd.register(np.full(4096, 9, dtype=np.uint8), gv.Access.local_write)
    pair.qp_a.write(src, part.remote()).wait(timeout=10)
    assert (pool[4096:8192] == 9).all() and (pool[:4096] == 0).all() and (pool[8192:] == 0).all()
    with pytest.raises(ValueError, match=r"remote: offset 5000 is past the region's end \(4096 bytes\)"):
        part.remote(5000)
    cache.invalidate(pool)
    assert cache.statistics["invalidations"] == 1
    again = cache.get(pool[4096:8192], RW)
    assert cache.statistics["misses"] == 2 and again.length == 4096
    with pytest.raises(TypeError, match="access must be gpuverbs.Access flags"):
        cache.get(pool, "rw")


def test_a_queue_pair_keeps_its_completion_queue_and_domain_alive(context, sides):
    from conftest import Side, connect_pair

    a, b = sides
    fresh = Side(a.device, gv.ProtectionDomain(a.device), gv.CompletionQueue(a.device, 64, context))
    qp, _ = connect_pair(context, fresh, b)
    src = fresh.pd.register(np.full(64, 3, dtype=np.uint8), gv.Access.local_write)
    del fresh
    gc.collect()
    dst = np.zeros(64, dtype=np.uint8)
    assert qp.write(src, b.pd.register(dst, RW).remote()).wait(timeout=10) == 64
    assert (dst == 3).all()


def test_attack_a_freed_arrays_address_is_registered_afresh_never_served_its_old_pages(pair):
    """Before, a host entry outlived the array it was made for: a new array at
    the same address was handed the old registration, whose pinned pages still
    held the freed array's bytes, and a peer's read returned those."""
    cache = gv.RegistrationCache(pair.b.pd)
    size = 4 << 20  # mmap-backed: given back to the kernel when freed, and its address often comes back
    old = np.full(size, 0xAA, dtype=np.uint8)
    address = old.ctypes.data
    first = cache.get(old, gv.Access.remote_read)
    again = cache.get(old, gv.Access.remote_read)  # a second user of the same entry
    assert cache.statistics["regions"] == 1 and cache.statistics["hits"] == 1
    del first
    gc.collect()
    assert cache.statistics["regions"] == 1  # still used by `again`
    del again, old
    gc.collect()
    assert cache.statistics["regions"] == 0  # the last region of the array gone: the entry is forgotten
    new = None
    for _ in range(8):
        new = np.full(size, 0x55, dtype=np.uint8)
        if new.ctypes.data == address:
            break
    # (when the allocator did not give the address back, the read below proves
    # less, but the cache must still have forgotten the old entry: checked above)
    fresh = cache.get(new, gv.Access.remote_read)
    assert cache.statistics["misses"] == 2
    back = np.zeros(4096, dtype=np.uint8)
    assert pair.qp_a.read(pair.a.pd.register(back, gv.Access.local_write), fresh.remote(0, 4096)).wait(timeout=10) == 4096
    assert (back == 0x55).all(), f"read the freed array's bytes (same address: {new.ctypes.data == address})"
