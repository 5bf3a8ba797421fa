"""Fixtures of the Python tests: the rig's two real Soft-RoCE devices
(tests/softroce/run names them in GPUVERBS_TEST_DEV0/DEV1), a Context, and
queue pairs connected through gpuverbs' own TCP bootstrap."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, List

import pytest

import gpuverbs as gv


def rig_devices() -> tuple[str, str]:
    dev0 = os.environ.get("GPUVERBS_TEST_DEV0", "")
    dev1 = os.environ.get("GPUVERBS_TEST_DEV1", "")
    if not dev0 or not dev1:
        pytest.skip("needs the Soft-RoCE rig (tests/softroce/run sets GPUVERBS_TEST_DEV0/DEV1)")
    return dev0, dev1


@dataclass
class Side:
    device: Any
    pd: Any
    cq: Any
    regions: List[Any] = field(default_factory=list)


@dataclass
class Pair:
    """Two connected queue pairs, one per rig device, on one Context."""

    context: Any
    a: Side
    b: Side
    qp_a: Any
    qp_b: Any


# The data-path tests register their regions after connecting, so the pair
# grants every remote access up front (what a queue pair that advertised
# those regions would grant); test_least_access.py checks the default.
EVERYTHING = gv.Access.remote_write | gv.Access.remote_read | gv.Access.remote_atomic


def connect_pair(context: Any, a: Side, b: Side, remote_access: Any = EVERYTHING,
                 **qp_options: int) -> tuple[Any, Any]:
    listener = gv.TcpListener(0, "127.0.0.1")
    got: dict[str, Any] = {}

    def serve() -> None:
        try:
            got["b"] = gv.connect_tcp(b.pd, b.cq, None, 0, listener=listener, remote_access=remote_access,
                                     **qp_options)
        except BaseException as e:  # surfaced below
            got["error"] = e

    server = threading.Thread(target=serve)
    server.start()
    qp_a, _, channel = gv.connect_tcp(a.pd, a.cq, "127.0.0.1", listener.port, remote_access=remote_access,
                                        **qp_options)
    server.join()
    if "error" in got:
        raise got["error"]
    channel.close()
    got["b"][2].close()
    return qp_a, got["b"][0]


@pytest.fixture
def context() -> Any:
    return gv.Context()


@pytest.fixture
def sides(context: Any) -> tuple[Side, Side]:
    dev0, dev1 = rig_devices()
    out = []
    for name in (dev0, dev1):
        device = gv.Device.open(name)
        pd = gv.ProtectionDomain(device)
        out.append(Side(device, pd, gv.CompletionQueue(device, 4096, context)))
    return out[0], out[1]


@pytest.fixture
def pair(context: Any, sides: tuple[Side, Side]) -> Pair:
    a, b = sides
    qp_a, qp_b = connect_pair(context, a, b, max_send_sge=4, max_send_wr=512, max_recv_wr=512)
    return Pair(context, a, b, qp_a, qp_b)
