"""Least access from Python, attacked on the rig's Soft-RoCE devices: a queue
pair grants its peer what the regions it advertised allow, nothing when it
advertised none (before, every queue pair granted write, read and atomics,
and Python could not narrow it)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gpuverbs as gv
from conftest import connect_pair

RW = gv.Access.local_write | gv.Access.remote_write
ALL = RW | gv.Access.remote_read | gv.Access.remote_atomic


def test_attack_a_queue_pair_that_advertised_nothing_lets_a_valid_key_write_nothing(context, sides):
    a, b = sides
    qp_a, qp_b = connect_pair(context, a, b, remote_access=None)  # connect_tcp's default: no regions, no grant
    assert qp_b.remote_access == 0
    victim = np.full(4096, 0x5A, dtype=np.uint8)
    key = b.pd.register(victim, ALL).remote()  # the attacker holds a valid key of b's domain
    src = a.pd.register(np.ones(4096, dtype=np.uint8), gv.Access.local_write)
    with pytest.raises(gv.CompletionError) as caught:
        qp_a.write(src, key).wait(timeout=10)
    assert "remote invalid request" in str(caught.value)
    assert "PreparedQueuePair::advertise" in str(caught.value)
    assert (victim == 0x5A).all()


def test_attack_a_peer_given_a_read_only_region_reads_it_and_cannot_write_beside_it(context, sides):
    a, b = sides
    shown = np.full(4096, 0x33, dtype=np.uint8)
    readable = b.pd.register(shown, gv.Access.remote_read)
    victim = np.full(4096, 0x5A, dtype=np.uint8)
    writable = b.pd.register(victim, ALL)  # another peer's region in the same domain
    listener = gv.TcpListener(0, "127.0.0.1")
    got = {}
    server = threading.Thread(target=lambda: got.update(b=gv.connect_tcp(b.pd, b.cq, None, 0, [readable],
                                                                          listener=listener)))
    server.start()
    qp_a, regions, channel = gv.connect_tcp(a.pd, a.cq, "127.0.0.1", listener.port)
    server.join()
    qp_b = got["b"][0]
    assert qp_b.remote_access == int(gv.Access.remote_read)
    assert qp_a.remote_access == 0

    back = np.zeros(4096, dtype=np.uint8)
    assert qp_a.read(a.pd.register(back, gv.Access.local_write), regions[0]).wait(timeout=10) == 4096
    assert (back == 0x33).all()
    src = a.pd.register(np.ones(4096, dtype=np.uint8), gv.Access.local_write)
    with pytest.raises(gv.CompletionError) as caught:
        qp_a.write(src, writable.remote()).wait(timeout=10)
    assert "remote invalid request" in str(caught.value)
    assert (victim == 0x5A).all()
    channel.close()
    got["b"][2].close()


def test_remote_access_grants_exactly_what_it_says_and_bad_flags_are_refused(context, sides):
    a, b = sides
    qp_a, qp_b = connect_pair(context, a, b, remote_access=gv.Access.remote_write)
    assert qp_b.remote_access == int(gv.Access.remote_write)
    dst = np.zeros(64, dtype=np.uint8)
    src = a.pd.register(np.full(64, 7, dtype=np.uint8), gv.Access.local_write)
    assert qp_a.write(src, b.pd.register(dst, ALL).remote()).wait(timeout=10) == 64
    assert (dst == 7).all()

    prepared = gv.PreparedQueuePair(a.pd, a.cq)
    with pytest.raises(ValueError, match=r"connect: remote_access .* has flags a queue pair cannot grant"):
        prepared.connect(qp_b.remote_endpoint, remote_access=int(gv.Access.local_write))
    region = a.pd.register(np.zeros(64, dtype=np.uint8), RW)
    offered = prepared.advertise(region)
    assert (offered.address, offered.length, offered.rkey) == (region.remote().address, 64, region.rkey)
    assert prepared.advertised_access == int(gv.Access.remote_write)
    with pytest.raises(ValueError, match=r"a RemoteMemory among regions does not say what the peer may do"):
        gv.connect_tcp(a.pd, a.cq, "127.0.0.1", 1, [region.remote()])
