"""vllm_triton: vLLM's Triton KV-cache writer, judged by attncheck (device "cuda").

Entry ``kv_cache_write`` (docs/ops/kv_cache_write.md) calls vLLM's
``triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
kv_cache_dtype, k_scale, v_scale)`` on the harness's buffers (``torch.from_dlpack``: zero-copy
views with their strides), so the writer is checked for every byte of both caches.

    attncheck run --tier quick --op kv_cache_write --kernels py:vllm_triton

Where vLLM comes from, first match wins:

- ``ATTNCHECK_VLLM_SRC=<vLLM checkout>``: the tree is put first on ``sys.path`` and the module
  imported from it as ``vllm.attention.ops.triton_reshape_and_cache_flash`` (or the
  ``vllm.v1.attention.ops`` path of later releases);
- an installed ``vllm`` (same module paths);
- ``ATTNCHECK_VLLM_FILE=<path of triton_reshape_and_cache_flash.py>``: that one file on its own.
  Its only vLLM imports are ``vllm.platforms.current_platform`` (``fp8_dtype``, ``is_rocm``,
  ``is_xpu``) and ``vllm.triton_utils`` (``tl``, ``triton``); when no ``vllm`` package can be
  imported, minimal stand-ins answering those from torch and triton are installed for the load.
  The kernel and its wrapper run unchanged.

What it declines (``Unsupported``) is what the vLLM function does not serve: SHUFFLE caches (that
is ``reshape_and_cache_shuffle``), caches whose heads are not contiguous within a slot (the
function asserts ``key_cache.stride(2) == head_size``: padded and packed caches), a value cache
with other block/page strides than the key cache (the function addresses both with the key
cache's), key/value rows whose heads and dims are not one contiguous run, and an fp8 format other
than the platform's (``current_platform.fp8_dtype()``: e4m3fn on NVIDIA).
"""

import importlib
import importlib.util
import os
import sys
import types

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported

# kv_cache_write is exact (a copy, or fp32 x / scale rounded to fp8 by RNE): no arithmetic contract applies.
ADAPTER = ab.Adapter(name="vllm_triton", device="cuda")

_MODULES = (
    "vllm.attention.ops.triton_reshape_and_cache_flash",
    "vllm.v1.attention.ops.triton_reshape_and_cache_flash",
)
_writer = None
_source = None  # where the writer came from, for messages


def _install_standins():
    """vllm.platforms.current_platform and vllm.triton_utils from torch and triton alone."""
    import torch
    import triton
    import triton.language as tl

    class _Platform:
        @staticmethod
        def is_rocm():
            return torch.version.hip is not None

        @staticmethod
        def is_xpu():
            return False

        @staticmethod
        def fp8_dtype():
            return _platform_fp8()

    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = _Platform()
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton
    sys.modules.update({"vllm": vllm, "vllm.platforms": platforms, "vllm.triton_utils": triton_utils})


def _load():
    """The writer function and a description of its source; raises Unsupported with the reason."""
    global _writer, _source
    if _writer is not None:
        return _writer
    errors = []
    src = os.environ.get("ATTNCHECK_VLLM_SRC")
    if src:
        sys.path.insert(0, src)
    for name in _MODULES:
        try:
            mod = importlib.import_module(name)
            _writer, _source = mod.triton_reshape_and_cache_flash, f"{name} ({mod.__file__})"
            return _writer
        except Exception as e:  # noqa: BLE001 - any import failure: try the next source
            errors.append(f"{name}: {type(e).__name__}: {e}")
    path = os.environ.get("ATTNCHECK_VLLM_FILE")
    if path:
        if not os.path.isfile(path):
            raise Unsupported(f"ATTNCHECK_VLLM_FILE={path} is not a file")
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]  # a half-imported vllm from the attempts above
        _install_standins()
        spec = importlib.util.spec_from_file_location("vllm_triton_reshape_and_cache_flash", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _writer, _source = mod.triton_reshape_and_cache_flash, f"{path} (standalone)"
        return _writer
    raise Unsupported(
        "vLLM not found: set ATTNCHECK_VLLM_SRC to a checkout or ATTNCHECK_VLLM_FILE to "
        "triton_reshape_and_cache_flash.py (" + "; ".join(errors) + ")"
    )


def source():
    """Where the writer was loaded from (after the first call)."""
    return _source


def _arg(t, name):
    if name not in t:
        raise Refuse(f"missing argument '{name}'")
    return t[name]


@ADAPTER.entry("kv_cache_write")
def kv_cache_write(t, p):
    names = ("key", "value", "key_cache", "value_cache", "slot_mapping", "k_scale", "v_scale")
    key, value, kc, vc, slots, ks, vs = (_arg(t, n) for n in names)
    layout = p.get("kv_cache_layout")
    if layout == "SHUFFLE":
        raise Unsupported("SHUFFLE caches: triton_reshape_and_cache_flash writes NHD caches only")
    if layout != "NHD":
        raise Refuse(f"kv_cache_layout must be NHD or SHUFFLE, got {layout!r}")
    kv_dtype = p.get("kv_cache_dtype")
    if kv_dtype not in ("auto", "fp8"):
        raise Refuse(f"kv_cache_dtype must be auto or fp8, got {kv_dtype!r}")
    ab.expect_dtype(key, "bf16", "f16")
    if value.dtype_name != key.dtype_name:
        raise Refuse(f"'key' is {key.dtype_name} but 'value' is {value.dtype_name}")
    ab.expect_dtype(slots, "i64")
    ab.expect_ndim(slots, 1)
    if kc.dtype_name != vc.dtype_name:
        raise Refuse("key_cache and value_cache dtypes differ")
    fmt = None
    if kv_dtype == "fp8":
        ab.expect_dtype(kc, "u8")
        ab.expect_dtype(ks, "f32")
        ab.expect_dtype(vs, "f32")
        fmt = p.get("fp8_format")
        if fmt not in ("e4m3fn", "e4m3fnuz"):
            raise Refuse(f"fp8_format must be e4m3fn or e4m3fnuz, got {fmt!r}")
    elif kc.dtype_name != key.dtype_name:
        raise Refuse(f"kv_cache_dtype auto needs {key.dtype_name} caches, got {kc.dtype_name}")
    for c in (kc, vc):
        ab.expect_ndim(c, 4)
    if kc.shape != vc.shape:
        raise Refuse(f"key_cache {kc.shape} and value_cache {vc.shape} differ")
    nb, P, H, D = kc.shape
    T = slots.shape[0]
    for x in (key, value):
        if x.ndim != 3 or x.shape != (T, H, D):
            raise Refuse(f"'{x.name}' {x.shape} is not [T={T}, Hkv={H}, D={D}]")

    # What the vLLM function can address (it takes no other strides).
    for c in (kc, vc):
        if c.strides[3] != 1 or c.strides[2] != D:
            raise Unsupported(
                f"'{c.name}' strides {c.strides}: the writer needs heads contiguous within a slot "
                f"(stride(2) == head_size = {D}, stride(3) == 1)"
            )
    if vc.strides[:2] != kc.strides[:2]:
        raise Unsupported(
            f"value_cache block/page strides {vc.strides[:2]} differ from key_cache's "
            f"{kc.strides[:2]}: the writer addresses both caches with the key cache's"
        )
    for x in (key, value):
        if x.strides[2] != 1 or x.strides[1] != D:
            raise Unsupported(f"'{x.name}' strides {x.strides}: each token's heads and dims must be one run")
    if slots.shape[0] > 1 and slots.strides[0] != 1:
        raise Unsupported("slot_mapping must be contiguous")

    writer = _load()
    import torch

    if fmt is not None:
        platform = torch.float8_e4m3fnuz if fmt == "e4m3fnuz" else torch.float8_e4m3fn
        want = _platform_fp8()
        if platform != want:
            raise Unsupported(f"fp8_format {fmt}: vLLM's fp8 cache dtype on this platform is {want}")
    key_t, value_t = torch.from_dlpack(key), torch.from_dlpack(value)
    kc_t = ab.as_torch(kc, fmt) if fmt else torch.from_dlpack(kc)
    vc_t = ab.as_torch(vc, fmt) if fmt else torch.from_dlpack(vc)
    if T == 0 or nb == 0:
        return
    writer(
        key_t,
        value_t,
        kc_t,
        vc_t,
        torch.from_dlpack(slots),
        kv_dtype,
        torch.from_dlpack(ks),
        torch.from_dlpack(vs),
    )


def _platform_fp8():
    """vLLM's fp8 cache dtype: e4m3fnuz on gfx942 (MI300), e4m3fn everywhere else."""
    import torch

    if torch.version.hip is not None:
        if torch.cuda.get_device_properties(0).gcnArchName.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn
