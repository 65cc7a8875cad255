"""What the stand-in's functions share: the host tensor they take instead of torch tensors, the
number formats, and the platform facts AITER derives from the GPU (arch, fp8 type, CU count).

Test-only (bridge/tests/test_aiter_adapter.py, and `attncheck run` with
ATTNCHECK_AITER_BACKEND=numpy): it lets the rocm_aiter adapter's argument mapping run on a CPU.
Nothing here is AITER's code; the functions elsewhere in this package follow AITER's documented
signatures and the semantics of its kernels as read at the commit named in docs/adapters/aiter.md.
"""

import os

import numpy as np

import attncheck_bridge as ab

# Raw storage of each dtype: 16-bit floats and fp8 are kept as their bit patterns.
_STORAGE = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.uint16,
    "bf16": np.uint16,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u64": np.uint64,
    "e4m3fn": np.uint8,
    "e4m3fnuz": np.uint8,
}
FP8 = ("e4m3fn", "e4m3fnuz")
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}


class StandinError(RuntimeError):
    """What AITER would report (an AITER_CHECK, an assert, a missing kernel), or a layout the
    stand-in will not emulate because the real kernel would write outside the view."""


def gfx():
    """The arch the stand-in pretends to be (AITER_STANDIN_GFX, default gfx942)."""
    return os.environ.get("AITER_STANDIN_GFX", "gfx942")


def platform_fp8():
    """aiter.dtypes.fp8: e4m3fnuz on gfx942, e4m3fn elsewhere."""
    return "e4m3fnuz" if gfx() == "gfx942" else "e4m3fn"


def cu_num():
    return int(os.environ.get("AITER_STANDIN_CU_NUM", "80"))


def check(cond, why):
    if not cond:
        raise StandinError(why)


class HostTensor:
    """A strided NumPy view plus its attncheck dtype name: the stand-in's torch.Tensor.

    ``arr`` holds raw storage (uint16 bits for bf16/f16, uint8 codes for fp8) and may be a view of
    the harness's buffer, so writes through it land there. Strides are in elements, as torch's."""

    __slots__ = ("arr", "dtype")

    def __init__(self, arr, dtype):
        if dtype not in _STORAGE:
            raise StandinError(f"stand-in: unknown dtype {dtype!r}")
        if arr.dtype != np.dtype(_STORAGE[dtype]):
            raise StandinError(f"stand-in: a {dtype} tensor needs {np.dtype(_STORAGE[dtype])} storage, got {arr.dtype}")
        self.arr = arr
        self.dtype = dtype

    @classmethod
    def empty(cls, shape, dtype, fill=None):
        """A new tensor; without ``fill`` floats start as NaN and the rest as 0xFF bytes, so that
        an element nobody writes is visible."""
        st = np.dtype(_STORAGE[dtype])
        arr = np.empty(tuple(int(s) for s in shape), st)
        if fill is None:
            if dtype in ("f32", "f64"):
                arr.fill(np.nan)
            else:
                arr.view(np.uint8).fill(0xFF)
        else:
            cls(arr, dtype).store(np.full(arr.shape, fill, np.float64))
        return cls(arr, dtype)

    @classmethod
    def from_values(cls, values, dtype):
        t = cls.empty(np.shape(values), dtype, fill=0)
        t.store(np.asarray(values, np.float64))
        return t

    # -- geometry, as torch names it --------------------------------------------------------
    @property
    def shape(self):
        return tuple(self.arr.shape)

    def dim(self):
        return self.arr.ndim

    @property
    def ndim(self):
        return self.arr.ndim

    def size(self, i=None):
        return self.shape if i is None else self.arr.shape[i]

    def stride(self, i=None):
        es = self.arr.itemsize
        st = tuple(s // es for s in self.arr.strides)
        return st if i is None else st[i]

    def numel(self):
        return int(self.arr.size)

    def element_size(self):
        return self.arr.itemsize

    def is_contiguous(self):
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride())):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def view(self, *shape):
        """A reshape that never copies (torch's view): fails when the strides do not allow it."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        a = self.arr.view()
        try:
            a.shape = tuple(int(s) for s in shape)
        except AttributeError as e:
            raise StandinError(f"stand-in: view{tuple(shape)} of a {self.shape} tensor with strides {self.stride()} needs a copy") from e
        return HostTensor(a, self.dtype)

    def unsqueeze(self, d):
        return HostTensor(np.expand_dims(self.arr, d), self.dtype)

    def __getitem__(self, idx):
        return HostTensor(self.arr[idx], self.dtype)

    def view_dtype(self, dtype):
        """Reinterpret the bits (torch's tensor.view(dtype)); the element size may change only
        over a contiguous last dimension."""
        st = np.dtype(_STORAGE[dtype])
        if st.itemsize == self.arr.itemsize:
            return HostTensor(self.arr.view(st), dtype)
        check(self.arr.ndim >= 1 and self.stride(-1) == 1, "stand-in: view(dtype) needs a unit last stride")
        return HostTensor(self.arr.view(st), dtype)

    # -- values -----------------------------------------------------------------------------
    def values(self):
        """The elements as float64 (integers exactly)."""
        a = self.arr
        if self.dtype == "bf16":
            return ab.bf16_to_f32(a).astype(np.float64)
        if self.dtype == "f16":
            return a.view(np.float16).astype(np.float64)
        if self.dtype in FP8:
            return ab.fp8_to_f32(a, self.dtype).astype(np.float64)
        return a.astype(np.float64)

    def store(self, values, index=Ellipsis):
        """Round ``values`` once (nearest even; fp8 saturating) into this tensor's dtype and write
        them at ``index``."""
        v = np.asarray(values, np.float64)
        if self.dtype == "bf16":
            bits = ab.f32_to_bf16_rne(v.astype(np.float32))
        elif self.dtype == "f16":
            bits = v.astype(np.float16).view(np.uint16)
        elif self.dtype in FP8:
            bits = encode_fp8(v, self.dtype)
        elif self.dtype in ("f32", "f64"):
            bits = v.astype(self.arr.dtype)
        else:
            bits = v.astype(self.arr.dtype)
        self.arr[index] = bits

    def __repr__(self):
        return f"HostTensor({self.dtype}, shape={self.shape}, strides={self.stride()})"


def values_of(x):
    """float64 values of a HostTensor (or a plain number)."""
    return x.values() if isinstance(x, HostTensor) else np.asarray(x, np.float64)


_ENC: dict = {}


def _encoder(fmt):
    """Finite non-negative values of the format, ascending, with their codes."""
    if fmt not in _ENC:
        table = ab.fp8_to_f32(np.arange(256, dtype=np.uint8), fmt).astype(np.float64)
        codes = [c for c in range(128) if np.isfinite(table[c])]
        vals = table[codes]
        order = np.argsort(vals, kind="stable")
        _ENC[fmt] = (vals[order], np.asarray(codes, np.uint8)[order])
    return _ENC[fmt]


def encode_fp8(values, fmt):
    """float64 -> fp8 codes, round to nearest (ties to the even code), saturating at the format's
    largest finite value; NaN -> the format's NaN code."""
    vals, codes = _encoder(fmt)
    v = np.asarray(values, np.float64)
    mag = np.minimum(np.abs(v), vals[-1])
    hi = np.clip(np.searchsorted(vals, mag), 0, len(vals) - 1)
    lo = np.clip(hi - 1, 0, len(vals) - 1)
    d_hi, d_lo = np.abs(vals[hi] - mag), np.abs(mag - vals[lo])
    tie = d_hi == d_lo
    pick = np.where(d_lo < d_hi, lo, hi)
    pick = np.where(tie & (codes[lo] % 2 == 0), lo, pick)
    out = codes[pick].copy()
    neg = (v < 0) | ((v == 0) & np.signbit(v))
    if fmt == "e4m3fnuz":
        neg &= out != 0  # no negative zero in fnuz
    out = np.where(neg, out | 0x80, out).astype(np.uint8)
    nan = np.isnan(v)
    return np.where(nan, np.uint8(0x80 if fmt == "e4m3fnuz" else 0x7F), out).astype(np.uint8)


def f32(x):
    """Round to float32 (the kernels' accumulator type) and back to float64."""
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)
