"""numpy_reference against hand answers and straightforward loops; numpy_broken's bugs."""

import numpy as np
import pytest

import attncheck_bridge as ab
import numpy_broken
import numpy_reference as ref

T_ = ab.Tensor.from_numpy


# ------------------------------------------------------------------------------------------------
# page_indices


def page_problem(out_len=14, table_row_stride=5):
    """K = 4; requests of 5, 0, 9 tokens; the table [3, 3] has row stride 5 and -7 past each
    request's blocks; the output view is the first out_len of 17 slots poisoned with -1; one
    slot of padding on either side stands in for the harness's guards."""
    store = np.full(3 * table_row_stride, -7, dtype=np.int32)
    table = np.lib.stride_tricks.as_strided(store, (3, 3), (4 * table_row_stride, 4))
    table[0, :2] = [7, 2]
    table[2, :3] = [4, 0, 9]
    padded = np.full(19, -1, dtype=np.int32)
    t = {
        "block_table": T_(table, "block_table"),
        "seq_lens": T_(np.array([5, 0, 9], dtype=np.int32), "seq_lens"),
        "cu_seq_lens": T_(np.array([0, 5, 5, 14], dtype=np.int32), "cu_seq_lens"),
        "page_indices": T_(padded[1 : 1 + out_len], "page_indices"),
    }
    return t, {"kernel_block_size": 4}, store, padded


EXPECTED = [28, 29, 30, 31, 8, 16, 17, 18, 19, 0, 1, 2, 3, 36]


def test_page_indices_by_hand():
    t, p, store, padded = page_problem()
    ref.page_indices(t, p)
    assert padded[1:15].tolist() == EXPECTED
    assert padded[0] == -1 and padded[15:].tolist() == [-1] * 4


@pytest.mark.parametrize("K", [1, 3, 16])
def test_page_indices_matches_the_formula(K):
    rng = np.random.default_rng(K)
    lens = np.array([0, 1, K - 1, K, K + 1, 37], dtype=np.int32)
    W = int(-(-lens.max() // K)) + 2
    table = rng.permutation(1000)[: len(lens) * W].reshape(len(lens), W).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    out = np.full(int(cu[-1]), -1, dtype=np.int32)
    ref.page_indices({"block_table": T_(table, "block_table"), "seq_lens": T_(lens, "seq_lens"), "cu_seq_lens": T_(cu, "cu_seq_lens"), "page_indices": T_(out, "page_indices")}, {"kernel_block_size": K})
    want = [table[r, tok // K] * K + tok % K for r in range(len(lens)) for tok in range(lens[r])]
    assert out.tolist() == want


def test_page_indices_refusals_are_exactly_the_documented_ones():
    t, p, _, _ = page_problem()
    with pytest.raises(ab.Refuse, match="kernel_block_size"):
        ref.page_indices(t, {"kernel_block_size": 0})
    t2 = dict(t, seq_lens=T_(np.array([5, 0, 9], dtype=np.int64), "seq_lens"))
    with pytest.raises(ab.Refuse, match="seq_lens"):
        ref.page_indices(t2, p)
    strided = np.array([5, 99, 0, 99, 9], dtype=np.int32)[::2]
    with pytest.raises(ab.Refuse, match="contiguous"):
        ref.page_indices(dict(t, seq_lens=T_(strided, "seq_lens")), p)
    t3, p3, _, _ = page_problem(out_len=13)
    with pytest.raises(ab.Unsupported, match="holds 13 slots"):
        ref.page_indices(t3, p3)


def test_page_indices_refuses_a_slot_past_int32_before_writing_that_request():
    # K = 4: block 2^29 - 1 puts the last slot at 2^31 - 1 exactly; 2^29 is one block past it.
    t, p, store, padded = page_problem()
    store[10] = 2**29 - 1  # request 2's first block; its tokens 0..3 end at slot 2^31 - 1
    ref.page_indices(t, p)
    assert padded[6:10].tolist() == [2**31 - 4, 2**31 - 3, 2**31 - 2, 2**31 - 1]
    t, p, store, padded = page_problem()
    store[10] = 2**29
    # Outside attncheck (no case context) the adapter does not serve it ...
    with pytest.raises(ab.Unsupported, match="request 2: slots past int32"):
        ref.page_indices(t, p)
    assert padded[6:15].tolist() == [-1] * 9


def test_page_indices_asks_the_op_whether_the_case_is_invalid():
    # ... inside attncheck the op's own answer (the ABI's case_context) decides, before any write.
    t, p, store, padded = page_problem()
    reason = "request 2: block id 536870912 * 4 = 2147483648 is past the int32 slot range"
    ab._set_case({"op": "page_indices", "id": "page_indices/x", "params": {}, "invalid": reason,
                  "fields": []})
    try:
        assert ab.invalid() == reason
        assert ab.current_case()["op"] == "page_indices"
        with pytest.raises(ab.Refuse) as refused:
            ref.page_indices(t, p)
        assert refused.value.why == reason
        assert padded.tolist() == [-1] * len(padded)
        ab._set_case(dict(ab.current_case(), invalid=None))
        t, p, store, padded = page_problem()
        ref.page_indices(t, p)  # a valid case runs
        assert padded[1:15].tolist() == EXPECTED
    finally:
        ab._set_case(None)
    assert ab.invalid() is None


# ------------------------------------------------------------------------------------------------
# kv_gather: loops over the documented semantics


def bf16(x):
    return ab.f32_to_bf16_rne(np.asarray(x, dtype=np.float32))


def make_meta(lens, starts, P, rng, pad=2):
    B = len(lens)
    ctx = [s + n for s, n in zip(starts, lens)]
    W = max(1, max(-(-c // P) for c in ctx)) + 1
    nb = B * W
    table = np.full((B, W), -7, dtype=np.int32)
    perm = rng.permutation(nb).astype(np.int32)
    for b in range(B):
        nblk = -(-ctx[b] // P)
        table[b, :nblk] = perm[b * W : b * W + nblk]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    t2b = np.full(T + pad, B, dtype=np.int32)
    for b in range(B):
        t2b[cu[b] : cu[b + 1]] = b
    return table, cu, t2b, np.array(starts, dtype=np.int32), nb, T


def loop_gather(read, table, cu, t2b, starts, T, P, H, D):
    out = np.zeros((T, H, D), dtype=np.float64)
    for t in range(T):
        b = t2b[t]
        pos = t - cu[b] + starts[b]
        blk, s = table[b, pos // P], pos % P
        for h in range(H):
            for d in range(D):
                out[t, h, d] = read(blk, s, h, d)
    return out


@pytest.mark.parametrize("strides", ["contiguous", "hybrid", "padded"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_kv_gather_nhd(strides, dtype):
    rng = np.random.default_rng(1)
    P, H, D = 4, 2, 8
    table, cu, t2b, starts, nb, T = make_meta([3, 0, 6, 1], [0, 0, 2, 5], P, rng)
    Hsz = P * H * D
    vals = rng.standard_normal(4 * nb * Hsz + 64)
    raw = bf16(vals) if dtype == "bf16" else vals.astype(np.float16).view(np.uint16)
    if strides == "contiguous":
        st, k0, v0 = (Hsz, H * D, D, 1), 0, nb * Hsz
    elif strides == "hybrid":
        st, k0, v0 = (2 * Hsz, H * D, D, 1), 0, Hsz
    else:
        st = (Hsz + 3 * 8 + 8, (H * D + 8) + 8, D + 8, 1)
        k0, v0 = 0, nb * st[0]
    storage = raw[: max(k0, v0) + (nb - 1) * st[0] + (P - 1) * st[1] + (H - 1) * st[2] + D]
    kc = ab.Tensor("key_cache", storage.__array_interface__["data"][0], 2 * k0, (nb, P, H, D), st, ab.kDLBfloat if dtype == "bf16" else ab.kDLFloat, 16, owner=storage)
    vc = ab.Tensor("value_cache", storage.__array_interface__["data"][0], 2 * v0, (nb, P, H, D), st, kc.dl_code, 16, owner=storage)
    work = np.full((2, T + 3, H, D), 0x7FC1, dtype=np.uint16)
    before = storage.copy()
    t = {
        "key_cache": kc, "value_cache": vc,
        "block_tables": T_(table, "block_tables"), "cu_seqlens_kv": T_(cu, "cu_seqlens_kv"),
        "token_to_batch": T_(t2b, "token_to_batch"), "seq_starts": T_(starts, "seq_starts"),
        "k_scale": T_(np.ones(1, np.float32), "k_scale"), "v_scale": T_(np.ones(1, np.float32), "v_scale"),
        "key": T_(work[0, :T], "key", dtype), "value": T_(work[1, :T], "value", dtype),
    }
    ref.kv_gather(t, {"kv_cache_layout": "NHD", "dequant": False, "total_tokens": T})
    for which, base in ((0, k0), (1, v0)):
        want = loop_gather(lambda blk, s, h, d: storage[base + blk * st[0] + s * st[1] + h * st[2] + d], table, cu, t2b, starts, T, P, H, D)
        assert np.array_equal(work[which, :T], want.astype(np.uint16))
        assert (work[which, T:] == 0x7FC1).all()  # rows past total_tokens untouched
    assert np.array_equal(storage, before)


def shuffle_caches(nhd_k, nhd_v, x):
    """SHUFFLE tiles from NHD caches by the flat formulas of docs/ops/kv_gather.md."""
    nb, P, H, D = nhd_k.shape
    K = np.zeros((nb, H, D // x, P, x), dtype=nhd_k.dtype)
    V = np.zeros((nb, H, P // x, D, x), dtype=nhd_v.dtype)
    for blk in range(nb):
        for s in range(P):
            for h in range(H):
                for d in range(D):
                    K[blk, h, d // x, s, d % x] = nhd_k[blk, s, h, d]
                    V[blk, h, s // x, d, s % x] = nhd_v[blk, s, h, d]
    return K, V


@pytest.mark.parametrize("kv", ["model", "e4m3fn", "e4m3fnuz"])
def test_kv_gather_shuffle_equals_nhd_and_dequant_is_one_rounding(kv):
    rng = np.random.default_rng(2)
    fp8 = kv != "model"
    x = 16 if fp8 else 8
    P, H, D = 16, 2, 32
    table, cu, t2b, starts, nb, T = make_meta([5, 17, 0], [0, 3, 1], P, rng)
    if fp8:
        codes = rng.integers(0, 256, size=(2, nb, P, H, D)).astype(np.uint8)
        codes[codes == 0x7F] = 0x10
        codes[codes == 0xFF] = 0x10
        codes[codes == 0x80] = 0x11
        nk, nv = codes[0], codes[1]
        name = "u8"
    else:
        nk = bf16(rng.standard_normal((nb, P, H, D)))
        nv = bf16(rng.standard_normal((nb, P, H, D)))
        name = "bf16"
    sk, sv = shuffle_caches(nk, nv, x)
    params = {"dequant": fp8, "total_tokens": T}
    if fp8:
        params["fp8_format"] = kv
    scales = (np.array([0.0123], np.float32), np.array([1.7], np.float32))
    results = {}
    for layout, (K, V) in (("NHD", (nk, nv)), ("SHUFFLE", (sk, sv))):
        work = np.zeros((2, T, H, D), dtype=np.uint16)
        t = {
            "key_cache": T_(K, "key_cache", name), "value_cache": T_(V, "value_cache", name),
            "block_tables": T_(table, "block_tables"), "cu_seqlens_kv": T_(cu, "cu_seqlens_kv"),
            "token_to_batch": T_(t2b, "token_to_batch"), "seq_starts": T_(starts, "seq_starts"),
            "k_scale": T_(scales[0], "k_scale"), "v_scale": T_(scales[1], "v_scale"),
            "key": T_(work[0], "key", "bf16"), "value": T_(work[1], "value", "bf16"),
        }
        ref.kv_gather(t, dict(params, kv_cache_layout=layout))
        results[layout] = work
    assert np.array_equal(results["NHD"], results["SHUFFLE"])
    # Loop: value = float(code) * scale in fp32, rounded once to bf16.
    for which, cache, scale in ((0, nk, scales[0][0]), (1, nv, scales[1][0])):
        if fp8:
            dec = ab.fp8_to_f32(cache, kv)
            want = loop_gather(lambda blk, s, h, d: float(ab.bf16_to_f32(bf16(np.float32(dec[blk, s, h, d]) * scale))), table, cu, t2b, starts, T, P, H, D)
            got = ab.bf16_to_f32(results["NHD"][which]).astype(np.float64)
        else:
            want = loop_gather(lambda blk, s, h, d: cache[blk, s, h, d], table, cu, t2b, starts, T, P, H, D)
            got = results["NHD"][which]
        assert np.array_equal(got, want)


def test_kv_gather_refusals():
    rng = np.random.default_rng(3)
    table, cu, t2b, starts, nb, T = make_meta([2], [0], 4, rng)
    kc = np.zeros((nb, 4, 1, 8), dtype=np.uint16)
    work = np.zeros((2, T, 1, 8), dtype=np.uint16)
    base = {
        "key_cache": T_(kc, "key_cache", "bf16"), "value_cache": T_(kc, "value_cache", "bf16"),
        "block_tables": T_(table, "block_tables"), "cu_seqlens_kv": T_(cu, "cu_seqlens_kv"),
        "token_to_batch": T_(t2b, "token_to_batch"), "seq_starts": T_(starts, "seq_starts"),
        "k_scale": T_(np.ones(1, np.float32), "k_scale"), "v_scale": T_(np.ones(1, np.float32), "v_scale"),
        "key": T_(work[0], "key", "bf16"), "value": T_(work[1], "value", "bf16"),
    }
    p = {"kv_cache_layout": "NHD", "dequant": False, "total_tokens": T}
    ref.kv_gather(base, p)
    with pytest.raises(ab.Refuse, match="layout"):
        ref.kv_gather(base, dict(p, kv_cache_layout="HND"))
    with pytest.raises(ab.Refuse, match="f16"):  # cache dtype not the output's
        ref.kv_gather(dict(base, key_cache=T_(kc, "key_cache", "f16")), p)
    with pytest.raises(ab.Refuse, match="fp8_format"):
        ref.kv_gather(base, dict(p, dequant=True, fp8_format="e5m2"))
    with pytest.raises(ab.Refuse, match="rank|NHD"):
        ref.kv_gather(dict(base, key_cache=T_(kc[0], "key_cache", "bf16")), p)
    with pytest.raises(ab.Refuse, match="cannot hold"):
        ref.kv_gather(dict(base, key=T_(work[0, :, :, :4], "key", "bf16")), p)


# ------------------------------------------------------------------------------------------------
# rope: loops over the documented pairs, evaluated in float64 and rounded once


def rope_loop(x, positions, cache, neox):
    T, H, rot = x.shape
    y = x.copy()
    half = rot // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                c, s = cache[positions[t], i], cache[positions[t], half + i]
                ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a, b = x[t, h, ia], x[t, h, ib]
                y[t, h, ia] = a * c - b * s
                y[t, h, ib] = b * c + a * s
    return y


def rope_problem(neox, view, rng, T=5, H=3, hd=16, rot=8, dtype="bf16"):
    rows = 32
    theta = 10000.0 ** (-2.0 * np.arange(rot // 2) / rot)
    p = np.arange(rows)[:, None] * theta[None, :]
    cache = np.concatenate([np.cos(p), np.sin(p)], axis=1).astype(np.float32)
    enc = bf16 if dtype == "bf16" else (lambda v: np.asarray(v).astype(np.float16).view(np.uint16))
    qf = enc(rng.standard_normal((T, H, hd)))
    kf = enc(rng.standard_normal((T, hd)))
    lo = 0 if view == "front" else hd - rot
    positions = np.array([0, 1, 7, 31, 12][:T], dtype=np.int64)
    return qf, kf, lo, positions, cache


def decode(bits, dtype="bf16"):
    return ab.bf16_to_f32(bits).astype(np.float64) if dtype == "bf16" else bits.view(np.float16).astype(np.float64)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("view", ["front", "back"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_rope_inplace_and_out_of_place(neox, view, dtype):
    rng = np.random.default_rng(4)
    qf, kf, lo, positions, cache = rope_problem(neox, view, rng, dtype=dtype)
    rot = cache.shape[1]
    q0, k0 = qf.copy(), kf.copy()
    tq = T_(qf[:, :, lo : lo + rot], "q", dtype)
    tk = T_(kf[:, None, lo : lo + rot], "k", dtype)
    common = {"positions": T_(positions, "positions"), "cos_sin_cache": T_(cache, "cos_sin_cache")}
    # Out of place first: q/k untouched, outputs rotated.
    q_out = np.zeros((5, 3, rot), dtype=np.uint16)
    k_out = np.zeros((5, 1, rot), dtype=np.uint16)
    ref.rope_out_of_place(dict(common, q=tq, k=tk, q_out=T_(q_out, "q_out", dtype), k_out=T_(k_out, "k_out", dtype)), {"is_neox": neox})
    assert np.array_equal(qf, q0) and np.array_equal(kf, k0)
    for got, src in ((q_out, q0[:, :, lo : lo + rot]), (k_out, k0[:, None, lo : lo + rot])):
        want = rope_loop(decode(src, dtype), positions, cache.astype(np.float64), neox)
        g = decode(got, dtype)
        u = 2.0**-8 if dtype == "bf16" else 2.0**-11
        assert np.all(np.abs(g - want) <= u * np.abs(want) + 1e-30), np.max(np.abs(g - want))
        assert np.array_equal(g[0], decode(src, dtype)[0])  # position 0 is the identity
    # In place gives the same bits and leaves the other dims alone.
    ref.rope_inplace(dict(common, q=tq, k=tk), {"is_neox": neox})
    assert np.array_equal(qf[:, :, lo : lo + rot], q_out)
    assert np.array_equal(kf[:, None, lo : lo + rot], k_out)
    other = np.ones(qf.shape[-1], bool)
    other[lo : lo + rot] = False
    assert np.array_equal(qf[:, :, other], q0[:, :, other]) and np.array_equal(kf[:, other], k0[:, other])


def test_rope_rounds_once_from_double():
    # A value whose float32 rounding lands on a bf16 tie: double rounding would go the wrong way.
    y = np.array([1.0 + 2.0**-8 + 2.0**-30, 1.0 + 2.0**-8 - 2.0**-30, -(1.0 + 3 * 2.0**-8 + 2.0**-40)])
    assert ref._round_f64(y, "bf16").tolist() == [0x3F81, 0x3F80, 0xBF82]


def test_rope_refusals_and_unsupported():
    rng = np.random.default_rng(5)
    qf, kf, lo, positions, cache = rope_problem(True, "front", rng)
    t = {"positions": T_(positions, "positions"), "cos_sin_cache": T_(cache, "cos_sin_cache"), "q": T_(qf[:, :, :8], "q", "bf16"), "k": T_(kf[:, :8], "k", "bf16")}
    ref.rope_inplace(t, {"is_neox": True})  # [T, rot] k accepted
    with pytest.raises(ab.Refuse, match="views must be"):
        ref.rope_inplace(dict(t, q=T_(qf[:, :, :6], "q", "bf16")), {"is_neox": True})
    with pytest.raises(ab.Refuse, match="one dtype"):
        ref.rope_inplace(dict(t, k=T_(kf[:, :8], "k", "f16")), {"is_neox": True})
    with pytest.raises(ab.Refuse, match="positions"):
        ref.rope_inplace(dict(t, positions=T_(positions.astype(np.float32), "positions")), {"is_neox": True})
    odd = np.zeros((32, 7), np.float32)
    with pytest.raises(ab.Refuse, match="even"):
        ref.rope_inplace(dict(t, cos_sin_cache=T_(odd, "cos_sin_cache"), q=T_(qf[:, :, :7], "q", "bf16"), k=T_(kf[:, :7], "k", "bf16")), {"is_neox": True})
    with pytest.raises(ab.Unsupported, match="rows"):
        ref.rope_inplace(dict(t, positions=T_(np.array([0, 1, 2, 3, 99]), "positions")), {"is_neox": True})


# ------------------------------------------------------------------------------------------------
# numpy_broken: every bug does what its name says


def broken_page(monkeypatch, bug):
    monkeypatch.setenv("ATTNCHECK_BROKEN", f"page_indices={bug}")
    t, p, store, padded = page_problem()
    return t, p, store, padded


@pytest.mark.parametrize(
    "bug, check",
    [
        ("none", lambda padded, store, t: padded[1:15].tolist() == EXPECTED),
        ("wrong_element", lambda padded, store, t: padded[1:14].tolist() == EXPECTED[:-1] and padded[14] == EXPECTED[-1] + 1),
        ("unwritten", lambda padded, store, t: (padded[1:15] != EXPECTED).sum() == 1 and -1 in padded[1:15].tolist() and padded[15] == -1),
        ("guard_before", lambda padded, store, t: padded[0] == 0 and padded[1:15].tolist() == EXPECTED),
        ("past_view", lambda padded, store, t: padded[15] == -2 and padded[1:15].tolist() == EXPECTED),
        ("mutate_input", lambda padded, store, t: ab.as_numpy(t["seq_lens"])[0] == 4),
        ("ignore_stride", lambda padded, store, t: padded[1:15].tolist() != EXPECTED),
    ],
)
def test_broken_page_indices(monkeypatch, bug, check):
    t, p, store, padded = broken_page(monkeypatch, bug)
    numpy_broken.ADAPTER.get("page_indices")(t, p)
    assert check(padded, store, t), padded.tolist()


@pytest.mark.parametrize("bug, exc", [("raise", ValueError), ("refuse", ab.Refuse), ("unsupported", ab.Unsupported)])
def test_broken_exceptions(monkeypatch, bug, exc):
    t, p, _, padded = broken_page(monkeypatch, bug)
    with pytest.raises(exc):
        numpy_broken.ADAPTER.get("page_indices")(t, p)
    assert (padded == -1).all()


def test_broken_nondeterministic_flips_every_second_call(monkeypatch):
    monkeypatch.setenv("ATTNCHECK_BROKEN", "*=nondeterministic")
    numpy_broken._calls.clear()
    lasts = []
    for _ in range(4):
        t, p, _, padded = page_problem()
        numpy_broken.ADAPTER.get("page_indices")(t, p)
        lasts.append(int(padded[14]))
    assert lasts == [36, 37, 36, 37]


def test_broken_defaults_and_bad_spec(monkeypatch):
    monkeypatch.delenv("ATTNCHECK_BROKEN", raising=False)
    assert [numpy_broken.bug_for(e) for e in numpy_broken.ADAPTER.ops()] == ["wrong_element", "ignore_stride", "mutate_input", "unwritten", "undeclared_rounding"]
    monkeypatch.setenv("ATTNCHECK_BROKEN", "page_indices=teleport")
    with pytest.raises(ValueError, match="unknown bug"):
        numpy_broken.bug_for("page_indices")


# ------------------------------------------------------------------------------------------------
# decode_attention (docs/ops/decode_attention.md): a plain loop over the documented semantics, with
# each q.k product rounded to the input type (the contract the entry declares)


def round_to(x, dtype):
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return ab.bf16_to_f32(ab.f32_to_bf16_rne(x))
    return x.astype(np.float16).astype(np.float32)


def to_bits(values, dtype):
    if dtype == "bf16":
        return ab.f32_to_bf16_rne(np.asarray(values, dtype=np.float32))
    return np.asarray(values, dtype=np.float16).view(np.uint16)


def decode_problem(rng, dtype="bf16", fp8=None, mla=False, P=4, Hq=4, Hkv=2, Lk=16, Lv=8, lens=(1, 5, 9), cap=0.0):
    """Caches [pages, P, Hkv, D] (3-D when P = 1) with a permuted page table; o and lse views of
    NaN-filled storages one row wider (the harness's poison)."""
    B = len(lens)
    W = max(-(-L // P) for L in lens) + 1
    pages = B * W + 3
    table = (rng.permutation(pages)[: B * W].reshape(B, W)).astype(np.int32)
    shape = (pages, Hkv, Lk) if P == 1 else (pages, P, Hkv, Lk)
    vshape = shape[:-1] + (Lv,)

    def fp8_codes(shape):
        c = rng.integers(0, 256, size=shape).astype(np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x30  # no NaN codes: e4m3fn 0x7F/0xFF ...
        c[c == 0x80] = 0x31  # ... and e4m3fnuz 0x80
        return c

    if fp8:
        kbits, k_scale, v_scale, kdt = fp8_codes(shape), 0.03125 * 1.1, 0.03125 * 0.9, "u8"
    else:
        kbits, k_scale, v_scale, kdt = to_bits(rng.normal(size=shape), dtype), 1.0, 1.0, dtype
    if mla:
        v_scale, vview = k_scale, kbits[..., :Lv]  # V is K's latent prefix, same storage
    else:
        vview = fp8_codes(vshape) if fp8 else to_bits(rng.normal(size=vshape), dtype)
    qbits = to_bits(rng.normal(size=(B, Hq, Lk)) * 2, dtype)
    o_store = np.full((B + 1, Hq, Lv), 0x7FC0, dtype=np.uint16)
    lse_store = np.full((B + 1, Hq), np.nan, dtype=np.float32)
    t = {
        "q": T_(qbits, "q", dtype),
        "k_buffer": T_(kbits, "k_buffer", kdt),
        "v_buffer": T_(vview, "v_buffer", kdt),
        "req_to_token": T_(table, "req_to_token"),
        "b_seq_len": T_(np.array(lens, dtype=np.int32), "b_seq_len"),
        "o": T_(o_store[:B], "o", dtype),
        "lse": T_(lse_store[:B], "lse"),
    }
    p = {"num_kv_splits": 3, "sm_scale": float(np.float32(1 / np.sqrt(Lk))), "page_size": P, "logit_cap": cap, "k_scale": k_scale, "v_scale": v_scale, "is_mla": mla}
    if fp8:
        p["fp8_format"] = fp8
    return t, p, o_store, lse_store


def decode_loop(t, p, dtype, sm_scale_power=1):
    """Token by token, head by head: the documented semantics with rounded products."""
    fmt = p.get("fp8_format")
    val = (lambda a: ab.fp8_to_f32(a, fmt)) if fmt else (lambda a: ab.bf16_to_f32(a) if dtype == "bf16" else ab.f16_to_f32(a))
    q = ab.bf16_to_f32(ab.as_numpy(t["q"])) if dtype == "bf16" else ab.f16_to_f32(ab.as_numpy(t["q"]))
    K, V = ab.as_numpy(t["k_buffer"]), ab.as_numpy(t["v_buffer"])
    table, lens = ab.as_numpy(t["req_to_token"]), ab.as_numpy(t["b_seq_len"])
    P = p["page_size"]
    B, Hq, Lk = q.shape
    Hkv = K.shape[-2]
    o = np.zeros((B, Hq, V.shape[-1]))
    lse = np.zeros((B, Hq))
    for b in range(B):
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s, vs = [], []
            for n in range(int(lens[b])):
                page = table[b, n // P]
                krow = K[page, g] if P == 1 else K[page, n % P, g]
                vrow = V[page, g] if P == 1 else V[page, n % P, g]
                acc = np.float32(0)
                for i in range(Lk):
                    acc = np.float32(acc + round_to(q[b, h, i] * val(krow[i]), dtype))
                x = float(acc) * p["sm_scale"] ** sm_scale_power * p["k_scale"]
                if p["logit_cap"] > 0:
                    x = p["logit_cap"] * np.tanh(x / p["logit_cap"])
                s.append(x)
                vs.append(val(vrow).astype(np.float64) * p["v_scale"])
            s = np.array(s)
            w = np.exp(s - s.max())
            o[b, h] = (w[:, None] * np.array(vs)).sum(axis=0) / w.sum()
            lse[b, h] = s.max() + np.log(w.sum())
    return o, lse


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"dtype": "f16", "P": 1, "Hkv": 4},
        {"mla": True, "Hkv": 1, "Lv": 12},
        {"fp8": "e4m3fn", "cap": 5.0},
        {"fp8": "e4m3fnuz", "mla": True, "Hkv": 1},
    ],
)
def test_decode_attention_matches_the_loop_with_rounded_products(kw):
    dtype = kw.get("dtype", "bf16")
    t, p, o_store, lse_store = decode_problem(np.random.default_rng(7), **kw)
    ref.decode_attention(t, p)
    o_want, lse_want = decode_loop(t, p, dtype)
    got = ab.bf16_to_f32(o_store[:-1]) if dtype == "bf16" else ab.f16_to_f32(o_store[:-1])
    u = 2.0**-8 if dtype == "bf16" else 2.0**-11
    # o rounded once from float64; the loop's float32 sum runs in another order than NumPy's
    # pairwise sum (a few fp32 ulps of the scores), far below one output ulp.
    assert np.all(np.abs(got - o_want) <= u * np.abs(o_want) + 1e-4)
    np.testing.assert_allclose(lse_store[:-1], lse_want, rtol=1e-5, atol=1e-5)
    assert np.all(o_store[-1] == 0x7FC0) and np.isnan(lse_store[-1]).all()  # nothing past the views
    assert ref.ADAPTER.contract_of("decode_attention") == "qk-products-in-input-type"


def test_decode_attention_rounds_products_where_fp32_products_would_differ():
    """The rounding is real: exact products give another result (else the contract test would
    prove nothing)."""
    t, p, o_store, lse_store = decode_problem(np.random.default_rng(3), Lk=64)
    ref.decode_attention(t, p)
    q = ab.bf16_to_f32(ab.as_numpy(t["q"])).astype(np.float64)
    K = ab.bf16_to_f32(ab.as_numpy(t["k_buffer"])).astype(np.float64)
    b, n, table = 2, 8, ab.as_numpy(t["req_to_token"])
    exact = (q[b, 0] * K[table[b, n // 4], n % 4, 0]).sum()
    rounded = round_to(q[b, 0] * K[table[b, n // 4], n % 4, 0], "bf16").astype(np.float64).sum()
    assert exact != rounded


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t, p: t.update(q=T_(np.zeros((3, 4, 16), np.float32), "q")), "'q' must be bf16 or f16"),
        (lambda t, p: p.update(page_size=16), "page_size 16 differs"),
        (lambda t, p: p.update(num_kv_splits=0), "num_kv_splits must be in"),
        (lambda t, p: p.update(k_scale=2.0), "a 16-bit cache takes no scales"),
        (lambda t, p: p.update(is_mla=True), "is_mla: v_buffer must be k_buffer"),
    ],
)
def test_decode_attention_refusals(change, message):
    t, p, _, _ = decode_problem(np.random.default_rng(1))
    change(t, p)
    with pytest.raises(ab.Refuse, match=message):
        ref.decode_attention(t, p)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(Hq=3, Hkv=2), "heads 3 is not a multiple of kv_heads 2"),
        (dict(mla=True, Lk=16, Lv=16), "is_mla needs Lv < Lk (V is the latent prefix of K), got 16/16"),
    ],
)
def test_decode_attention_asks_the_op_whether_the_case_is_invalid(invalid_case, monkeypatch, kwargs, reason):
    """The op's reason (decode_attention.cpp's invalid()), before anything is written, also from
    numpy_broken's entry; the entries do not re-code the rules."""
    t, p, o_store, lse_store = decode_problem(np.random.default_rng(1), **kwargs)
    o_before, lse_before = o_store.copy(), lse_store.copy()
    invalid_case("decode_attention", reason)
    monkeypatch.setenv("ATTNCHECK_BROKEN", "decode_attention=wrong_scale")
    for entry in (ref.decode_attention, numpy_broken.ADAPTER.get("decode_attention")):
        with pytest.raises(ab.Refuse) as refused:
            entry(t, p)
        assert refused.value.why == reason
    assert np.array_equal(o_store, o_before)
    assert np.array_equal(lse_store, lse_before, equal_nan=True)


def test_decode_attention_without_a_case_declines_heads_it_cannot_group():
    """Outside attncheck (no case) a head count that does not group onto the kv heads is not
    refused by a re-coded rule: the entry declines what its head mapping cannot compute."""
    t, p, _, _ = decode_problem(np.random.default_rng(1), Hq=3, Hkv=2)
    with pytest.raises(ab.Unsupported, match="heads 3 do not form groups over kv_heads 2"):
        ref.decode_attention(t, p)


def test_broken_decode_attention(monkeypatch):
    t, p, o_store, _ = decode_problem(np.random.default_rng(5))
    monkeypatch.setenv("ATTNCHECK_BROKEN", "decode_attention=wrong_scale")
    numpy_broken.ADAPTER.get("decode_attention")(t, p)
    o_want, _ = decode_loop(t, p, "bf16", sm_scale_power=2)
    got = ab.bf16_to_f32(o_store[:-1])
    assert np.all(np.abs(got - o_want) <= 2.0**-8 * np.abs(o_want) + 1e-4)
    o_right, _ = decode_loop(t, p, "bf16")
    assert np.abs(got - o_right).max() > 0.05  # the bug shows
    monkeypatch.setenv("ATTNCHECK_BROKEN", "decode_attention=undeclared_rounding")
    numpy_broken.ADAPTER.get("decode_attention")(t, p)
    assert np.all(np.abs(ab.bf16_to_f32(o_store[:-1]) - o_right) <= 2.0**-8 * np.abs(o_right) + 1e-4)
    monkeypatch.setenv("ATTNCHECK_BROKEN", "page_indices=wrong_scale")
    with pytest.raises(ValueError, match="applies to decode_attention only"):
        numpy_broken.ADAPTER.get("page_indices")(*broken_page(monkeypatch, "wrong_scale")[:2])


def test_broken_decode_attention_declares_by_its_bug(monkeypatch):
    import importlib

    # The module as loaded under ctest: no ATTNCHECK_BROKEN, the default bug undeclared_rounding.
    monkeypatch.delenv("ATTNCHECK_BROKEN", raising=False)
    fresh = importlib.reload(numpy_broken)
    assert fresh.ADAPTER.contract_of("decode_attention") == "fp32-accumulate"
    monkeypatch.setenv("ATTNCHECK_BROKEN", "decode_attention=wrong_scale")
    assert importlib.reload(numpy_broken).ADAPTER.contract_of("decode_attention") == "qk-products-in-input-type"
    monkeypatch.setenv("ATTNCHECK_BROKEN", "*=none")
    assert importlib.reload(numpy_broken).ADAPTER.contract_of("decode_attention") == "qk-products-in-input-type"
    monkeypatch.delenv("ATTNCHECK_BROKEN")
    importlib.reload(numpy_broken)
