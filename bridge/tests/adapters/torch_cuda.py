"""Test adapter for the bridge's cuda path (torch): bridge/tests/cuda_smoke.cpp drives it on a GPU.

page_indices is the example of docs/bridge.md, verbatim."""

import torch

import attncheck_bridge as ab

ADAPTER = ab.Adapter(name="torch_cuda", device="cuda")


@ADAPTER.entry("page_indices")
def page_indices(t, p):
    K = int(p["kernel_block_size"])
    if K < 1:
        raise ab.Refuse(f"kernel_block_size must be >= 1, got {K}")     # invalid: refuse
    for x in t.values():
        ab.expect_dtype(x, "i32")                                       # Refuse naming the tensor
    if t["seq_lens"].strides != (1,) or t["page_indices"].strides != (1,):
        raise ab.Refuse("seq_lens and page_indices must be contiguous")
    table = torch.from_dlpack(t["block_table"])        # zero-copy views, strides kept
    lens, cu = torch.from_dlpack(t["seq_lens"]), torch.from_dlpack(t["cu_seq_lens"])
    out = torch.from_dlpack(t["page_indices"])
    for r in range(lens.numel()):
        n = int(lens[r])
        if n == 0:
            continue
        tok = torch.arange(n, device=out.device, dtype=torch.int32)
        out[int(cu[r]) : int(cu[r]) + n] = table[r, tok // K] * K + tok % K  # write in place


@ADAPTER.entry("probe")
def probe(t, p):
    """torch.from_dlpack sees every view where it is (pointer, strides, dtype, device); out = 2 x."""
    want = {"i32": torch.int32, "bf16": torch.bfloat16, "f32": torch.float32, "u8": torch.uint8}
    for name, x in t.items():
        v = torch.from_dlpack(x)
        assert v.is_cuda, (name, v.device)
        assert v.dtype == want[x.dtype_name], (name, v.dtype, x.dtype_name)
        assert tuple(v.shape) == x.shape and tuple(v.stride()) == x.strides, (name, v.shape, v.stride(), x)
        assert v.data_ptr() == x.ptr, (name, hex(v.data_ptr()), hex(x.ptr))
        assert ab.as_torch(x).data_ptr() == x.ptr
    torch.from_dlpack(t["out"]).copy_(2 * torch.from_dlpack(t["x"]))
    if "h" in t:  # bf16, doubled in place through its strided view
        h = torch.from_dlpack(t["h"])
        h.mul_(2)


@ADAPTER.entry("fp8_view")
def fp8_view(t, p):
    codes = ab.as_torch(t["codes"], fp8_format=p["fp8_format"])
    assert str(codes.dtype).startswith("torch.float8_e4m3"), codes.dtype
    torch.from_dlpack(t["out"]).copy_(codes.float())


@ADAPTER.entry("raise")
def raise_(t, p):
    raise ValueError("deliberate failure in a cuda adapter")


@ADAPTER.entry("device_assert")
def device_assert(t, p):
    # An out-of-range gather index on the GPU: a device-side assert, reported asynchronously.
    x = torch.zeros(4, device="cuda")
    idx = torch.full((1,), 1 << 30, device="cuda", dtype=torch.int64)
    y = x[idx]
    del y
