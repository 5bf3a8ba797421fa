"""Leases and the Prometheus text from Python, on the rig's real devices: the
owner (side b) leases blocks to a reader (side a), the reader reads them under
the lease's deadline and releases it with the read's notification; another
reader's release, a stale list and a reuse under a live lease are refused in
the library's words; a lease's own regions let the reader reach exactly the
leased bytes, and nothing once it is revoked."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import gpuverbs as gv

BLOCK = 4096
READER, OTHER = 1, 2


def wait_notification(context: Any, inbox: Any, op: Any) -> Any:
    for _ in range(50_000_000):
        context.progress()
        heard = inbox.poll()
        if heard is not None:
            return heard
        if op.poll():
            op.result()  # raises the transfer's error if it failed before notifying
    raise AssertionError("no notification")


def test_a_lease_is_released_by_its_reader_alone_and_blocks_are_reused_only_then(pair):
    context, a, b = pair.context, pair.a, pair.b
    owner_pool = np.arange(64 * BLOCK, dtype=np.uint32).astype(np.uint8)
    reader_pool = np.zeros(64 * BLOCK, dtype=np.uint8)
    owned = b.pd.register(owner_pool, gv.Access.local_write | gv.Access.remote_read)
    mine = a.pd.register(reader_pool, gv.Access.local_write)
    inbox = gv.NotificationInbox(pair.qp_b, b.pd, slots=8)

    leases = gv.BlockLeases(ttl=30.0, grace=5.0)
    ids = np.array([3, 17, 40, 41, 63], dtype=np.uint64)
    blocks = gv.RemoteBlocks(owned.remote(), ids * BLOCK, BLOCK)
    first = leases.grant(blocks, READER)
    second = leases.grant(blocks, READER)
    assert first.lease != 0 and second.lease not in (0, first.lease)
    assert second.version > first.version and first.ttl == 30.0 and first.scope == "whole_regions"
    assert leases.active == 2 and leases.held(blocks)

    # The list travels as bytes; the reader refuses one older than it already has.
    reader = gv.LeaseReader()
    got = gv.LeasedBlockList.from_bytes(second.to_bytes())
    assert (got.lease, got.version, len(got)) == (second.lease, second.version, 5)
    assert list(got.blocks.offsets) == list(ids * BLOCK)
    reader.accept(1000, got)
    with pytest.raises(gv.Error) as stale:
        reader.accept(1000, gv.LeasedBlockList.from_bytes(first.to_bytes()))
    assert stale.value.code == gv.Errc.stale_block_list
    assert f"version {first.version}" in str(stale.value) and f"{second.version}" in str(stale.value)
    with pytest.raises(gv.Error, match="truncated|too short|bytes"):
        gv.LeasedBlockList.from_bytes(second.to_bytes()[:10])

    # The reader reads under the lease's deadline, and its notification names the lease.
    deadline = gv.LeaseReader.deadline(got, time.monotonic())
    assert time.monotonic() + 29 < deadline <= time.monotonic() + 30
    plan = gv.TransferPlan("read", gv.LocalBlocks(mine, np.arange(5, dtype=np.uint64) * BLOCK, BLOCK), got.blocks,
                           pair.qp_a)
    op = gv.transfer(pair.qp_a, plan, notify=got.lease, deadline=deadline)
    heard = wait_notification(context, inbox, op)
    assert heard.immediate == second.lease and heard.qp_num == pair.qp_b.qp_num
    assert op.wait(timeout=30) == 5 * BLOCK
    assert (reader_pool[:5 * BLOCK].reshape(5, BLOCK) == owner_pool.reshape(64, BLOCK)[ids.astype(np.int64)]).all()

    # Not before the lease is gone: a reuse is refused, naming the lease.
    with pytest.raises(gv.Error) as busy:
        leases.claim(blocks)
    assert busy.value.code == gv.Errc.blocks_leased and "lease" in str(busy.value)
    # Another reader cannot end it: refused, counted, the lease stays.
    with pytest.raises(gv.Error) as theft:
        leases.release(heard.immediate, OTHER)
    assert theft.value.code == gv.Errc.lease_not_yours
    assert leases.statistics["refused_releases"] == 1 and leases.active == 2
    leases.release(heard.immediate, READER)
    with pytest.raises(gv.Error) as again:
        leases.release(heard.immediate, READER)
    assert again.value.code == gv.Errc.lease_unknown
    assert leases.revoke(first.lease) and not leases.revoke(first.lease)
    leases.claim(blocks)  # free now
    assert not leases.held(blocks) and leases.active == 0
    assert leases.statistics == {"granted": 2, "released": 1, "revoked": 1, "expired": 0, "refused_releases": 1,
                                 "unknown_releases": 1}


def test_an_unreleased_lease_expires_after_its_ttl_and_grace():
    leases = gv.BlockLeases(ttl=0.05, grace=0.05)
    region = gv.RemoteMemory(0x10000, 1 << 20, 7)
    blocks = gv.RemoteBlocks(region, [0, BLOCK], BLOCK)
    lease = leases.grant(blocks, READER).lease
    assert leases.expire() == [] and leases.held(blocks)
    time.sleep(0.15)
    assert leases.expire() == [lease]
    assert not leases.held(blocks) and leases.statistics["expired"] == 1
    with pytest.raises(gv.Error) as bad:
        gv.BlockLeases(ttl=0)
    assert bad.value.code == gv.Errc.invalid_argument and "ttl" in str(bad.value)
    with pytest.raises(ValueError, match="ttl is -1.000000 s"):
        gv.BlockLeases(ttl=-1)
    with pytest.raises(ValueError, match="access is for lease regions: give pd as well"):
        leases.grant(blocks, READER, access=gv.Access.remote_read)


def test_attack_a_lease_region_reaches_the_leased_bytes_alone_and_nothing_once_revoked(pair):
    context, a, b = pair.context, pair.a, pair.b
    owner_pool = np.full(16 * BLOCK, 0x5A, dtype=np.uint8)
    reader_pool = np.zeros(16 * BLOCK, dtype=np.uint8)
    owned = b.pd.register(owner_pool, gv.Access.local_write | gv.Access.remote_read)
    mine = a.pd.register(reader_pool, gv.Access.local_write)
    leases = gv.BlockLeases(ttl=30.0)
    listed = leases.grant(gv.RemoteBlocks(owned.remote(), [4 * BLOCK], BLOCK), READER, pd=b.pd,
                          access=gv.Access.remote_read)
    assert listed.scope == "lease_regions"
    leased = listed.blocks.memories[0]
    assert leased.rkey != owned.remote().rkey and leased.length == BLOCK

    def read(remote: Any, offset: int) -> Any:
        plan = gv.TransferPlan("read", gv.LocalBlocks(mine, [0], BLOCK), gv.RemoteBlocks(remote, [offset], BLOCK),
                               pair.qp_a)
        return gv.transfer(pair.qp_a, plan, timeout=20.0)

    assert read(leased, 0).wait(timeout=30) == BLOCK
    assert (reader_pool[:BLOCK] == 0x5A).all()
    # The next block of the same memory, through the lease's key: the NIC refuses it.
    beside = gv.RemoteMemory(leased.address, 2 * BLOCK, leased.rkey)
    with pytest.raises(gv.CompletionError, match="remote access error"):
        read(beside, BLOCK).wait(timeout=30)
    # The queue pair failed with it; a fresh pair reads nothing once the lease is revoked.
    assert leases.revoke(listed.lease)
    from conftest import connect_pair
    qp_a, _qp_b = connect_pair(context, a, b)
    plan = gv.TransferPlan("read", gv.LocalBlocks(mine, [0], BLOCK), gv.RemoteBlocks(leased, [0], BLOCK), qp_a)
    with pytest.raises(gv.CompletionError, match="remote access error"):
        gv.transfer(qp_a, plan, timeout=20.0).wait(timeout=30)


def test_prometheus_text_carries_a_queue_pairs_counters_and_the_ports_and_parses(pair):
    parser = pytest.importorskip("prometheus_client.parser")
    region = pair.b.pd.register(np.zeros(BLOCK, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    source = pair.a.pd.register(np.ones(BLOCK, dtype=np.uint8), gv.Access.local_write)
    for _ in range(3):
        assert pair.qp_a.write(source, region.remote()).wait(timeout=30) == BLOCK
    text = gv.PrometheusText()
    text.add_queue_pair("decode-0", pair.qp_a)
    text.add_port(pair.a.device)
    samples = [s for family in parser.text_string_to_metric_families(text.text()) for s in family.samples]
    posted = [s for s in samples if s.name == "gpuverbs_qp_requests_posted_total"
              and s.labels.get("qp") == "decode-0" and s.labels.get("queue") == "send"]
    assert len(posted) == 1 and posted[0].value >= 3
    assert any(s.labels.get("device") == pair.a.device.name for s in samples)
    with pytest.raises(gv.Error) as bad:
        text.add_port(pair.a.device, 9)
    assert bad.value.code == gv.Errc.port_not_found and "port 9" in str(bad.value)


def test_a_kv_pool_leases_a_requests_blocks_and_the_readers_notification_releases_them(pair):
    # prefill (b) leases request 7's blocks of every layer to decode (a), which reads them by id and notifies.
    context, a, b = pair.context, pair.a, pair.b
    layers, blocks, block = 4, 64, 256
    layout = gv.KvLayout.per_layer(layers, blocks, block)
    rng = np.random.default_rng(5)
    prefill = [rng.integers(0, 256, layout.tensor_bytes, dtype=np.uint8) for _ in range(layers)]
    decode = [np.zeros(layout.tensor_bytes, dtype=np.uint8) for _ in range(layers)]
    owner = gv.KvPool(layout, [b.pd.register(t, gv.Access.local_write | gv.Access.remote_read) for t in prefill])
    reader_pool = gv.KvPool(layout, [a.pd.register(t, gv.Access.local_write) for t in decode])
    inbox = gv.NotificationInbox(pair.qp_b, b.pd, slots=8)
    request_ids = np.array([5, 9, 10, 33], dtype=np.uint32)
    leased = owner.remote_blocks(request_ids)
    assert len(leased) == 4 * layers * 2 and set(leased.lengths) == {block}
    leases = gv.BlockLeases(ttl=30.0)
    listed = leases.grant(leased, READER)
    with pytest.raises(gv.Error) as busy:
        leases.claim(owner.remote_blocks([9], layers=(2, 1)))  # one block of the request, layer 2
    assert busy.value.code == gv.Errc.blocks_leased
    leases.claim(owner.remote_blocks([11]))  # another request's block is free
    with pytest.raises(gv.Error, match="id 64 \\(index 1\\) is outside the pool of 64 blocks"):
        owner.remote_blocks([0, 64])

    theirs = gv.RemoteKvPool.load(owner.describe())
    plan = reader_pool.plan("read", np.arange(4), theirs, request_ids, pair.qp_a)
    op = gv.transfer(pair.qp_a, plan, notify=listed.lease, notify_message=b"request-7")
    heard = wait_notification(context, inbox, op)
    assert heard.bytes == b"request-7"
    leases.release(heard.immediate, READER)
    leases.claim(leased)  # free to reuse now
    assert op.wait(timeout=30) == plan.bytes
    for layer in range(layers):
        got, want = decode[layer].reshape(2, blocks, block), prefill[layer].reshape(2, blocks, block)
        assert (got[:, :4] == want[:, request_ids]).all()
