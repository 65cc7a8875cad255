"""Test adapter without NumPy: the bridge's error paths and metadata (bridge/tests/pybridge_test.cpp)."""

import ctypes
import sys

import attncheck_bridge as ab

ADAPTER = ab.Adapter(name="pure_python", device="cpu", contract="p-in-input-type")


@ADAPTER.entry("check_meta")
def check_meta(t, p):
    """params: {"<name>": "dtype|shape|strides|byte_offset"} for every tensor; AssertionError if not."""
    assert sorted(t) == sorted(k for k in p if not k.startswith("_")), f"names {sorted(t)} vs {sorted(p)}"
    for name, want in p.items():
        if name.startswith("_"):
            continue
        x = t[name]
        got = f"{x.dtype_name}|{','.join(map(str, x.shape))}|{','.join(map(str, x.strides))}|{x.byte_offset}"
        assert got == want, f"{name}: got {got}, want {want}"
        assert x.name == name and x.device == "cpu" and x.__dlpack_device__() == (1, 0), x
        assert x.ptr == x.data + x.byte_offset


@ADAPTER.entry("fill")
def fill(t, p):
    """out (i32, 1-d, any stride)[i] = base + i, written with ctypes through the stride."""
    out = t["out"]
    assert out.dtype_name == "i32", out
    for i in range(out.shape[0]):
        ctypes.c_int32.from_address(out.ptr + 4 * i * out.strides[0]).value = int(p["base"]) + i


@ADAPTER.entry("raise")
def raise_(t, p):
    def inner():
        raise KeyError("deliberate failure inside the adapter")

    inner()


@ADAPTER.entry("unsupported")
def unsupported(t, p):
    raise ab.Unsupported("this adapter does not implement that")


@ADAPTER.entry("refuse")
def refuse(t, p):
    raise ab.Refuse("kernel_block_size must be >= 1, got 0")


@ADAPTER.entry("print")
def print_(t, p):
    print("PRINTED-BY-ADAPTER")
    sys.stdout.flush()


@ADAPTER.entry("exit")
def exit_(t, p):
    sys.exit(3)
