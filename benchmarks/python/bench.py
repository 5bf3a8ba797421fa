"""What the Python layer costs, measured against the same work in C++
(benchmarks/python/run puts both in one boot of the Soft-RoCE rig).

    bench.py write --ops N --rounds R
        a chain of N dependent 64-byte RDMA writes, each awaited on the running
        asyncio loop (DEV0 -> DEV1, one process), as async_overhead's
        "coroutine, event" form does in C++: prints the median ns per write.
    bench.py kv --layers L --pool-blocks B --ids N --block BYTES --repeat K
        kv_handoff_bench from Python: a hand-off of N scattered blocks of every
        layer by block id (KvPool.plan, one read, a polled context stepped until
        done); prints kv_handoff_bench's line.
    bench.py transfer --blocks N --block BYTES --repeat K
        transfer_bench's gpuverbs form from Python: N blocks scattered through
        pools twice their size on both sides (no two neighbours coalesce), one
        prepared plan, K awaited transfers; every byte checked after each,
        outside the timed part. Prints transfer_bench's line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

import numpy as np

import gpuverbs as gv


def connected(context, send_sge=1):
    devices = [gv.Device.open(os.environ["GPUVERBS_TEST_DEV0"]), gv.Device.open(os.environ["GPUVERBS_TEST_DEV1"])]
    pds = [gv.ProtectionDomain(d) for d in devices]
    cqs = [gv.CompletionQueue(d, 4096, context) for d in devices]
    listener = gv.TcpListener(0, "127.0.0.1")
    got = {}
    # The peer grants what the benchmarks do to its memory (its regions are registered after connecting).
    grant = gv.Access.remote_write | gv.Access.remote_read
    t = threading.Thread(target=lambda: got.update(b=gv.connect_tcp(pds[1], cqs[1], None, 0, listener=listener,
                                                                    remote_access=grant, max_send_sge=send_sge)))
    t.start()
    qp, _, _ = gv.connect_tcp(pds[0], cqs[0], "127.0.0.1", listener.port, max_send_sge=send_sge)
    t.join()
    return pds, qp, got["b"][0]


def bench_write(ops: int, rounds: int) -> None:
    context = gv.Context()
    pds, qp, peer = connected(context)
    src = pds[0].register(np.ones(64, dtype=np.uint8), gv.Access.local_write)
    dst = pds[1].register(np.zeros(64, dtype=np.uint8), gv.Access.local_write | gv.Access.remote_write)
    remote = dst.remote()

    async def chain() -> float:
        start = time.perf_counter_ns()
        for _ in range(ops):
            await qp.write(src, remote)
        return (time.perf_counter_ns() - start) / ops

    async def main():
        await chain()  # warm-up
        return [await chain() for _ in range(rounds)]

    samples = asyncio.run(main())
    print(f"python awaited write: {statistics.median(samples):.0f} ns/op median ({ops} dependent 64 B writes, "
          f"{rounds} rounds)")


def bench_transfer(blocks: int, block: int, repeat: int) -> None:
    context = gv.Context()
    pds, qp, peer = connected(context, send_sge=4)
    pool = 2 * blocks
    src = np.random.default_rng(1).integers(0, 256, pool * block, dtype=np.uint8)
    dst = np.zeros(pool * block, dtype=np.uint8)
    rs = pds[0].register(src, gv.Access.local_write)
    rd = pds[1].register(dst, gv.Access.local_write | gv.Access.remote_write)
    # Every other block, in a shuffled order on each side: nothing coalesces.
    mine = (np.random.default_rng(2).permutation(blocks) * 2).astype(np.uint64)
    theirs = (np.random.default_rng(3).permutation(blocks) * 2).astype(np.uint64)
    plan = gv.TransferPlan("write", gv.LocalBlocks(rs, mine * block, block),
                           gv.RemoteBlocks(rd.remote(), theirs * block, block), qp)

    async def main() -> float:
        await gv.transfer(qp, plan)  # warm-up
        total = 0.0
        for _ in range(repeat):
            dst[:] = 0
            start = time.perf_counter()
            await gv.transfer(qp, plan)
            total += time.perf_counter() - start
            ok = (dst.reshape(-1, block)[theirs.astype(np.int64)] == src.reshape(-1, block)[mine.astype(np.int64)])
            if not ok.all():
                sys.exit("python: bytes wrong after the transfer")
        return total

    seconds = asyncio.run(main())
    n = blocks * repeat
    print(f"python: {blocks} blocks x {repeat}, 1 rail(s), {seconds:.3f} s, {n / seconds:.0f} blocks/s, "
          f"{n * block / seconds / 1e9:.3f} GB/s")


def bench_kv(layers: int, blocks: int, ids: int, block: int, repeat: int) -> None:
    """kv_handoff_bench from Python: plan `ids` scattered blocks of every layer by id, read them in one
    transfer, the engine's loop polling a polled context until done; every sampled byte checked after each."""
    context = gv.Context(polled=True)
    devices = [gv.Device.open(os.environ["GPUVERBS_TEST_DEV0"]), gv.Device.open(os.environ["GPUVERBS_TEST_DEV1"])]
    pds = [gv.ProtectionDomain(d) for d in devices]
    cqs = [gv.CompletionQueue(d, 4096, context) for d in devices]
    listener = gv.TcpListener(0, "127.0.0.1")
    got = {}
    t = threading.Thread(target=lambda: got.update(b=gv.connect_tcp(
        pds[1], cqs[1], None, 0, listener=listener, remote_access=gv.Access.remote_read, max_send_sge=4,
        max_send_wr=512)))
    t.start()
    qp, _, _ = gv.connect_tcp(pds[0], cqs[0], "127.0.0.1", listener.port, max_send_sge=4, max_send_wr=512)
    t.join()
    layout = gv.KvLayout.per_layer(layers, blocks, block)
    decode = [np.zeros(layout.tensor_bytes, dtype=np.uint8) for _ in range(layers)]
    prefill = [((np.arange(layout.tensor_bytes) // 64 + t) % 251).astype(np.uint8) for t in range(layers)]
    ours = gv.KvPool(layout, [pds[0].register(x, gv.Access.local_write) for x in decode])
    theirs_pool = gv.KvPool(layout, [pds[1].register(x, gv.Access.local_write | gv.Access.remote_read)
                                     for x in prefill])
    theirs = gv.RemoteKvPool.load(theirs_pool.describe())
    mine = np.random.default_rng(1).permutation(blocks)[:ids].astype(np.uint32)
    far = np.random.default_rng(2).permutation(blocks)[:ids].astype(np.uint32)

    def handoff() -> None:
        plan = ours.plan("read", mine, theirs, far, qp)
        op = gv.transfer(qp, plan)
        while not op.poll():
            pass
        op.result()

    handoff()  # warm-up
    total = 0.0
    for _ in range(repeat):
        for x in decode:
            x[:] = 0xFF
        start = time.perf_counter()
        handoff()
        total += time.perf_counter() - start
        for layer in range(layers):
            got_blocks = decode[layer].reshape(2, blocks, block)[:, mine.astype(np.int64), ::64]
            want = prefill[layer].reshape(2, blocks, block)[:, far.astype(np.int64), ::64]
            if not (got_blocks == want).all():
                sys.exit("python kv: bytes wrong after the hand-off")
    pieces = ids * layers * 2 * repeat
    print(f"python kv: {ids} ids x {layers} layers x {repeat}, {total:.3f} s, {pieces / total:.0f} blocks/s")


def bench_calibrate(ops: int) -> None:
    """What this machine's Python pays for one bare await through the loop
    (asyncio.sleep(0)): the unit that tells an emulated CPU's time from a real one's."""

    async def main() -> float:
        start = time.perf_counter_ns()
        for _ in range(ops):
            await asyncio.sleep(0)
        return (time.perf_counter_ns() - start) / ops

    print(f"python bare await: {asyncio.run(main()):.0f} ns (asyncio.sleep(0), {ops} times)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("form", choices=["write", "transfer", "kv", "calibrate"])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--pool-blocks", type=int, default=1024)
    p.add_argument("--ids", type=int, default=1000)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--blocks", type=int, default=1000)
    p.add_argument("--block", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    if a.form == "calibrate":
        bench_calibrate(a.ops * 10)
    elif a.form == "write":
        bench_write(a.ops, a.rounds)
    elif a.form == "kv":
        bench_kv(a.layers, a.pool_blocks, a.ids, a.block, a.repeat)
    else:
        bench_transfer(a.blocks, a.block, a.repeat)


if __name__ == "__main__":
    main()
