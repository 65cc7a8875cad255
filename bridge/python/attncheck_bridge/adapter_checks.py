"""Argument checks the adapters share (docs/ops/*.md "Refusals"): one place for each contract's
malformed-argument rules, so that two adapters of the same kernels (py:rocm_aiter and
py:aiter_triton, and their AITER plans and Triton entries) refuse the same cases with the same
words. Which configurations are *invalid* is the op's answer (``ab.refuse_if_invalid()``), never
re-coded here. Functions that need torch import it when called (the NumPy stand-in tests have none).
"""

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}


def param(p, name):
    if name not in p:
        raise Refuse(f"missing parameter '{name}'")
    return p[name]


def contiguous_1d(x):
    return x.ndim == 1 and x.is_contiguous()


def rows_of(x, width):
    """A 2-D view whose rows are ``width`` apart with a unit column stride (rows may be any count)."""
    return x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == 1) and (x.shape[0] <= 1 or x.strides[0] == width)


def fp8_format(p, what):
    fmt = p.get("fp8_format")
    if fmt not in ("e4m3fn", "e4m3fnuz"):
        raise Refuse(f"fp8_format must be e4m3fn or e4m3fnuz for {what}, got {fmt!r}")
    return fmt


def mla_common(t, p):
    """The argument checks docs/ops/mla_decode.md and sparse_mla.md share ("Refusals"; the head
    count is the op's answer, asked in plan()); returns the facts the plans need (AITER's declines
    come after the metadata checks, in _mla_declines)."""
    q, kv, out, lse, bt = (ab.arg(t, n) for n in ("q", "kv_cache", "out", "lse", "block_table"))
    ab.expect_ndim(q, 3)
    T, N, Lk = q.shape
    ab.expect_dtype(q, "bf16", "f16")
    if q.ndim == 3 and q.shape[2] > 1 and q.strides[2] != 1:
        raise Refuse("'q' must have a unit stride in its last dim")
    ab.expect_ndim(out, 3)
    ab.expect_dtype(out, q.dtype_name)
    ab.expect_ndim(lse, 2)
    ab.expect_dtype(lse, "f32")
    Lv = out.shape[2]
    if out.shape[:2] != (T, N) or lse.shape != (T, N):
        raise Refuse(f"out {out.shape} / lse {lse.shape} are not [T={T}, N={N}, Lv] / [T, N]")
    if Lk % 16 or Lv % 16 or Lv > Lk or Lk > 576 or Lv > 512:
        raise Refuse(f"Lk={Lk}, Lv={Lv}: both multiples of 16, Lv <= Lk, Lk <= 576, Lv <= 512")
    if int(p.get("lv", Lv)) != Lv:
        raise Refuse(f"lv={p.get('lv')} but out holds {Lv}")
    ab.expect_ndim(kv, 3)
    if kv.shape[2] != Lk or not kv.is_contiguous():
        raise Refuse(f"kv_cache {kv.shape} strides {kv.strides}: must be a contiguous [num_blocks, P, {Lk}]")
    if kv.ptr % 16:
        raise Refuse("kv_cache must be 16-byte aligned")
    P = kv.shape[1]
    if int(p.get("kernel_block_size", -1)) != P:
        raise Refuse(f"kernel_block_size {p.get('kernel_block_size')} is not the cache block size {P}")
    kv_scale = float(p.get("kv_scale", 1.0))
    fmt = None
    if kv.dtype_name == "u8":
        fmt = fp8_format(p, "an fp8 cache")
    elif kv.dtype_name == q.dtype_name:
        if kv_scale != 1.0:
            raise Refuse(f"kv_scale must be 1 for a 16-bit cache, got {kv_scale}")
    else:
        raise Refuse(f"kv_cache must be {q.dtype_name} or uint8 (fp8), got {kv.dtype_name}")
    ab.expect_dtype(bt, "i32")
    ab.expect_ndim(bt, 2)
    if "scale" not in p:
        raise Refuse("missing parameter scale (the softmax scale is never recomputed)")
    return dict(T=T, N=N, Lk=Lk, Lv=Lv, P=P, fmt=fmt, kv_scale=kv_scale, nb=kv.shape[0], scale=float(p["scale"]))


HEAD_DIM, TOKEN_BYTES = 128, 132


def indexer_cache(c):
    ab.expect_dtype(c, "u8")
    ab.expect_ndim(c, 3)
    nb, bs, tb = c.shape
    if tb != TOKEN_BYTES or c.strides[2] != 1 or c.strides[1] != TOKEN_BYTES:
        raise Refuse(f"'{c.name}' {c.shape} strides {c.strides}: pages of block_size x {TOKEN_BYTES} contiguous bytes")
    if nb > 1 and c.strides[0] < bs * TOKEN_BYTES:
        raise Refuse(f"page stride {c.strides[0]} is below {bs * TOKEN_BYTES}")
    return nb, bs


def packed_pages(c, who):
    nb, bs, _ = c.shape
    if nb > 1 and c.strides[0] != bs * TOKEN_BYTES:
        raise Unsupported(f"page stride {c.strides[0]} != {bs * TOKEN_BYTES}: {who} addresses pages as block * block_size * {TOKEN_BYTES}")


def indexer_logits_prefill_args(t, p):
    """The prefill logits' arguments as docs/ops/indexer.md defines them, checked once for both
    AITER adapters (this one and aiter_triton); Refuse otherwise. Returns the fp8 format, the
    tensors (q, k_fp8, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, logits) and the head count."""
    q, kf, ks, w, ks_, ke, logits = (ab.arg(t, n) for n in ("q", "k_fp8", "k_scale", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "logits"))
    fmt = fp8_format(p, "the indexer logits")
    for x in (q, kf):
        ab.expect_dtype(x, "u8")
    ab.expect_ndim(q, 3)
    M, H, D = q.shape
    N = kf.shape[0]
    if D != HEAD_DIM or kf.shape != (N, D) or ks.shape != (N,) or w.shape != (M, H) or logits.shape != (M, N):
        raise Refuse(f"q {q.shape}, k_fp8 {kf.shape}, k_scale {ks.shape}, weights {w.shape}, logits {logits.shape} disagree")
    if N > 1 and kf.strides[0] % 4:
        raise Refuse("k_fp8 rows must be 4-byte aligned")
    return fmt, (q, kf, ks, w, ks_, ke, logits), H


def indexer_logits_decode_args(t, p):
    """The paged decode logits' arguments as docs/ops/indexer.md defines them, checked once for
    both AITER adapters; Refuse otherwise. Returns the fp8 format, the tensors (q, kv_cache,
    weights, context_lens, block_table, logits), q's [B, next_n, H, D], the ChunkQ asked for (at
    most H) and the cache's (blocks, block size)."""
    q, cache, w, lens, table, logits = (ab.arg(t, n) for n in ("q", "kv_cache", "weights", "context_lens", "block_table", "logits"))
    fmt = fp8_format(p, "the indexer logits")
    ab.expect_dtype(q, "u8")
    ab.expect_ndim(q, 4)
    B, nn, H, D = q.shape
    chunk = min(int(p.get("chunk_q", 64)), H)
    nb, bs = indexer_cache(cache)
    if D != HEAD_DIM or w.shape != (B * nn, H) or lens.shape != (B,) or table.shape[0] != B or logits.ndim != 2 or logits.shape[0] != B * nn:
        raise Refuse(f"q {q.shape}, weights {w.shape}, context_lens {lens.shape}, block_table {table.shape}, logits {logits.shape} disagree")
    return fmt, (q, cache, w, lens, table, logits), (B, nn, H, D), chunk, (nb, bs)


def host(t, name):
    import torch

    return torch.from_dlpack(t[name]).cpu()


def mla_metadata(t, f):
    """Validated per-token metadata of a dense MLA case: (request of every token, causal kv length of
    every token, qlens). Refusals as docs/ops/mla_decode.md."""
    import torch

    sl, qsl = t["seq_lens"], t["query_start_loc"]
    for x in (sl, qsl):
        ab.expect_dtype(x, "i32")
        if x.ndim != 1 or not x.is_contiguous():
            raise Refuse(f"'{x.name}' must be a contiguous 1-D tensor")
    B = sl.shape[0]
    if qsl.shape[0] != B + 1 or t["block_table"].shape[0] != B:
        raise Refuse(f"seq_lens [{B}], query_start_loc {qsl.shape}, block_table {t['block_table'].shape} disagree")
    lens, starts, table = host(t, "seq_lens").long(), host(t, "query_start_loc").long(), host(t, "block_table")
    qlens = starts[1:] - starts[:-1]
    if starts[0] != 0 or starts[-1] != f["T"] or bool((qlens < 0).any()):
        raise Refuse(f"query_start_loc must run from 0 to T={f['T']} without decreasing")
    if bool((lens < qlens).any()):
        raise Refuse("a request's kv length is shorter than its query tokens")
    need = (lens + f["P"] - 1) // f["P"]
    if bool((need > table.shape[1]).any()):
        raise Refuse(f"the block table ({table.shape[1]} columns) is too narrow for a request")
    for r in range(B):
        used = table[r, : int(need[r])]
        if bool(((used < 0) | (used >= f["nb"])).any()):
            raise Refuse("the block table names a block outside the cache")
    req = torch.repeat_interleave(torch.arange(B), qlens)
    pos = torch.arange(f["T"]) - starts[req]  # local position i of every token
    causal = lens[req] - qlens[req] + pos + 1
    return req, causal, qlens


def num_kv_splits(p, max_len):
    s = int(p.get("num_kv_splits", 0) or 0)
    if s < 0 or s > 65535:
        raise Refuse(f"num_kv_splits = {s} outside [0, 65535]")
    return s or max(1, min(16, -(-int(max_len) // 256)))


def sparse_common(t, p):
    """Refusals of docs/ops/sparse_mla.md and the converted top-k: [T, topk] global slots, -1 where
    the contract's conversion gives -1 (triton_convert_req_index_to_global_index's rule)."""
    f = mla_common(t, p)
    req, topk = t["req_id_per_token"], t["topk_indices"]
    ab.expect_dtype(req, "i32")
    ab.expect_dtype(topk, "i32")
    if req.ndim != 1 or not req.is_contiguous() or req.shape[0] != f["T"]:
        raise Refuse(f"req_id_per_token must be a contiguous [T={f['T']}]")
    ab.expect_ndim(topk, 2)
    if topk.shape[0] != f["T"]:
        raise Refuse(f"topk_indices {topk.shape} is not [T={f['T']}, topk]")
    import torch

    table = host(t, "block_table").long()
    r = host(t, "req_id_per_token").long()
    if bool(((r < 0) | (r >= table.shape[0])).any()):
        raise Refuse("req_id_per_token names a request outside the block table")
    tok = host(t, "topk_indices").long()
    P, W = f["P"], table.shape[1]
    blk = torch.where(tok >= 0, tok // P, torch.full_like(tok, -1))
    ok = (tok >= 0) & (blk >= 0) & (blk < W)
    page = table[r.unsqueeze(1).expand_as(tok), blk.clamp(0, W - 1)]
    slots = torch.where(ok, page * P + tok % P, torch.full_like(tok, -1))
    if bool(((slots >= f["nb"] * P) | ((slots < 0) & (slots != -1))).any()):
        raise ValueError("a converted slot lies outside the cache (a block table entry names a missing block)")
    return f, r, tok.masked_fill(~ok, -1), slots


# ------------------------------------------------------------------------------------------------
# vLLM's Triton functions (py:vllm_triton): what their interfaces take.


def vllm_platform_fp8():
    """vLLM's fp8 cache dtype: e4m3fnuz on gfx94x (MI300), e4m3fn everywhere else."""
    import torch

    if torch.version.hip is not None:
        if torch.cuda.get_device_properties(0).gcnArchName.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def vllm_fp8_format(p, required):
    fmt = p.get("fp8_format")
    if required and fmt not in ("e4m3fn", "e4m3fnuz"):
        raise Refuse(f"fp8_format must be e4m3fn or e4m3fnuz, got {fmt!r}")
    return fmt


def vllm_expect_platform_fp8(fmt):
    """Unsupported unless ``fmt`` is the fp8 type vLLM's kernels use on this platform."""
    import torch

    want = vllm_platform_fp8()
    have = torch.float8_e4m3fnuz if fmt == "e4m3fnuz" else torch.float8_e4m3fn
    if have != want:
        raise Unsupported(f"fp8_format {fmt}: vLLM's fp8 dtype on this platform is {want}")


def rows_contiguous(x):
    """x's elements are one contiguous run in row-major order (sizes-1 dims aside)."""
    return x.numel <= 1 or x.is_contiguous()


def decode_attention_args(t, p):
    """The argument checks of docs/ops/decode_attention.md ("Refusals"); returns the pieces the
    call needs. Which configurations are invalid (heads not a multiple of kv_heads, is_mla with
    Lv >= Lk) the op answers: decode_attention asks it first."""
    names = ("q", "k_buffer", "v_buffer", "req_to_token", "b_seq_len", "o", "lse")
    q, kb, vb, table, lens, o, lse = (ab.arg(t, n) for n in names)
    S = int(param(p, "num_kv_splits"))
    P = int(param(p, "page_size"))
    sm_scale = float(param(p, "sm_scale"))
    cap = float(p.get("logit_cap", 0.0))
    k_scale, v_scale = float(p.get("k_scale", 1.0)), float(p.get("v_scale", 1.0))
    is_mla = bool(p.get("is_mla", False))

    ab.expect_dtype(q, "bf16", "f16")
    if o.dtype_name != q.dtype_name:
        raise Refuse(f"'o' is {o.dtype_name} but 'q' is {q.dtype_name}")
    fp8 = kb.dtype_name == "u8"
    fmt = vllm_fp8_format(p, required=True) if fp8 else None
    for c in (kb, vb):
        if c.dtype_name != ("u8" if fp8 else q.dtype_name):
            raise Refuse(f"'{c.name}' is {c.dtype_name}: the caches must be {q.dtype_name} or fp8 (u8)")
    if not fp8 and (k_scale != 1.0 or v_scale != 1.0):
        raise Refuse(f"k_scale {k_scale} / v_scale {v_scale} must be 1 on a 16-bit cache")
    ab.expect_dtype(lse, "f32")
    ab.expect_dtype(table, "i32")
    ab.expect_dtype(lens, "i32")
    for x, n in ((q, 3), (o, 3), (lse, 2), (table, 2), (lens, 1)):
        ab.expect_ndim(x, n)
    ab.expect_ndim(kb, 3, 4)
    if vb.ndim != kb.ndim:
        raise Refuse(f"'v_buffer' has {vb.ndim} dims, 'k_buffer' {kb.ndim}")
    for x in (q, o, kb, vb):
        if x.strides[-1] != 1:
            raise Refuse(f"'{x.name}' needs a unit last stride, got strides {x.strides}")
    B, Hq, Lk = q.shape
    Hkv, Lv = kb.shape[-2], vb.shape[-1]
    if kb.shape[-1] != Lk:
        raise Refuse(f"'k_buffer' head dim {kb.shape[-1]} is not q's {Lk}")
    if vb.shape[:-1] != kb.shape[:-1]:
        raise Refuse(f"'v_buffer' {vb.shape} and 'k_buffer' {kb.shape} differ before the head dim")
    cache_p = kb.shape[1] if kb.ndim == 4 else 1
    if P != cache_p:
        raise Refuse(f"page_size {P} is not the cache's {cache_p}")
    if o.shape != (B, Hq, Lv) or lse.shape != (B, Hq):
        raise Refuse(f"'o' {o.shape} / 'lse' {lse.shape} are not [B={B}, Hq={Hq}, Lv={Lv}] / [B, Hq]")
    if table.shape[0] != B or lens.shape != (B,):
        raise Refuse(f"'req_to_token' {table.shape} / 'b_seq_len' {lens.shape} do not have B={B} rows")
    if not 1 <= S <= 65535:
        raise Refuse(f"num_kv_splits must be in [1, 65535], got {S}")
    if is_mla:
        if vb.ptr != kb.ptr or vb.strides != kb.strides:
            raise Refuse("is_mla needs v_buffer == k_buffer[..., :Lv] (same pointer and strides)")
        if v_scale != k_scale:
            raise Refuse(f"is_mla needs v_scale == k_scale, got {v_scale} / {k_scale}")
    return dict(q=q, kb=kb, vb=vb, table=table, lens=lens, o=o, lse=lse, S=S, P=P, B=B, Hq=Hq, Lv=Lv,
                sm_scale=sm_scale, cap=cap, k_scale=k_scale, v_scale=v_scale, is_mla=is_mla, fmt=fmt)


def kv_gather_args(t, p):
    names = ("key_cache", "value_cache", "block_tables", "cu_seqlens_kv", "token_to_batch",
             "seq_starts", "k_scale", "v_scale", "key", "value")
    kc, vc, bt, cu, t2b, starts, ks, vs, key, value = (ab.arg(t, n) for n in names)
    layout = p.get("kv_cache_layout")
    if layout not in ("NHD", "SHUFFLE"):
        raise Refuse(f"kv_cache_layout must be NHD or SHUFFLE, got {layout!r}")
    dequant = bool(param(p, "dequant"))
    total = int(param(p, "total_tokens"))
    ab.expect_dtype(key, "bf16", "f16")
    if value.dtype_name != key.dtype_name:
        raise Refuse(f"'key' is {key.dtype_name} but 'value' is {value.dtype_name}")
    fmt = vllm_fp8_format(p, required=dequant)
    for c in (kc, vc):
        want = "u8" if dequant else key.dtype_name
        if c.dtype_name != want:
            raise Refuse(f"'{c.name}' is {c.dtype_name}, expected {want} (dequant={dequant})")
        ab.expect_ndim(c, 4 if layout == "NHD" else 5)
    for x in (bt, cu, t2b, starts):
        ab.expect_dtype(x, "i32")
    ab.expect_ndim(bt, 2)
    for x in (ks, vs):
        ab.expect_dtype(x, "f32")
    for x in (key, value):
        ab.expect_ndim(x, 3)
    Hkv, D = key.shape[1], key.shape[2]
    if layout == "NHD":
        nb, P = kc.shape[0], kc.shape[1]
        for c in (kc, vc):
            if c.shape != (nb, P, Hkv, D):
                raise Refuse(f"'{c.name}' {c.shape} is not [nb, P, Hkv={Hkv}, D={D}]")
    else:
        x = 16 // (1 if dequant else 2)
        nb, P = kc.shape[0], kc.shape[3]
        if kc.shape != (nb, Hkv, D // x, P, x) or vc.shape != (nb, Hkv, P // x, D, x):
            raise Refuse(
                f"SHUFFLE caches {kc.shape} / {vc.shape} are not [nb, Hkv, D/x, P, x] / "
                f"[nb, Hkv, P/x, D, x] with x = {x}"
            )
    if value.shape != key.shape or key.shape[0] < total:
        raise Refuse(f"'key' {key.shape} / 'value' {value.shape} cannot hold [{total}, Hkv, D]")
    return dict(kc=kc, vc=vc, bt=bt, cu=cu, t2b=t2b, starts=starts, ks=ks, vs=vs, key=key,
                value=value, layout=layout, dequant=dequant, total=total, fmt=fmt, nb=nb, P=P,
                Hkv=Hkv, D=D)


VLLM_INDEXER_HEAD_DIM, VLLM_INDEXER_TOKEN_BYTES = 128, 132  # fp8 values, then one fp32 scale


def indexer_cache_rows(cache):
    """The cache's dtype, rank and row width; its block size and page stride rules are the op's
    (asked by the entries before this)."""
    ab.expect_dtype(cache, "u8")
    ab.expect_ndim(cache, 3)
    nb, bs, width = cache.shape
    if width != VLLM_INDEXER_TOKEN_BYTES:
        raise Refuse(f"'kv_cache' rows are {width} bytes, expected {VLLM_INDEXER_TOKEN_BYTES} (128 fp8 + fp32 scale)")
    if cache.strides[1:] != (VLLM_INDEXER_TOKEN_BYTES, 1) or (nb > 1 and cache.strides[0] < bs * VLLM_INDEXER_TOKEN_BYTES):
        raise Unsupported(
            f"'kv_cache' strides {cache.strides}: the function views each page as one run of "
            f"block_size x {VLLM_INDEXER_TOKEN_BYTES} bytes"
        )
    return nb, bs
