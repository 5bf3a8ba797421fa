"""The GPU half of the Python package, on a real GPU (scripts/test-gpu on
the device machine, which has no RDMA device): PyTorch and CuPy CUDA memory
through DLPack and __cuda_array_interface__, the registration decision with
its reasons, the exact refusal where there is no RDMA device, a GpuBuffer
exported to PyTorch and CuPy, and the buffer id that tells a reused address
from the allocation a registration was made for; and a CuPy kernel pushing
through a gpuverbs.DeviceQueue made in Python, read back by Python.

Runs under pytest, or as a script where pytest is not installed."""

from __future__ import annotations

import sys

import numpy as np

import gpuverbs as gv

try:
    import pytest
except ImportError:  # the device machine may have no pytest: see __main__ below
    pytest = None

try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
except ImportError:
    cupy = None


def needs(module, name):
    if module is None or (module is torch and not torch.cuda.is_available()):
        if pytest is not None:
            pytest.skip(f"{name} with CUDA is not installed here")
        raise Skip(f"{name} with CUDA is not installed here")


class Skip(Exception):
    pass


def test_a_torch_cuda_tensor_is_seen_where_it_lies_through_dlpack():
    needs(torch, "PyTorch")
    t = torch.zeros(1 << 20, dtype=torch.float16, device="cuda")
    m = gv.gpu_memory(t)
    assert m["address"] == t.data_ptr()
    assert m["size"] == t.numel() * 2
    assert m["gpu"] == t.device.index
    assert m["allocation_base"] <= m["address"] < m["allocation_base"] + m["allocation_size"]
    assert m["buffer_id"] != 0
    assert gv.gpu_memory(t, via="cuda_array_interface") == m  # PyTorch has both protocols


def test_a_cupy_array_is_seen_through_both_protocols():
    needs(cupy, "CuPy")
    a = cupy.arange(4096, dtype=cupy.uint32)
    via_dlpack = gv.gpu_memory(a, via="dlpack")
    via_cai = gv.gpu_memory(a, via="cuda_array_interface")
    assert via_dlpack == via_cai
    assert via_cai["address"] == a.data.ptr and via_cai["size"] == a.nbytes


def test_the_registration_decision_has_its_reasons_for_each_kind_of_memory():
    needs(torch, "PyTorch")
    objects = {"torch": torch.ones(4096, device="cuda"), "gpubuffer": gv.GpuBuffer(1 << 16)}
    if cupy is not None:
        objects["cupy"] = cupy.ones(4096)
    for name, obj in objects.items():
        e = gv.explain_gpu_registration(obj)
        probes = e["probes"]
        assert set(probes) == {"gpu_direct_rdma", "memory", "gpu_dmabuf", "nic_dmabuf", "peermem"}, name
        assert probes["nic_dmabuf"] == {"ok": False, "reason": "the NIC was not probed: no protection domain was "
                                                              "given (no RDMA device opened)"}
        for probe in probes.values():
            assert probe["ok"] or probe["reason"], (name, probe)
        # DMA-BUF cannot be chosen without the NIC; peermem only where the module is loaded.
        assert "DMA-BUF" not in e["order"], name
        assert ("peermem" in e["order"]) == (probes["peermem"]["ok"] and probes["gpu_direct_rdma"]["ok"]
                                             and probes["memory"]["ok"]), (name, e)
        rejected = dict(e["rejected"])
        assert rejected.get("DMA-BUF") == probes["nic_dmabuf"]["reason"], (name, e)
        print(name, e["order"], e["rejected"])


def test_without_an_rdma_device_opening_one_is_refused_in_the_librarys_words():
    if gv.devices():
        raise AssertionError("this test is for the GPU machine, which has no RDMA device")
    try:
        gv.Device.open_first()
    except gv.Error as e:
        assert e.code == gv.Errc.no_rdma_device
        assert str(e).startswith("ibv_get_device_list: no RDMA device on this machine")
    else:
        raise AssertionError("open_first() found a device")


def test_a_gpubuffer_is_read_back_through_torch_and_cupy_by_dlpack():
    needs(torch, "PyTorch")
    b = gv.GpuBuffer(1 << 20)
    pattern = (np.arange(1 << 20) % 251).astype(np.uint8)
    b.copy_from(pattern)
    t = torch.from_dlpack(b)
    assert t.device.type == "cuda" and t.dtype == torch.uint8 and t.numel() == 1 << 20
    assert t.data_ptr() == b.address
    assert bool((t.cpu().numpy() == pattern).all())
    t.fill_(3)
    torch.cuda.synchronize()
    assert b.to_bytes() == bytes([3]) * (1 << 20)
    del b  # the tensor keeps the buffer alive
    assert int(t.sum().item()) == 3 << 20
    if cupy is not None:
        c = cupy.from_dlpack(gv.GpuBuffer(4096))
        assert c.size == 4096


def test_a_reused_address_gets_a_new_buffer_id():
    needs(torch, "PyTorch")
    n = 64 << 20
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    first = gv.gpu_memory(x)
    del x
    # The caching allocator hands the same block back: the same allocation, the same id
    # (a cached registration of it stays valid).
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    again = gv.gpu_memory(y)
    assert again["address"] == first["address"] and again["buffer_id"] == first["buffer_id"]
    del y
    # Freed to the driver and allocated again: where the address comes back, the id must differ.
    for _ in range(8):
        torch.cuda.empty_cache()
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
        reused = gv.gpu_memory(z)
        if reused["address"] == first["address"]:
            assert reused["buffer_id"] != first["buffer_id"]
            return
        del z
    if pytest is not None:
        pytest.skip("the driver never handed the same address back")
    raise Skip("the driver never handed the same address back")


def test_refusals_name_the_problem():
    needs(torch, "PyTorch")
    try:
        gv.gpu_memory(torch.zeros(8, 8, device="cuda").t())
    except ValueError as e:
        assert "not contiguous" in str(e)
    else:
        raise AssertionError("a transposed tensor was taken")
    try:
        gv.GpuBuffer(64).copy_from(np.arange(128, dtype=np.uint8)[::2])
    except ValueError as e:
        assert "copy_from: data must be contiguous" in str(e)
    else:
        raise AssertionError("a strided array was copied")
    try:
        gv.gpu_memory(torch.zeros(8))
    except ValueError as e:
        assert "obj is cpu memory, not CUDA device memory" in str(e)
    else:
        raise AssertionError("a CPU tensor was taken as GPU memory")


PRODUCER = r"""
#include <gpuverbs/device_queue/device.cuh>

extern "C" __global__ void produce(unsigned long long slots, unsigned long long producer, unsigned long long proxy,
                                   unsigned int log2_capacity, unsigned long long per_thread, unsigned int* failed) {
    namespace dev = gpuverbs::device;
    const dev::QueueView q = dev::queue_view(slots, producer, proxy, log2_capacity);
    const unsigned int thread = blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long i = 0; i < per_thread; ++i) {
        // Peer `thread`, its i-th block: the reader checks each thread's order.
        if (dev::put(q, thread, 1, i * 64, 2, thread * 64, 64, 10000000000ULL, true) != dev::WaitResult::done) {
            atomicAdd(failed, 1u);
        }
    }
    if (dev::quiet(q, 10000000000ULL) != dev::WaitResult::done) atomicAdd(failed, 1u);
}
"""


def test_a_cupy_kernel_pushes_through_a_device_queue_made_in_python_and_python_reads_every_request():
    needs(cupy, "CuPy")
    q = gv.DeviceQueue.on_gpu(0, 10)
    assert q.gpu == 0 and q.capacity == 1024
    module = cupy.RawModule(code=PRODUCER, options=("-std=c++20", "-I" + gv.device_queue_include_dir()),
                            backend="nvcc")
    produce = module.get_function("produce")
    blocks, threads, per_thread = 4, 32, 256
    failed = cupy.zeros(1, dtype=cupy.uint32)
    slots, producer, proxy, log2 = q.view
    produce((blocks,), (threads,), (cupy.uint64(slots), cupy.uint64(producer), cupy.uint64(proxy),
                                    cupy.uint32(log2), cupy.uint64(per_thread), failed))
    total = blocks * threads * per_thread
    next_block = [0] * (blocks * threads)
    wrong = 0
    while q.taken < total:
        r = q.take()
        if r is None:
            continue
        peer = r["peer"]
        ok = (r["op"] == "put" and peer < blocks * threads and r["dst_offset"] == next_block[peer] * 64
              and r["src_window"] == 2 and r["src_offset"] == peer * 64 and r["dst_window"] == 1
              and r["bytes"] == 64)
        wrong += 0 if ok else 1
        if peer < blocks * threads:
            next_block[peer] += 1
        if q.taken % 32 == 0:
            q.complete(q.taken)
    q.complete(q.taken)
    cupy.cuda.Device().synchronize()
    assert wrong == 0
    assert int(failed[0]) == 0
    assert q.take() is None
    print(f"python: a CuPy kernel of {blocks} x {threads} threads pushed {total} puts through a DeviceQueue; "
          "Python read and checked each")


if __name__ == "__main__":
    passed = failed = skipped = 0
    for name, test in list(globals().items()):
        if not name.startswith("test_"):
            continue
        try:
            test()
            passed += 1
            print(f"PASSED {name}")
        except Skip as s:
            skipped += 1
            print(f"SKIPPED {name}: {s}")
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {e}")
    print(f"python: {passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)
