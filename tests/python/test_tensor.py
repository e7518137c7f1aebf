"""Tests of the one tensor boundary: the converter from Python tensors to the core's TensorView
(python/bindings/tensor_convert.cc) and the C++ checks behind comm and ckpt, as Python sees them.
"""
import ctypes

import numpy as np
import pytest
import torch

from loongforge import _C, comm
from loongforge.ckpt import CheckpointVault


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _ForeignTensor:
    """A DLPack producer claiming `device_type`/`device_id` memory (never dereferenced here)."""

    def __init__(self, n, device_type, device_id=0, code=2, bits=32):
        self._shape = (ctypes.c_int64 * 1)(n)
        self._buf = (ctypes.c_float * max(1, n))()
        self._m = _DLManagedTensor()
        t = self._m.dl_tensor
        t.data = ctypes.addressof(self._buf)
        t.device = _DLDevice(device_type, device_id)
        t.ndim = 1
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = self._shape
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._new = lambda: new(ctypes.addressof(self._m), b"dltensor", None)

    def __dlpack__(self, stream=None):
        return self._new()


# Guards the converter: dtype, shape, strides, device and byte offsets of torch views, bool (which
# torch 1.13 cannot export), numpy producers and raw capsules all arrive as the core expects.
def test_converter_sees_what_torch_sees():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    info = _C.testing.tensor_info(base.t(), "t")
    assert info["dtype"] == "f32" and info["shape"] == [6, 4] and info["strides"] == [1, 6]
    assert not info["contiguous"] and info["device"] == "cpu" and info["stream"] == 0
    assert _C.testing.tensor_info(torch.zeros(3, dtype=torch.bool))["dtype"] == "bool"
    assert _C.testing.tensor_info(torch.zeros(3, dtype=torch.bfloat16))["dtype"] == "bf16"
    w = torch.ones(5, requires_grad=True)  # exported through detach(): same memory
    assert _C.testing.tensor_info(w)["shape"] == [5]
    assert _C.testing.tensor_info(np.zeros((2, 3), dtype=np.int16))["dtype"] == "i16"
    assert _C.testing.tensor_info(torch.utils.dlpack.to_dlpack(torch.zeros(7)))["shape"] == [7]
    # A slice's data pointer (DLPack byte offset included) is where the core writes.
    dense = torch.zeros(10)
    comm.scatter_add(torch.tensor([2.0]), torch.tensor([1], dtype=torch.int32), dense[4:])
    assert dense[5] == 2.0 and dense.sum() == 2.0


# Guards error translation of the converter: a non-tensor and an unsupported dtype are ValueErrors
# naming the argument.
def test_converter_rejects_non_tensors_by_name():
    with pytest.raises(ValueError, match="tensor 'dense' is a list, not a tensor"):
        comm.scatter_add(torch.ones(1), torch.zeros(1, dtype=torch.int32), [0.0, 0.0])
    with pytest.raises(ValueError, match="tensor 'grad' has dtype complex64"):
        comm.topk_error_feedback(torch.zeros(4, dtype=torch.complex64), torch.zeros(4), 1)
    with pytest.raises(ValueError, match="DLPack device type 4"):
        _C.testing.tensor_info(_ForeignTensor(4, device_type=4), "x")


# Guards the checks that moved from comm.py into C++: wrong dtype, non-contiguous and wrong-device
# tensors raise ValueError naming the tensor, and nothing is written.
def test_comm_rejects_bad_tensors_by_name():
    res = torch.randn(16)
    before = res.clone()
    with pytest.raises(ValueError, match="tensor 'grad' has dtype f64; expected f32 or bf16"):
        comm.topk_error_feedback(torch.randn(16, dtype=torch.float64), res, 4)
    with pytest.raises(ValueError, match="tensor 'residual' has dtype bf16; expected f32"):
        comm.topk_error_feedback(None, res.bfloat16(), 4)
    with pytest.raises(ValueError, match="tensor 'residual' is not contiguous"):
        comm.topk_error_feedback(None, torch.zeros(4, 8).t(), 4)
    with pytest.raises(ValueError, match="tensor 'grad' is not contiguous"):
        comm.topk_error_feedback(torch.zeros(8, 2).t(), res, 4)
    with pytest.raises(ValueError,
                       match="tensor 'values' is on cuda:0 but tensor 'residual' is on cpu"):
        comm.topk_error_feedback(None, res, 4, values=_ForeignTensor(4, device_type=2))
    with pytest.raises(ValueError, match="tensor 'values' has dtype f16"):
        comm.topk_error_feedback(None, res, 4, value_dtype=torch.float16)
    with pytest.raises(ValueError, match="tensor 'indices' has dtype i64; expected i32"):
        comm.topk_error_feedback(None, res, 4, indices=torch.zeros(4, dtype=torch.int64))
    assert torch.equal(res, before)
    dense = torch.zeros(16)
    with pytest.raises(ValueError, match="tensor 'values' is on cpu but tensor 'dense' is on cuda:1"):
        comm.scatter_add(torch.ones(2), torch.zeros(2, dtype=torch.int32),
                         _ForeignTensor(16, device_type=2, device_id=1))
    with pytest.raises(ValueError, match="tensor 'dense' is not contiguous"):
        comm.scatter_add(torch.ones(2), torch.zeros(2, dtype=torch.int32), torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="3 values do not split into 2 segments"):
        comm.scatter_add(torch.ones(3), torch.zeros(3, dtype=torch.int32), dense, num_segments=2)


# Guards the checkpoint boundary: an unsupported dtype is a ValueError naming the state entry, and
# every supported dtype (bool included) round-trips through the converter.
def test_ckpt_dtypes_through_the_converter(tmp_path):
    state = {d: torch.arange(6).to(getattr(torch, d)).reshape(2, 3)
             for d in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                       "float32", "float64")}
    state["strided"] = torch.arange(12.0).reshape(3, 4).t()
    with CheckpointVault(tmp_path / "v", fsync=False) as v:
        v.save(1, state)
        out = v.load()
        for k, t in state.items():
            assert out[k].dtype == t.dtype and torch.equal(out[k], t), k
        with pytest.raises(ValueError, match="tensor 'model/z' has dtype complex64"):
            v.save(2, {"model": {"z": torch.zeros(2, dtype=torch.complex64)}})


# Guards the one DType <-> DLPack table (python/bindings/dlpack_capsule.h): every dtype torch
# imports through DLPack leaves the core's TensorView and comes back with the same dtype, shape,
# strides and memory, and the Python side reads torch's names from _C (no table of its own).
def test_dlpack_table_round_trips_every_dtype():
    from torch.utils.dlpack import from_dlpack
    # torch 1.13 imports no DLPack bool; bool's short name still maps to torch's.
    assert _C.dtype_long_name("bool") == "bool"
    for short in ("u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"):
        dtype = getattr(torch, _C.dtype_long_name(short))
        t = torch.arange(6).to(dtype).reshape(2, 3)
        back = from_dlpack(_C.testing.tensor_reexport(t))
        assert back.dtype == dtype and back.data_ptr() == t.data_ptr(), short
        assert torch.equal(back, t) and _C.testing.tensor_info(t)["dtype"] == short
    strided = torch.arange(12.0).reshape(3, 4).t()
    back = from_dlpack(_C.testing.tensor_reexport(strided))
    assert back.stride() == strided.stride() and torch.equal(back, strided)
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        _C.dtype_long_name("f8")


# Guards the one dtype table: every dtype the core declares names a torch dtype of its size, and
# safetensors I/O reads its names from that table (an export and a read agree on every dtype).
def test_dtype_table_is_the_cores():
    import torch

    from loongforge import _C
    from loongforge.models import safetensors_io

    table = _C.dtypes()
    assert len({d["name"] for d in table}) == len(table) == 10
    for d in table:
        t = getattr(torch, d["long_name"])
        assert torch.empty(0, dtype=t).element_size() == d["size"], d
        assert safetensors_io._ST_DTYPES[d["safetensors"]] is t
