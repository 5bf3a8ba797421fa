"""gpuverbs: GPUDirect RDMA from Python, over the C++ library.

Memory comes from the objects you already have, zero copy: anything with
``__dlpack__`` (PyTorch, CuPy, JAX, NumPy), ``__cuda_array_interface__`` or
the buffer protocol, CPU or CUDA. A region holds the object for its whole
life. Operations are awaited on the running asyncio loop, or waited for.

    import gpuverbs as gv
    device = gv.Device.open_first()
    pd = gv.ProtectionDomain(device)
    cq = gv.CompletionQueue(device, 1024, gv.Context())
    region = pd.register(tensor, gv.Access.local_write | gv.Access.remote_write)
    ...
    await qp.write(region.slice(0, 4096), peer_memory)

The rules, the asyncio model and the GPU decision: docs/python.md.
"""

from __future__ import annotations

import asyncio
import enum
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _asyncio, _core
from ._core import (
    CompletionQueue,
    Context,
    Device,
    Endpoint,
    Errc,
    GpuBuffer,
    LocalBlocks,
    LocalBuffer,
    MemoryRegion,
    Operation,
    PreparedQueuePair,
    ProtectionDomain,
    QueuePair,
    Received,
    RemoteBlocks,
    RemoteMemory,
    TcpChannel,
    TcpListener,
    TransferPlan,
    TransferReport,
    devices,
    explain_gpu_registration,
    gpu_memory,
    tcp_connect,
    transfer,
)
from .errors import (
    Aborted,
    CompletionError,
    ConnectionClosed,
    ConnectionRejected,
    Error,
    GpuDirectUnavailable,
    RequestRefused,
    TimeoutError,
)

__version__: str = _core.__version__

have_rdma_cm: bool = _core.have_rdma_cm
if have_rdma_cm:
    from ._core import CmConnection, CmListener, cm_resolve

__all__ = [
    "Aborted",
    "Access",
    "CmConnection",
    "CmListener",
    "CompletionError",
    "CompletionQueue",
    "ConnectionClosed",
    "ConnectionRejected",
    "Context",
    "Device",
    "Endpoint",
    "Errc",
    "Error",
    "GpuBuffer",
    "GpuDirectUnavailable",
    "LocalBlocks",
    "LocalBuffer",
    "MemoryRegion",
    "Operation",
    "PreparedQueuePair",
    "ProtectionDomain",
    "QueuePair",
    "Received",
    "RemoteBlocks",
    "RemoteMemory",
    "RequestRefused",
    "TcpChannel",
    "TcpListener",
    "TimeoutError",
    "TransferPlan",
    "TransferReport",
    "cm_resolve",
    "connect_tcp",
    "devices",
    "doctor",
    "explain_gpu_registration",
    "gpu_memory",
    "tcp_connect",
    "transfer",
]


class Access(enum.IntFlag):
    """What the NIC may do with a registered region (combine with ``|``)."""

    none = _core._access_flags["none"]
    local_write = _core._access_flags["local_write"]
    remote_write = _core._access_flags["remote_write"]
    remote_read = _core._access_flags["remote_read"]
    remote_atomic = _core._access_flags["remote_atomic"]
    relaxed_ordering = _core._access_flags["relaxed_ordering"]


def _register(
    self: ProtectionDomain,
    obj: Any,
    access: Union[Access, int] = Access.local_write,
    *,
    via: str = "auto",
    policy: str = "auto",
) -> MemoryRegion:
    """Registers ``obj``'s memory, zero copy, and holds ``obj`` while the region lives.

    ``obj`` exposes ``__dlpack__`` (tried first), ``__cuda_array_interface__``
    or the buffer protocol; ``via`` picks one ("dlpack",
    "cuda_array_interface", "buffer"). It must be contiguous (never copied).
    CUDA memory goes through the C++ ``register_gpu_memory`` (``policy``:
    "auto", "dmabuf", "peermem"): ``region.method`` says which was taken,
    ``region.reasons`` why the others were not; when none works it raises
    :class:`GpuDirectUnavailable` with the library's words.
    """
    if not isinstance(access, int):
        raise TypeError(f"access must be gpuverbs.Access flags, not {type(access).__name__}")
    return _core._register(self, obj, int(access), via, policy)


ProtectionDomain.register = _register  # type: ignore[attr-defined]
Operation.__await__ = _asyncio.await_operation  # type: ignore[method-assign,assignment]


def doctor(live: bool = True) -> Dict[str, Any]:
    """The GPUDirect RDMA readiness checklist: the same findings as
    ``gpuverbs-doctor --json``, as dicts (``["checks"]``, ``["gpus"]``, …)."""
    result: Dict[str, Any] = json.loads(_core._doctor_json(live))
    return result


def connect_tcp(
    pd: ProtectionDomain,
    cq: CompletionQueue,
    host: Optional[str],
    port: int,
    regions: Sequence[RemoteMemory] = (),
    *,
    timeout: float = 30.0,
    listener: Optional[TcpListener] = None,
    **qp_options: int,
) -> Tuple[QueuePair, List[RemoteMemory], TcpChannel]:
    """One reliable queue pair over the TCP bootstrap, in one call.

    The server passes ``host=None`` (it listens on ``port``, or uses
    ``listener``); the client passes the server's host. Both send their
    endpoint and ``regions`` and get the peer's: returns ``(qp,
    peer_regions, channel)``; the channel stays open for records (block
    lists). Blocking, GIL released: from asyncio, ``await
    asyncio.to_thread(gv.connect_tcp, ...)``.
    """
    prepared = PreparedQueuePair(pd, cq, **qp_options)
    if host is None:
        server = listener if listener is not None else TcpListener(port)
        channel = server.accept(timeout)
    else:
        channel = tcp_connect(host, port, timeout)
    endpoint, peer_regions = channel.exchange(prepared.endpoint, list(regions), timeout)
    qp = prepared.connect(endpoint)
    return qp, peer_regions, channel


class _EventWait:
    """``CmConnection.wait_event()``: awaitable on the running loop (the
    connection's event channel is watched with ``loop.add_reader``), or
    ``.wait()`` to block. The event is a dict: type, native_type, status,
    description."""

    __slots__ = ("_conn", "_timeout")

    def __init__(self, conn: Any, timeout: Optional[float]) -> None:
        self._conn = conn
        self._timeout = timeout

    def wait(self) -> Optional[Dict[str, Any]]:
        event: Optional[Dict[str, Any]] = self._conn._wait_event(30.0 if self._timeout is None else self._timeout)
        return event

    def __await__(self) -> Any:
        return self._wait_async().__await__()

    async def _wait_async(self) -> Dict[str, Any]:
        event = self._conn.poll_event()
        if event is not None:
            return event  # type: ignore[no-any-return]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Dict[str, Any]] = loop.create_future()
        fd = self._conn.event_fd()

        def ready() -> None:
            if future.done():
                return
            try:
                got = self._conn.poll_event()
            except Error as e:
                future.set_exception(e)
                return
            if got is not None:
                future.set_result(got)

        loop.add_reader(fd, ready)
        try:
            return await asyncio.wait_for(future, self._timeout)
        finally:
            loop.remove_reader(fd)


if have_rdma_cm:

    def _wait_event(self: Any, timeout: Optional[float] = None) -> _EventWait:
        return _EventWait(self, timeout)

    CmConnection.wait_event = _wait_event  # type: ignore[attr-defined]
