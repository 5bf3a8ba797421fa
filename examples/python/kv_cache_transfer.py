"""The hand-off of disaggregated inference, from Python.

Each side has a paged KV-cache pool: a PyTorch tensor of fixed-size blocks
(on the GPU with --cuda where GPUDirect RDMA works, on the CPU otherwise). A
request's KV cache sits in some of the prefill side's blocks; the decode side
wants it in its own, differently scattered blocks. Decode sends the list of
its blocks; prefill moves every block in ONE transfer that ends with a
notification; decode verifies every byte. Both sides run on asyncio.

    python3 kv_cache_transfer.py decode [--device rxe1] [--port 18519]            (the server)
    python3 kv_cache_transfer.py prefill HOST [--device rxe0] [--port 18519]      (the client)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import numpy as np
import torch

import gpuverbs as gv

REQUEST_ID = 42


def scattered_blocks(pool: int, count: int, seed: int) -> np.ndarray:
    """`count` distinct block ids of a pool, in a scattered order (each side its own seed)."""
    return np.random.default_rng(seed).permutation(pool)[:count].astype(np.int64)


def expected(k: int, elements: int) -> torch.Tensor:
    """What the request's k-th block holds: fp16 values prefill writes and decode checks."""
    return ((torch.arange(elements, dtype=torch.float32) * 7 + k * 131 + REQUEST_ID) % 251).to(torch.float16)


async def run(args: argparse.Namespace) -> int:
    # 1. The pool: pool_blocks blocks of block_elements fp16 values, registered once, zero copy.
    device = gv.Device.open(args.device) if args.device else gv.Device.open_first()
    pd = gv.ProtectionDomain(device)
    cq = gv.CompletionQueue(device, 1024, gv.Context())
    elements = args.block_size // 2
    where = "cuda" if args.cuda else "cpu"
    pool = torch.zeros(args.blocks, elements, dtype=torch.float16, device=where)
    decode = args.role == "decode"
    access = gv.Access.local_write | gv.Access.remote_write if decode else gv.Access.local_write
    region = pd.register(pool, access)
    if region.method != "host":
        print(f"{args.role}: pool registered through {region.method} (not taken: {region.reasons})")

    # 2. Connect over TCP (endpoints, and decode's pool region). Set-up blocks: run it off the loop.
    host = None if decode else args.host
    qp, _, channel = await asyncio.to_thread(gv.connect_tcp, pd, cq, host, args.port, [region],
                                             max_send_sge=4)
    decode_ids = scattered_blocks(args.blocks, args.request, 1)
    prefill_ids = scattered_blocks(args.blocks, args.request, 2)
    block_bytes = elements * 2

    if decode:
        # 3d. A receive for the notification, then our block list on the wire.
        notified = qp.receive(region.slice(0, 0))
        wanted = gv.RemoteBlocks(region.remote(), decode_ids * block_bytes, block_bytes)
        await asyncio.to_thread(channel.send, wanted.to_bytes())
        got = await notified
        # 4d. The notification came after the last block: check every byte of every block.
        bad = sum(not torch.equal(pool[int(i)].cpu(), expected(k, elements)) for k, i in enumerate(decode_ids))
        verdict = "every byte verified" if bad == 0 else f"MISMATCH in {bad} blocks"
        print(f"decode: request {got.immediate}: {len(decode_ids)} blocks of {block_bytes} bytes arrived in my "
              f"blocks {decode_ids[0]}, {decode_ids[1]}, ...; {verdict}")
        return 0 if bad == 0 and got.immediate == REQUEST_ID else 1

    # 3p. Fill the request's blocks, read decode's list, move them all in one transfer.
    for k, i in enumerate(prefill_ids):
        pool[int(i)] = expected(k, elements).to(where)
    theirs = gv.RemoteBlocks.from_bytes(await asyncio.to_thread(channel.receive))
    mine = gv.LocalBlocks(region, prefill_ids * block_bytes, block_bytes)
    plan = gv.TransferPlan("write", mine, theirs, qp)
    start = time.perf_counter()
    moved = await gv.transfer(qp, plan, notify=REQUEST_ID)
    seconds = time.perf_counter() - start
    print(f"prefill: request {REQUEST_ID}: {len(mine)} blocks, {moved} bytes in {plan.requests} work requests, "
          f"{seconds * 1e3:.2f} ms ({moved / seconds / 1e6:.1f} MB/s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="Moves a request's KV-cache blocks into another pool's blocks.")
    parser.add_argument("role", choices=["decode", "prefill"])
    parser.add_argument("host", nargs="?", help="prefill: the decode side's address")
    parser.add_argument("--device", default="", help="RDMA device (default: the first)")
    parser.add_argument("--port", type=int, default=18519)
    parser.add_argument("--blocks", type=int, default=1024, help="blocks in each pool")
    parser.add_argument("--block-size", type=int, default=16 << 10, help="bytes per block (even)")
    parser.add_argument("--request", type=int, default=300, help="blocks in the request (at most --blocks)")
    parser.add_argument("--cuda", action="store_true", help="pools in GPU memory (needs GPUDirect RDMA)")
    args = parser.parse_args()
    if args.role == "prefill" and not args.host:
        parser.error("prefill needs the decode side's HOST")
    if not 2 <= args.request <= args.blocks:
        parser.error("--request must be between 2 and --blocks")
    try:
        return asyncio.run(run(args))
    except gv.Error as e:
        print(f"{args.role}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
