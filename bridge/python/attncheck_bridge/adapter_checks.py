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
