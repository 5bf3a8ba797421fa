"""Registration from Python objects, zero copy, on a real device: DLPack and
the buffer protocol for NumPy arrays, PyTorch CPU tensors and bytes-likes;
the object outlives `del`; every refusal says what is wrong."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import gpuverbs as gv

RW = gv.Access.local_write | gv.Access.remote_write


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed for this interpreter")


@pytest.mark.parametrize("via", ["dlpack", "buffer", "auto"])
def test_a_numpy_array_is_registered_where_it_lies(sides, via):
    a, _ = sides
    arr = np.arange(1 << 16, dtype=np.uint32)
    region = a.pd.register(arr, RW, via=via)
    assert region.address == arr.ctypes.data
    assert region.length == arr.nbytes == len(region)
    assert region.method == "host"
    assert region.reasons == []
    assert region.device == "cpu"
    assert region.via == ("dlpack" if via == "auto" else via)
    assert region.obj is arr
    assert region.lkey != 0 and region.rkey != 0
    assert region.access == int(RW)


@pytest.mark.parametrize("via", ["dlpack", "buffer"])
def test_a_torch_cpu_tensor_is_registered_where_it_lies(sides, via):
    torch = torch_or_skip()
    a, _ = sides
    t = torch.arange(4096, dtype=torch.float32)
    if via == "buffer":
        region = a.pd.register(t.numpy(), RW, via="buffer")  # a tensor's buffer is its NumPy view
    else:
        region = a.pd.register(t, RW, via="dlpack")
    assert region.address == t.data_ptr()
    assert region.length == t.numel() * t.element_size()
    assert region.device == "cpu"


def test_the_registered_object_outlives_del_and_its_memory_stays_valid(pair):
    a, b = pair.a, pair.b
    arr = np.zeros(1 << 20, dtype=np.uint8)
    address = arr.ctypes.data
    alive = weakref.ref(arr)
    region = b.pd.register(arr, RW)
    del arr
    gc.collect()
    assert alive() is not None, "the region must hold the array"
    src = np.full(1 << 20, 0x5A, dtype=np.uint8)
    sent = pair.qp_a.write(a.pd.register(src, gv.Access.local_write), region.remote()).wait()
    assert sent == 1 << 20
    held = region.obj
    assert held.ctypes.data == address
    assert (held == 0x5A).all()
    del held, region
    gc.collect()
    assert alive() is None, "the array must be released with its region"


def test_a_torch_tensor_deleted_while_registered_keeps_its_storage(pair):
    torch = torch_or_skip()
    t = torch.zeros(1 << 18, dtype=torch.uint8)
    pointer = t.data_ptr()
    region = pair.b.pd.register(t, RW)
    del t
    gc.collect()
    src = np.full(1 << 18, 7, dtype=np.uint8)
    pair.qp_a.write(pair.a.pd.register(src, gv.Access.local_write), region.remote()).wait()
    assert region.obj.data_ptr() == pointer
    assert bool((region.obj == 7).all())


def test_a_read_only_array_is_taken_through_the_buffer_protocol_for_remote_reads(sides):
    a, _ = sides
    arr = np.arange(1024, dtype=np.uint8)
    arr.setflags(write=False)
    region = a.pd.register(arr, gv.Access.remote_read)
    assert region.via == "buffer"
    region2 = a.pd.register(b"immutable bytes", gv.Access.remote_read)
    assert region2.length == len(b"immutable bytes")


def test_a_read_only_object_with_write_access_is_refused_with_words(sides):
    a, _ = sides
    with pytest.raises(ValueError, match=r"register: obj \(bytes\) is read-only, but access lets the NIC write"):
        a.pd.register(b"immutable", RW)


def test_a_non_contiguous_array_is_refused_never_copied(sides):
    a, _ = sides
    arr = np.zeros((64, 64), dtype=np.uint8)[:, ::2]
    with pytest.raises(ValueError, match=r"register: obj is not contiguous \(shape \(64, 32\), strides \(64, 2\) "
                                         r"elements\).*gpuverbs never copies"):
        a.pd.register(arr, RW)
    with pytest.raises(ValueError, match=r"register: obj is not contiguous \(shape \(64, 32\), strides \(64, 2\) bytes"):
        a.pd.register(arr, RW, via="buffer")


def test_a_non_contiguous_torch_tensor_is_refused(sides):
    torch = torch_or_skip()
    a, _ = sides
    with pytest.raises(ValueError, match=r"register: obj is not contiguous"):
        a.pd.register(torch.zeros(8, 8).t(), RW)


def test_wrong_arguments_name_the_argument(sides):
    a, _ = sides
    with pytest.raises(TypeError, match=r"register: obj must expose __dlpack__, __cuda_array_interface__ or the "
                                        r"buffer protocol .*not int"):
        a.pd.register(42, RW)
    with pytest.raises(ValueError, match=r"register: obj is empty \(0 bytes\)"):
        a.pd.register(np.zeros(0, dtype=np.uint8), RW)
    with pytest.raises(ValueError, match=r"register: via must be 'auto', 'dlpack', 'cuda_array_interface' or "
                                         r"'buffer', not 'pickle'"):
        a.pd.register(np.zeros(8), RW, via="pickle")
    with pytest.raises(TypeError, match=r"register: obj \(ndarray\) has no __cuda_array_interface__"):
        a.pd.register(np.zeros(8), RW, via="cuda_array_interface")
    with pytest.raises(TypeError, match=r"access must be gpuverbs.Access flags, not str"):
        a.pd.register(np.zeros(8), "rw")
    with pytest.raises(ValueError, match=r"register: access has unknown bits 4096"):
        a.pd.register(np.zeros(8), 4096)
    region = a.pd.register(np.zeros(64, dtype=np.uint8), RW)
    with pytest.raises(ValueError, match=r"slice: offset must not be negative \(got -1\)"):
        region.slice(-1, 8)
    with pytest.raises(ValueError, match=r"slice: \[60, 68\) is outside the region's 64 bytes"):
        region.slice(60, 8)
    with pytest.raises(ValueError, match=r"slice: length must not be negative"):
        region.slice(0, -8)


def test_remote_write_without_local_write_is_the_librarys_refusal(sides):
    a, _ = sides
    with pytest.raises(gv.Error) as caught:
        a.pd.register(np.zeros(64, dtype=np.uint8), gv.Access.remote_write)
    assert caught.value.code == gv.Errc.invalid_argument
    assert "remote_write" in str(caught.value) and "local_write" in str(caught.value)


def test_a_cuda_object_on_a_build_or_machine_without_a_gpu_is_refused_in_the_librarys_words(sides):
    a, _ = sides

    class FakeCuda:  # a CUDA array interface pointing at host memory: the driver must say so
        def __init__(self):
            self.host = np.zeros(4096, dtype=np.uint8)
            self.__cuda_array_interface__ = {"data": (self.host.ctypes.data, False), "shape": (4096,),
                                             "typestr": "|u1", "version": 3, "strides": None}

    with pytest.raises(gv.Error) as caught:
        a.pd.register(FakeCuda(), RW)
    assert caught.value.code in (gv.Errc.no_gpu_driver, gv.Errc.built_without_cuda, gv.Errc.no_gpu,
                                 gv.Errc.not_gpu_memory)
    assert str(caught.value)  # the library's words, whatever the machine lacks


def test_remote_memory_round_trips_through_its_wire_form(sides):
    a, _ = sides
    region = a.pd.register(bytearray(1000), RW)
    remote = region.remote(100, 200)
    assert (remote.address, remote.length, remote.rkey) == (region.address + 100, 200, region.rkey)
    assert gv.RemoteMemory.from_bytes(remote.to_bytes()) == remote
    with pytest.raises(gv.Error) as caught:
        gv.RemoteMemory.from_bytes(b"short")
    assert caught.value.code == gv.Errc.malformed_record


def test_close_deregisters_and_is_idempotent(pair):
    dst = np.zeros(64, dtype=np.uint8)
    region = pair.b.pd.register(dst, RW)
    remote = region.remote()
    region.close()
    region.close()
    src = pair.a.pd.register(np.ones(64, dtype=np.uint8), gv.Access.local_write)
    with pytest.raises(gv.CompletionError) as caught:
        pair.qp_a.write(src, remote).wait(timeout=10)
    assert caught.value.category == "work completion"
    assert (dst == 0).all()
