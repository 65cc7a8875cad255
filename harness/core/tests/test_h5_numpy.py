"""Reads the file h5_sample_writer wrote, with h5py + numpy only (no ml_dtypes: Debian has none).

Proves the storage rules of docs/formats.md from the outside: bf16 is uint16 raw bits, fp8 is
uint8 raw bits, every dataset names its dtype in a string attribute, and the bits decode to the
values the format definitions give. The fp8 decoder below is written from the definitions
(sign/exponent/mantissa, bias, NaN rules), independently of the C++ one it is compared with.

Run by ctest (core.h5_numpy_read) with ATTNCHECK_H5_SAMPLE=<file>.
"""
import math
import os

import h5py
import numpy as np
import pytest

SAMPLE = os.environ.get("ATTNCHECK_H5_SAMPLE", "")

# (exponent bits, mantissa bits, bias, NaN rule) per fp8 format.
FP8 = {
    "fp8_e4m3fn": (4, 3, 7, "fn"),  # OCP: S.1111.111 is NaN, no inf
    "fp8_e4m3fnuz": (4, 3, 8, "fnuz"),  # 0x80 is the only NaN, no -0, no inf
    "fp8_e5m2": (5, 2, 15, "ieee"),  # IEEE-like: exponent all ones = inf / NaN
    "fp8_e5m2fnuz": (5, 2, 16, "fnuz"),
}


def fp8_lut(name):
    """256-entry float64 table: value of every code of the format."""
    e_bits, m_bits, bias, rule = FP8[name]
    lut = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code >> m_bits) & ((1 << e_bits) - 1)
        man = code & ((1 << m_bits) - 1)
        top = (1 << e_bits) - 1
        if rule == "fnuz" and code == 0x80:
            lut[code] = math.nan
            continue
        if rule == "fn" and exp == top and man == (1 << m_bits) - 1:
            lut[code] = math.nan
            continue
        if rule == "ieee" and exp == top:
            lut[code] = math.nan if man else sign * math.inf
            continue
        if exp == 0:
            lut[code] = sign * man * 2.0 ** (1 - bias - m_bits)
        else:
            lut[code] = sign * (1.0 + man / 2.0**m_bits) * 2.0 ** (exp - bias)
    return lut


def bf16_decode(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def same(actual, expected):
    """Equal as float64, NaN matching NaN, and the sign of zero respected."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape
    both_nan = np.isnan(a) & np.isnan(e)
    equal = (a == e) & (np.signbit(a) == np.signbit(e))
    bad = ~(both_nan | equal)
    assert not bad.any(), f"differ at {np.nonzero(bad)[0]}: {a[bad]} vs {e[bad]}"


@pytest.fixture(scope="module")
def h5():
    if not SAMPLE:
        pytest.fail("set ATTNCHECK_H5_SAMPLE to the file h5_sample_writer wrote")
    with h5py.File(SAMPLE, "r") as f:
        yield f


def test_every_dataset_names_its_dtype(h5):
    seen = []
    h5.visititems(lambda name, obj: seen.append(name) if isinstance(obj, h5py.Dataset) else None)
    assert len(seen) >= 13
    storage = {"f64": np.float64, "f32": np.float32, "i32": np.int32, "bf16": np.uint16}
    storage.update({name: np.uint8 for name in FP8})
    for name in seen:
        dtype = h5[name].attrs["dtype"]
        assert isinstance(dtype, str), (name, type(dtype))  # a str, not numpy bytes
        assert h5[name].dtype == storage[dtype], (name, dtype, h5[name].dtype)


def test_file_attributes_are_plain_python_values(h5):
    assert h5.attrs["producer"] == "h5_sample_writer"
    assert int(h5.attrs["version"]) == 1
    assert float(h5.attrs["scale"]) == 0.5


def test_bf16_is_uint16_raw_bits(h5):
    ds = h5["bf16/values"]
    assert ds.dtype == np.uint16
    assert ds.attrs["dtype"] == "bf16"
    assert ds.attrs["encoding"] == "raw_bits"
    bits = ds[()]
    expected_bits = [0x3F80, 0xC020, 0x4049, 0x477F, 0x0008, 0x8000, 0x7F7F, 0x7F80, 0xFF80]
    assert [int(b) for b in bits[:9]] == expected_bits
    assert (bits[9] & 0x7F80) == 0x7F80 and (bits[9] & 0x007F) != 0  # NaN, any payload
    same(bf16_decode(bits),
         [1.0, -2.5, 3.140625, 65280.0, 2.0**-130, -0.0, 3.3895313892515355e38,
          math.inf, -math.inf, math.nan])


def test_bf16_strided_view_is_stored_logically(h5):
    grid = bf16_decode(h5["bf16/transposed"][()])
    assert grid.shape == (6, 4)
    j, i = np.meshgrid(np.arange(6), np.arange(4), indexing="ij")
    same(grid, 10 * i + j)


def test_fp8_e4m3fn_values(h5):
    ds = h5["fp8_e4m3fn/values"]
    assert ds.dtype == np.uint8 and ds.attrs["dtype"] == "fp8_e4m3fn"
    bits = ds[()]
    assert [int(b) for b in bits] == [0x7E, 0xFE, 0x7E, 0x01, 0x38, 0x80, 0x2A, 0x7F]
    same(fp8_lut("fp8_e4m3fn")[bits], [448, -448, 448, 2.0**-9, 1.0, -0.0, 0.3125, math.nan])


def test_fp8_e4m3fnuz_values(h5):
    ds = h5["fp8_e4m3fnuz/values"]
    assert ds.dtype == np.uint8 and ds.attrs["dtype"] == "fp8_e4m3fnuz"
    bits = ds[()]
    # FNUZ has no -0: -0.0 encodes as 0x00; 0x80 is NaN.
    assert [int(b) for b in bits] == [0x7F, 0xFF, 0x7F, 0x01, 0x40, 0x00, 0x32, 0x80]
    same(fp8_lut("fp8_e4m3fnuz")[bits], [240, -240, 240, 2.0**-10, 1.0, 0.0, 0.3125, math.nan])


@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_all_codes_agree_with_the_definition(name, h5):
    codes = h5[f"{name}/all_codes"][()]
    assert codes.dtype == np.uint8
    assert [int(c) for c in codes] == list(range(256))
    decoded = h5[f"{name}/all_decoded"]
    assert decoded.dtype == np.float64 and decoded.attrs["dtype"] == "f64"
    same(decoded[()], fp8_lut(name)[codes])


def test_fnuz_is_half_of_fn_for_finite_codes():
    fn, fnuz = fp8_lut("fp8_e4m3fn"), fp8_lut("fp8_e4m3fnuz")
    for code in range(256):
        if code in (0x00, 0x80, 0x7F, 0xFF):
            continue
        assert fnuz[code] == fn[code] / 2, hex(code)
    assert fn[0x7E] == 448 and fnuz[0x7F] == 240


def test_native_types(h5):
    f32 = h5["f32/values"]
    assert f32.dtype == np.float32 and f32.attrs["dtype"] == "f32"
    same(f32[()], np.array([1.5, -2.25, 1e-45, 3.0e38, -math.inf], dtype=np.float32))
    i32 = h5["i32/values"]
    assert i32.dtype == np.int32 and i32.attrs["dtype"] == "i32"
    assert i32[()].tolist() == [-7, 0, 2147483647, -2147483648, 123456]
