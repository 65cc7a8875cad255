"""flashmla's mapping without a GPU: what it refuses (op contract) and declines (FlashMLA's SM90
rules), the top-k -> cache-row conversion and head padding of the sparse entry, and the declines
of its executor (device, missing flash_mla) through a stand-in torch. NumPy-backed tensors; the
kernels themselves are judged on a GPU (docs/adapters/deepgemm_flashmla.md)."""

import sys

import numpy as np
import pytest

import attncheck_bridge as ab
import flashmla

from sm90_test_support import aligned, fake_torch  # noqa: E402

T_ = ab.Tensor.from_numpy

# The op's reason for an invalid head count (reference/mla_decode.cpp, mla_num_heads_message).
MLA_HEADS = ("Aiter MLA requires that num_heads be multiples or divisors of 16, but provided {n} number of heads.\n"
             "Try adjusting tensor_parallel_size value.")


def token_head_view(layout, T, N, L):
    """q/out views as attncheck lays them out (harness/ops/mla_inputs.h): contiguous, strided
    (head stride L + 40, token stride N (L + 40) + 24, element offset 3), transposed."""
    if layout == "contiguous":
        return aligned((T + 1, N, L), np.uint16)[:T]
    if layout == "strided":
        hs, ts = L + 40, N * (L + 40) + 24
        store = aligned((T * ts + 3 + 64,), np.uint16)
        return np.lib.stride_tricks.as_strided(store[3:], (T, N, L), (ts * 2, hs * 2, 2))
    return aligned((N, T + 1, L), np.uint16)[:, :T].transpose(1, 0, 2)


def common(T, N, Lk, Lv, P, nb, dtype, kv, layout, B, W, table_col_stride=1):
    cache_dt = np.uint8 if kv == "fp8" else np.uint16
    table = aligned((B, W * table_col_stride), np.int32)[:, ::table_col_stride]
    table[:] = np.arange(B * W, dtype=np.int32).reshape(B, W) % max(nb, 1)
    t = {
        "q": T_(token_head_view(layout, T, N, Lk), "q", dtype),
        "kv_cache": T_(aligned((nb, P, Lk), cache_dt), "kv_cache", "u8" if kv == "fp8" else dtype),
        "block_table": T_(table, "block_table"),
        "out": T_(token_head_view(layout, T, N, Lv), "out", dtype),
        "lse": T_(aligned((T, N + 3), np.float32)[:, :N], "lse"),
    }
    p = {"scale": 0.0417, "kv_scale": 0.19 if kv == "fp8" else 1.0, "kernel_block_size": P, "lv": Lv}
    if kv == "fp8":
        p["fp8_format"] = "e4m3fn"
    return t, p


def dense(
    B=2, s_q=2, N=16, Lk=576, Lv=512, P=64, dtype="bf16", kv="auto", layout="contiguous", qlens=None, seq=300, **kw
):
    qlens = qlens or [s_q] * B
    T = sum(qlens)
    W = -(-seq // P)
    nb = B * W
    t, p = common(T, N, Lk, Lv, P, nb, dtype, kv, layout, B, W, **kw)
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    t["seq_lens"] = T_(np.full(B, seq, np.int32), "seq_lens")
    t["query_start_loc"] = T_(qsl, "query_start_loc")
    p["max_seqlen_q"] = max(qlens)
    return t, p


def plan_dense(t, p):
    values = [ab.as_numpy(t[n]).tolist() for n in ("seq_lens", "query_start_loc", "block_table")]
    return flashmla.plan_dense(t, p, *values)


def sparse(T=3, N=16, Lk=576, Lv=512, P=64, dtype="bf16", kv="auto", layout="contiguous", K=64, B=2, W=3):
    nb = B * W
    t, p = common(T, N, Lk, Lv, P, nb, dtype, kv, layout, B, W)
    t["req_id_per_token"] = T_(np.arange(T, dtype=np.int32) % B, "req_id_per_token")
    t["topk_indices"] = T_(np.full((T, K), -1, np.int32), "topk_indices")
    return t, p


def plan_sparse(t, p):
    return flashmla.plan_sparse(t, p, ab.as_numpy(t["req_id_per_token"]).tolist())


# ------------------------------------------------------------------------------------------------
# mla_decode


def test_dense_plan_of_a_servable_case():
    t, p = dense(B=1, s_q=6, N=4, seq=65)
    plan = plan_dense(t, p)
    assert plan == {"B": 1, "s_q": 6, "T": 6, "N": 4, "Lk": 576, "Lv": 512, "scale": 0.0417}


def test_dense_takes_head_major_q():
    t, p = dense(layout="transposed")
    assert plan_dense(t, p)["s_q"] == 2


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"kv": "fp8"}, "takes 16-bit caches"),
        ({"Lk": 96, "Lv": 64}, "Lk 576 or 512 and Lv 512"),
        ({"P": 16}, "page_block_size 64"),
        ({"qlens": [1, 3]}, r"query lengths \[1, 3\]"),
        ({"layout": "strided"}, "16-byte boundary: FlashMLA loads q through TMA"),
        ({"table_col_stride": 2}, "unit column stride"),
    ],
)
def test_dense_declines_what_the_sm90_kernel_does_not_serve(kwargs, why):
    t, p = dense(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        plan_dense(t, p)


@pytest.mark.parametrize("N", [3, 5, 12, 24, 40])
def test_dense_asks_the_op_about_the_16_head_rule(invalid_case, N):
    """The op's reason (mla_inputs.h's invalid()); without a case (outside attncheck) the rule is
    not re-coded: FlashMLA gets the heads."""
    t, p = dense(N=N)
    assert plan_dense(t, p)["N"] == N
    invalid_case("mla_decode", MLA_HEADS.format(n=N))
    with pytest.raises(ab.Refuse) as refused:
        plan_dense(t, p)
    assert refused.value.why == MLA_HEADS.format(n=N)


def test_dense_refuses_invalid_metadata_and_parameters():
    t, p = dense()
    with pytest.raises(ab.Refuse, match="kv_scale 2.0 on a 16-bit cache"):
        plan_dense(t, dict(p, kv_scale=2.0))
    with pytest.raises(ab.Refuse, match="kernel_block_size 16 != cache block size 64"):
        plan_dense(t, dict(p, kernel_block_size=16))
    values = [ab.as_numpy(t[n]).tolist() for n in ("seq_lens", "query_start_loc", "block_table")]
    with pytest.raises(ab.Refuse, match="shorter than its 2 query tokens"):
        flashmla.plan_dense(t, p, [1, 300], values[1], values[2])
    with pytest.raises(ab.Refuse, match="without decreasing"):
        flashmla.plan_dense(t, p, values[0], [0, 3, 2], values[2])
    bad_table = [row[:] for row in values[2]]
    bad_table[1][0] = 999
    with pytest.raises(ab.Refuse, match="names block 999 outside the cache"):
        flashmla.plan_dense(t, p, values[0], values[1], bad_table)
    t["out"] = T_(aligned((4, 16, 512), np.uint16), "out", "f16")
    with pytest.raises(ab.Refuse, match="'out' is f16"):
        plan_dense(t, p)


# ------------------------------------------------------------------------------------------------
# sparse_mla


@pytest.mark.parametrize("N, Npad", [(1, 64), (16, 64), (48, 64), (64, 64), (80, 128), (128, 128)])
def test_sparse_plan_pads_heads_and_topk_as_vllm_feeds_the_kernel(N, Npad):
    t, p = sparse(N=N, K=64 if N != 128 else 2048)
    plan = plan_sparse(t, p)
    assert (plan["Npad"], plan["topk_pad"]) == (Npad, 128 if N != 128 else 2048)
    assert plan["nb"] * plan["P"] == 6 * 64


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"kv": "fp8"}, "656 B per token"),
        ({"dtype": "f16"}, "takes bf16 q and kv"),
        ({"Lk": 96, "Lv": 64}, "Lk 576 or 512 and Lv 512"),
        ({"N": 64, "layout": "strided"}, "loads q through TMA"),
    ],
)
def test_sparse_declines_what_the_kernel_does_not_serve(kwargs, why):
    t, p = sparse(**kwargs)
    with pytest.raises(ab.Unsupported, match=why):
        plan_sparse(t, p)


def test_sparse_pads_strided_q_instead_of_reading_it():
    t, p = sparse(N=16, layout="strided")  # padding copies q into a fresh buffer
    assert plan_sparse(t, p)["Npad"] == 64


def test_sparse_refuses_requests_outside_the_table_and_asks_the_op_about_heads(invalid_case):
    t, p = sparse()
    with pytest.raises(ab.Refuse, match="names request 5 outside"):
        flashmla.plan_sparse(t, p, [0, 1, 5])
    t, p = sparse(N=12)
    assert plan_sparse(t, p)["Npad"] == 64
    invalid_case("sparse_mla", MLA_HEADS.format(n=12))
    with pytest.raises(ab.Refuse) as refused:
        plan_sparse(t, p)
    assert refused.value.why == MLA_HEADS.format(n=12)


def test_convert_topk_follows_the_contract():
    P, W = 4, 3
    table = np.array([[7, 2, 5], [1, 0, 6]], np.int64)
    tok = np.array([[0, -1, 5, 11, 12], [-3, 9, 4, 1, 100]], np.int64)  # holes, past the table
    req = np.array([0, 1], np.int64)
    slots, valid = flashmla.convert_topk(np.where, tok, req, table, P, W)
    assert slots.tolist() == [[28, -1, 9, 23, -1], [-1, 25, 0, 5, -1]]
    assert valid.tolist() == [[True, False, True, True, False], [False, True, True, True, False]]


def test_padded_heads():
    assert [flashmla.padded_heads(n) for n in (1, 2, 8, 64, 65, 112, 128, 129)] == [64, 64, 64, 64, 128, 128, 128, None]


# ------------------------------------------------------------------------------------------------
# registration and the executor's declines


def test_entries_and_contracts():
    assert flashmla.ADAPTER.ops() == ["mla_decode", "sparse_mla"]
    for name in flashmla.ADAPTER.ops():
        assert flashmla.ADAPTER.contract_of(name) == "p-in-input-type"


def test_executor_declines_other_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch((10, 0)))
    t, p = dense()
    with pytest.raises(ab.Unsupported, match="sm_100: this adapter maps FlashMLA's sm_90a kernels"):
        flashmla.mla_decode(t, p)


def test_executor_declines_without_flash_mla(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", fake_torch((9, 0)))
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    monkeypatch.setattr(flashmla, "_flash_mla", None)
    monkeypatch.setenv("ATTNCHECK_FLASHMLA_SRC", str(tmp_path))
    t, p = sparse(N=64)
    with pytest.raises(ab.Unsupported, match="flash_mla not importable"):
        flashmla.sparse_mla(t, p)
