"""numpy_reference: a NumPy adapter for attncheck's Python bridge (device "cpu").

Written from the op contracts (docs/abi.md "page_indices: the worked example", docs/ops/kv_gather.md,
docs/ops/rope.md, docs/ops/decode_attention.md), not from reference/*.cpp. Which configurations are
invalid is the op's answer (attncheck_bridge.refuse_if_invalid(), docs/bridge.md "Validity"); the
entries refuse (attncheck_bridge.Refuse) arguments those documents call malformed and decline
(Unsupported) what they leave undefined.
Every output is written in place through the harness's strided views.

    attncheck run --tier smoke --op page_indices --kernels py:numpy_reference

decode_attention rounds each q.k product to the 16-bit input type and declares that arithmetic
contract ("qk-products-in-input-type"): attncheck judges it by the budgets derived for it when the
default ones fail, and says so in the verdict.
"""

import numpy as np

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported, as_numpy

# The exact ops evaluate in float64 and round once (stricter than the default contract); entries
# with contract-dependent arithmetic declare their own contract.
ADAPTER = ab.Adapter(name="numpy_reference", device="cpu")


_arg = ab.arg


def _contiguous_1d(x):
    return x.ndim == 1 and x.is_contiguous()


# ------------------------------------------------------------------------------------------------
# page_indices (docs/abi.md): page_indices[cu[r] + t] = block_table[r, t / K] * K + t % K


@ADAPTER.entry("page_indices", export=ab.Export(
    module="numpy_reference", function="page_indices_arrays", framework="numpy",
    args=["t['block_table']", "t['seq_lens']", "t['cu_seq_lens']", "t['page_indices']",
          "int(p['kernel_block_size'])"]))
def page_indices(t, p):
    table, lens, cu, out = (_arg(t, n) for n in ("block_table", "seq_lens", "cu_seq_lens", "page_indices"))
    # The op decides validity (slots past int32, ...): asked, not re-coded.
    ab.refuse_if_invalid()
    K = int(p.get("kernel_block_size", 0))
    if K < 1:
        raise Refuse(f"kernel_block_size must be >= 1, got {K}")
    for x in (table, lens, cu, out):
        ab.expect_dtype(x, "i32")
    if table.ndim != 2:
        raise Unsupported(f"'block_table' must be [B, W], got {table.ndim} dims")
    for x in (lens, cu, out):
        if not _contiguous_1d(x):
            raise Refuse(f"'{x.name}' must be a contiguous 1-D tensor (shape {x.shape}, strides {x.strides})")
    B = lens.shape[0]
    if table.shape[0] != B or cu.shape[0] != B + 1:
        raise Unsupported(f"block_table {table.shape}, seq_lens {lens.shape}, cu_seq_lens {cu.shape} disagree on B")
    page_indices_arrays(as_numpy(table), as_numpy(lens), as_numpy(cu), as_numpy(out), K)


def page_indices_arrays(tab, n, c, o, K):
    """page_indices on NumPy arrays: the entry's computation after its checks (and the function
    `attncheck repro --export pytest` calls)."""
    B = n.shape[0]
    total = int(n.astype(np.int64).sum())
    if o.shape[0] != total:
        raise Unsupported(f"'page_indices' holds {o.shape[0]} slots, the requests {total} tokens")
    for r in range(B):
        L = int(n[r])
        if L < 0:
            raise Unsupported(f"seq_lens[{r}] = {L} is negative")
        if L == 0:
            continue
        blocks = -(-L // K)
        if blocks > tab.shape[1]:
            raise Unsupported(f"request {r} needs {blocks} blocks, the table has {tab.shape[1]} columns")
        tok = np.arange(L, dtype=np.int64)
        row = tab[r, :blocks].astype(np.int64)  # never past the request's last block
        slots = row[tok // K] * K + tok % K
        if slots.max() > np.iinfo(np.int32).max:
            # Outside attncheck (no case context): the int32 slot would wrap into another page.
            raise Unsupported(f"request {r}: slots past int32 (the op refuses such tables)")
        base = int(c[r])
        o[base : base + L] = slots.astype(np.int32)


# ------------------------------------------------------------------------------------------------
# kv_gather (docs/ops/kv_gather.md)

_MODEL = ("bf16", "f16")


def _to_bits(values_f32_or_f64, dtype_name):
    """Round once (nearest even) to bf16/f16 bit patterns."""
    if dtype_name == "bf16":
        return ab.f32_to_bf16_rne(values_f32_or_f64.astype(np.float32))
    return values_f32_or_f64.astype(np.float16).view(np.uint16)


@ADAPTER.entry("kv_gather")
def kv_gather(t, p):
    ab.refuse_if_invalid()
    names = ("key_cache", "value_cache", "block_tables", "cu_seqlens_kv", "token_to_batch", "seq_starts", "k_scale", "v_scale", "key", "value")
    kc, vc, bt, cu, t2b, starts, ks, vs, key, value = (_arg(t, n) for n in names)
    layout = p.get("kv_cache_layout")
    if layout not in ("NHD", "SHUFFLE"):
        raise Refuse(f"unknown kv_cache_layout {layout!r} (NHD or SHUFFLE)")
    dequant = bool(p.get("dequant", False))
    T = int(p.get("total_tokens", -1))
    if T < 0:
        raise Unsupported("parameter total_tokens is missing or negative")

    for x in (bt, cu, t2b, starts):
        ab.expect_dtype(x, "i32")
    for x in (key, value):
        ab.expect_dtype(x, *_MODEL)
    if key.dtype_name != value.dtype_name:
        raise Refuse(f"'key' is {key.dtype_name} but 'value' is {value.dtype_name}")
    out_dtype = key.dtype_name
    if dequant:
        fmt = p.get("fp8_format")
        if fmt not in ("e4m3fn", "e4m3fnuz"):
            raise Refuse(f"unknown fp8_format {fmt!r} (e4m3fn or e4m3fnuz)")
        for x in (kc, vc):
            ab.expect_dtype(x, "u8")
        for x in (ks, vs):
            ab.expect_dtype(x, "f32")
            if x.numel < 1:
                raise Refuse(f"'{x.name}' must hold one f32 scale")
    else:
        for x in (kc, vc):
            ab.expect_dtype(x, *_MODEL)
            if x.dtype_name != out_dtype:
                raise Refuse(f"'{x.name}' is {x.dtype_name} without dequant but the output is {out_dtype}")

    K, V = as_numpy(kc), as_numpy(vc)
    if layout == "NHD":
        if K.ndim != 4 or V.ndim != 4:
            raise Refuse(f"NHD caches must be [nb, P, Hkv, D], got ranks {K.ndim} and {V.ndim}")
        if K.shape != V.shape:
            raise Unsupported(f"key_cache {K.shape} and value_cache {V.shape} differ")
        nb, P, H, D = K.shape
    else:
        if K.ndim != 5 or V.ndim != 5:
            raise Refuse(f"SHUFFLE caches must be 5-d, got ranks {K.ndim} and {V.ndim}")
        x = 16 // kc.itemsize
        if K.shape[4] != x or V.shape[4] != x:
            raise Refuse(f"SHUFFLE tile width must be 16 / element size = {x}, got key {K.shape[4]}, value {V.shape[4]}")
        nb, H, Dx, P, _ = K.shape
        D = Dx * x
        if V.shape != (nb, H, P // x, D, x) or P % x:
            raise Refuse(f"SHUFFLE K tiles {K.shape} and V tiles {V.shape} disagree")

    o_k, o_v = as_numpy(key), as_numpy(value)
    for name, o in (("key", o_k), ("value", o_v)):
        if o.ndim != 3 or o.shape[0] < T or o.shape[1:] != (H, D):
            raise Refuse(f"'{name}' {o.shape} cannot hold [total_tokens={T}, Hkv={H}, D={D}]")
        if o.strides[2] != o.itemsize:
            raise Refuse(f"'{name}' must have a unit last stride")
    if T == 0:
        return

    c, tb, st, tab = as_numpy(cu), as_numpy(t2b), as_numpy(starts), as_numpy(bt)
    if tb.shape[0] < T:
        raise Unsupported(f"token_to_batch has {tb.shape[0]} entries, total_tokens is {T}")
    tok = np.arange(T, dtype=np.int64)
    b = tb[:T].astype(np.int64)
    pos = tok - c[b].astype(np.int64) + st[b].astype(np.int64)
    if (pos < 0).any():
        raise Unsupported("a token position inside its request is negative")
    blk = tab[b, pos // P].astype(np.int64)
    s = pos % P
    if (blk < 0).any() or (blk >= nb).any():
        raise Unsupported("a block table entry the tokens need is outside the cache")

    if layout == "NHD":
        gk, gv = K[blk, s], V[blk, s]  # [T, H, D], read through the views' strides
    else:
        gk = K[blk, :, :, s, :].reshape(T, H, D)  # (blk, h, d/x, s, d%x)
        gv = V[blk, :, s // x, :, s % x]  # (blk, h, s/x, d, s%x) -> [T, H, D]

    if dequant:
        k_scale = np.float32(as_numpy(ks).reshape(-1)[0])
        v_scale = np.float32(as_numpy(vs).reshape(-1)[0])
        fk = ab.fp8_to_f32(gk, fmt) * k_scale  # one fp32 product
        fv = ab.fp8_to_f32(gv, fmt) * v_scale
        o_k[:T] = _to_bits(fk, out_dtype)
        o_v[:T] = _to_bits(fv, out_dtype)
    else:
        o_k[:T] = gk
        o_v[:T] = gv


# ------------------------------------------------------------------------------------------------
# rope (docs/ops/rope.md): entries rope_inplace and rope_out_of_place


def _decode(x, dtype_name):
    """Values of a view as float64 (exact for bf16/f16/f32)."""
    if dtype_name == "bf16":
        return ab.bf16_to_f32(x).astype(np.float64)
    if dtype_name == "f16":
        return x.view(np.float16).astype(np.float64)
    return x.astype(np.float64)


def _rope_prepare(t, p, out_names):
    ab.refuse_if_invalid()
    pos_t, cache_t, q_t, k_t = (_arg(t, n) for n in ("positions", "cos_sin_cache", "q", "k"))
    if "is_neox" not in p:
        raise Unsupported("parameter is_neox is missing")
    neox = bool(p["is_neox"])
    if pos_t.ndim != 1 or pos_t.dtype_name not in ("i32", "i64"):
        raise Refuse(f"'positions' must be 1-d int32/int64, got {pos_t.dtype_name} with {pos_t.ndim} dims")
    if q_t.dtype_name not in _MODEL or k_t.dtype_name not in _MODEL or q_t.dtype_name != k_t.dtype_name:
        raise Refuse(f"q and k must be bf16/f16 of one dtype, got {q_t.dtype_name} and {k_t.dtype_name}")
    ab.expect_dtype(cache_t, "f32", "bf16", "f16")
    if cache_t.ndim != 2:
        raise Refuse(f"'cos_sin_cache' must be [max_pos, rot], got {cache_t.ndim} dims")
    rot = cache_t.shape[1]
    T = pos_t.shape[0]
    k_shape_ok = k_t.shape in ((T, 1, rot), (T, rot))
    if q_t.ndim != 3 or q_t.shape[0] != T or q_t.shape[2] != rot or not k_shape_ok:
        raise Refuse(f"rope: views must be [T={T}, H, rot={rot}] and agree (q {q_t.shape}, k {k_t.shape})")
    if rot % 2:
        raise Refuse(f"rope: rot must be even, got {rot}")
    outs = []
    for name, src in zip(out_names, (q_t, k_t)):
        o = _arg(t, name)
        if o.dtype_name != src.dtype_name or o.shape != src.shape:
            raise Refuse(f"'{name}' must be {src.dtype_name} {src.shape}, got {o.dtype_name} {o.shape}")
        outs.append(o)
    positions = as_numpy(pos_t).astype(np.int64)
    if T and ((positions < 0).any() or (positions >= cache_t.shape[0]).any()):
        raise Unsupported(
            f"positions outside the cache's {cache_t.shape[0]} rows (docs/ops/rope.md does not define them)"
        )
    cache = _decode(as_numpy(cache_t), cache_t.dtype_name)
    cos = cache[positions, : rot // 2]  # [T, rot/2]
    sin = cache[positions, rot // 2 :]
    return neox, rot, cos, sin, (q_t, k_t), outs


def rope_out_of_place_arrays(positions, cos_sin_cache, q, k, q_out, k_out, neox, dtype_name,
                             cache_dtype_name):
    """rope_out_of_place on NumPy arrays (16-bit floats as uint16 bits): the entry's computation
    after its checks (and the function `attncheck repro --export pytest` calls)."""
    rot = cos_sin_cache.shape[1]
    cache = _decode(cos_sin_cache, cache_dtype_name)
    pos = positions.astype(np.int64)
    cos, sin = cache[pos, : rot // 2], cache[pos, rot // 2 :]
    for src, dst in ((q, q_out), (k, k_out)):
        _rotate_arrays(src, dst, dtype_name, neox, rot, cos, sin)


def _rotate(src_t, dst_t, neox, rot, cos, sin):
    _rotate_arrays(as_numpy(src_t), as_numpy(dst_t), src_t.dtype_name, neox, rot, cos, sin)


def _rotate_arrays(src, dst, dtype_name, neox, rot, cos, sin):
    x = _decode(src, dtype_name).reshape(src.shape[0], -1, rot)  # [T, H, rot]
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x[..., : rot // 2], x[..., rot // 2 :]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    a2 = a * c - b * s
    b2 = b * c + a * s
    y = np.empty_like(x)
    if neox:
        y[..., : rot // 2], y[..., rot // 2 :] = a2, b2
    else:
        y[..., 0::2], y[..., 1::2] = a2, b2
    # One rounding from float64 to the tensor dtype, written through the destination's strides.
    dst[...] = _round_f64(y, dtype_name).reshape(dst.shape)


def _round_f64(y, dtype_name):
    """float64 -> bf16/f16 bit patterns in one round-to-nearest-even."""
    if dtype_name == "f16":
        return y.astype(np.float16).view(np.uint16)  # NumPy converts double -> half directly
    # bf16: round to odd into float32 first (truncate toward zero, set the last bit when inexact);
    # float32 keeps 16 more bits than bf16, so the final nearest-even rounding is exact.
    f = y.astype(np.float32)
    bits = f.view(np.uint32).copy()
    inexact = np.isfinite(f) & (f.astype(np.float64) != y)
    bits = np.where(inexact & (np.abs(f.astype(np.float64)) > np.abs(y)), bits - np.uint32(1), bits)
    bits = np.where(inexact, bits | np.uint32(1), bits).astype(np.uint32)
    return ab.f32_to_bf16_rne(bits.view(np.float32))


@ADAPTER.entry("rope_inplace")
def rope_inplace(t, p):
    neox, rot, cos, sin, (q, k), _ = _rope_prepare(t, p, ())
    _rotate(q, q, neox, rot, cos, sin)
    _rotate(k, k, neox, rot, cos, sin)


@ADAPTER.entry("rope_out_of_place", export=ab.Export(
    module="numpy_reference", function="rope_out_of_place_arrays", framework="numpy",
    args=["t['positions']", "t['cos_sin_cache']", "t['q']", "t['k']", "t['q_out']", "t['k_out']",
          "bool(p['is_neox'])", "ARGS['q']['dtype']", "ARGS['cos_sin_cache']['dtype']"]))
def rope_out_of_place(t, p):
    neox, rot, cos, sin, (q, k), (q_out, k_out) = _rope_prepare(t, p, ("q_out", "k_out"))
    _rotate(q, q_out, neox, rot, cos, sin)
    _rotate(k, k_out, neox, rot, cos, sin)


# ------------------------------------------------------------------------------------------------
# decode_attention (docs/ops/decode_attention.md, "Semantics" and "Kernel contract"), computed the
# way a kernel with bf16/f16 products does: each q.k product rounded to the 16-bit input type, the
# rounded products summed in float32. That is not the default arithmetic contract, so the entry
# declares it (docs/verification.md "Arithmetic contracts"); the softmax, P.V and the merge run in
# float64 (no splits: any split count gives the same result), o is rounded once to q's dtype.

_TOKEN_CHUNK = 256  # tokens per product block: [Hq, chunk, Lk] float32 stays small


def _decode_values(a, dtype_name, fp8_format):
    """Values of raw elements as float32 (exact: 16-bit floats and fp8 codes widen exactly)."""
    if dtype_name == "u8":
        return ab.fp8_to_f32(a, fp8_format)
    if dtype_name == "bf16":
        return ab.bf16_to_f32(a)
    return ab.f16_to_f32(a)


def _round_products(prod_f32, dtype_name):
    """Each product (exact in float32: 16-bit x 16-bit or x fp8) rounded once to the input type."""
    if dtype_name == "bf16":
        return ab.bf16_to_f32(ab.f32_to_bf16_rne(prod_f32))
    return prod_f32.astype(np.float16).astype(np.float32)


def _decode_attention_arguments(t, p):
    """The validated views and parameters. The op decides validity (heads not a multiple of
    kv_heads, is_mla with Lv >= Lk): asked, not re-coded; Refuse here is argument validation."""
    ab.refuse_if_invalid()
    names = ("q", "k_buffer", "v_buffer", "req_to_token", "b_seq_len", "o", "lse")
    q, k, v, table, lens, o, lse = (_arg(t, n) for n in names)
    ab.expect_dtype(q, *_MODEL)
    ab.expect_dtype(o, q.dtype_name)
    ab.expect_dtype(lse, "f32")
    ab.expect_dtype(table, "i32")
    ab.expect_dtype(lens, "i32")
    fp8 = k.dtype_name == "u8"
    fmt = p.get("fp8_format")
    if fp8 and fmt not in ("e4m3fn", "e4m3fnuz"):
        raise Refuse(f"uint8 caches need fp8_format e4m3fn or e4m3fnuz, got {fmt!r}")
    if not fp8:
        ab.expect_dtype(k, q.dtype_name)
    ab.expect_dtype(v, k.dtype_name)
    ab.expect_ndim(q, 3)
    ab.expect_ndim(o, 3)
    ab.expect_ndim(lse, 2)
    ab.expect_ndim(k, 3, 4)
    ab.expect_ndim(v, k.ndim)
    ab.expect_ndim(table, 2)
    ab.expect_ndim(lens, 1)
    for x in (q, k, v, o):
        if x.strides[-1] != 1:
            raise Refuse(f"'{x.name}' must have a unit last stride, got strides {x.strides}")
    B, Hq, Lk = q.shape
    P = 1 if k.ndim == 3 else k.shape[1]
    Hkv, Lv = k.shape[-2], v.shape[-1]
    if int(p.get("page_size", -1)) != P:
        raise Refuse(f"page_size {p.get('page_size')} differs from the cache's page size {P}")
    if Hkv < 1 or Hq % Hkv:
        # Outside attncheck (no case context): head h reads kv head h // (Hq / Hkv), undefined here.
        raise Unsupported(f"heads {Hq} do not form groups over kv_heads {Hkv} (the op refuses such cases)")
    if k.shape[-1] != Lk or v.shape[:-1] != k.shape[:-1]:
        raise Refuse(f"k_buffer {k.shape} and v_buffer {v.shape} do not fit q {q.shape}")
    if o.shape != (B, Hq, Lv) or lse.shape != (B, Hq) or table.shape[0] != B or lens.shape != (B,):
        raise Refuse(f"o {o.shape}, lse {lse.shape}, req_to_token {table.shape}, b_seq_len {lens.shape} disagree with q {q.shape}")
    S = int(p.get("num_kv_splits", 0))
    if not 1 <= S <= 65535:
        raise Refuse(f"num_kv_splits must be in [1, 65535], got {S}")
    k_scale, v_scale = float(p.get("k_scale", 1.0)), float(p.get("v_scale", 1.0))
    if not fp8 and (k_scale != 1.0 or v_scale != 1.0):
        raise Refuse(f"a 16-bit cache takes no scales, got k_scale {k_scale}, v_scale {v_scale}")
    if bool(p.get("is_mla", False)):
        if v.ptr != k.ptr or v.strides != k.strides:
            raise Refuse("is_mla: v_buffer must be k_buffer[..., :Lv] (same pointer and strides)")
        if v_scale != k_scale:
            raise Refuse(f"is_mla: v_scale {v_scale} must equal k_scale {k_scale}")
    if Lv > 1024:
        raise Refuse(f"Lv {Lv} > 1024")
    return q, k, v, table, lens, o, lse, P, fmt, k_scale, v_scale


def _decode_attention(t, p, sm_scale_power=1):
    """decode_attention with products rounded to the input type. sm_scale_power 2 is
    numpy_broken's wrong_scale bug (the scale applied twice)."""
    q, k, v, table, lens, o, lse, P, fmt, k_scale, v_scale = _decode_attention_arguments(t, p)
    B, Hq, Lk = q.shape
    Hkv, G = k.shape[-2], q.shape[1] // k.shape[-2]
    sm_scale = float(p["sm_scale"]) ** sm_scale_power
    cap = float(p.get("logit_cap", 0.0))
    qv = _decode_values(as_numpy(q), q.dtype_name, fmt)  # [B, Hq, Lk]
    kc, vc = as_numpy(k), as_numpy(v)
    tab, n = as_numpy(table), as_numpy(lens)
    o_out, lse_out = as_numpy(o), as_numpy(lse)
    kv_head = np.arange(Hq) // G
    for b in range(B):
        L = int(n[b])
        if L < 1 or -(-L // P) > tab.shape[1]:
            raise Unsupported(f"request {b}: length {L} (the op defines 1 .. {tab.shape[1] * P})")
        tok = np.arange(L)
        pages = tab[b, tok // P].astype(np.int64)
        if (pages < 0).any() or (pages >= kc.shape[0]).any():
            raise Unsupported(f"request {b} reads a page outside the cache")
        rows_k = kc[pages] if P == 1 else kc[pages, tok % P]  # [L, Hkv, Lk] codes or bits
        rows_v = vc[pages] if P == 1 else vc[pages, tok % P]  # [L, Hkv, Lv]
        kf = _decode_values(rows_k, k.dtype_name, fmt)
        dots = np.empty((Hq, L), dtype=np.float32)
        for c0 in range(0, L, _TOKEN_CHUNK):
            kk = kf[c0 : c0 + _TOKEN_CHUNK][:, kv_head, :].transpose(1, 0, 2)  # [Hq, chunk, Lk]
            prod = qv[b][:, None, :] * kk  # exact in float32
            dots[:, c0 : c0 + _TOKEN_CHUNK] = _round_products(prod, q.dtype_name).sum(axis=-1, dtype=np.float32)
        s = dots.astype(np.float64) * sm_scale * k_scale
        if cap > 0:
            s = cap * np.tanh(s / cap)
        m = s.max(axis=1, keepdims=True)
        w = np.exp(s - m)  # [Hq, L]
        l = w.sum(axis=1, keepdims=True)
        vf = _decode_values(rows_v, v.dtype_name, fmt).astype(np.float64)  # [L, Hkv, Lv]
        out = np.empty((Hq, vf.shape[2]))
        for g in range(Hkv):
            heads = slice(g * G, (g + 1) * G)
            out[heads] = w[heads] @ vf[:, g, :]
        o_out[b] = _round_f64(v_scale * out / l, o.dtype_name)
        lse_out[b] = (m + np.log(l))[:, 0].astype(np.float32)


# Bitwise invariance (docs/verification.md "Invariance"): each request is computed on its own
# (the loop over b above, shapes of that request only), num_kv_splits is checked but never used,
# and page ids only gather the rows, in token order.
@ADAPTER.entry(
    "decode_attention",
    contract="qk-products-in-input-type",
    properties=("batch-invariant", "split-invariant", "page-order-invariant"),
)
def decode_attention(t, p):
    _decode_attention(t, p)
