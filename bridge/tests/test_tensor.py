"""Tensors, strided NumPy views written in place, DLPack."""

import importlib.machinery
import importlib.util
import os

import numpy as np
import pytest

import attncheck_bridge as ab


def view_tensor(base, name, byte_offset, shape, strides, dtype_name=None):
    """A Tensor over base's memory with arbitrary (element) strides and offset."""
    code, bits = ab._DL_OF_NAME[dtype_name or ab._numpy_name(base.dtype)]
    return ab.Tensor(name, base.__array_interface__["data"][0], byte_offset, shape, strides, code, bits)


def test_as_numpy_honours_strides_and_offset_and_writes_in_place():
    base = np.zeros(40, dtype=np.int32)
    t = view_tensor(base, "x", 8, (3, 4), (10, 2))
    v = ab.as_numpy(t)
    assert v.shape == (3, 4) and v.strides == (40, 8)
    v[...] = np.arange(12, dtype=np.int32).reshape(3, 4) + 1
    want = np.zeros(40, dtype=np.int32)
    for i in range(3):
        for j in range(4):
            want[2 + 10 * i + 2 * j] = 1 + 4 * i + j
    assert np.array_equal(base, want)


def test_as_numpy_negative_and_zero_strides():
    base = np.arange(10, dtype=np.int64)
    t = view_tensor(base, "r", 9 * 8, (10,), (-1,))
    assert list(ab.as_numpy(t)) == list(range(9, -1, -1))
    b = view_tensor(base, "b", 8, (3, 2), (0, 1))  # broadcast rows
    assert ab.as_numpy(b).tolist() == [[1, 2]] * 3


def test_16_bit_floats_are_uint16_bits_and_fp8_uint8_codes():
    raw = np.zeros(8, dtype=np.uint16)
    t = view_tensor(raw, "q", 2, (2, 2), (4, 1), "bf16")
    assert t.dtype_name == "bf16"
    v = ab.as_numpy(t)
    assert v.dtype == np.uint16
    v[...] = ab.f32_to_bf16_rne(np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32))
    assert raw.tolist() == [0, 0x3F80, 0x4000, 0, 0, 0x4040, 0xBF80, 0]
    h = view_tensor(raw, "h", 0, (8,), (1,), "f16")
    assert ab.as_numpy(h).dtype == np.uint16
    codes = np.zeros(4, dtype=np.uint8)
    c = view_tensor(codes, "c", 0, (4,), (1,), "e4m3fn")
    assert ab.as_numpy(c).dtype == np.uint8 and c.dtype_name == "e4m3fn"


def test_from_numpy_transposed_shares_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ab.Tensor.from_numpy(a.T, "aT")
    assert t.shape == (4, 3) and t.strides == (1, 4) and not t.is_contiguous()
    v = ab.as_numpy(t)
    assert np.shares_memory(v, a) and np.array_equal(v, a.T)
    v[0, 0] = 99
    assert a[0, 0] == 99


def test_empty_views():
    t = ab.Tensor.from_numpy(np.zeros((0, 3), dtype=np.int32), "e")
    assert ab.as_numpy(t).shape == (0, 3) and t.extent() == (0, 0)


def test_dtype_names_from_dlpack_codes():
    assert ab.dtype_name_of(ab.kDLBfloat, 16) == "bf16"
    assert ab.dtype_name_of(ab.kDLFloat, 16) == "f16"
    assert ab.dtype_name_of(ab.kDLFloat, 32) == "f32"
    assert ab.dtype_name_of(ab.kDLFloat, 64) == "f64"
    assert ab.dtype_name_of(ab.kDLInt, 32) == "i32"
    assert ab.dtype_name_of(ab.kDLInt, 64) == "i64"
    assert ab.dtype_name_of(ab.kDLUInt, 8) == "u8"  # fp8 under ABI v1
    assert ab.dtype_name_of(10, 8) == "e4m3fn"  # kDLFloat8_e4m3fn (DLPack >= 1.0)
    assert ab.dtype_name_of(11, 8) == "e4m3fnuz"


def test_as_numpy_refuses_device_memory():
    t = ab.Tensor("d", 0x1000, 0, (4,), (1,), ab.kDLFloat, 32, device="cuda")
    assert t.__dlpack_device__() == (ab.kDLCUDA, 0)
    with pytest.raises(TypeError, match="as_torch"):
        ab.as_numpy(t)


def test_dlpack_through_numpy_owner():
    a = np.arange(6, dtype=np.int32)
    t = ab.Tensor.from_numpy(a, "a")
    assert np.array_equal(np.from_dlpack(t), a)


def _native():
    lib = os.environ.get("ATTNCHECK_PYBRIDGE", "")
    if not lib or not os.path.exists(lib):
        pytest.skip("set ATTNCHECK_PYBRIDGE to the built libattncheck_pybridge.so (ctest does)")
    loader = importlib.machinery.ExtensionFileLoader("_attncheck_native", lib)
    spec = importlib.util.spec_from_file_location("_attncheck_native", lib, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_native_capsules_are_strided_views_numpy_can_import(monkeypatch):
    native = _native()
    monkeypatch.setitem(__import__("sys").modules, "_attncheck_native", native)
    base = np.arange(64, dtype=np.int32)
    # [3, 4] at element offset 5, strides (12, 2): NumPy's importer honours byte_offset and strides.
    t = view_tensor(base, "x", 20, (3, 4), (12, 2))
    d = np.from_dlpack(t)
    assert np.array_equal(d, ab.as_numpy(t))
    assert d.__array_interface__["data"][0] == base.__array_interface__["data"][0] + 20
    # An unconsumed capsule frees only its descriptor.
    for _ in range(1000):
        t.__dlpack__()
    assert base[5] == 5


def test_native_capsule_carries_bf16_dtype():
    native = _native()
    raw = np.zeros(4, dtype=np.uint16)
    cap = native.dlpack_capsule(raw.__array_interface__["data"][0], 0, ab.kDLCPU, 0, ab.kDLBfloat, 16, 1, (4,), (1,))
    assert type(cap).__name__ == "PyCapsule"
    with pytest.raises((TypeError, BufferError, RuntimeError)):
        np.from_dlpack(_Cap(cap))  # NumPy has no bfloat16: it must refuse, not misread


class _Cap:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, stream=None):
        return self.cap

    def __dlpack_device__(self):
        return (ab.kDLCPU, 0)
