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
    BlockLeases,
    CompletionQueue,
    Context,
    Device,
    DeviceEvents,
    DeviceQueue,
    DeviceQueueProxy,
    Endpoint,
    Errc,
    GpuBuffer,
    KvLayout,
    KvPool,
    LeasedBlockList,
    LeaseReader,
    LocalBlocks,
    LocalBuffer,
    MemoryRegion,
    Mesh,
    MeshPeer,
    Notification,
    NotificationInbox,
    Operation,
    PmixRendezvous,
    PreparedQueuePair,
    PrometheusText,
    ProtectionDomain,
    QueuePair,
    RailGroup,
    Received,
    RedisRendezvous,
    RemoteBlocks,
    RegistrationCache,
    RemoteKvPool,
    RemoteMemory,
    TcpChannel,
    TcpListener,
    TransferPlan,
    TransferRail,
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
    "async_drive",
    "BlockLeases",
    "CmConnection",
    "CmListener",
    "CompletionError",
    "CompletionQueue",
    "ConnectionClosed",
    "ConnectionRejected",
    "Context",
    "Device",
    "DeviceEvents",
    "DeviceQueue",
    "DeviceQueueProxy",
    "Endpoint",
    "Errc",
    "Error",
    "GpuBuffer",
    "GpuDirectUnavailable",
    "KvLayout",
    "KvPool",
    "LeasedBlockList",
    "LeaseReader",
    "LocalBlocks",
    "LocalBuffer",
    "MemoryRegion",
    "Mesh",
    "MeshPeer",
    "Notification",
    "NotificationInbox",
    "Operation",
    "PmixRendezvous",
    "PreparedQueuePair",
    "PrometheusText",
    "ProtectionDomain",
    "QueuePair",
    "RailGroup",
    "Received",
    "RedisRendezvous",
    "RemoteBlocks",
    "RegistrationCache",
    "RemoteKvPool",
    "RemoteMemory",
    "RequestRefused",
    "TcpChannel",
    "TcpListener",
    "TimeoutError",
    "TransferPlan",
    "TransferRail",
    "TransferReport",
    "cm_resolve",
    "connect_tcp",
    "device_queue_include_dir",
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


def device_queue_include_dir() -> str:
    """The directory to add to a kernel's include path for ``#include <gpuverbs/device_queue/device.cuh>``.

    The headers a kernel started from Python includes (CuPy's ``RawModule(...,
    options=("-std=c++20", "-I" + gv.device_queue_include_dir()), backend="nvcc")``):
    ``put``, ``put_signal``, ``signal``, ``fence``, ``quiet``, ``wait_signal`` and
    ``queue_view(slots, producer, proxy, log2_capacity)``, whose four
    arguments are a :class:`DeviceQueue`'s ``view``.
    """
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


async def async_drive(
    proxy: DeviceQueueProxy,
    *,
    passes: Optional[int] = None,
    idle_passes_before_nap: Optional[int] = None,
    nap: Optional[float] = None,
) -> None:
    """Drives a :class:`DeviceQueueProxy` on the running asyncio loop, as the
    C++ ``async_drive`` does on an Asio executor: ``passes`` ``progress()``
    calls, then the loop runs other work; after ``idle_passes_before_nap``
    idle passes in a row it sleeps ``nap`` seconds, so an idle queue costs
    little. ``None`` takes ``DeviceQueueDriveOptions``' default (C++: its one
    source). Returns once the queue closed; raises :class:`Error`
    (``device_queue_failed``, the proxy's words) once it failed; cancelled,
    it closes the queue first, so no kernel waits on a queue nobody drives.
    """
    defaults = DeviceQueueProxy.drive_defaults
    n = defaults["passes"] if passes is None else passes
    idle_before_nap = defaults["idle_passes_before_nap"] if idle_passes_before_nap is None else idle_passes_before_nap
    pause = defaults["nap"] if nap is None else nap
    if n < 1 or idle_before_nap < 0 or pause < 0:
        raise ValueError(f"async_drive: passes {n} must be 1 or more, idle_passes_before_nap {idle_before_nap} and "
                         f"nap {pause} 0 or more")
    try:
        while proxy.error == "none":
            idle = proxy.drive_passes(n)
            if idle_before_nap != 0 and idle >= idle_before_nap:
                await asyncio.sleep(pause)
            else:
                await asyncio.sleep(0)
    except asyncio.CancelledError:
        proxy.close()
        raise
    if proxy.error != "closed":
        _core._device_queue_failed(proxy.failure)  # raises gpuverbs.Error (device_queue_failed)


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
    regions: Sequence[Union[MemoryRegion, RemoteMemory]] = (),
    *,
    timeout: float = 30.0,
    listener: Optional[TcpListener] = None,
    remote_access: Optional[Union[Access, int]] = None,
    **qp_options: int,
) -> Tuple[QueuePair, List[RemoteMemory], TcpChannel]:
    """One reliable queue pair over the TCP bootstrap, in one call.

    The server passes ``host=None`` (it listens on ``port``, or uses
    ``listener``); the client passes the server's host. Both send their
    endpoint and ``regions`` and get the peer's: returns ``(qp,
    peer_regions, channel)``; the channel stays open for records (block
    lists). Blocking, GIL released: from asyncio, ``await
    asyncio.to_thread(gv.connect_tcp, ...)``.

    The queue pair grants the peer what the ``regions`` allow (each
    MemoryRegion is advertised), and nothing when none are given; a
    RemoteMemory does not say what its region allows, so with one among
    ``regions``, ``remote_access`` must say what to grant. ``remote_access``
    overrides the grant either way.
    """
    prepared = PreparedQueuePair(pd, cq, **qp_options)
    offered: List[RemoteMemory] = []
    for region in regions:
        if isinstance(region, MemoryRegion):
            offered.append(prepared.advertise(region))
        else:
            if remote_access is None:
                raise ValueError("connect_tcp: a RemoteMemory among regions does not say what the peer may do with "
                                 "it: pass the MemoryRegion itself (its access is then granted), or remote_access")
            offered.append(region)
    if host is None:
        server = listener if listener is not None else TcpListener(port)
        channel = server.accept(timeout)
    else:
        channel = tcp_connect(host, port, timeout)
    endpoint, peer_regions = channel.exchange(prepared.endpoint, offered, timeout)
    qp = prepared.connect(endpoint, remote_access=None if remote_access is None else int(remote_access))
    return qp, peer_regions, channel


class _EventWait:
    """An awaitable wait for the next event of an rdma_cm connection or a
    device: on the running loop its descriptor is watched with
    ``loop.add_reader`` (a device is also polled every
    ``DeviceEvents.removal_check_interval``, as in C++, for a removal that no
    descriptor announces); ``.wait()`` blocks instead (GIL released). Either
    gives the event as a dict, or None when ``timeout`` seconds pass first."""

    __slots__ = ("_poll", "_fd", "_wait", "_timeout", "_tick")

    def __init__(self, poll: Any, fd: int, wait: Any, timeout: Optional[float], tick: Optional[float] = None) -> None:
        self._poll = poll
        self._fd = fd
        self._wait = wait
        self._timeout = timeout
        self._tick = tick

    def wait(self) -> Optional[Dict[str, Any]]:
        event: Optional[Dict[str, Any]] = self._wait(86400.0 if self._timeout is None else self._timeout)
        return event

    def __await__(self) -> Any:
        return self._wait_async().__await__()

    async def _wait_async(self) -> Optional[Dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout is None else loop.time() + self._timeout
        while True:
            event = self._poll()
            if event is not None:
                return event  # type: ignore[no-any-return]
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            if self._tick is not None:
                left = self._tick if left is None else min(left, self._tick)
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, left)
            except asyncio.TimeoutError:
                pass
            finally:
                loop.remove_reader(self._fd)


if have_rdma_cm:

    def _cm_wait_event(self: Any, timeout: Optional[float] = None) -> _EventWait:
        """The connection's next rdma_cm event (``await conn.wait_event(10)``, or ``.wait()``)."""
        return _EventWait(self.poll_event, self.event_fd(), self._wait_event, timeout)

    CmConnection.wait_event = _cm_wait_event  # type: ignore[attr-defined]


def _device_wait_event(self: DeviceEvents, timeout: Optional[float] = None) -> _EventWait:
    """The device's next event (``await events.wait_event(10)``, or ``.wait()``)."""
    return _EventWait(self.poll, self.fileno(), self._wait_for, timeout, DeviceEvents.removal_check_interval)


DeviceEvents.wait_event = _device_wait_event  # type: ignore[attr-defined]


def _cache_get(self: RegistrationCache, obj: Any, access: Union[Access, int] = Access.local_write) -> MemoryRegion:
    """A region for ``obj`` from the cache (held, zero copy); registers only on a miss."""
    if not isinstance(access, int):
        raise TypeError(f"access must be gpuverbs.Access flags, not {type(access).__name__}")
    return self._get(obj, int(access))


RegistrationCache.get = _cache_get  # type: ignore[method-assign,assignment]
