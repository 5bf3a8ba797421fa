"""One member of a two-member mesh, for tests/python/test_mesh.py: joins
through Redis (a service whose store the test started) or PMIx (the job
mpirun started), connects a queue pair to its peer through gpuverbs.Mesh,
reads the peer's region and checks every byte, hands a describe()-sized
record over the rendezvous itself, then checks that a peer it disconnected
reads as closed. Prints one line "mesh-member RANK: ..." and exits 0 when
all of it held; anything else raises (exit status 1) with the library's words.

Usage: python3 mesh_member.py redis HOST PORT SERVICE   (password in $GPUVERBS_TEST_REDIS_PASSWORD)
       python3 mesh_member.py pmix                      (under mpirun -np 2)
"""

from __future__ import annotations

import os
import sys
import time

import gpuverbs as gv

SIZE = 64 * 1024


def pattern(rank: int) -> bytes:
    return bytes((rank * 37 + i * 7) % 251 for i in range(SIZE))


def main(argv: list[str]) -> int:
    if argv[1] == "redis":
        rendezvous = gv.RedisRendezvous(argv[2], int(argv[3]), service=argv[4], world_size=2,
                                        password_env="GPUVERBS_TEST_REDIS_PASSWORD")
    else:
        rendezvous = gv.PmixRendezvous()
    rank, peer = rendezvous.rank, 1 - rendezvous.rank
    devices = (os.environ["GPUVERBS_TEST_DEV0"], os.environ["GPUVERBS_TEST_DEV1"])
    device = gv.Device.open(devices[rank % 2])
    context = gv.Context()
    pd = gv.ProtectionDomain(device)
    cq = gv.CompletionQueue(device, 256, context)
    mine = bytearray(pattern(rank))
    offered = pd.register(mine, gv.Access.local_write | gv.Access.remote_read)
    mesh = gv.Mesh(rendezvous, pd, cq, [offered], name="python-mesh", timeout=60.0)
    mesh.connect_all()
    assert mesh.peers == [peer], mesh.peers
    theirs = mesh.peer(peer)
    assert theirs.rank == peer and len(theirs.regions) == 1 and theirs.regions[0].length == SIZE
    assert theirs.qp.failure is None
    # What the mesh's queue pair grants: the offered region's remote read, nothing more.
    assert theirs.qp.remote_access == int(gv.Access.remote_read), theirs.qp.remote_access

    landing = bytearray(SIZE)
    into = pd.register(landing, gv.Access.local_write)
    assert theirs.qp.read(into, theirs.regions[0]).wait(timeout=30)
    if bytes(landing) != pattern(peer):
        bad = next(i for i in range(SIZE) if landing[i] != pattern(peer)[i])
        raise AssertionError(f"byte {bad} read from rank {peer} differs")

    # The rendezvous as a side channel: a KV pool's record goes this way (lookup waits for the key).
    record = b"kv-pool-of-%d:" % rank + bytes(700)
    rendezvous.publish("pool", record)
    assert rendezvous.lookup(peer, "pool", 60.0) == b"kv-pool-of-%d:" % peer + bytes(700)

    # Both have read before either lets its region go. PMIx's fence is a barrier; Redis's only waits
    # for membership, and a member that leaves takes its keys with it, so there rank 1 says it is done
    # and waits for rank 0's word, and rank 0 takes rank 1's word first and then waits for it to leave.
    if argv[1] == "pmix":
        rendezvous.fence(60.0)
    elif rank == 1:
        rendezvous.publish("read", b"1")
        rendezvous.lookup(0, "read", 60.0)
    else:
        rendezvous.lookup(1, "read", 60.0)
        rendezvous.publish("read", b"1")
    qp = theirs.qp
    mesh.disconnect(peer)
    assert mesh.find(peer) is None and mesh.peers == []
    try:
        qp.read(into, theirs.regions[0])
        raise AssertionError("a disconnected peer's queue pair still posts")
    except ValueError as e:
        assert "the QueuePair is closed" in str(e), e
    if argv[1] == "redis" and rank == 0:
        deadline = time.monotonic() + 60
        while 1 in rendezvous.members():
            assert time.monotonic() < deadline, "rank 1 did not leave within 60 s"
            time.sleep(0.05)
    print(f"mesh-member {rank}: read {SIZE} bytes from rank {peer} through {rendezvous.name}, verified; "
          f"record exchanged; disconnected queue pair reads as closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
