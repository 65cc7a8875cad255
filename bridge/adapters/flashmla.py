"""flashmla: FlashMLA's SM90 MLA kernels, judged by attncheck (device "cuda").

    attncheck run --tier quick --op mla_decode --op sparse_mla --kernels py:flashmla

Entries (docs/ops/mla_decode.md, docs/ops/sparse_mla.md, docs/adapters/deepgemm_flashmla.md):

- ``mla_decode`` -> ``flash_mla.get_mla_metadata()`` + ``flash_mla.flash_mla_with_kvcache(q, k_cache,
  block_table, cache_seqlens, 512, meta, softmax_scale=scale, causal=True)``: the dense split-KV
  decode kernel. q ``[T, N, Lk]`` is handed over as the view ``[B, qlen, N, Lk]`` (strides kept),
  the cache as ``[num_blocks, 64, 1, Lk]``. FlashMLA returns new ``out [B, qlen, N, 512]`` and
  ``lse [B, N, qlen]`` (natural log) tensors; the adapter copies them into the harness's views.
- ``sparse_mla`` -> ``flash_mla.flash_mla_sparse_fwd(q, kv, indices, scale, d_v=512)``: the sparse
  kernel vLLM's FLASHMLA_SPARSE backend runs on a bf16 cache, fed the way that backend feeds it:
  request-local top-k positions converted to flat cache rows (``block_table[r, tok // P] * P +
  tok % P``, -1 where invalid), the cache viewed as ``[num_blocks * P, 1, Lk]``, top-k padded
  with -1 to a multiple of 128 and heads padded to 64 or 128 (zero queries, sliced off after).
  FlashMLA reports a row with no valid index as ``lse = +inf`` (out 0); the op's contract is
  ``-inf`` (the identity of the LSE merge), so exactly those rows' +inf is written as -inf.
  FlashMLA's sparse *decode* path (``flash_mla_with_kvcache`` with ``indices``) reads only its own
  fp8 cache format (656 bytes per token: 512 fp8 values, 4 fp32 scales, 64 bf16 RoPE values),
  which no attncheck case holds: fp8 cases are declined with that reason.

Everything else the kernels do not serve is declined (``Unsupported``): fp8 caches in mla_decode
(SM90 dense decode is 16-bit only), f16 in sparse_mla, head dims other than 576/512 and 512, page
sizes other than 64 (dense), ragged query lengths (dense), block tables with a column stride,
TMA-misaligned q views, more than 128 heads (sparse), devices other than sm_90. Configurations the
op calls invalid (the 16-head rule) are the op's answer, asked first (``ab.refuse_if_invalid()``,
docs/bridge.md "Validity") and refused with its reason; malformed arguments (dtypes, shapes,
metadata) are refused (``Refuse``) with theirs.

The mapping (``plan_dense``, ``plan_sparse``, ``convert_topk``, ``padded_heads``) is plain
Python/NumPy and runs without torch; only ``_execute_*`` import torch and ``flash_mla``, which
comes from ``ATTNCHECK_FLASHMLA_SRC`` (an in-place build, put first on ``sys.path``) or an
installed package.
"""


import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported

ADAPTER = ab.Adapter(name="flashmla", device="cuda", contract="p-in-input-type")

HEAD_DIMS_K = (576, 512)  # csrc/api/dense_decode.h, sparse_fwd.h: head_size_k 576 or 512
HEAD_DIM_V = 512  # both: head_size_v / d_v 512
PAGE_SIZE = 64  # dense_decode.h: page_block_size must be 64
SPARSE_HEADS = (64, 128)  # sparse_fwd.h: h_q 64 or 128 on SM90
TOPK_MULTIPLE = 128  # sm90/prefill/sparse/phase1.cuh: topk % (2 * B_TOPK) == 0
TMA_ALIGN = 16
_ITEM = {"bf16": 2, "f16": 2}

_flash_mla = None


_arg = ab.arg


def _common(t, p):
    """Argument checks shared by both entries, after asking the op whether the case is invalid
    (the 16-head rule); returns (T, N, Lk, Lv, nb, P, cache_is_fp8)."""
    ab.refuse_if_invalid()
    q, cache, table, out, lse = (_arg(t, n) for n in ("q", "kv_cache", "block_table", "out", "lse"))
    ab.expect_dtype(q, "bf16", "f16")
    ab.expect_ndim(q, 3)
    T, N, Lk = q.shape
    Lv = int(p.get("lv", -1))
    if Lk % 16 or Lv % 16 or Lv < 16 or Lv > Lk or Lk > 576 or Lv > 512:
        raise Refuse(f"head dims Lk {Lk}, Lv {Lv}: need multiples of 16, Lv <= Lk <= 576, Lv <= 512")
    if out.dtype_name != q.dtype_name:
        raise Refuse(f"'out' is {out.dtype_name}, q is {q.dtype_name}")
    ab.expect_dtype(lse, "f32")
    if out.shape != (T, N, Lv) or lse.shape != (T, N):
        raise Refuse(f"out {list(out.shape)} / lse {list(lse.shape)}: expected [{T}, {N}, {Lv}] / [{T}, {N}]")
    for x in (q, out):
        if x.strides[2] != 1:
            raise Refuse(f"'{x.name}' needs a unit stride in its last dim, strides {x.strides}")
    ab.expect_ndim(cache, 3)
    nb, P, width = cache.shape
    if width != Lk:
        raise Refuse(f"'kv_cache' rows hold {width} elements, q {Lk}")
    fp8 = cache.dtype_name == "u8"
    if not fp8 and cache.dtype_name != q.dtype_name:
        raise Refuse(f"'kv_cache' is {cache.dtype_name}: expected {q.dtype_name} or u8 (fp8)")
    if not cache.is_contiguous() or cache.ptr % 16:
        raise Refuse(f"'kv_cache' strides {cache.strides}: must be contiguous in its last three dims, 16-byte aligned")
    if int(p.get("kernel_block_size", -1)) != P:
        raise Refuse(f"kernel_block_size {p.get('kernel_block_size')} != cache block size {P}")
    kv_scale = float(p.get("kv_scale", 1.0))
    if fp8:
        if p.get("fp8_format") not in ("e4m3fn", "e4m3fnuz"):
            raise Refuse(f"fp8_format must be e4m3fn or e4m3fnuz, got {p.get('fp8_format')!r}")
    elif kv_scale != 1.0:
        raise Refuse(f"kv_scale {kv_scale} on a 16-bit cache (must be 1)")
    ab.expect_dtype(table, "i32")
    ab.expect_ndim(table, 2)
    if "scale" not in p:
        raise Refuse("missing parameter 'scale'")
    return T, N, Lk, Lv, nb, P, fp8


def _decline_dims(Lk, Lv):
    if Lk not in HEAD_DIMS_K or Lv != HEAD_DIM_V:
        raise Unsupported(f"head dims {Lk}x{Lv}: FlashMLA takes Lk 576 or 512 and Lv 512 (csrc/api/*.h)")


def _tma_view(x, dims):
    """FlashMLA loads q through a TMA descriptor: the address and the strides of `dims` (those of
    size > 1) must be 16-byte multiples."""
    item = _ITEM[x.dtype_name]
    if x.ptr % TMA_ALIGN:
        raise Unsupported(f"'{x.name}' starts {x.ptr % TMA_ALIGN} bytes past a 16-byte boundary: FlashMLA loads q through TMA")
    for d in dims:
        if x.shape[d] > 1 and (x.strides[d] * item) % TMA_ALIGN:
            raise Unsupported(f"'{x.name}' stride {x.strides[d]} of dim {d} is not a 16-byte multiple: FlashMLA loads q through TMA")


def _table_columns_unit(table):
    if table.shape[1] > 1 and table.strides[1] != 1:
        raise Unsupported(f"'block_table' strides {table.strides}: FlashMLA reads rows with unit column stride")


# ------------------------------------------------------------------------------------------------
# mla_decode


def plan_dense(t, p, seq_lens, query_start_loc, table_rows):
    """Validate an mla_decode call; seq_lens, query_start_loc and table_rows (the block table's
    rows) are host copies (sequences of int). Returns {B, s_q, T, N, Lk, Lv, scale} or raises
    Refuse/Unsupported."""
    T, N, Lk, Lv, nb, P, fp8 = _common(t, p)
    lens_t, qsl_t, table = _arg(t, "seq_lens"), _arg(t, "query_start_loc"), t["block_table"]
    ab.expect_dtype(lens_t, "i32")
    ab.expect_dtype(qsl_t, "i32")
    B = lens_t.shape[0] if lens_t.ndim == 1 else -1
    if B < 1 or qsl_t.shape != (B + 1,) or table.shape[0] != B:
        raise Refuse(f"seq_lens {list(lens_t.shape)}, query_start_loc {list(qsl_t.shape)}, block_table {list(table.shape)} disagree")
    for x in (lens_t, qsl_t):
        if x.shape[0] > 1 and x.strides[0] != 1:
            raise Refuse(f"'{x.name}' must be contiguous")
    qsl, lens = [int(v) for v in query_start_loc], [int(v) for v in seq_lens]
    if qsl[0] != 0 or qsl[-1] != T or any(b < a for a, b in zip(qsl, qsl[1:])):
        raise Refuse(f"query_start_loc {qsl} must run from 0 to T = {T} without decreasing")
    W = table.shape[1]
    for r in range(B):
        qlen = qsl[r + 1] - qsl[r]
        if lens[r] < qlen:
            raise Refuse(f"request {r}: kv length {lens[r]} is shorter than its {qlen} query tokens")
        used = -(-lens[r] // P)
        if used > W:
            raise Refuse(f"request {r}: {lens[r]} keys need {used} blocks, the table has {W}")
        bad = [int(b) for b in list(table_rows[r])[:used] if not 0 <= int(b) < nb]
        if bad:
            raise Refuse(f"request {r}: block table names block {bad[0]} outside the cache [0, {nb})")
    scale = float(p.get("scale", 0.0))

    if fp8:
        raise Unsupported("fp8 cache: FlashMLA's SM90 dense decode takes 16-bit caches of q's dtype (csrc/api/dense_decode.h)")
    _decline_dims(Lk, Lv)
    if P != PAGE_SIZE:
        raise Unsupported(f"page size {P}: FlashMLA's dense decode needs page_block_size 64 (csrc/api/dense_decode.h)")
    qlens = {qsl[r + 1] - qsl[r] for r in range(B)}
    if len(qlens) != 1 or 0 in qlens:
        raise Unsupported(f"query lengths {sorted(qlens)}: FlashMLA takes q as [batch, seqlen_q, ...] with one seqlen_q >= 1")
    s_q = qlens.pop()
    _table_columns_unit(table)
    _tma_view(t["q"], (0, 1))
    return {"B": B, "s_q": s_q, "T": T, "N": N, "Lk": Lk, "Lv": Lv, "scale": scale}


def host_ints(x):
    """A harness tensor's values on the host, as nested lists of int (cpu or cuda)."""
    if x.device == "cpu":
        return ab.as_numpy(x).tolist()
    return _torch().from_dlpack(x).cpu().tolist()


@ADAPTER.entry("mla_decode", contract="p-in-input-type")
def mla_decode(t, p):
    lens, qsl, table = (host_ints(_arg(t, n)) for n in ("seq_lens", "query_start_loc", "block_table"))
    plan = plan_dense(t, p, lens, qsl, table)
    _execute_dense(t, plan)


def _execute_dense(t, plan):
    torch, fm = _load()
    B, s_q, N, Lk, Lv = plan["B"], plan["s_q"], plan["N"], plan["Lk"], plan["Lv"]
    q = ab.as_torch(t["q"]).view(B, s_q, N, Lk)
    cache = ab.as_torch(t["kv_cache"]).unsqueeze(2)  # [num_blocks, 64, h_kv = 1, Lk]
    meta, _ = fm.get_mla_metadata()
    o, lse = fm.flash_mla_with_kvcache(
        q,
        cache,
        torch.from_dlpack(t["block_table"]),
        torch.from_dlpack(t["seq_lens"]),
        Lv,
        meta,
        None,
        softmax_scale=plan["scale"],
        causal=True,  # FlashMLA drops the mask itself at seqlen_q 1
    )
    ab.as_torch(t["out"]).view(B, s_q, N, Lv).copy_(o)
    torch.from_dlpack(t["lse"]).view(B, s_q, N).copy_(lse.transpose(1, 2))  # [B, N, s_q] -> [B, s_q, N]


# ------------------------------------------------------------------------------------------------
# sparse_mla


def padded_heads(n):
    """The head count the sparse kernel runs (64 or 128), as vLLM pads for it; None above 128."""
    for h in SPARSE_HEADS:
        if n <= h:
            return h
    return None


def plan_sparse(t, p, req_ids):
    """Validate a sparse_mla call; req_ids is a host copy of req_id_per_token. Returns {T, N,
    Npad, Lk, Lv, nb, P, W, topk, topk_pad, scale} or raises Refuse/Unsupported."""
    T, N, Lk, Lv, nb, P, fp8 = _common(t, p)
    req, topk = _arg(t, "req_id_per_token"), _arg(t, "topk_indices")
    table = t["block_table"]
    ab.expect_dtype(req, "i32")
    ab.expect_dtype(topk, "i32")
    if req.shape != (T,) or (T > 1 and req.strides[0] != 1):
        raise Refuse(f"'req_id_per_token' {list(req.shape)} strides {req.strides}: expected contiguous [{T}]")
    ab.expect_ndim(topk, 2)
    if topk.shape[0] != T:
        raise Refuse(f"'topk_indices' has {topk.shape[0]} rows, q {T}")
    K = topk.shape[1]
    if K < 1:
        raise Refuse("topk must be >= 1")
    bad = [int(r) for r in req_ids if not 0 <= int(r) < table.shape[0]]
    if bad:
        raise Refuse(f"req_id_per_token names request {bad[0]} outside the block table's {table.shape[0]} rows")

    if fp8:
        raise Unsupported(
            "fp8 cache: FlashMLA's sparse kernels read bf16 rows or their own fp8 format (656 B per token: 512 fp8 "
            "values, 4 fp32 scales per 128, 64 bf16 RoPE values); attncheck's fp8 cache quantizes all "
            f"{Lk} dims with one kv_scale"
        )
    if t["q"].dtype_name != "bf16":
        raise Unsupported("f16: FlashMLA's sparse kernel takes bf16 q and kv (csrc/api/sparse_fwd.h)")
    _decline_dims(Lk, Lv)
    Npad = padded_heads(N)
    if Npad is None:
        raise Unsupported(f"{N} heads: FlashMLA's SM90 sparse kernel runs 64 or 128 (csrc/api/sparse_fwd.h)")
    if Npad == N:
        _tma_view(t["q"], (0, 1))
    return {
        "T": T,
        "N": N,
        "Npad": Npad,
        "Lk": Lk,
        "Lv": Lv,
        "nb": nb,
        "P": P,
        "W": table.shape[1],
        "topk": K,
        "topk_pad": -(-K // TOPK_MULTIPLE) * TOPK_MULTIPLE,
        "scale": float(p.get("scale", 0.0)),
    }


def convert_topk(where, tok, req, table, P, W):
    """Request-local top-k positions -> flat cache rows (docs/ops/sparse_mla.md, step 1):
    tok < 0 or tok // P outside [0, W) -> -1, else table[req, tok // P] * P + tok % P.
    Works on NumPy or torch int64 arrays (`where` is numpy.where or torch.where);
    tok [T, K], req [T], table [B, W]."""
    valid = (tok >= 0) & (tok < P * W)
    safe = where(valid, tok, 0)
    slot = table[req.reshape(-1, 1), safe // P] * P + safe % P
    return where(valid, slot, -1), valid


@ADAPTER.entry("sparse_mla", contract="p-in-input-type")
def sparse_mla(t, p):
    plan = plan_sparse(t, p, host_ints(_arg(t, "req_id_per_token")))
    _execute_sparse(t, plan)


def _execute_sparse(t, plan):
    torch, fm = _load()
    T, N, Npad, Lk, Lv, nb, P, W = (plan[k] for k in ("T", "N", "Npad", "Lk", "Lv", "nb", "P", "W"))
    if T == 0:
        return
    req = torch.from_dlpack(t["req_id_per_token"]).long()
    table = torch.from_dlpack(t["block_table"]).long()
    tok = torch.from_dlpack(t["topk_indices"]).long()
    slots, valid = convert_topk(torch.where, tok, req, table, P, W)
    outside = valid & ((slots < 0) | (slots >= nb * P))
    if bool(outside.any()):
        raise RuntimeError(f"{int(outside.sum())} converted slots lie outside the cache [0, {nb * P}) (bad block table entries)")
    idx = torch.full((T, 1, plan["topk_pad"]), -1, dtype=torch.int32, device=slots.device)
    idx[:, 0, : plan["topk"]] = slots.to(torch.int32)
    q = ab.as_torch(t["q"])
    if Npad != N:  # vLLM pads heads the same way for this kernel (zeros here: deterministic)
        qp = torch.zeros((T, Npad, Lk), dtype=q.dtype, device=q.device)
        qp[:, :N] = q
        q = qp
    kv = ab.as_torch(t["kv_cache"]).view(nb * P, 1, Lk)
    o, _max_logits, lse = fm.flash_mla_sparse_fwd(q, kv, idx, plan["scale"], d_v=Lv)
    ab.as_torch(t["out"]).copy_(o[:, :N])
    lse = lse[:, :N]
    empty = ~valid.any(dim=1, keepdim=True)  # FlashMLA: +inf for a row with no valid index
    lse = torch.where(empty & torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)
    torch.from_dlpack(t["lse"]).copy_(lse)


# ------------------------------------------------------------------------------------------------
# Loading FlashMLA and the device check


def _torch():
    import torch

    return torch


def _load():
    """(torch, flash_mla) after checking the device; raises Unsupported with the reason."""
    global _flash_mla
    torch = _torch()
    if torch.version.hip is not None:
        raise Unsupported("FlashMLA is a CUDA library; this torch is a ROCm build")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        raise Unsupported(f"device sm_{major}{minor}: this adapter maps FlashMLA's sm_90a kernels (dense decode is SM90-only)")
    if _flash_mla is None:
        _flash_mla = ab.import_upstream("flash_mla", "ATTNCHECK_FLASHMLA_SRC", "build it (docs/adapters/deepgemm_flashmla.md)")
    return torch, _flash_mla
