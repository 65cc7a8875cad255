"""vllm_triton without a GPU (docs/adapters/vllm.md): what each entry refuses and declines before any
GPU work, how it maps attncheck's arguments onto the vLLM function (a NumPy-backed stand-in for
torch records the call), and where it finds vLLM: installed, a checkout, a partial tree executed with
stand-ins for the vllm modules it lacks, or one file. The kernels themselves are judged on a GPU
(docs/adapters/vllm.md, "Seed fixes, before and after")."""

import inspect
import sys
import types

import numpy as np
import pytest

import attncheck_bridge as ab
import vllm_triton
from attncheck_bridge import upstream

T_ = ab.Tensor.from_numpy


# ------------------------------------------------------------------------------------------------
# Isolation: loading vLLM touches sys.modules, sys.meta_path and sys.path.


@pytest.fixture
def fresh(monkeypatch):
    """No vLLM loaded, no vLLM environment, and everything restored afterwards."""
    saved_modules = dict(sys.modules)
    saved_meta, saved_path = list(sys.meta_path), list(sys.path)
    for var in ("ATTNCHECK_VLLM_SRC", "ATTNCHECK_VLLM_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(vllm_triton, "_loaded", {})
    upstream.vllm_reset()
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    yield
    upstream.vllm_reset()
    sys.meta_path[:] = saved_meta
    sys.path[:] = saved_path
    for name in [m for m in sys.modules if m not in saved_modules]:
        del sys.modules[name]
    sys.modules.update(saved_modules)


def _no_installed_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        return
    pytest.skip("vllm is installed here")


# ------------------------------------------------------------------------------------------------
# A stand-in for torch: from_dlpack views the NumPy buffers of Tensor.from_numpy tensors, and the
# few operations the entries do on the host work on them; a fake vLLM function records its call.

_TORCH_DTYPES = {"u8": "uint8", "bf16": "bfloat16", "f16": "float16", "f32": "float32",
                 "i32": "int32", "i64": "int64"}


class FakeTensor:
    device = "cuda:0"

    def __init__(self, arr=None, src=None, dtype=None, size=None, strides=None):
        self.arr, self.src, self.dtype = arr, src, dtype
        self.size_, self.strides_ = size, strides

    def view(self, dtype):
        return FakeTensor(self.arr, self.src, dtype)

    def stride(self, i=None):
        s = self.strides_ or self.src.strides
        return s if i is None else s[i]

    def as_strided(self, size, stride):
        return FakeTensor(self.arr, self.src, self.dtype, tuple(size), tuple(stride))

    def __getitem__(self, key):
        return FakeTensor(self.arr[key], None, self.dtype)

    def __sub__(self, other):
        return FakeTensor(self.arr - other.arr, None, self.dtype)

    def to(self, dtype):
        return FakeTensor(self.arr.astype(np.dtype(dtype)), None, dtype)

    def numel(self):
        return int(self.arr.size)

    def __float__(self):
        return float(self.arr)


class FakeTorch(types.ModuleType):
    def __init__(self, hip=None, arch="gfx942:sramecc+:xnack-"):
        super().__init__("torch")
        self.version = types.SimpleNamespace(hip=hip, cuda=None if hip else "12.4")
        self.cuda = types.SimpleNamespace(get_device_properties=lambda i: types.SimpleNamespace(gcnArchName=arch))
        for name in ("uint8", "bfloat16", "float16", "float32", "int32", "int64",
                     "float8_e4m3fn", "float8_e4m3fnuz"):
            setattr(self, name, name)

    def from_dlpack(self, t):
        arr = ab.as_numpy(t) if t.device == "cpu" and t.numel else None
        return FakeTensor(arr, t, _TORCH_DTYPES.get(t.dtype_name, t.dtype_name))

    def full(self, shape, value, dtype=None, device=None):
        return FakeTensor(np.full(shape, value, np.float32), None, dtype, tuple(shape))

    def tensor(self, values, dtype=None, device=None):
        return FakeTensor(np.array(values, np.float32), None, dtype)

    def arange(self, n, dtype=None, device=None):
        return FakeTensor(np.arange(n, dtype=np.dtype(dtype)), None, dtype)

    def repeat_interleave(self, x, repeats):
        return FakeTensor(np.repeat(x.arr, repeats.arr), None, x.dtype)


class Recorder:
    """A vLLM function standing in for the real one: remembers its arguments."""

    def __init__(self, params):
        self.calls = []
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))


@pytest.fixture
def fake_torch(monkeypatch):
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def _fake_function(monkeypatch, entry, params, module_attrs=None):
    fn = Recorder(params)
    mod = types.SimpleNamespace(**(module_attrs or {}))
    monkeypatch.setitem(vllm_triton._loaded, entry, (fn, mod, "test double"))
    return fn


# ------------------------------------------------------------------------------------------------
# kv_cache_write

NB, P, H, D, TOK = 4, 16, 2, 64, 5


def cache_write_problem(cache="contiguous", layout="NHD", kv="auto", fmt=None, slot_dtype=np.int64):
    """Tensors of a kv_cache_write case: bf16 bits as uint16, fp8 as uint8."""
    es = np.uint8 if kv == "fp8" else np.uint16
    if cache == "packed":  # (nb, Hkv, P, 2D) split along the last dim after the (1, 2) transpose
        store = np.zeros((NB, H, P, 2 * D), dtype=es).transpose(0, 2, 1, 3)
        kc, vc = store[..., :D], store[..., D:]
    elif cache == "padded":
        store = np.zeros((NB, P, H, D + 8), dtype=es)
        kc, vc = store[..., :D], np.zeros((NB, P, H, D + 8), dtype=es)[..., :D]
    elif layout == "SHUFFLE":
        x = 16 // np.dtype(es).itemsize
        kc, vc = np.zeros((NB, H, D // x, P, x), dtype=es), np.zeros((NB, H, P // x, D, x), dtype=es)
    else:
        kc, vc = np.zeros((NB, P, H, D), dtype=es), np.zeros((NB, P, H, D), dtype=es)
    cache_name = "u8" if kv == "fp8" else "bf16"
    t = {
        "key": T_(np.zeros((TOK, H, D), np.uint16), "key", "bf16"),
        "value": T_(np.zeros((TOK, H, D), np.uint16), "value", "bf16"),
        "key_cache": T_(kc, "key_cache", cache_name),
        "value_cache": T_(vc, "value_cache", cache_name),
        "slot_mapping": T_(np.array([3, -1, 17, 63, -1], dtype=slot_dtype), "slot_mapping"),
        "k_scale": T_(np.ones(1, np.float32), "k_scale"),
        "v_scale": T_(np.ones(1, np.float32), "v_scale"),
    }
    p = {"kv_cache_layout": layout, "kv_cache_dtype": kv}
    if fmt:
        p["fp8_format"] = fmt
    return t, p


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"layout": "SHUFFLE"}, "writes NHD caches only"),
        ({"cache": "packed"}, "heads contiguous within a slot"),
        ({"cache": "padded"}, "heads contiguous within a slot"),
    ],
)
def test_cache_write_declines_what_the_vllm_function_cannot_address(kwargs, why):
    t, p = cache_write_problem(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        vllm_triton.kv_cache_write(t, p)


def test_cache_write_declines_a_value_cache_with_other_strides():
    t, p = cache_write_problem()
    other = np.zeros((NB, 2 * P, H, D), np.uint16)[:, ::2]  # page stride doubled
    t["value_cache"] = T_(other, "value_cache", "bf16")
    with pytest.raises(ab.Unsupported, match="addresses both caches with the key cache's"):
        vllm_triton.kv_cache_write(t, p)


@pytest.mark.parametrize(
    "kwargs, param, value, why",
    [
        ({}, "kv_cache_layout", "HND", "kv_cache_layout must be NHD or SHUFFLE"),
        ({}, "kv_cache_dtype", "fp8_e5m2", "kv_cache_dtype must be auto or fp8"),
        ({"kv": "fp8", "fmt": "e4m3fn"}, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"),
    ],
)
def test_cache_write_refuses_invalid_parameters(kwargs, param, value, why):
    t, p = cache_write_problem(**kwargs)
    p[param] = value
    with pytest.raises(ab.Refuse, match=why):
        vllm_triton.kv_cache_write(t, p)


def test_cache_write_refuses_int32_slots():
    t, p = cache_write_problem(slot_dtype=np.int32)
    with pytest.raises(ab.Refuse, match="slot_mapping"):
        vllm_triton.kv_cache_write(t, p)


def test_cache_write_passes_the_views_and_the_cache_dtype(monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "kv_cache_write", ["key", "value", "key_cache", "value_cache",
                                                       "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale"])
    t, p = cache_write_problem(kv="fp8", fmt="e4m3fn")
    vllm_triton.kv_cache_write(t, p)
    (args, kwargs), = fn.calls
    assert [a.src.name for a in args[:5]] == ["key", "value", "key_cache", "value_cache", "slot_mapping"]
    assert args[2].dtype == args[3].dtype == "float8_e4m3fn" and args[5] == "fp8"


def test_cache_write_declines_the_other_fp8_format(monkeypatch, fake_torch):
    _fake_function(monkeypatch, "kv_cache_write", ["key"])
    t, p = cache_write_problem(kv="fp8", fmt="e4m3fnuz")
    with pytest.raises(ab.Unsupported, match="fp8_format e4m3fnuz: vLLM's fp8 dtype on this platform"):
        vllm_triton.kv_cache_write(t, p)


# ------------------------------------------------------------------------------------------------
# decode_attention

DECODE_FN = ["q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "b_seq_len", "attn_logits",
             "num_kv_splits", "sm_scale", "page_size", "logit_cap", "k_scale", "v_scale", "is_mla"]
DECODE_FN_OLD = [n for n in DECODE_FN if n not in ("k_scale", "v_scale")]


def decode_problem(lk=576, lv=512, mla=True, hq=16, hkv=1, page=16, splits=4, fp8=False,
                   cross_layer=False, strided_table=False, lse_gap=False):
    B, W, pages = 3, 4, 12
    cache_dtype, cache_name = (np.uint8, "u8") if fp8 else (np.uint16, "bf16")
    shape = (pages, page, hkv, lk) if page > 1 else (pages, hkv, lk)
    if cross_layer:
        wide = shape[:1] + (2,) + shape[1:-1] + (lk + 3,)
        k = np.zeros(wide, cache_dtype)[:, 1, ..., :lk]
    else:
        k = np.zeros(shape, cache_dtype)
    v = k[..., :lv] if mla else np.zeros(shape[:-1] + (lv,), cache_dtype)
    table = np.zeros((B, W + 5), np.int32)[:, :W] if strided_table else np.zeros((B, W), np.int32)
    if strided_table == "columns":
        table = np.zeros((B, 2 * W), np.int32)[:, ::2]
    lse = np.zeros((hq, B), np.float32).T if lse_gap else np.zeros((B, hq), np.float32)
    t = {
        "q": T_(np.zeros((B, hq, lk), np.uint16), "q", "bf16"),
        "k_buffer": T_(k, "k_buffer", cache_name),
        "v_buffer": T_(v, "v_buffer", cache_name),
        "req_to_token": T_(table, "req_to_token"),
        "b_seq_len": T_(np.ones(B, np.int32), "b_seq_len"),
        "o": T_(np.zeros((B, hq, lv), np.uint16), "o", "bf16"),
        "lse": T_(lse, "lse"),
    }
    scale = 0.01 if fp8 else 1.0
    p = {"num_kv_splits": splits, "sm_scale": 0.0625, "page_size": page, "logit_cap": 0.0,
         "k_scale": scale, "v_scale": scale, "is_mla": mla}
    if fp8:
        p["fp8_format"] = "e4m3fn"
    return t, p


@pytest.mark.parametrize(
    "kwargs, change, why",
    [
        ({}, {"page_size": 64}, "page_size 64 is not the cache's 16"),
        ({}, {"k_scale": 0.5, "v_scale": 0.5}, "must be 1 on a 16-bit cache"),
        ({}, {"num_kv_splits": 0}, r"num_kv_splits must be in \[1, 65535\]"),
        ({"fp8": True}, {"v_scale": 0.02}, "is_mla needs v_scale == k_scale"),
        ({"fp8": True}, {"fp8_format": "e5m2"}, "fp8_format must be e4m3fn or e4m3fnuz"),
    ],
)
def test_decode_refuses_malformed_arguments(fresh, kwargs, change, why):
    t, p = decode_problem(**kwargs)
    p.update(change)
    with pytest.raises(ab.Refuse, match=why):
        vllm_triton.decode_attention(t, p)


DECODE_INVALID = [
    ({"mla": False, "hq": 12, "hkv": 8, "lk": 128, "lv": 128}, {}, "heads 12 is not a multiple of kv_heads 8"),
    ({"mla": True, "lk": 128, "lv": 128}, {},
     "is_mla needs Lv < Lk (V is the latent prefix of K), got 128/128"),
]


@pytest.mark.parametrize("kwargs, change, reason", DECODE_INVALID)
def test_decode_asks_the_op_whether_the_case_is_invalid(fresh, invalid_case, kwargs, change, reason):
    """The op's reason (decode_attention.cpp's invalid()), before vLLM is even loaded."""
    t, p = decode_problem(**kwargs)
    p.update(change)
    invalid_case("decode_attention", reason)
    with pytest.raises(ab.Refuse) as refused:
        vllm_triton.decode_attention(t, p)
    assert refused.value.why == reason


@pytest.mark.parametrize("kwargs, change, reason", DECODE_INVALID)
def test_decode_does_not_recode_the_ops_rules(fresh, kwargs, change, reason):
    """Without a case (outside attncheck) the entry goes on to vLLM (absent here: declined)."""
    _no_installed_vllm()
    t, p = decode_problem(**kwargs)
    p.update(change)
    with pytest.raises(ab.Unsupported, match="vLLM"):
        vllm_triton.decode_attention(t, p)


def test_decode_refuses_an_mla_value_buffer_that_is_not_the_key_prefix(fresh):
    t, p = decode_problem()
    t["v_buffer"] = T_(np.zeros(t["v_buffer"].shape, np.uint16), "v_buffer", "bf16")
    with pytest.raises(ab.Refuse, match=r"v_buffer == k_buffer\[..., :Lv\]"):
        vllm_triton.decode_attention(t, p)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"strided_table": "columns"}, "reads b \\* stride\\(0\\) \\+ column"),
        ({"lse_gap": True}, "stage 2 writes lse \\+ b \\* stride\\(0\\) \\+ h"),
    ],
)
def test_decode_declines_views_the_kernel_cannot_address(fresh, kwargs, why):
    t, p = decode_problem(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        vllm_triton.decode_attention(t, p)


def test_decode_declines_cross_layer_pages_where_the_revision_cannot_address_them(fresh, monkeypatch):
    _fake_function(monkeypatch, "decode_attention", DECODE_FN)  # no _page_stride in the module
    t, p = decode_problem(cross_layer=True)
    with pytest.raises(ab.Unsupported, match="PAGE_SIZE \\* stride\\(-3\\) \\(no _page_stride\\)"):
        vllm_triton.decode_attention(t, p)


def test_decode_takes_cross_layer_pages_where_the_revision_reads_the_page_stride(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "decode_attention", DECODE_FN, {"_page_stride": object()})
    t, p = decode_problem(cross_layer=True)
    vllm_triton.decode_attention(t, p)
    assert len(fn.calls) == 1


def test_decode_declines_fp8_where_the_revision_takes_no_scales(fresh, monkeypatch):
    _fake_function(monkeypatch, "decode_attention", DECODE_FN_OLD)
    t, p = decode_problem(fp8=True)
    with pytest.raises(ab.Unsupported, match="takes no k_scale/v_scale"):
        vllm_triton.decode_attention(t, p)


def test_decode_maps_the_arguments(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "decode_attention", DECODE_FN)
    t, p = decode_problem(fp8=True, splits=7, page=16)
    p["logit_cap"] = 30.0
    vllm_triton.decode_attention(t, p)
    (args, kwargs), = fn.calls
    names = ["q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "b_seq_len"]
    assert [a.src.name for a in args[:7]] == names
    assert args[1].dtype == args[2].dtype == "float8_e4m3fn"  # uint8 codes viewed as the fp8 type
    logits = args[7]
    assert logits.size_ == (3, 16, 7, 513) and np.isnan(logits.arr).all()  # [B, Hq, S, Lv + 1], NaN
    assert args[8:] == (7, 0.0625)
    assert kwargs["page_size"] == 16 and kwargs["logit_cap"] == 30.0 and kwargs["is_mla"] is True
    assert float(kwargs["k_scale"].arr[0]) == float(kwargs["v_scale"].arr[0]) == np.float32(0.01)


def test_decode_passes_unit_device_scales_on_16_bit_caches(fresh, monkeypatch, fake_torch):
    # Device scalars filled by a kernel, never the function's default torch.tensor(1.0, device=...):
    # a host-to-device copy that a CUDA graph capture refuses.
    fn = _fake_function(monkeypatch, "decode_attention", DECODE_FN)
    t, p = decode_problem(mla=False, lk=128, lv=128, hkv=2, page=1)
    vllm_triton.decode_attention(t, p)
    (args, kwargs), = fn.calls
    assert float(kwargs["k_scale"].arr[0]) == float(kwargs["v_scale"].arr[0]) == 1.0
    assert kwargs["is_mla"] is False and kwargs["page_size"] == 1


def test_decode_passes_no_scales_where_the_revision_takes_none(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "decode_attention", DECODE_FN_OLD)
    t, p = decode_problem(mla=False, lk=128, lv=128, hkv=2, page=1)
    vllm_triton.decode_attention(t, p)
    (args, kwargs), = fn.calls
    assert "k_scale" not in kwargs and "v_scale" not in kwargs


def test_decode_declares_the_contract_of_both_kernel_paths():
    assert vllm_triton.ADAPTER.contract_of("decode_attention") == "qk-products-in-input-type+p-in-input-type"
    for exact in ("kv_cache_write", "kv_gather", "indexer_k_cache", "indexer_gather"):
        assert vllm_triton.ADAPTER.contract_of(exact) == "fp32-accumulate"


def test_decode_declares_the_kernels_invariance_and_an_experiment_replaces_it(monkeypatch):
    import importlib

    # One program per (request, head group, split), split bounds from the request's own length:
    # batch- and page-order-invariant, not split-invariant (the split count changes the reduction).
    monkeypatch.delenv("ATTNCHECK_VLLM_DECODE_PROPERTIES", raising=False)
    assert importlib.reload(vllm_triton).ADAPTER.properties_of("decode_attention") == ("batch-invariant", "page-order-invariant")
    monkeypatch.setenv("ATTNCHECK_VLLM_DECODE_PROPERTIES", "")
    assert importlib.reload(vllm_triton).ADAPTER.properties_of("decode_attention") == ()
    monkeypatch.setenv("ATTNCHECK_VLLM_DECODE_PROPERTIES", "batch-invariant,split-invariant")
    assert importlib.reload(vllm_triton).ADAPTER.properties_of("decode_attention") == ("batch-invariant", "split-invariant")
    monkeypatch.setenv("ATTNCHECK_VLLM_DECODE_PROPERTIES", "order-free")
    with pytest.raises(ValueError, match="unknown invariance property 'order-free'"):
        importlib.reload(vllm_triton)
    monkeypatch.delenv("ATTNCHECK_VLLM_DECODE_PROPERTIES")
    importlib.reload(vllm_triton)


# ------------------------------------------------------------------------------------------------
# kv_gather

GATHER_FN = ["key_cache", "value_cache", "key", "value", "block_tables", "k_scales", "v_scales",
             "cu_seqlens_kv", "token_to_batch", "seq_starts", "dequant", "kv_cache_layout", "total_tokens"]


class _Backend:
    @classmethod
    def get_supported_head_sizes(cls):
        return [64, 128, 256]


def gather_problem(layout="NHD", strides="contiguous", kv="model", d=64, table="contiguous",
                   scales=(0.5, 2.0)):
    nb, page, hkv, total = 6, 16, 2, 9
    fp8 = kv != "model"
    es, name = (np.uint8, "u8") if fp8 else (np.uint16, "bf16")
    if layout == "NHD":
        shape_k = shape_v = (nb, page, hkv, d)
    else:
        x = 16 // np.dtype(es).itemsize
        shape_k, shape_v = (nb, hkv, d // x, page, x), (nb, hkv, page // x, d, x)
    if strides == "hybrid":  # [K0][V0][K1][V1]...: block stride twice the block
        kc = np.zeros((nb, 2) + shape_k[1:], es)[:, 0]
        vc = np.zeros((nb, 2) + shape_v[1:], es)[:, 1]
    elif strides == "padded":
        kc = np.zeros(tuple(n + 1 for n in shape_k), es)[tuple(slice(0, n) for n in shape_k)]
        vc = np.zeros(tuple(n + 1 for n in shape_v), es)[tuple(slice(0, n) for n in shape_v)]
    else:
        kc, vc = np.zeros(shape_k, es), np.zeros(shape_v, es)
    bt = np.zeros((3, 4 + 5), np.int32)[:, :4] if table == "strided" else np.zeros((3, 4), np.int32)
    ws = np.zeros((2, total + 3, hkv, d), np.uint16)
    t = {
        "key_cache": T_(kc, "key_cache", name),
        "value_cache": T_(vc, "value_cache", name),
        "block_tables": T_(bt, "block_tables"),
        "cu_seqlens_kv": T_(np.array([0, 4, 4, total], np.int32), "cu_seqlens_kv"),
        "token_to_batch": T_(np.zeros(total + 5, np.int32), "token_to_batch"),
        "seq_starts": T_(np.zeros(3, np.int32), "seq_starts"),
        "k_scale": T_(np.array([scales[0]], np.float32), "k_scale"),
        "v_scale": T_(np.array([scales[1]], np.float32), "v_scale"),
        "key": T_(ws[0, :total], "key", "bf16"),
        "value": T_(ws[1, :total], "value", "bf16"),
    }
    p = {"kv_cache_layout": layout, "dequant": fp8, "total_tokens": total}
    if fp8:
        p["fp8_format"] = kv
    return t, p


@pytest.mark.parametrize(
    "kwargs, change, why",
    [
        ({}, {"kv_cache_layout": "HND"}, "kv_cache_layout must be NHD or SHUFFLE"),
        ({"kv": "e4m3fn"}, {"dequant": False}, "'key_cache' is u8, expected bf16"),
        ({"kv": "e4m3fn"}, {"fp8_format": "e5m2"}, "fp8_format must be e4m3fn or e4m3fnuz"),
        ({}, {"total_tokens": 10}, "cannot hold \\[10, Hkv, D\\]"),
    ],
)
def test_gather_refuses_invalid_arguments(fresh, kwargs, change, why):
    t, p = gather_problem(**kwargs)
    p.update(change)
    with pytest.raises(ab.Refuse, match=why):
        vllm_triton.kv_gather(t, p)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"table": "strided"}, "reads row b at b \\* block_tables.size\\(1\\) = b \\* 4"),
        ({"layout": "SHUFFLE", "strides": "padded"}, "reads each block as one contiguous run of tiles"),
    ],
)
def test_gather_declines_what_the_function_cannot_address(fresh, kwargs, why):
    t, p = gather_problem(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        vllm_triton.kv_gather(t, p)


def test_gather_declines_head_sizes_the_backend_does_not_list(fresh, monkeypatch):
    _fake_function(monkeypatch, "kv_gather", GATHER_FN, {"AiterFlashAttentionBackend": _Backend})
    t, p = gather_problem(d=192)
    with pytest.raises(ab.Unsupported, match="head size 192: .* supports \\[64, 128, 256\\]"):
        vllm_triton.kv_gather(t, p)


def test_gather_declines_shuffle_dequant_with_scales(fresh, monkeypatch, fake_torch):
    _fake_function(monkeypatch, "kv_gather", GATHER_FN, {"AiterFlashAttentionBackend": _Backend})
    t, p = gather_problem(layout="SHUFFLE", kv="e4m3fn")
    with pytest.raises(ab.Unsupported, match="SHUFFLE path multiplies by 1.0"):
        vllm_triton.kv_gather(t, p)


def test_gather_passes_strided_nhd_caches_as_they_are(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "kv_gather", GATHER_FN, {"AiterFlashAttentionBackend": _Backend})
    t, p = gather_problem(strides="hybrid", kv="e4m3fn")
    vllm_triton.kv_gather(t, p)
    (_, kw), = fn.calls
    assert kw["key_cache"].src is t["key_cache"] and kw["key_cache"].strides_ is None
    assert kw["key_cache"].dtype == "float8_e4m3fn" and kw["dequant"] is True
    assert kw["kv_cache_layout"] == "NHD" and kw["total_tokens"] == 9
    assert kw["block_tables"].src is t["block_tables"] and kw["k_scales"].src is t["k_scale"]


def test_gather_hands_shuffle_blocks_over_as_vllm_holds_them(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "kv_gather", GATHER_FN, {"AiterFlashAttentionBackend": _Backend})
    t, p = gather_problem(layout="SHUFFLE", strides="hybrid", scales=(1.0, 1.0))
    vllm_triton.kv_gather(t, p)
    (_, kw), = fn.calls
    kc = t["key_cache"]
    # [nb, P, Hkv, D] over each block's tiles, the block stride kept (hybrid: twice the block)
    assert kw["key_cache"].size_ == (6, 16, 2, 64)
    assert kw["key_cache"].strides_ == (kc.strides[0], 128, 64, 1) and kc.strides[0] == 2 * 16 * 2 * 64


# ------------------------------------------------------------------------------------------------
# indexer_k_cache, indexer_gather


def index_cache(bs=16, blocks=4, pad=0):
    stride = bs * 132 + pad
    store = np.full(blocks * stride, 0xFF, np.uint8)
    return np.lib.stride_tricks.as_strided(store, (blocks, bs, 132), (stride, 132, 1))


def k_cache_problem(bs=16, pad=0, k_stride=128, fmt="e4m3fn", quant_max=448.0):
    k = np.zeros((8, k_stride), np.uint16)[:, :128]
    t = {"k": T_(k, "k", "bf16"), "slot_mapping": T_(np.arange(5, dtype=np.int64), "slot_mapping"),
         "kv_cache": T_(index_cache(bs, pad=pad), "kv_cache")}
    return t, {"fp8_format": fmt, "quant_max": quant_max}


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"quant_max": 500.0}, "quant_max 500.0 outside"),
    ],
)
def test_k_cache_refuses_malformed_arguments(fresh, kwargs, why):
    t, p = k_cache_problem(**kwargs)
    with pytest.raises(ab.Refuse, match=why):
        vllm_triton.indexer_k_cache(t, p)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"k_stride": 192}, "reads token t at k \\+ t \\* 128"),
        ({"fmt": "e4m3fnuz", "quant_max": 240.0}, "divides the amax by 224.0 for e4m3fnuz"),
    ],
)
def test_k_cache_declines_what_the_writer_does_not_serve(fresh, kwargs, why):
    t, p = k_cache_problem(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        vllm_triton.indexer_k_cache(t, p)


K_CACHE_INVALID = [
    ({"bs": 24}, "block size 24 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"),
    ({"pad": 2}, "page stride 2114 is not a multiple of 4 (fp32 scales would be misaligned)"),
]


@pytest.mark.parametrize("kwargs, reason", K_CACHE_INVALID)
def test_k_cache_asks_the_op_whether_the_case_is_invalid(fresh, invalid_case, kwargs, reason):
    """The op's reason (indexer.cpp's invalid()); outside attncheck the writer is called."""
    t, p = k_cache_problem(**kwargs)
    invalid_case("indexer_k_cache", reason)
    with pytest.raises(ab.Refuse) as refused:
        vllm_triton.indexer_k_cache(t, p)
    assert refused.value.why == reason


@pytest.mark.parametrize("kwargs, reason", K_CACHE_INVALID)
def test_k_cache_does_not_recode_the_ops_rules(fresh, monkeypatch, fake_torch, kwargs, reason):
    fn = _fake_function(monkeypatch, "indexer_k_cache", ["k", "kv_cache", "slot_mapping", "quant_block_size", "scale_fmt"])
    t, p = k_cache_problem(**kwargs)
    vllm_triton.indexer_k_cache(t, p)
    assert len(fn.calls) == 1


def test_gather_asks_the_op_whether_the_case_is_invalid(fresh, invalid_case):
    t = {"kv_cache": T_(index_cache(16, pad=2), "kv_cache"),
         "block_table": T_(np.zeros((3, 4), np.int32), "block_table"),
         "cu_seq_lens": T_(np.array([0, 1, 2, 3], np.int32), "cu_seq_lens"),
         "k_fp8": T_(np.zeros((3, 128), np.uint8), "k_fp8"),
         "k_scale": T_(np.zeros(3, np.float32), "k_scale")}
    invalid_case("indexer_gather", "page stride is not a multiple of 4")
    with pytest.raises(ab.Refuse) as refused:
        vllm_triton.indexer_gather(t, {})
    assert refused.value.why == "page stride is not a multiple of 4"


def test_k_cache_calls_the_writer_with_ue8m0_scales(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "indexer_k_cache", ["k", "kv_cache", "slot_mapping", "quant_block_size", "scale_fmt"])
    t, p = k_cache_problem(bs=1, pad=64)
    vllm_triton.indexer_k_cache(t, p)
    (args, _), = fn.calls
    assert [a.src.name for a in args[:3]] == ["k", "kv_cache", "slot_mapping"] and args[3:] == (128, "ue8m0")


def test_gather_derives_token_to_seq_from_cu_seq_lens(fresh, monkeypatch, fake_torch):
    fn = _fake_function(monkeypatch, "indexer_gather", ["k_cache", "k_fp8", "k_fp8_scale", "block_table",
                                                        "cu_seqlen", "token_to_seq"])
    cu = np.array([0, 3, 3, 7], np.int32)  # request 1 is empty
    t = {"kv_cache": T_(index_cache(64, pad=36), "kv_cache"),
         "block_table": T_(np.zeros((3, 9), np.int32)[:, :4], "block_table"),  # strided rows: fine
         "cu_seq_lens": T_(cu, "cu_seq_lens"),
         "k_fp8": T_(np.zeros((9, 128), np.uint8)[:7], "k_fp8"),
         "k_scale": T_(np.zeros(9, np.float32)[:7], "k_scale")}
    vllm_triton.indexer_gather(t, {})
    (args, _), = fn.calls
    assert args[1].dtype == "float8_e4m3fn" and args[2].src.name == "k_scale"
    assert args[5].arr.tolist() == [0, 0, 0, 2, 2, 2, 2] and args[5].dtype == "int32"


def test_gather_declines_strided_table_columns(fresh):
    t = {"kv_cache": T_(index_cache(64), "kv_cache"),
         "block_table": T_(np.zeros((3, 8), np.int32)[:, ::2], "block_table"),
         "cu_seq_lens": T_(np.array([0, 1, 2, 3], np.int32), "cu_seq_lens"),
         "k_fp8": T_(np.zeros((3, 128), np.uint8), "k_fp8"),
         "k_scale": T_(np.zeros(3, np.float32), "k_scale")}
    with pytest.raises(ab.Unsupported, match="reads b \\* stride\\(0\\) \\+ column"):
        vllm_triton.indexer_gather(t, {})


# ------------------------------------------------------------------------------------------------
# Where vLLM comes from


def _fake_triton(monkeypatch):
    triton = types.ModuleType("triton")
    triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    triton.__version__ = "3.3.0"
    tl = types.ModuleType("triton.language")
    tl.constexpr = object
    triton.language = tl
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.language", tl)
    return triton, tl


# A kernel file of the shape vLLM's are: vLLM internals imported, subclassed, subscripted, used in
# annotations, decorators and module-level calls, and a platform-guarded definition.
PARTIAL_FILE = '''
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder, AttentionType, MultipleOf
from vllm.compilation.breakable_cudagraph import eager_break_during_capture
import vllm.envs as envs

is_hip_ = current_platform.is_rocm()
FP8 = current_platform.fp8_dtype()
logger = init_logger(__name__)
logger.info_once("loaded %s", "once")


@dataclass
class Meta:
    config: VllmConfig | None
    sizes: list[int]


class Builder(AttentionMetadataBuilder[Meta]):
    kind = AttentionType.DECODER
    supported: ClassVar[list[int | MultipleOf]] = [16, MultipleOf(16)]


class Backend(AttentionBackend):
    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [64, 128, 256]


@eager_break_during_capture
def wrapped(x):
    return x


@triton.jit
def kernel(x, N: tl.constexpr):
    return x


def decode_attention_fwd(*args, **kwargs):
    return "decode", args, kwargs


if current_platform.is_rocm():
    def cp_mha_gather_cache(*args, **kwargs):
        return "gather"
'''


def _tree(tmp_path, relpath, text=PARTIAL_FILE):
    path = tmp_path / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_partial_tree_runs_the_unmodified_file_with_stand_ins(fresh, monkeypatch, fake_torch, tmp_path):
    _no_installed_vllm()
    triton, tl = _fake_triton(monkeypatch)
    path = _tree(tmp_path, "vllm/v1/attention/ops/triton_decode_attention.py")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    fn, mod, where = vllm_triton._load("decode_attention")
    assert fn()[0] == "decode" and mod.__file__ == str(path)
    assert "from the tree" in where and vllm_triton.source("decode_attention") == where
    # the real answers
    assert mod.triton is triton and mod.tl is tl
    assert mod.is_hip_ is False and mod.FP8 == "float8_e4m3fn"
    assert mod.Backend.get_supported_head_sizes() == [64, 128, 256]
    assert mod.Builder.supported[0] == 16 and issubclass(mod.Builder, mod.AttentionMetadataBuilder)
    # a stand-in used as a value names itself
    with pytest.raises(vllm_triton.StandInUsed, match="vllm.envs.VLLM_ROCM_USE_AITER is a stand-in"):
        bool(mod.envs.VLLM_ROCM_USE_AITER)
    with pytest.raises(vllm_triton.StandInUsed, match="eager_break_during_capture"):
        bool(mod.wrapped)


def test_stand_ins_answer_for_a_rocm_device(fresh, monkeypatch, tmp_path):
    _no_installed_vllm()
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(hip="6.3", arch="gfx942:sramecc+:xnack-"))
    _fake_triton(monkeypatch)
    _tree(tmp_path, "vllm/v1/attention/ops/triton_decode_attention.py",
          PARTIAL_FILE + "\nfrom vllm.platforms.rocm import _ON_GFX942, _ON_GFX950\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    mod = vllm_triton._load("decode_attention")[1]
    assert mod.is_hip_ is True and mod.FP8 == "float8_e4m3fnuz"
    assert mod._ON_GFX942 is True and mod._ON_GFX950 is False


def test_rocm_guarded_definitions_load_off_rocm_with_a_local_view(fresh, monkeypatch, fake_torch, tmp_path):
    _no_installed_vllm()
    _fake_triton(monkeypatch)
    _tree(tmp_path, "vllm/v1/attention/backends/rocm_aiter_fa.py")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    fn, mod, where = vllm_triton._load("kv_gather")
    assert fn() == "gather" and "ROCm-guarded definitions loaded with is_rocm() answering True" in where
    assert mod.is_hip_ is True  # the file's own view ...
    assert sys.modules["vllm.platforms"].current_platform.is_rocm() is False  # ... and nobody else's
    assert mod.FP8 == "float8_e4m3fn"  # every other answer stays real


def test_a_checkout_that_imports_is_imported(fresh, monkeypatch, tmp_path):
    _no_installed_vllm()
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    _tree(tmp_path, "vllm/v1/attention/ops/triton_decode_attention.py", "def decode_attention_fwd():\n    return 1\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    fn, _, where = vllm_triton._load("decode_attention")
    assert fn() == 1 and "checkout import" in where


def test_a_checkout_that_does_not_import_is_loaded_file_wise(fresh, monkeypatch, fake_torch, tmp_path):
    _no_installed_vllm()
    _fake_triton(monkeypatch)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("import vllm_dependency_that_is_not_installed\n")
    _tree(tmp_path, "vllm/v1/attention/ops/triton_decode_attention.py")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    fn, _, where = vllm_triton._load("decode_attention")
    assert fn()[0] == "decode"
    assert "from the tree" in where and "checkout import failed" in where and "vllm_dependency_that_is_not_installed" in where


def test_the_src_tree_is_the_only_source(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    monkeypatch.setenv("ATTNCHECK_VLLM_FILE", str(_tree(tmp_path / "elsewhere", "writer.py")))
    with pytest.raises(ab.Unsupported, match="holds none of vllm/v1/attention/backends/rocm_aiter_fa.py"):
        vllm_triton._load("kv_gather")
    with pytest.raises(ab.Unsupported, match="holds none of vllm/attention/ops/triton_reshape_and_cache_flash.py"):
        vllm_triton._load("kv_cache_write")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path / "missing"))
    with pytest.raises(ab.Unsupported, match="is not a directory"):
        vllm_triton._load("decode_attention")


def test_a_file_that_fails_to_execute_is_declined_with_the_reason(fresh, monkeypatch, fake_torch, tmp_path):
    _no_installed_vllm()
    _fake_triton(monkeypatch)
    _tree(tmp_path, "vllm/v1/attention/ops/triton_decode_attention.py",
          "import vllm.envs as envs\nif envs.VLLM_USE_V2:\n    pass\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    with pytest.raises(ab.Unsupported, match="triton_decode_attention.py failed to load: StandInUsed: vllm.envs.VLLM_USE_V2 is a stand-in .module vllm.envs: not in the tree"):
        vllm_triton._load("decode_attention")


def test_the_one_file_of_the_cache_writer_still_loads(fresh, monkeypatch, fake_torch, tmp_path):
    _no_installed_vllm()
    _fake_triton(monkeypatch)
    writer = _tree(tmp_path, "triton_reshape_and_cache_flash.py",
                   "from vllm.platforms import current_platform\nfrom vllm.triton_utils import tl, triton\n"
                   "def triton_reshape_and_cache_flash(*a):\n    return current_platform.fp8_dtype()\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_FILE", str(writer))
    fn, _, where = vllm_triton._load("kv_cache_write")
    assert fn() == "float8_e4m3fn" and "standalone" in where


def test_without_vllm_it_says_where_it_looked(fresh):
    _no_installed_vllm()
    t, p = cache_write_problem()
    with pytest.raises(ab.Unsupported, match="vLLM not found: set ATTNCHECK_VLLM_SRC"):
        vllm_triton.kv_cache_write(t, p)


def test_a_missing_vllm_file_is_named(fresh, monkeypatch, tmp_path):
    _no_installed_vllm()
    monkeypatch.setenv("ATTNCHECK_VLLM_FILE", str(tmp_path / "nope.py"))
    t, p = cache_write_problem()
    with pytest.raises(ab.Unsupported, match="is not a file"):
        vllm_triton.kv_cache_write(t, p)


def test_declines_the_per_token_quant_writer_naming_where_it_lives():
    with pytest.raises(ab.Unsupported, match="reshape_and_cache_with_pertoken_quant"):
        vllm_triton.kv_cache_write_pertoken_quant({}, {})


def test_the_writers_pure_python_imports_run_from_the_tree(fresh, monkeypatch, fake_torch, tmp_path):
    """vLLM main's writer computes FP8_MIN, FP8_MAX = get_fp8_min_max() at import (issue 36): the
    quant_utils module is executed from the tree, its own unloadable imports stood in."""
    _no_installed_vllm()
    _fake_triton(monkeypatch)
    _tree(tmp_path, "vllm/model_executor/layers/quantization/utils/quant_utils.py",
          "from vllm.distributed.parallel_state import get_ep_group\n"
          "from vllm.platforms import current_platform\n"
          "def get_fp8_min_max():\n"
          "    return (-224.0, 224.0) if current_platform.is_fp8_fnuz() else (-448.0, 448.0)\n")
    _tree(tmp_path, "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
          "from vllm.model_executor.layers.quantization.utils.quant_utils import get_fp8_min_max\n"
          "from vllm.v1.kv_cache_interface import KVQuantMode\n"
          "FP8_MIN, FP8_MAX = get_fp8_min_max()\n"
          "def triton_reshape_and_cache_flash(*a):\n    return FP8_MIN, FP8_MAX\n")
    monkeypatch.setenv("ATTNCHECK_VLLM_SRC", str(tmp_path))
    fn, _, where = vllm_triton._load("kv_cache_write")
    assert fn() == (-448.0, 448.0) and "from the tree" in where
    stood_in = upstream._vllm["tree"].stood_in
    assert "not in the tree" in stood_in["vllm.distributed.parallel_state"]
    assert "vllm.model_executor.layers.quantization.utils.quant_utils" not in stood_in
