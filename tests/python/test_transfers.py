"""Block-list transfers from Python: lists as NumPy arrays (no Python loop
over the blocks), one transfer with its notification, over one or two rails;
the block list's wire form; refusals."""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Any

import numpy as np
import pytest

import gpuverbs as gv

RW = gv.Access.local_write | gv.Access.remote_write


def scattered(pool: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(pool)[:count].astype(np.uint64)


def fill(pool: np.ndarray, ids: np.ndarray, block: int) -> None:
    view = pool.reshape(-1, block)
    for k, i in enumerate(ids[:50]):  # the rest keep the seeded pattern below
        view[i] = (np.arange(block) * 7 + k) % 251


def test_ten_thousand_blocks_move_in_one_transfer_with_its_notification(pair):
    blocks, block = 10_000, 512
    src_pool = np.random.default_rng(1).integers(0, 256, blocks * 2 * block, dtype=np.uint8)
    dst_pool = np.zeros(blocks * 2 * block, dtype=np.uint8)
    src_ids = scattered(blocks * 2, blocks, 2)
    dst_ids = scattered(blocks * 2, blocks, 3)
    rs = pair.a.pd.register(src_pool, gv.Access.local_write)
    rd = pair.b.pd.register(dst_pool, RW)
    local = gv.LocalBlocks(rs, src_ids * block, block)
    remote = gv.RemoteBlocks(rd.remote(), dst_ids * block, np.full(blocks, block, dtype=np.int64))
    # The decode side sends its list on the wire; prefill parses it.
    remote = gv.RemoteBlocks.from_bytes(remote.to_bytes())
    assert len(remote) == blocks and len(local) == blocks
    assert list(remote.offsets[:3]) == list(dst_ids[:3] * block)
    plan = gv.TransferPlan("write", local, remote, pair.qp_a)
    assert plan.bytes == blocks * block
    notified = pair.qp_b.receive(rd.slice(0, 0))

    async def main():
        op = gv.transfer(pair.qp_a, plan, notify=42)
        moved = await op
        got = await notified
        return op, moved, got

    op, moved, got = asyncio.run(main())
    assert moved == blocks * block
    assert got.immediate == 42
    assert op.report.landed == blocks and op.report.not_posted == 0 and op.report.uncertain == 0
    src = src_pool.reshape(-1, block)
    dst = dst_pool.reshape(-1, block)
    assert (dst[dst_ids.astype(np.int64)] == src[src_ids.astype(np.int64)]).all()
    untouched = np.setdiff1d(np.arange(blocks * 2), dst_ids.astype(np.int64))
    assert (dst[untouched] == 0).all()


def test_a_read_transfer_over_two_rails_brings_every_block_back(context, sides, pair):
    from conftest import connect_pair

    second_a, second_b = connect_pair(context, pair.a, pair.b, max_send_sge=4)
    blocks, block = 2000, 1024
    remote_pool = np.random.default_rng(4).integers(0, 256, blocks * block, dtype=np.uint8)
    local_pool = np.zeros(blocks * block, dtype=np.uint8)
    rr = pair.b.pd.register(remote_pool, RW | gv.Access.remote_read)
    rl = pair.a.pd.register(local_pool, RW)
    order = np.arange(blocks, dtype=np.uint64)[::-1].copy()
    plan = gv.TransferPlan("read", gv.LocalBlocks(rl, order * block, block),
                           gv.RemoteBlocks(rr.remote(), np.arange(blocks, dtype=np.uint64) * block, block),
                           pair.qp_a)
    op = gv.transfer([pair.qp_a, second_a], plan)
    assert op.wait(timeout=60) == blocks * block
    rails = op.report.rails
    assert len(rails) == 2 and all(r["bytes"] > 0 for r in rails) and sum(r["bytes"] for r in rails) == blocks * block
    assert (local_pool.reshape(-1, block)[::-1] == remote_pool.reshape(-1, block)).all()


def test_a_failed_transfer_reports_what_landed(pair):
    rs = pair.a.pd.register(np.ones(64 * 1024, dtype=np.uint8), gv.Access.local_write)
    rd = pair.b.pd.register(np.zeros(64 * 1024, dtype=np.uint8), RW)
    wrong = gv.RemoteMemory(rd.remote().address, rd.length, rd.rkey ^ 0x55)
    plan = gv.TransferPlan("write", gv.LocalBlocks(rs, np.arange(16) * 4096, 4096),
                           gv.RemoteBlocks(wrong, np.arange(16) * 4096, 4096), pair.qp_a)
    op = gv.transfer(pair.qp_a, plan, notify=1)
    with pytest.raises(gv.CompletionError) as caught:
        op.wait(timeout=30)
    assert caught.value.verb == "async_transfer"
    assert "remote block" in str(caught.value)
    report = caught.value.report
    assert report.landed + report.not_posted + report.uncertain == 16
    assert report.landed == 0


def test_block_lists_refuse_bad_input_by_name(pair):
    rs = pair.a.pd.register(np.zeros(4096, dtype=np.uint8), gv.Access.local_write)
    with pytest.raises(ValueError, match=r"offsets must not hold negative values \(got -4 at index 1\)"):
        gv.LocalBlocks(rs, np.array([0, -4]), 8)
    with pytest.raises(ValueError, match=r"lengths has 3 values; the offsets have 2"):
        gv.LocalBlocks(rs, [0, 8], [8, 8, 8])
    with pytest.raises(TypeError, match=r"offsets must hold integers \(its format is 'd'\)"):
        gv.LocalBlocks(rs, np.array([0.5]), 8)
    with pytest.raises(ValueError, match=r"direction must be 'write' or 'read', not 'copy'"):
        gv.TransferPlan("copy", gv.LocalBlocks(rs, [0], 8), gv.RemoteBlocks(rs.remote(), [0], 8), pair.qp_a)
    with pytest.raises(gv.Error) as caught:
        gv.TransferPlan("write", gv.LocalBlocks(rs, [0], 8), gv.RemoteBlocks(rs.remote(), [0], 16), pair.qp_a)
    assert caught.value.code == gv.Errc.invalid_argument
    assert "8" in str(caught.value) and "16" in str(caught.value)
    with pytest.raises(gv.Error) as caught:
        gv.RemoteBlocks.from_bytes(b"GVBL garbage")
    assert caught.value.code in (gv.Errc.malformed_record, gv.Errc.unsupported_version)
    with pytest.raises(ValueError, match=r"rails is empty"):
        gv.transfer([], gv.TransferPlan("write", gv.LocalBlocks(rs, [0], 8),
                                        gv.RemoteBlocks(rs.remote(), [0], 8), pair.qp_a))


def test_a_kv_pool_on_two_rails_reads_striped_with_each_rails_own_keys(context, sides):
    from conftest import Side, connect_pair
    a, b = sides
    qp_a, qp_b = connect_pair(context, a, b, max_send_sge=4, max_send_wr=512)  # both ends held: a peer's
    # queue pair destroyed would fail its rail (and the transfer would fail over).
    # Rail 1: other protection domains on both sides (another NIC's keys, as far as the NIC can tell).
    a1, b1 = Side(a.device, gv.ProtectionDomain(a.device), a.cq), Side(b.device, gv.ProtectionDomain(b.device), b.cq)
    qp_a1, qp_b1 = connect_pair(context, a1, b1, max_send_sge=4, max_send_wr=512)
    layers, blocks, block = 4, 256, 128
    layout = gv.KvLayout.per_layer(layers, blocks, block)
    rng = np.random.default_rng(3)
    prefill = [rng.integers(0, 256, layout.tensor_bytes, dtype=np.uint8) for _ in range(layers)]
    decode = [np.full(layout.tensor_bytes, 0xEE, dtype=np.uint8) for _ in range(layers)]
    theirs_pool = gv.KvPool(layout, [b.pd.register(t, RW | gv.Access.remote_read) for t in prefill])
    assert theirs_pool.add_rail([b1.pd.register(t, RW | gv.Access.remote_read) for t in prefill]) == 1
    ours = gv.KvPool(layout, [a.pd.register(t, RW) for t in decode])
    assert ours.add_rail([a1.pd.register(t, RW) for t in decode]) == 1 and ours.rails == 2
    metadata = theirs_pool.describe()
    assert len(metadata) == 88 + layers * (16 + 2 * 4)
    theirs = gv.RemoteKvPool.load(metadata)
    assert theirs.rails == 2
    their_ids, our_ids = rng.permutation(blocks)[:150], rng.permutation(blocks)[:150]
    plan = ours.plan("read", our_ids, theirs, their_ids, qp_a)
    op = gv.transfer([ours.rail(0, qp_a, theirs), ours.rail(1, qp_a1, theirs)], plan)
    assert op.wait(timeout=60) == plan.bytes
    assert [r["bytes"] > 0 for r in op.report.rails] == [True, True], op.report.rails
    assert qp_b.qp_num and qp_b1.qp_num  # held to here
    for layer in range(layers):
        got, want = decode[layer].reshape(2, blocks, block), prefill[layer].reshape(2, blocks, block)
        assert (got[:, our_ids] == want[:, their_ids]).all()
    with pytest.raises(gv.Error, match="rail 2: our pool is on 2 rails and the peer's on 2"):
        ours.rail(2, qp_a1, theirs)
    with pytest.raises(gv.Error, match="memory region 0 covers"):
        ours.add_rail([a1.pd.register(t, RW) for t in prefill])


def test_a_kv_pool_hands_off_scattered_blocks_of_every_layer_by_id_with_bytes_as_metadata(pair):
    # prefill (b) owns 8 layers of 512 blocks of 64 bytes, K and V; decode (a) reads 200 of them by id.
    layers, blocks, block = 8, 512, 64
    layout = gv.KvLayout.per_layer(layers, blocks, block)
    assert layout.tensors == layers and layout.tensor_bytes == 2 * blocks * block and layout.problem == ""
    rng = np.random.default_rng(7)
    prefill = [rng.integers(0, 256, layout.tensor_bytes, dtype=np.uint8) for _ in range(layers)]
    decode = [np.full(layout.tensor_bytes, 0xEE, dtype=np.uint8) for _ in range(layers)]
    theirs_pool = gv.KvPool(layout, [pair.b.pd.register(t, RW | gv.Access.remote_read) for t in prefill])
    ours = gv.KvPool(layout, [pair.a.pd.register(t, RW) for t in decode])

    metadata = theirs_pool.describe()  # carried over the engine's own channel
    assert isinstance(metadata, bytes) and len(metadata) == 88 + 20 * layers
    theirs = gv.RemoteKvPool.load(metadata)
    assert theirs.layout == layout and theirs.pool_id == theirs_pool.pool_id and len(theirs.tensors) == layers

    their_ids = rng.permutation(blocks)[:200]  # any integer array
    our_ids = rng.permutation(blocks)[:200].astype(np.int32)
    plan = ours.plan("read", our_ids, theirs, their_ids, pair.qp_a)
    assert plan.bytes == 200 * layers * 2 * block
    moved = asyncio.run(_await(gv.transfer(pair.qp_a, plan)))
    assert moved == plan.bytes
    for layer in range(layers):
        got = decode[layer].reshape(2, blocks, block)
        want = prefill[layer].reshape(2, blocks, block)
        assert (got[:, our_ids] == want[:, their_ids]).all()
        untouched = np.setdiff1d(np.arange(blocks), our_ids)
        assert (got[:, untouched] == 0xEE).all()

    # Refusals name the problem.
    with pytest.raises(gv.Error, match="remote id 512 \\(index 0\\) is outside the peer's pool of 512 blocks"):
        ours.plan("read", [0], theirs, [512], pair.qp_a)
    with pytest.raises(ValueError, match="local_ids\\[0\\] is 4294967296: block ids are below 2\\^32"):
        ours.plan("read", [2**32], theirs, [0], pair.qp_a)
    with pytest.raises(gv.Error, match="its checksum does not match"):
        gv.RemoteKvPool.load(metadata[:-1] + bytes([metadata[-1] ^ 1]))
    # Lease terms travel with the metadata; a restarted peer's old record is refused against its new one.
    assert gv.RemoteKvPool.load(theirs_pool.describe(lease_ttl=12.5)).lease_ttl == 12.5
    remade = gv.KvPool(layout, [pair.b.pd.register(t, RW | gv.Access.remote_read) for t in prefill])
    newer = gv.RemoteKvPool.load(remade.describe(), previous=theirs)
    assert newer.made_ns > theirs.made_ns and newer.pool_id == remade.pool_id
    with pytest.raises(gv.Error, match="is not newer than pool .* already loaded from this peer") as stale:
        gv.RemoteKvPool.load(metadata, previous=newer)
    assert stale.value.code == gv.Errc.stale_metadata
    # A cache's region may start inside a larger registration: refused, naming it.
    cache = gv.RegistrationCache(pair.a.pd)
    with pytest.raises(ValueError, match="regions\\[0\\] comes from a RegistrationCache"):
        gv.KvPool(gv.KvLayout.per_layer(1, blocks, block), [cache.get(decode[0], RW)])
    # A region closed under the pool: its blocks are refused in those words, not as 0x0 to 0x0.
    regions = [pair.a.pd.register(t, RW) for t in decode]
    closing = gv.KvPool(layout, regions)
    regions[0].close()
    with pytest.raises(gv.Error, match="is in a memory region that was closed \\(or never registered\\)"):
        closing.plan("read", our_ids, theirs, their_ids, pair.qp_a)


async def _await(op):
    return await op


def polled_pair() -> Any:
    from conftest import Pair, Side, connect_pair, rig_devices

    context = gv.Context(polled=True)
    sides = []
    for name in rig_devices():
        device = gv.Device.open(name)
        sides.append(Side(device, gv.ProtectionDomain(device), gv.CompletionQueue(device, 4096, context)))
    qp_a, qp_b = connect_pair(context, sides[0], sides[1], max_send_sge=4, max_send_wr=512, max_recv_wr=512)
    return Pair(context, sides[0], sides[1], qp_a, qp_b)


def test_a_polled_context_moves_only_when_its_owner_calls_progress():
    # A serving engine's step loop: start a transfer, then once per step ask
    # whether it finished. No asyncio loop, no thread: nothing moves between steps.
    pair = polled_pair()
    assert pair.context.polled
    blocks, block = 1000, 256
    src_pool = np.random.default_rng(7).integers(0, 256, blocks * block, dtype=np.uint8)
    dst_pool = np.zeros(blocks * 2 * block, dtype=np.uint8)
    rs = pair.a.pd.register(src_pool, gv.Access.local_write)
    rd = pair.b.pd.register(dst_pool, RW)
    dst_ids = scattered(blocks * 2, blocks, 8)
    plan = gv.TransferPlan("write", gv.LocalBlocks(rs, np.arange(blocks, dtype=np.uint64) * block, block),
                           gv.RemoteBlocks(rd.remote(), dst_ids * block, block), pair.qp_a)
    notified = pair.qp_b.receive(rd.slice(0, 0))
    op = gv.transfer(pair.qp_a, plan, notify=9, timeout=60)
    time.sleep(0.2)
    assert not op.done and not notified.done  # nobody called progress()
    steps = 0
    while not (op.poll() and notified.done) and steps < 10_000_000:
        pair.context.progress()
        steps += 1
    assert op.result() == blocks * block
    assert notified.result().immediate == 9
    assert (dst_pool.reshape(-1, block)[dst_ids.astype(np.int64)] == src_pool.reshape(-1, block)).all()
    # Idle: nothing runs.
    assert all(pair.context.progress() == 0 for _ in range(1000))
    # wait() spins progress() on a polled context; await is refused in words.
    op2 = gv.transfer(pair.qp_a, plan)
    assert op2.wait(timeout=60) == blocks * block

    async def awaits():
        return await gv.transfer(pair.qp_a, plan)

    with pytest.raises(ValueError, match="Context is polled: nothing wakes an asyncio loop"):
        asyncio.run(awaits())
    pair.context.progress()  # the refused await's transfer still ran: let it end
    for _ in range(100_000):
        if pair.a.cq.statistics["completed"] >= 3:
            break
        pair.context.progress()


def test_a_transfer_deadline_from_python(pair):
    block = 4096
    src = pair.a.pd.register(np.ones(block, dtype=np.uint8), gv.Access.local_write)
    dst = pair.b.pd.register(np.zeros(block, dtype=np.uint8), RW)
    plan = gv.TransferPlan("write", gv.LocalBlocks(src, np.zeros(1, dtype=np.uint64), block),
                           gv.RemoteBlocks(dst.remote(), np.zeros(1, dtype=np.uint64), block), pair.qp_a)
    # Passed already: refused, nothing posted.
    op = gv.transfer(pair.qp_a, plan, deadline=time.monotonic() - 1)
    with pytest.raises(gv.TimeoutError, match="the deadline had passed when the transfer started") as e:
        op.wait(timeout=10)
    assert e.value.code == errno.ETIMEDOUT
    assert op.report.landed == 0
    # In the future: it moves.
    assert gv.transfer(pair.qp_a, plan, timeout=30).wait(timeout=60) == block
    assert gv.transfer(pair.qp_a, plan, deadline=time.monotonic() + 30).wait(timeout=60) == block
    with pytest.raises(ValueError, match="give deadline or timeout, not both"):
        gv.transfer(pair.qp_a, plan, deadline=time.monotonic(), timeout=1)
    with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
        gv.transfer(pair.qp_a, plan, timeout=-1)


def test_a_reads_notification_reaches_the_owners_inbox_with_the_request_id():
    # Decode reads prefill's blocks; prefill's inbox hears the request id only
    # after every read, reuses the blocks at once, and releases nothing early.
    from conftest import Pair, Side, connect_pair, rig_devices

    context = gv.Context(polled=True)
    sides = []
    for name in rig_devices():
        device = gv.Device.open(name)
        sides.append(Side(device, gv.ProtectionDomain(device), gv.CompletionQueue(device, 4096, context)))
    qp_a, qp_b = connect_pair(context, sides[0], sides[1], max_send_sge=4, max_send_wr=512, max_recv_wr=64,
                              max_inline_data=64)
    pair = Pair(context, sides[0], sides[1], qp_a, qp_b)
    blocks, block = 2000, 512
    owner_pool = np.random.default_rng(11).integers(0, 256, blocks * block, dtype=np.uint8)
    before = owner_pool.copy()
    reader_pool = np.zeros(blocks * block, dtype=np.uint8)
    ro = pair.b.pd.register(owner_pool, RW | gv.Access.remote_read)
    rr = pair.a.pd.register(reader_pool, RW)
    inbox = gv.NotificationInbox(pair.qp_b, pair.b.pd, slots=8)
    ids = scattered(blocks, blocks, 12)
    plan = gv.TransferPlan("read", gv.LocalBlocks(rr, np.arange(blocks, dtype=np.uint64) * block, block),
                           gv.RemoteBlocks(ro.remote(), ids * block, block), pair.qp_a)
    op = gv.transfer(pair.qp_a, plan, notify=77, notify_message=b"request-0042")
    heard = None
    for _ in range(50_000_000):
        context.progress()
        heard = inbox.poll()
        if heard is not None:
            owner_pool[:] = 0xDD  # reused the moment it heard
            break
    assert heard is not None
    assert heard.immediate == 77 and heard.bytes == b"request-0042" and heard.size == 12
    assert heard.qp_num == pair.qp_b.qp_num
    while not op.poll():
        pass
    assert op.result() == blocks * block
    assert (reader_pool.reshape(-1, block) == before.reshape(-1, block)[ids.astype(np.int64)]).all()
    assert inbox.statistics == {"received": 1, "failed": 0, "paused": 0} and inbox.unread == 0
    assert inbox.poll() is None
    with pytest.raises(gv.Error, match="notify_message has 65 bytes; a notification carries at most 64"):
        gv.transfer(pair.qp_a, plan, notify=1, notify_message=bytes(65)).wait(timeout=10)


def test_a_rail_group_learns_leaves_a_failed_rail_out_and_takes_a_replaced_one_back(context, sides):
    parser = pytest.importorskip("prometheus_client.parser")
    from conftest import connect_pair
    a, b = sides
    qp0, peer0 = connect_pair(context, a, b, max_send_sge=4, max_send_wr=512)
    qp1, peer1 = connect_pair(context, a, b, max_send_sge=4, max_send_wr=512)
    blocks, block = 512, 4096
    src = np.arange(blocks * block, dtype=np.uint32).astype(np.uint8)
    dst = np.zeros(2 * blocks * block, dtype=np.uint8)  # every other block: nothing coalesces
    src_mr, dst_mr = a.pd.register(src), b.pd.register(dst, RW)
    plan = gv.TransferPlan("write", gv.LocalBlocks(src_mr, np.arange(blocks) * block, block),
                           gv.RemoteBlocks(dst_mr.remote(), np.arange(blocks) * 2 * block, block), qp0)

    def landed() -> bool:
        return bool((dst.reshape(blocks, 2, block)[:, 0].reshape(-1) == src).all())
    group = gv.RailGroup([qp0, qp1], cooldown=60.0)
    assert len(group) == 2 and group.health(0)["transfers"] == 0 and group.health(0)["failed_at"] is None

    assert gv.transfer(group, plan).wait(timeout=60) == plan.bytes
    assert landed()
    h0, h1 = group.health(0), group.health(1)
    assert h0["transfers"] == 1 and h1["transfers"] == 1 and h0["bytes"] + h1["bytes"] == plan.bytes
    assert h0["busy_seconds"] > 0 and not h0["cooling"]

    # Rail 1 fails (the peer's end closed: nothing answers it): the transfer moves its requests to rail 0.
    peer1.close()
    dst[:] = 0
    op = gv.transfer(group, plan)
    assert op.wait(timeout=60) == plan.bytes
    assert landed()
    h1 = group.health(1)
    assert h1["failures"] == 1 and h1["cooling"] and h1["failed_at"] is not None and h1["last_error"], h1
    assert op.report.rails[1]["bytes"] == 0 or op.report.rails[1]["error"]
    # Cooling: the next transfer leaves it out.
    assert gv.transfer(group, plan).wait(timeout=60) == plan.bytes
    assert group.health(1)["transfers"] == h1["transfers"] and group.health(0)["transfers"] == 3

    # Reconnected: replace() brings it back at once.
    qp1b, peer1b = connect_pair(context, a, b, max_send_sge=4, max_send_wr=512)
    group.replace(1, qp1b)
    assert not group.health(1)["cooling"] and group.health(1)["transfers"] == 0
    dst[:] = 0
    assert gv.transfer(group, plan).wait(timeout=60) == plan.bytes
    assert landed() and group.health(1)["bytes"] > 0

    text = gv.PrometheusText()
    text.add_rail_group("kv", group)
    samples = [s for f in parser.text_string_to_metric_families(text.text()) for s in f.samples]
    assert {s.labels.get("rail") for s in samples if s.labels.get("group") == "kv"} == {"0", "1"}
    with pytest.raises(IndexError, match="rail 2: the group has 2"):
        group.health(2)
    with pytest.raises(TypeError, match="a rail is a gpuverbs.QueuePair"):
        gv.RailGroup([qp0, 3])
    assert peer0 and peer1 and peer1b  # held to here
