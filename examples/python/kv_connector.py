"""A KV-cache connector shaped like a serving engine's, and a harness that
plays the engine's step loop in two processes.

A disaggregated engine runs prefill and decode apart; decode pulls each
request's KV cache out of prefill's paged pool into its own. The connector
here has the calls a serving engine's connector API asks for (vLLM's:
register_kv_caches, start_load_kv, wait_for_layer_load, get_finished):

- register_kv_caches: one tensor per layer, [2, blocks, block_size, heads,
  head_dim], registered once as a gpuverbs.KvPool; its metadata (a few
  hundred bytes, whatever the number of blocks) goes to the peer over the
  engine's own side channel;
- start_load_kv (decode): a read per layer of the request's blocks, by block
  id, all started at once but the last; the last layer's read starts when
  the others have completed and ends with a notification carrying the
  request id to prefill (so prefill hears only once every layer was read);
  nothing blocks;
- wait_for_layer_load (decode): steps until that layer's read has landed,
  so the engine can run a layer while the next ones are still arriving;
- get_finished: once per engine step, from the engine's own loop (no asyncio,
  no thread: a polled gpuverbs.Context, advanced by progress()): decode's
  requests whose blocks all landed, prefill's requests whose blocks the
  reader is done with (their notification arrived, so the blocks may be
  reused).

    python3 kv_connector.py prefill [--device rxe1] [--port 18521]          (the server)
    python3 kv_connector.py decode HOST [--device rxe0] [--port 18521]      (the client)

Tensors are on the CPU by default; --cuda puts them on the GPU (registration
then needs GPUDirect RDMA). Every byte decode loads is checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import torch

import gpuverbs as gv


class KvConnector:
    """One engine's end of the KV-cache hand-off, over one queue pair to its peer."""

    def __init__(self, role: str, device: gv.Device, context: gv.Context) -> None:
        self.role = role
        self.context = context
        self.pd = gv.ProtectionDomain(device)
        self.cq = gv.CompletionQueue(device, 4096, context)
        self.qp: Optional[gv.QueuePair] = None
        self.pool: Optional[gv.KvPool] = None
        self.peer: Optional[gv.RemoteKvPool] = None
        self.inbox: Optional[gv.NotificationInbox] = None
        self.loading: Dict[str, List[gv.Operation]] = {}  # decode: request id -> its reads, layer by layer
        self.last_layer: Dict[str, gv.TransferPlan] = {}  # decode: the last layer's read, not yet started
        self.done_sending: Set[str] = set()  # prefill: requests whose reader is done
        self.started = 0

    # -- set-up ------------------------------------------------------------
    def register_kv_caches(self, kv_caches: List[torch.Tensor]) -> bytes:
        """Registers the cache once (a tensor per layer); returns the metadata the peer loads."""
        halves, blocks = kv_caches[0].shape[0], kv_caches[0].shape[1]
        block_bytes = kv_caches[0][0, 0].numel() * kv_caches[0].element_size()
        layout = gv.KvLayout.per_layer(len(kv_caches), blocks, block_bytes, halves)
        access = gv.Access.local_write | gv.Access.remote_read if self.role == "prefill" else gv.Access.local_write
        self.pool = gv.KvPool(layout, [self.pd.register(t, access) for t in kv_caches])
        return self.pool.describe()

    def connect(self, host: Optional[str], port: int) -> gv.TcpChannel:
        """The queue pair to the peer (prefill listens); the TCP channel stays as the side channel."""
        grant = gv.Access.remote_read if self.role == "prefill" else None  # None: nothing to grant
        self.qp, _, channel = gv.connect_tcp(self.pd, self.cq, host, port, remote_access=grant,
                                             max_send_sge=4, max_send_wr=512, max_inline_data=64)
        if self.role == "prefill":
            self.inbox = gv.NotificationInbox(self.qp, self.pd, slots=32)
        return channel

    def add_peer(self, metadata: bytes) -> None:
        self.peer = gv.RemoteKvPool.load(metadata)  # refused, naming the field, if malformed

    # -- decode ------------------------------------------------------------
    def start_load_kv(self, request_id: str, local_ids: np.ndarray, remote_ids: np.ndarray) -> None:
        """Starts reading the request's blocks, a read per layer; returns at once."""
        assert self.pool is not None and self.peer is not None and self.qp is not None
        layers = self.pool.layout.layers
        self.loading[request_id] = [
            gv.transfer(self.qp, self.pool.plan("read", local_ids, self.peer, remote_ids, self.qp, layers=(layer, 1)),
                        timeout=30.0)
            for layer in range(layers - 1)]
        self.last_layer[request_id] = self.pool.plan("read", local_ids, self.peer, remote_ids, self.qp,
                                                     layers=(layers - 1, 1))
        self._start_last_layer(request_id)

    def _start_last_layer(self, request_id: str) -> None:
        """The last layer's read, with the notification, once every other layer's read has completed:
        the notification follows the reads of its own transfer, so it must be the last to start."""
        plan = self.last_layer.get(request_id)
        if plan is None or not all(op.done for op in self.loading[request_id]):
            return
        for op in self.loading[request_id]:
            op.result()  # a failed layer raises here, naming its blocks: prefill is not told
        assert self.qp is not None
        del self.last_layer[request_id]
        self.started += 1
        self.loading[request_id].append(gv.transfer(self.qp, plan, notify=self.started,
                                                    notify_message=request_id.encode(), timeout=30.0))

    def wait_for_layer_load(self, request_id: str, layer: int) -> None:
        """Steps until `layer`'s read has landed; raises its gpuverbs.Error (naming the blocks) if it failed."""
        ops = self.loading[request_id]
        while True:
            self.context.progress()
            self._start_last_layer(request_id)
            if layer < len(ops) and ops[layer].done:
                ops[layer].result()
                return

    # -- both: once per engine step ----------------------------------------
    def get_finished(self) -> Tuple[Set[str], Set[str]]:
        """(requests prefill may free, requests decode has loaded) since the last call; never blocks."""
        self.context.progress()
        sending: Set[str] = set()
        if self.inbox is not None:
            while (n := self.inbox.poll()) is not None:
                sending.add(n.bytes.decode())
        for r in list(self.last_layer):
            self._start_last_layer(r)
        recving = {r for r, ops in self.loading.items() if r not in self.last_layer and all(op.done for op in ops)}
        for r in recving:
            for op in self.loading.pop(r):
                op.result()
        self.done_sending |= sending
        return sending, recving


def pattern(request: int, layer: int, shape: Tuple[int, ...]) -> torch.Tensor:
    """What request `request`'s blocks of `layer` hold: fp16 values prefill writes and decode checks."""
    n = int(np.prod(shape))
    return ((torch.arange(n, dtype=torch.float32) * 3 + request * 131 + layer * 17) % 251).to(
        torch.float16).reshape(shape)


def run(args: argparse.Namespace) -> int:
    device = gv.Device.open(args.device) if args.device else gv.Device.open_first()
    where = "cuda" if args.cuda else "cpu"
    shape = (2, args.blocks, args.block_tokens, args.heads, args.head_dim)
    kv_caches = [torch.zeros(shape, dtype=torch.float16, device=where) for _ in range(args.layers)]
    connector = KvConnector(args.role, device, gv.Context(polled=True))
    metadata = connector.register_kv_caches(kv_caches)
    channel = connector.connect(args.host if args.role == "decode" else None, args.port)
    channel.send(metadata)
    connector.add_peer(channel.receive())
    rng = np.random.default_rng(5 if args.role == "prefill" else 6)
    started = time.perf_counter()

    if args.role == "prefill":
        # The scheduler's side: each request's blocks, filled, then announced (vLLM's kv_transfer_params).
        free = list(rng.permutation(args.blocks))
        owned: Dict[str, np.ndarray] = {}
        for r in range(args.requests):
            ids = np.array([free.pop() for _ in range(args.request_blocks)], dtype=np.int64)
            for layer, t in enumerate(kv_caches):
                t[:, torch.from_numpy(ids)] = pattern(r, layer, (2, len(ids)) + shape[2:]).to(where)
            owned[f"request-{r}"] = ids
            channel.send(json.dumps({"request": f"request-{r}", "blocks": ids.tolist()}).encode())
        steps = 0
        deadline = time.monotonic() + 60
        while len(connector.done_sending) < args.requests and time.monotonic() < deadline:
            sending, _ = connector.get_finished()  # the engine's step
            for request in sending:
                free.extend(owned.pop(request).tolist())  # the reader is done: the blocks go back to the pool
            steps += 1
        ok = len(connector.done_sending) == args.requests and not owned
        print(f"prefill: {len(connector.done_sending)} of {args.requests} requests read and their blocks freed, "
              f"in {steps} engine steps, {time.perf_counter() - started:.2f} s")
        return 0 if ok else 1

    # Decode: take each announced request, load it into blocks of our own, check every byte.
    free = list(rng.permutation(args.blocks))
    mine: Dict[str, Tuple[int, np.ndarray]] = {}
    for r in range(args.requests):
        announced = json.loads(channel.receive())
        ids = np.array([free.pop() for _ in range(args.request_blocks)], dtype=np.int64)
        mine[announced["request"]] = (r, ids)
        connector.start_load_kv(announced["request"], ids, np.array(announced["blocks"], dtype=np.int64))
    # The engine runs the first request layer by layer as each lands (checked as it lands).
    first = next(iter(mine))
    early = 0
    for layer, t in enumerate(kv_caches):
        connector.wait_for_layer_load(first, layer)
        r, ids = mine[first]
        early += int(not torch.equal(t[:, torch.from_numpy(ids)].cpu(), pattern(r, layer, (2, len(ids)) + shape[2:])))
    loaded: Set[str] = set()
    deadline = time.monotonic() + 60
    while len(loaded) < args.requests and time.monotonic() < deadline:
        _, recving = connector.get_finished()  # the engine's step
        loaded |= recving
    bad = 0
    for request, (r, ids) in mine.items():
        for layer, t in enumerate(kv_caches):
            want = pattern(r, layer, (2, len(ids)) + shape[2:])
            bad += int(not torch.equal(t[:, torch.from_numpy(ids)].cpu(), want))
    moved = args.requests * args.request_blocks * args.layers * 2 * int(np.prod(shape[2:])) * 2
    verdict = "every byte verified" if bad == 0 else f"MISMATCH in {bad} (request, layer) pairs"
    print(f"decode: loaded {len(loaded)} of {args.requests} requests, {args.request_blocks} blocks of "
          f"{args.layers} layers each by block id ({moved} bytes) in "
          f"{time.perf_counter() - started:.2f} s; {verdict}")
    if early:
        print(f"decode: {early} layers of {first} were not all there when wait_for_layer_load returned")
    return 0 if bad == 0 and early == 0 and len(loaded) == args.requests else 1


def main() -> int:
    parser = argparse.ArgumentParser(description="A KV-cache connector and an engine's step loop around it.")
    parser.add_argument("role", choices=["prefill", "decode"])
    parser.add_argument("host", nargs="?", help="decode: the prefill side's address")
    parser.add_argument("--device", default="", help="RDMA device (default: the first)")
    parser.add_argument("--port", type=int, default=18521)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=256, help="blocks per layer")
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--request-blocks", type=int, default=24, help="blocks per request")
    parser.add_argument("--cuda", action="store_true", help="caches in GPU memory (needs GPUDirect RDMA)")
    args = parser.parse_args()
    if args.role == "decode" and not args.host:
        parser.error("decode needs the prefill side's HOST")
    if args.requests * args.request_blocks > args.blocks:
        parser.error("--requests x --request-blocks must fit in --blocks")
    try:
        return run(args)
    except gv.Error as e:
        print(f"{args.role}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
