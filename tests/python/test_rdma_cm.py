"""rdma_cm from Python in its steps (create the queue pair, post receives,
then accept or connect with private data), between two of ours and against
rdma-core's rdma_server; events awaited on the loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import gpuverbs as gv

pytestmark = pytest.mark.skipif(not gv.have_rdma_cm, reason="gpuverbs was built without rdma_cm")
RW = gv.Access.local_write | gv.Access.remote_write


def rig_ips() -> tuple[str, str]:
    ip0, ip1 = os.environ.get("GPUVERBS_TEST_IP0", ""), os.environ.get("GPUVERBS_TEST_IP1", "")
    if not ip0 or not ip1:
        pytest.skip("needs the Soft-RoCE rig's addresses (GPUVERBS_TEST_IP0/IP1)")
    return ip0, ip1


def test_two_pythons_connect_in_steps_with_private_data_and_await_the_disconnect(context):
    ip0, ip1 = rig_ips()
    listener = gv.CmListener(ip1, 0)
    server: dict = {}

    def serve():
        try:
            conn = listener.accept(20)
            device = conn.device
            pd = gv.ProtectionDomain(device)
            cq = gv.CompletionQueue(device, 256, context)
            inbox = np.zeros(64, dtype=np.uint8)
            region = pd.register(inbox, RW)
            qp = conn.create_qp(pd, cq)
            server.update(conn=conn, pd=pd, cq=cq, inbox=inbox, qp=qp, receive=qp.receive(region))
            server["request_data"] = conn.peer_private_data
            conn.accept(b"welcome", 20)
        except BaseException as e:
            server["error"] = e

    t = threading.Thread(target=serve)
    t.start()
    conn = gv.cm_resolve(ip1, listener.port, 20, ip0)
    device = conn.device
    pd = gv.ProtectionDomain(device)
    cq = gv.CompletionQueue(device, 256, context)
    qp = conn.create_qp(pd, cq)
    conn.connect(b"hello", 20)
    t.join()
    assert "error" not in server, server.get("error")
    assert server["request_data"].startswith(b"hello")
    assert conn.peer_private_data.startswith(b"welcome")
    assert conn.connected and conn.peer_address == ip1 and conn.local_address == ip0
    message = np.arange(64, dtype=np.uint8)
    qp.send(pd.register(message, gv.Access.local_write)).wait(timeout=10)
    assert server["receive"].wait(timeout=10).bytes == 64
    assert (server["inbox"] == message).all()

    async def disconnected():
        wait = server["conn"].wait_event(10)
        conn.disconnect()
        return await wait

    event = asyncio.run(disconnected())
    assert event["type"] == "disconnected"
    assert event["description"]


def test_a_python_client_talks_to_rdma_cores_rdma_server(context):
    ip0, ip1 = rig_ips()
    port = 21000 + os.getpid() % 2000
    server = subprocess.Popen(["/usr/bin/rdma_server", "-s", ip1, "-p", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            conn = gv.cm_resolve(ip1, port, 20, ip0)
            device = conn.device
            pd = gv.ProtectionDomain(device)
            cq = gv.CompletionQueue(device, 16, context)
            memory = np.zeros(128, dtype=np.uint8)
            region = pd.register(memory, RW)
            qp = conn.create_qp(pd, cq)
            answer = qp.receive(region.slice(0, 64))  # posted before connect: rdma_server sends right away
            try:
                conn.connect(b"", 20)
                break
            except gv.ConnectionRejected:
                assert time.monotonic() < deadline, "rdma_server never listened"
                time.sleep(0.05)
        memory[64:80] = np.arange(16, dtype=np.uint8) + 7
        assert qp.send(region.slice(64, 16)).wait(timeout=10) == 16
        got = answer.wait(timeout=10)
        assert got.bytes == 16  # rdma_server answers with its zeroed 16-byte buffer
        assert (memory[:16] == 0).all()

        async def peer_disconnects():
            return await conn.wait_event(10)

        assert asyncio.run(peer_disconnects())["type"] == "disconnected"
        out, _ = server.communicate(timeout=20)
        assert server.returncode == 0, out
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_refused_connection_raises_connection_rejected_with_the_peers_data(context):
    ip0, ip1 = rig_ips()
    listener = gv.CmListener(ip1, 0)

    refused = {}

    def refuse():
        conn = listener.accept(20)
        device = conn.device
        pd = gv.ProtectionDomain(device)
        refused["qp"] = conn.create_qp(pd, gv.CompletionQueue(device, 16, context))
        refused["keep"] = (conn, pd)
        conn.reject(b"no room")  # frees the queue pair made on it

    t = threading.Thread(target=refuse)
    t.start()
    conn = gv.cm_resolve(ip1, listener.port, 20, ip0)
    device = conn.device
    pd = gv.ProtectionDomain(device)
    conn.create_qp(pd, gv.CompletionQueue(device, 16, context))
    with pytest.raises(gv.ConnectionRejected) as caught:
        conn.connect(b"", 20)
    t.join()
    assert caught.value.code == gv.Errc.connection_rejected
    assert conn.rejection["by_peer"] and conn.rejection["private_data"].startswith(b"no room")
    region = refused["keep"][1].register(np.zeros(8, dtype=np.uint8), RW)
    with pytest.raises(ValueError, match="the QueuePair is closed"):
        refused["qp"].receive(region)
