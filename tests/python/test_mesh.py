"""Many peers from Python on the rig: gpuverbs.Mesh over a redis-server this
test starts (with a password, from a 0600 file) and over PMIx under mpirun,
each with two member processes (tests/python/mesh_member.py) that read each
other's memory and check every byte; then what a mesh refuses, in words."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import gpuverbs as gv

from conftest import rig_devices

MEMBER = Path(__file__).with_name("mesh_member.py")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Redis:
    def __init__(self, tmp: Path) -> None:
        self.host = os.environ.get("GPUVERBS_TEST_IP0") or "127.0.0.1"
        self.port = free_port(self.host)
        self.password = "pw-" + secrets.token_hex(12)
        conf = tmp / "redis.conf"
        conf.touch(mode=0o600)
        conf.write_text(f"bind {self.host}\nport {self.port}\nrequirepass {self.password}\nsave \"\"\n"
                        "appendonly no\ndir /tmp\nprotected-mode no\n")
        self.log = tmp / "redis.log"
        self.process = subprocess.Popen(["redis-server", str(conf)], stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT)
        # The members (child processes) and this process read it from there, by name.
        os.environ["GPUVERBS_TEST_REDIS_PASSWORD"] = self.password
        deadline = time.monotonic() + 10
        while True:
            try:
                probe = gv.RedisRendezvous(self.host, self.port, service="probe",
                                           password_env="GPUVERBS_TEST_REDIS_PASSWORD")
                probe.withdraw()
                return
            except gv.Error:
                if time.monotonic() > deadline:
                    raise AssertionError("redis-server did not start: " + self.log.read_text())
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    rig_devices()
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server (scripts/install-deps installs it)")
    if not gv.RedisRendezvous.available():
        pytest.skip("this gpuverbs was built without hiredis (RedisRendezvous raises Errc.unsupported)")
    server = Redis(tmp_path)
    yield server
    server.stop()
    os.environ.pop("GPUVERBS_TEST_REDIS_PASSWORD", None)


def members_pass(processes: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    outputs = []
    for p in processes:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in processes:
                q.kill()
            raise AssertionError("a mesh member did not end within %.0f s" % timeout)
    # Every member's output when one failed: the other's often says why.
    assert all(p.returncode == 0 for p in processes), "\n---\n".join(
        f"exit status {p.returncode}:\n{out}" for p, out in zip(processes, outputs))
    # mpirun forwards both ranks' output through one pipe, where two lines may run together.
    return [m.group(0) for out in outputs for m in re.finditer(r"mesh-member \d+: [^\n]*?closed", out)]


def test_a_mesh_through_redis_connects_two_processes_that_read_each_others_memory(redis: Redis) -> None:
    service = "py-mesh-" + secrets.token_hex(4)
    members = [subprocess.Popen([sys.executable, str(MEMBER), "redis", redis.host, str(redis.port), service],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    lines = members_pass(members, 120)
    assert sorted(line.split(":")[0] for line in lines) == ["mesh-member 0", "mesh-member 1"], lines
    assert all("verified" in line and "Redis" in line for line in lines), lines


def test_a_mesh_under_mpirun_connects_the_jobs_two_ranks_through_pmix() -> None:
    rig_devices()
    if shutil.which("mpirun") is None:
        pytest.skip("needs mpirun (scripts/install-deps installs Open MPI)")
    if not gv.PmixRendezvous.available():
        pytest.skip("this gpuverbs was built without PMIx (PmixRendezvous raises Errc.unsupported)")
    # MPI's own traffic over shared memory and TCP, never over the rxe devices under test.
    launcher = subprocess.Popen(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl", "self,vader,tcp",
         "--mca", "pml", "ob1", "--mca", "osc", "^ucx", "-x", "PYTHONPATH", "-x", "GPUVERBS_TEST_DEV0", "-x",
         "GPUVERBS_TEST_DEV1", sys.executable, str(MEMBER), "pmix"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = members_pass([launcher], 120)
    assert sorted(line.split(":")[0] for line in lines) == ["mesh-member 0", "mesh-member 1"], lines
    assert all("PMIx namespace" in line for line in lines), lines


def test_a_mesh_refuses_what_it_cannot_use_in_words(redis: Redis, context: Any) -> None:
    dev0, dev1 = rig_devices()
    device = gv.Device.open(dev0)
    pd, other = gv.ProtectionDomain(device), gv.ProtectionDomain(device)
    cq = gv.CompletionQueue(device, 64, context)
    rendezvous = gv.RedisRendezvous(redis.host, redis.port, service="py-refusals", world_size=2,
                                    password_env="GPUVERBS_TEST_REDIS_PASSWORD")
    with pytest.raises(TypeError, match=r"rendezvous must be a gpuverbs.RedisRendezvous or "
                                         r"gpuverbs.PmixRendezvous, not str"):
        gv.Mesh("redis://", pd, cq)
    elsewhere = other.register(bytearray(4096), gv.Access.local_write | gv.Access.remote_read)
    with pytest.raises(ValueError, match=r"regions\[0\] is registered in another protection domain"):
        gv.Mesh(rendezvous, pd, cq, [elsewhere])
    with pytest.raises(ValueError, match=r"Mesh: timeout is -1.000000 s"):
        gv.Mesh(rendezvous, pd, cq, timeout=-1)
    with pytest.raises(ValueError, match=r"Mesh: remote_access .* has flags a queue pair cannot grant"):
        gv.Mesh(rendezvous, pd, cq, remote_access=int(gv.Access.local_write))
    # A peer that never comes: connecting it ends at the mesh's timeout, naming the peer.
    mesh = gv.Mesh(rendezvous, pd, cq, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(gv.Error) as caught:
        mesh.connect(1 - rendezvous.rank)
    assert time.monotonic() - started < 10
    assert str(1 - rendezvous.rank) in str(caught.value), str(caught.value)
    assert mesh.peers == [] and mesh.find(1 - rendezvous.rank) is None
    # A store nobody listens on: the rendezvous says where it tried.
    with pytest.raises(gv.Error) as caught:
        gv.RedisRendezvous(redis.host, free_port(redis.host), service="nobody", command_timeout=1.0)
    assert caught.value.code == gv.Errc.rendezvous_unavailable, caught.value
