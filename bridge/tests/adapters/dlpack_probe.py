"""Test adapter (NumPy): DLPack capsules vs as_numpy views (bridge/tests/pybridge_test.cpp)."""

import numpy as np

import attncheck_bridge as ab

ADAPTER = ab.Adapter(name="dlpack_probe", device="cpu")


@ADAPTER.entry("probe")
def probe(t, p):
    """Every tensor: numpy.from_dlpack(t) sees the same elements as as_numpy(t) (uint/int/f32
    types NumPy's DLPack import understands); then out (i32) = 2 * x (i32) through from_dlpack."""
    for name, x in t.items():
        view = ab.as_numpy(x)
        if x.dtype_name in ("i32", "i64", "f32", "f64", "u8"):
            d = np.from_dlpack(x)
            assert d.shape == view.shape, (name, d.shape, view.shape)
            assert d.strides == view.strides, (name, d.strides, view.strides)
            assert d.__array_interface__["data"][0] == view.__array_interface__["data"][0], name
            assert np.array_equal(d, view), name
    src = np.from_dlpack(t["x"])
    out = ab.as_numpy(t["out"])
    out[...] = 2 * src


@ADAPTER.entry("write_through_dlpack")
def write_through_dlpack(t, p):
    """out[...] = 7 through numpy.from_dlpack, when NumPy hands out writable arrays."""
    d = np.from_dlpack(t["out"])
    if not d.flags.writeable:
        raise ab.Unsupported("numpy.from_dlpack returns read-only arrays in this NumPy")
    d[...] = 7
