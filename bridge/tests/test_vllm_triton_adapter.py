"""vllm_triton's mapping: what it declines or refuses before any GPU work (NumPy-backed tensors,
no torch needed), and where it looks for vLLM. The writer itself is judged on a GPU
(docs/ops/kv_cache_write.md, docs/results.md)."""

import numpy as np
import pytest

import attncheck_bridge as ab
import vllm_triton

T_ = ab.Tensor.from_numpy
NB, P, H, D, TOK = 4, 16, 2, 64, 5


def problem(cache="contiguous", layout="NHD", kv="auto", fmt=None, slot_dtype=np.int64):
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
def test_declines_what_the_vllm_function_cannot_address(kwargs, why):
    t, p = problem(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        vllm_triton.kv_cache_write(t, p)


def test_declines_a_value_cache_with_other_strides():
    t, p = problem()
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
def test_refuses_invalid_parameters(kwargs, param, value, why):
    t, p = problem(**kwargs)
    p[param] = value
    with pytest.raises(ab.Refuse, match=why):
        vllm_triton.kv_cache_write(t, p)


def test_refuses_int32_slots():
    t, p = problem(slot_dtype=np.int32)
    with pytest.raises(ab.Refuse, match="slot_mapping"):
        vllm_triton.kv_cache_write(t, p)


def test_without_vllm_it_says_where_it_looked(monkeypatch):
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    monkeypatch.delenv("ATTNCHECK_VLLM_SRC", raising=False)
    monkeypatch.delenv("ATTNCHECK_VLLM_FILE", raising=False)
    monkeypatch.setattr(vllm_triton, "_writer", None)
    t, p = problem()
    with pytest.raises(ab.Unsupported, match="vLLM not found: set ATTNCHECK_VLLM_SRC"):
        vllm_triton.kv_cache_write(t, p)


def test_a_missing_vllm_file_is_named(monkeypatch, tmp_path):
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    monkeypatch.delenv("ATTNCHECK_VLLM_SRC", raising=False)
    monkeypatch.setenv("ATTNCHECK_VLLM_FILE", str(tmp_path / "nope.py"))
    monkeypatch.setattr(vllm_triton, "_writer", None)
    t, p = problem()
    with pytest.raises(ab.Unsupported, match="is not a file"):
        vllm_triton.kv_cache_write(t, p)
