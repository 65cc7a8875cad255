"""deepgemm's mapping without a GPU: what it refuses (op contract) and declines (DeepGEMM's SM90
rules), the decode rows' key counts and the SHUFFLE -> row-major page map, and the declines of
its executor (device, missing deep_gemm) through a stand-in torch. NumPy-backed tensors; the
kernels themselves are judged on a GPU (docs/adapters/deepgemm_flashmla.md)."""

import sys

import numpy as np
import pytest

import attncheck_bridge as ab
import deepgemm

from sm90_test_support import aligned, fake_torch  # noqa: E402

T_ = ab.Tensor.from_numpy


def prefill(M=4, H=32, N=70, fmt="e4m3fn", weights_stride=None, q_offset=0):
    w = aligned((M, weights_stride or H), np.float32)[:, :H]
    t = {
        "q": T_(aligned((M, H, 128), np.uint8, q_offset), "q"),
        "k_fp8": T_(aligned((N, 128), np.uint8), "k_fp8"),
        "k_scale": T_(aligned((N,), np.float32), "k_scale"),
        "weights": T_(w, "weights"),
        "cu_seqlen_ks": T_(np.zeros(M, np.int32), "cu_seqlen_ks"),
        "cu_seqlen_ke": T_(np.full(M, N, np.int32), "cu_seqlen_ke"),
        "logits": T_(aligned((M, N + 26), np.float32)[:, :N], "logits"),
    }
    return t, {"fp8_format": fmt}


def decode(B=8, nn=1, H=32, BS=64, NB=20, pad=0, fmt="e4m3fn", chunk_q=64, table_col_stride=1, W=6):
    page = BS * 132 + pad
    store = aligned((NB * page,), np.uint8)
    cache = np.lib.stride_tricks.as_strided(store, (NB, BS, 132), (page, 132, 1))
    table = aligned((B, W * table_col_stride), np.int32)[:, ::table_col_stride]
    t = {
        "q": T_(aligned((B, nn, H, 128), np.uint8), "q"),
        "kv_cache": T_(cache, "kv_cache"),
        "weights": T_(aligned((B * nn, H), np.float32), "weights"),
        "context_lens": T_(np.array([0, 1, 63, 64, 65, 129, 189, 300][:B], np.int32), "context_lens"),
        "block_table": T_(table, "block_table"),
        "logits": T_(aligned((B * nn, 368), np.float32)[:, :337], "logits"),
    }
    return t, {"fp8_format": fmt, "chunk_q": chunk_q}


# ------------------------------------------------------------------------------------------------
# prefill


def test_prefill_plan_of_a_servable_case():
    t, p = prefill(M=16, H=64, N=594)
    assert deepgemm.plan_prefill(t, p) == {"M": 16, "H": 64, "N": 594}


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"fmt": "e4m3fnuz"}, "float8_e4m3fn only"),
        ({"H": 8}, "take 32 or 64 heads"),
        ({"H": 128}, "take 32 or 64 heads"),
        ({"weights_stride": 40}, "rows at a stride of num_heads"),
        ({"q_offset": 4}, "16-byte boundary"),
    ],
)
def test_prefill_declines_what_the_sm90_kernel_does_not_serve(kwargs, why):
    t, p = prefill(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        deepgemm.plan_prefill(t, p)


@pytest.mark.parametrize("H", [0, 256])
def test_prefill_asks_the_op_whether_the_case_is_invalid(invalid_case, H):
    """The op's reason (indexer_scores.cpp's invalid()); without a case (outside attncheck) the
    head count is DeepGEMM's to decline, not re-coded here."""
    t, p = prefill(H=H)
    with pytest.raises(ab.Unsupported, match="take 32 or 64 heads"):
        deepgemm.plan_prefill(t, p)
    invalid_case("indexer_logits_prefill", f"heads {H} outside [1, 128]")
    with pytest.raises(ab.Refuse) as refused:
        deepgemm.plan_prefill(t, p)
    assert refused.value.why == f"heads {H} outside [1, 128]"


def test_prefill_refuses_an_unknown_fp8_format_and_wrong_shapes():
    t, p = prefill()
    with pytest.raises(ab.Refuse, match="fp8_format"):
        deepgemm.plan_prefill(t, {"fp8_format": "e5m2"})
    t["k_scale"] = T_(np.zeros(69, np.float32), "k_scale")
    with pytest.raises(ab.Refuse, match="'k_scale' is"):
        deepgemm.plan_prefill(t, p)


def test_prefill_windows_outside_the_keys_are_declined():
    deepgemm.check_prefill_windows([0, 70, 14], [70, 70, 40], 70)  # empty and inner windows are fine
    for ks, ke in (([-1], [5]), ([0], [71]), ([6], [5])):
        with pytest.raises(ab.Unsupported, match="does not clamp"):
            deepgemm.check_prefill_windows(ks, ke, 70)


# ------------------------------------------------------------------------------------------------
# decode


def test_decode_plan_of_a_servable_case_when_pages_are_relaid_out():
    t, p = decode(nn=2, H=64)
    plan = deepgemm.plan_decode(t, p, unshuffle=True)
    assert plan == {
        "B": 8,
        "next_n": 2,
        "H": 64,
        "NB": 20,
        "BS": 64,
        "W": 6,
        "page_bytes": 64 * 132,
        "max_model_len": 337,
        "unshuffle": True,
    }


def test_decode_declines_shuffle_pages_by_default_and_names_the_switch():
    t, p = decode()
    with pytest.raises(ab.Unsupported, match="SHUFFLE.*ATTNCHECK_DEEPGEMM_UNSHUFFLE=1"):
        deepgemm.plan_decode(t, p, unshuffle=False)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"fmt": "e4m3fnuz"}, "float8_e4m3fn only"),
        ({"H": 16, "chunk_q": 16}, "take 32 or 64 heads"),
        ({"nn": 4}, "next_n 1 or 2"),
        ({"BS": 1, "NB": 301, "W": 301}, "block_kv 64"),
        ({"BS": 16}, "block_kv 64"),
        ({"pad": 20}, "row stride 8468 B is not a multiple of 16"),
        ({"table_col_stride": 2}, r"block_table.stride\(1\) == 1"),
    ],
)
def test_decode_declines_what_the_sm90_kernel_does_not_serve(kwargs, why):
    t, p = decode(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        deepgemm.plan_decode(t, p, unshuffle=True)


DECODE_INVALID = [
    ({"BS": 24}, "block size 24 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"),
    ({"chunk_q": 0}, "chunk_q 0 < 1"),
    ({"H": 48, "chunk_q": 32}, "heads 48 not a multiple of chunk_q 32"),
    ({"pad": 2}, "page stride is not a multiple of 4"),
    ({"H": 256}, "heads 256 outside [1, 128]"),
]


@pytest.mark.parametrize("kwargs, reason", DECODE_INVALID)
def test_decode_asks_the_op_whether_the_case_is_invalid(invalid_case, kwargs, reason):
    """The op's reason (indexer_scores.cpp's invalid()), before any argument check."""
    t, p = decode(**kwargs)
    invalid_case("indexer_logits_decode", reason)
    with pytest.raises(ab.Refuse) as refused:
        deepgemm.plan_decode(t, p, unshuffle=True)
    assert refused.value.why == reason


@pytest.mark.parametrize("kwargs, reason", DECODE_INVALID)
def test_decode_does_not_recode_the_ops_rules(kwargs, reason):
    """Without a case (outside attncheck) nothing is refused for the op's reasons: DeepGEMM's
    limits decline, or the plan is made."""
    t, p = decode(**kwargs)
    try:
        deepgemm.plan_decode(t, p, unshuffle=True)
    except ab.Unsupported:
        pass


def test_decode_row_ends_follow_the_next_n_rule_and_clamp():
    # row b*nn + n sees p <= L_b - nn + n, clamped to [0, max_model_len]
    assert deepgemm.decode_row_ends([0, 1, 5, 9], 2, 6) == [[0, 0], [0, 1], [4, 5], [6, 6]]
    assert deepgemm.decode_row_ends([3], 1, 10) == [[3]]


def test_normal_from_shuffle_is_the_documented_permutation():
    src = deepgemm.normal_from_shuffle(64)
    assert sorted(src.tolist()) == list(range(64 * 128))
    assert src[17 * 128 + 35] == 2579  # docs/ops/indexer.md worked example (BS 64, t 17, d 35)
    # a page written in SHUFFLE order reads back row-major through the map
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 256, (64, 128), dtype=np.uint8)
    page = np.empty(64 * 128, np.uint8)
    for tok in range(64):
        for d in range(128):
            page[(tok // 16) * 2048 + (d // 16) * 256 + (tok % 16) * 16 + d % 16] = rows[tok, d]
    assert np.array_equal(page[src].reshape(64, 128), rows)


# ------------------------------------------------------------------------------------------------
# registration and the executor's declines


def test_entries_and_contracts():
    assert deepgemm.ADAPTER.ops() == ["indexer_logits_prefill", "indexer_logits_decode"]
    assert deepgemm.ADAPTER.device == "cuda"
    for name in deepgemm.ADAPTER.ops():
        assert deepgemm.ADAPTER.contract_of(name) == "fp32-accumulate"


def test_executor_declines_other_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch((10, 0)))
    t, p = prefill()
    with pytest.raises(ab.Unsupported, match="sm_100: this adapter maps DeepGEMM's SM90 kernels"):
        deepgemm.indexer_logits_prefill(t, p)


def test_executor_declines_without_deep_gemm(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", fake_torch((9, 0)))
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    monkeypatch.setattr(deepgemm, "_deep_gemm", None)
    monkeypatch.setenv("ATTNCHECK_DEEPGEMM_SRC", str(tmp_path))
    t, p = decode()
    plan = deepgemm.plan_decode(t, p, unshuffle=True)
    with pytest.raises(ab.Unsupported, match="deep_gemm not importable"):
        deepgemm._execute_decode(t, plan)
