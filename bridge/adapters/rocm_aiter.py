"""rocm_aiter: AITER's (ROCm/aiter) attention kernels judged by attncheck, for MI300 (gfx942) and
MI355 (gfx950). NOT RUN ON AMD HARDWARE: written from AITER's source and tested on a CPU against a
NumPy stand-in that follows AITER's signatures and kernel semantics (bridge/tests/aiter_standin).

    attncheck run --tier quick --op mla_decode --kernels py:rocm_aiter

Read at ROCm/aiter commit e4048607a535ace3a2b51ded31b1c8c2d45c0879 (2026-08-22): aiter/mla.py,
aiter/ops/attention.py, aiter/ops/cache.py, aiter/ops/rope.py, aiter/ops/topk.py,
aiter/ops/triton/attention/{fp8_mqa_logits,pa_mqa_logits}.py, csrc/py_itfs_cu/asm_mla.cu,
hsa/gfx942|gfx950/mla/mla_asm.csv, csrc/kernels/cache_kernels.cu, csrc/kernels/rope/,
csrc/kernels/topk_per_row_kernels.cu. The callers' side follows vLLM's ROCm backends
(vllm/v1/attention/backends/mla/rocm_aiter_mla.py, rocm_aiter_mla_sparse.py,
vllm/v1/attention/ops/rocm_aiter_mla_sparse.py). docs/adapters/aiter.md has the mapping table.

Named rocm_aiter, not aiter: an adapter module called ``aiter`` would shadow the package it calls.

Every entry is a pure *plan* function (attncheck tensors and parameters -> the AITER calls, their
arguments as views of the harness's tensors, host-built metadata and workspaces) plus one executor
that runs a plan on a backend:

- ``torch`` (default): torch.from_dlpack views of the harness's device buffers, the real aiter;
- ``numpy`` (ATTNCHECK_AITER_BACKEND=numpy, test only): host buffers (device "cpu") and the
  stand-in ``aiter`` package, which must come first on PYTHONPATH (the backend insists on its
  ``STANDIN`` marker).

Which configurations are invalid is the op's answer: ``plan()`` asks it first
(``ab.refuse_if_invalid()``: the MLA 16-head rule, the indexer cache's block size and page stride,
the indexer heads and chunk_q; docs/bridge.md "Validity") and refuses with its reason; the plans do
not re-code those rules. A plan refuses (Refuse) malformed arguments and declines (Unsupported),
with AITER's reason, what AITER cannot serve; outputs that AITER returns in tensors of its own (the MLA
LSE, the prefill logits) or that vLLM un-pads (fewer than 16 MLA heads) are copied into the
harness's views, and nothing else is copied.

With ATTNCHECK_AITER_SRC set (and the torch backend), ADAPTER holds AITER's Triton kernels executed
from that source tree, on any torch GPU (attncheck_bridge.aiter_triton_entries, as py:aiter_triton).
"""

from __future__ import annotations

import importlib
import os

import numpy as np

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported
from attncheck_bridge import adapter_checks as checks
from attncheck_bridge.aiter_plans import (  # noqa: F401 - the plan vocabulary, reached as rocm_aiter.X too
    ARCHS, Alloc, AllocFromInfo, Call, Contiguous, Copy, Dtype, Host, Localize, NumpyBackend, Plan, Ref, RepeatHeads,
    TorchBackend, arch_supported as _arch_supported, arg, execute, expand_pages as _expand_pages,
    mla_declines as _mla_declines, mla_path as _mla_path, mla_steps as _mla_steps, platform_fp8,
    platform_format as _platform_format, rope_common as _rope_common, rope_declines as _rope_declines,
    rope_qk as _rope_qk, rope_tables as _rope_tables, sparse_indices, work)

AITER_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
BACKEND = os.environ.get("ATTNCHECK_AITER_BACKEND", "torch")
if BACKEND not in ("torch", "numpy"):
    raise ValueError(f"ATTNCHECK_AITER_BACKEND must be torch or numpy, got {BACKEND!r}")

ADAPTER = ab.Adapter(
    name="rocm_aiter" if BACKEND == "torch" else "rocm_aiter (numpy stand-in)",
    device="cuda" if BACKEND == "torch" else "cpu",
)


# ------------------------------------------------------------------------------------------------
# Checks shared by the plans


_need = ab.arg
# The argument checks both AITER adapters share (attncheck_bridge.adapter_checks).
_contiguous_1d, _rows_of, _fp8_format = checks.contiguous_1d, checks.rows_of, checks.fp8_format
_mla_common, _indexer_cache, _packed_pages = checks.mla_common, checks.indexer_cache, checks.packed_pages
indexer_logits_prefill_args = checks.indexer_logits_prefill_args
indexer_logits_decode_args = checks.indexer_logits_decode_args
HEAD_DIM, TOKEN_BYTES, FP8_MAX = checks.HEAD_DIM, checks.TOKEN_BYTES, checks.FP8_MAX


def plan_mla_decode(t, p, host, arch):
    """docs/ops/mla_decode.md through aiter.mla.mla_decode_fwd, with vLLM's ROCM_AITER_MLA metadata."""
    f = _mla_common(t, p)
    sl, qsl = _need(t, "seq_lens"), _need(t, "query_start_loc")
    for x in (sl, qsl):
        ab.expect_dtype(x, "i32")
        if not _contiguous_1d(x):
            raise Refuse(f"'{x.name}' must be a contiguous 1-D tensor")
    B = sl.shape[0]
    if qsl.shape[0] != B + 1 or t["block_table"].shape[0] != B:
        raise Refuse(f"seq_lens [{B}], query_start_loc {qsl.shape}, block_table {t['block_table'].shape} disagree")
    lens, starts, table = host("seq_lens").astype(np.int64), host("query_start_loc").astype(np.int64), host("block_table")
    qlens = np.diff(starts)
    if starts[0] != 0 or starts[-1] != f["T"] or np.any(qlens < 0):
        raise Refuse(f"query_start_loc must run from 0 to T={f['T']} without decreasing")
    if np.any(lens < qlens):
        raise Refuse("a request's kv length is shorter than its query tokens")
    need = -(-lens // f["P"])
    if np.any(need > table.shape[1]):
        raise Refuse(f"the block table ({table.shape[1]} columns) is too narrow for a request")
    used = np.concatenate([table[r, : need[r]] for r in range(B)]) if B else np.zeros(0)
    if np.any((used < 0) | (used >= f["nb"])):
        raise Refuse("the block table names a block outside the cache")
    max_q = int(qlens.max()) if B else 0
    if B and np.any(qlens != max_q):
        raise Unsupported(
            f"ragged query lengths {qlens.tolist()}: the decode kernels address request b's queries at "
            "b * max_seqlen_q rows (s_Q_Bs in asm_mla.cu; vLLM's builder declares QueryLenSupport.UNIFORM)"
        )
    path, heads = _mla_declines(t, f, arch, qlen=max_q, sparse=False)
    kv_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    kv_indices = _expand_pages(table, lens, f["P"]).astype(np.int32)
    steps = _mla_steps(f, path, heads, starts.astype(np.int32), kv_indptr, kv_indices, max_q, B)
    return Plan(steps, f"mla_decode_fwd, {path}, {heads} heads, qlen {max_q}")


def plan_sparse_mla(t, p, host, arch):
    """docs/ops/sparse_mla.md as vLLM's ROCM_AITER_MLA_SPARSE runs it: every token its own qlen-1
    request over its converted top-k slots, split-KV mla_decode_fwd."""
    f = _mla_common(t, p)
    req, topk = _need(t, "req_id_per_token"), _need(t, "topk_indices")
    ab.expect_dtype(req, "i32")
    ab.expect_dtype(topk, "i32")
    if not _contiguous_1d(req) or req.shape[0] != f["T"]:
        raise Refuse(f"req_id_per_token must be a contiguous [T={f['T']}]")
    ab.expect_ndim(topk, 2)
    if topk.shape[0] != f["T"]:
        raise Refuse(f"topk_indices {topk.shape} is not [T={f['T']}, topk]")
    table = host("block_table")
    r = host("req_id_per_token").astype(np.int64)
    if np.any((r < 0) | (r >= table.shape[0])):
        raise Refuse("req_id_per_token names a request outside the block table")
    path, heads = _mla_declines(t, f, arch, qlen=1, sparse=True)
    kv_indptr, kv_indices = sparse_indices(host("topk_indices"), r, table, f["P"])
    if np.any((kv_indices < 0) | (kv_indices >= f["nb"] * f["P"])):
        raise ValueError("a converted slot lies outside the cache (a block table entry names a missing block)")
    T = f["T"]
    steps = _mla_steps(f, path, heads, np.arange(T + 1, dtype=np.int32), kv_indptr, kv_indices, 1, T)
    return Plan(steps, f"mla_decode_fwd, sparse, {heads} heads")


# --- kv_cache_write --------------------------------------------------------------------------


def plan_kv_cache_write(t, p, host, arch):
    """docs/ops/kv_cache_write.md: NHD through reshape_and_cache_flash, SHUFFLE through
    reshape_and_cache(asm_layout=True) (K [nb, H, D/x, P, x], V [nb, H, P/x, D, x])."""
    a = ab.kv_cache_write_args(t, p)
    key, value, kc, vc, slots = a.key, a.value, a.key_cache, a.value_cache, a.slot_mapping
    layout = a.layout
    fmt = _fp8_format(p, "an fp8 cache") if a.kv_dtype == "fp8" else None
    T = slots.shape[0]
    es = 1 if fmt else 2
    if layout == "NHD":
        for c in (kc, vc):
            ab.expect_ndim(c, 4)
        if kc.shape != vc.shape:
            raise Refuse(f"key_cache {kc.shape} and value_cache {vc.shape} differ")
        nb, P, H, D = kc.shape
    else:
        for c in (kc, vc):
            ab.expect_ndim(c, 5)
        nb, H, Dx, P, x = kc.shape
        D = Dx * x
        if x != 16 // es or vc.shape != (nb, H, P // x, D, x) or P % x:
            raise Refuse(f"SHUFFLE caches K {kc.shape} / V {vc.shape}: tile width must be {16 // es} and agree")
    for v in (key, value):
        if v.ndim != 3 or v.shape != (T, H, D):
            raise Refuse(f"'{v.name}' {v.shape} is not [T={T}, Hkv={H}, D={D}]")
    if not _contiguous_1d(slots):
        raise Refuse("slot_mapping must be contiguous")

    # What AITER's writers address (csrc/kernels/cache_kernels.cu).
    _arch_supported(arch)
    if T == 0 or nb == 0:
        return Plan([], "no tokens")
    for v in (key, value):
        if v.strides[2] != 1 or v.strides[1] != D:
            raise Unsupported(f"'{v.name}' strides {v.strides}: the writers read token t's heads and dims as one run at t * stride(0)")
    if fmt:
        _platform_format(fmt, arch, "the writer's fp8 store")
    kd = "fp8" if fmt else "auto"
    cache = (lambda name: arg(name).as_dtype(fmt)) if fmt else arg
    scales = (arg("k_scale"), arg("v_scale"))
    if layout == "NHD":
        for c in (kc, vc):
            if c.strides[1:] != (H * D, D, 1):
                raise Unsupported(
                    f"'{c.name}' strides {c.strides}: reshape_and_cache_flash takes only the block stride from the "
                    f"cache (block * stride(0) + slot * H * D + head * D + d)"
                )
        if kc.strides[0] != vc.strides[0]:
            raise Unsupported(f"block strides {kc.strides[0]} / {vc.strides[0]}: AITER_CHECK(key_cache.stride(0) == value_cache.stride(0))")
        call = Call("aiter.ops.cache:reshape_and_cache_flash",
                    (arg("key"), arg("value"), cache("key_cache"), cache("value_cache"), arg("slot_mapping"), kd) + scales)
        return Plan([call], "reshape_and_cache_flash")
    for c in (kc, vc):
        if not c.is_contiguous():
            raise Unsupported(
                f"'{c.name}' strides {c.strides}: reshape_and_cache addresses the whole cache from its shape "
                "(block * H * D * P + ...), so only contiguous SHUFFLE caches are written where their views say"
            )
    call = Call("aiter.ops.cache:reshape_and_cache",
                (arg("key"), arg("value"), cache("key_cache"), cache("value_cache"), arg("slot_mapping"), kd) + scales,
                dict(asm_layout=True))
    return Plan([call], "reshape_and_cache(asm_layout=True)")


def plan_kv_cache_write_pertoken_quant(t, p, host, arch):
    """kv_cache_write's per-token-quant variant (entry kv_cache_write_pertoken_quant: one fp8 or
    int8 scale per (token, head), K [nb, H, D/16, P, 16], V [nb, H, P/16, D, 16] (asm_layout) or
    [nb, H, D, P], scales [nb, H, P] or [H, nb * P]) through
    reshape_and_cache_with_pertoken_quant(key, value, key_cache, value_cache, k_dequant_scales,
    v_dequant_scales, slot_mapping, asm_layout)."""
    names = ("key", "value", "key_cache", "value_cache", "k_dequant_scales", "v_dequant_scales", "slot_mapping")
    key, value, kc, vc, kds, vds, slots = (_need(t, n) for n in names)
    asm = p.get("asm_layout")
    if asm not in ("true", "false", True, False):
        raise Refuse(f"asm_layout must be true or false, got {asm!r}")
    asm = asm in ("true", True)
    kv_dtype = p.get("kv_cache_dtype")
    if kv_dtype not in ("fp8", "int8"):
        raise Refuse(f"kv_cache_dtype must be fp8 or int8, got {kv_dtype!r}")
    ab.expect_dtype(key, "bf16", "f16")
    if value.dtype_name != key.dtype_name:
        raise Refuse(f"'key' is {key.dtype_name} but 'value' is {value.dtype_name}")
    fmt = _fp8_format(p, "an fp8 cache") if kv_dtype == "fp8" else None
    for c in (kc, vc):
        ab.expect_dtype(c, "u8" if fmt else "i8")
    for s in (kds, vds):
        ab.expect_dtype(s, "f32")
    ab.expect_dtype(slots, "i64")
    if not _contiguous_1d(slots):
        raise Refuse("slot_mapping must be a contiguous 1-D tensor")
    ab.expect_ndim(kc, 5)
    nb, H, Dx, P, x = kc.shape
    D = Dx * x
    T = slots.shape[0]
    want_v = (nb, H, P // x, D, x) if asm else (nb, H, D, P)
    want_s = (nb, H, P) if asm else (H, nb * P)
    if x != 16 or vc.shape != want_v or kds.shape != want_s or vds.shape != want_s or (asm and P % x):
        raise Refuse(f"caches K {kc.shape} / V {vc.shape}, scales {kds.shape} / {vds.shape}: want x = 16, V {want_v}, scales {want_s}")
    for v in (key, value):
        if v.ndim != 3 or v.shape != (T, H, D):
            raise Refuse(f"'{v.name}' {v.shape} is not [T={T}, Hkv={H}, D={D}]")
    _arch_supported(arch)
    if fmt:
        _platform_format(fmt, arch, "reshape_and_cache_with_pertoken_quant's fp8 store")
    if D > 512:
        raise Unsupported(f"head size {D}: AITER_CHECK(head_size <= 512)")
    for v in (key, value):
        if v.strides[2] != 1 or v.strides[1] != D:
            raise Unsupported(f"'{v.name}' strides {v.strides}: the kernel reads token t, head h at t * stride(0) + h * head_size")
    for c in (kc, vc, kds, vds):
        if not c.is_contiguous():
            raise Unsupported(f"'{c.name}' strides {c.strides}: reshape_and_cache_with_pertoken_quant addresses caches and scales from their shapes")
    if T == 0:
        return Plan([], "no tokens")
    cache = (lambda name: arg(name).as_dtype(fmt)) if fmt else arg
    call = Call("aiter.ops.cache:reshape_and_cache_with_pertoken_quant",
                (arg("key"), arg("value"), cache("key_cache"), cache("value_cache"), arg("k_dequant_scales"),
                 arg("v_dequant_scales"), arg("slot_mapping"), asm))
    return Plan([call], "reshape_and_cache_with_pertoken_quant")


# --- RoPE ----------------------------------------------------------------------------------------


def _plan_rope(t, p, host, arch, out_of_place):
    pos, cache, q, k, rot = _rope_common(t, p, arch, "q", "k")
    ab.expect_ndim(q, 3)
    T, H, W = q.shape
    if W != rot or pos.shape[0] != T or not (k.shape == (T, 1, rot) or k.shape == (T, rot)):
        raise Refuse(f"rope: views must be [T={T}, H, rot={rot}] and agree (q {q.shape}, k {k.shape}, positions {pos.shape})")
    outs = []
    if out_of_place:
        qo, ko = _need(t, "q_out"), _need(t, "k_out")
        if qo.shape != q.shape or ko.shape != k.shape or qo.dtype_name != q.dtype_name or ko.dtype_name != k.dtype_name:
            raise Refuse("q_out / k_out must match q / k")
        if not (qo.is_contiguous() and ko.is_contiguous()):
            raise Refuse("q_out and k_out must be contiguous")
        outs = [qo, ko]
    _rope_declines(t, arch, [q, k] + outs)
    steps, cos, sin = _rope_tables(rot)
    x, y = _rope_qk(t, "q", "k", rot, False)
    pos_ref = arg("positions").view(1, T)
    style = 0 if p["is_neox"] else 1
    if out_of_place:
        xo, yo = _rope_qk(t, "q_out", "k_out", rot, False)
        steps.append(Call("aiter.ops.rope:rope_cached_positions_2c_fwd_impl", (xo, yo, x, y, cos, sin, pos_ref, style, True, False)))
        return Plan(steps, "rope_cached_positions_2c_fwd_impl")
    steps.append(Call("aiter.ops.rope:rope_cached_positions_2c_fwd_inplace", (x, y, cos, sin, pos_ref, style, True, False)))
    return Plan(steps, "rope_cached_positions_2c_fwd_inplace")


def plan_rope_inplace(t, p, host, arch):
    return _plan_rope(t, p, host, arch, out_of_place=False)


def plan_rope_out_of_place(t, p, host, arch):
    return _plan_rope(t, p, host, arch, out_of_place=True)


def plan_indexer_qk_rope(t, p, host, arch):
    """Both paths are AITER's in-place rotation of q[..., :rot] and k[..., :rot] (vLLM's ROCm fast
    path); the generic path's split / rotate / concat is vLLM's code around it, not AITER's."""
    pos, cache, q, k, rot = _rope_common(t, p, arch, "q", "k")
    if p.get("path") not in ("generic", "fast"):
        raise Refuse(f"path must be generic or fast, got {p.get('path')!r}")
    ab.expect_ndim(q, 3)
    ab.expect_ndim(k, 2)
    T, H, D = q.shape
    if k.shape != (T, D) or pos.shape[0] != T:
        raise Refuse(f"q {q.shape}, k {k.shape}, positions {pos.shape} disagree")
    if rot > D:
        raise Refuse(f"rot = {rot} > D = {D}")
    _rope_declines(t, arch, [q, k])
    steps, cos, sin = _rope_tables(rot)
    x, y = _rope_qk(t, "q", "k", rot, True)
    steps.append(Call("aiter.ops.rope:rope_cached_positions_2c_fwd_inplace",
                      (x, y, cos, sin, arg("positions").view(1, T), 0 if p["is_neox"] else 1, True, False)))
    return Plan(steps, "rope_cached_positions_2c_fwd_inplace (front slice)")


# --- indexer -------------------------------------------------------------------------------------

def plan_indexer_k_cache(t, p, host, arch):
    k, slots, cache = (_need(t, n) for n in ("k", "slot_mapping", "kv_cache"))
    fmt = _fp8_format(p, "the indexer cache")
    ab.expect_dtype(k, "bf16")
    ab.expect_ndim(k, 2)
    ab.expect_dtype(slots, "i64")
    if not _contiguous_1d(slots) or k.shape[1] != HEAD_DIM or k.shape[0] < slots.shape[0] or k.strides[1] != 1:
        raise Refuse(f"k {k.shape} / slot_mapping {slots.shape}: k [T' >= T, {HEAD_DIM}] with a unit column stride")
    nb, bs = _indexer_cache(cache)
    qmax = float(p.get("quant_max", 0))
    if not 0 < qmax <= FP8_MAX[fmt]:
        raise Refuse(f"quant_max {qmax} outside (0, {FP8_MAX[fmt]}]")
    _arch_supported(arch)
    _platform_format(fmt, arch, "indexer_k_quant_and_cache")
    if qmax != FP8_MAX[fmt]:
        raise Unsupported(f"quant_max {qmax}: indexer_k_quant_and_cache divides amax by the fp8 type's max ({FP8_MAX[fmt]} for {fmt})")
    if k.shape[0] > 1 and k.strides[0] != HEAD_DIM:
        raise Unsupported(f"k row stride {k.strides[0]}: indexer_k_quant_and_cache reads k as contiguous [num_tokens, {HEAD_DIM}] rows")
    _packed_pages(cache, "indexer_k_quant_and_cache")
    call = Call("aiter.ops.cache:indexer_k_quant_and_cache",
                (arg("k"), arg("kv_cache").as_dtype(fmt), arg("slot_mapping"), HEAD_DIM, "ue8m0"), dict(preshuffle=bs > 1))
    return Plan([call], "indexer_k_quant_and_cache")


def plan_indexer_gather(t, p, host, arch):
    cache, table, cu, kf, ks = (_need(t, n) for n in ("kv_cache", "block_table", "cu_seq_lens", "k_fp8", "k_scale"))
    nb, bs = _indexer_cache(cache)
    ab.expect_dtype(table, "i32")
    ab.expect_ndim(table, 2)
    ab.expect_dtype(cu, "i32")
    ab.expect_dtype(kf, "u8")
    ab.expect_dtype(ks, "f32")
    if not _contiguous_1d(cu) or cu.shape[0] != table.shape[0] + 1:
        raise Refuse(f"cu_seq_lens {cu.shape} must be a contiguous [R + 1] for block_table {table.shape}")
    N = int(host("cu_seq_lens")[-1]) if cu.shape[0] else 0
    if kf.ndim != 2 or kf.shape != (N, HEAD_DIM) or ks.shape != (N,):
        raise Refuse(f"k_fp8 {kf.shape} / k_scale {ks.shape} are not [{N}, {HEAD_DIM}] / [{N}]")
    if kf.shape[0] > 1 and kf.strides[0] % 4:
        raise Refuse("k_fp8 rows must be 4-byte aligned")
    _arch_supported(arch)
    if not _rows_of(table, table.shape[1]):
        raise Unsupported(f"block_table strides {table.strides}: cp_gather_indexer_k_quant_cache indexes it as b * size(1) + i")
    if not _rows_of(kf, HEAD_DIM):
        raise Unsupported(f"k_fp8 strides {kf.strides}: the kernel addresses a token's scale by k_fp8's row stride (token_stride * 4 / quant_block_size)")
    if not _contiguous_1d(ks):
        raise Unsupported("k_scale must be contiguous: it is written as [num_tokens, 1]")
    if N == 0:
        return Plan([], "nothing to gather")
    call = Call("aiter.ops.cache:cp_gather_indexer_k_quant_cache",
                (arg("kv_cache"), arg("k_fp8"), arg("k_scale").unsqueeze(1), arg("block_table"), arg("cu_seq_lens")),
                dict(preshuffle=bs > 1))
    return Plan([call], "cp_gather_indexer_k_quant_cache")


def plan_indexer_logits_prefill(t, p, host, arch):
    fmt, (q, kf, ks, w, ks_, ke, logits), H = indexer_logits_prefill_args(t, p)
    _arch_supported(arch)
    _platform_format(fmt, arch, "fp8_mqa_logits (vLLM passes current_platform.fp8_dtype())")
    if H & (H - 1):
        raise Unsupported(f"{H} heads: fp8_mqa_logits asserts a power-of-two head count")
    call = Call("aiter.ops.triton.attention.fp8_mqa_logits:fp8_mqa_logits",
                (arg("q").as_dtype(fmt), arg("k_fp8").as_dtype(fmt), arg("k_scale"), arg("weights"), arg("cu_seqlen_ks"), arg("cu_seqlen_ke")),
                result="mqa_logits")
    return Plan([call, Copy(arg("logits"), work("mqa_logits"))], "fp8_mqa_logits")


def plan_indexer_logits_decode(t, p, host, arch):
    fmt, (q, cache, w, lens, table, logits), (B, nn, H, D), chunk, (nb, bs) = indexer_logits_decode_args(t, p)
    _arch_supported(arch)
    _platform_format(fmt, arch, "deepgemm_fp8_paged_mqa_logits")
    if chunk != H:
        raise Unsupported(
            f"ChunkQ {chunk} < {H} heads: vLLM's gfx942/gfx950 path calls deepgemm_fp8_paged_mqa_logits, whose ChunkQ is "
            "the head count; smaller chunks are deepgemm_fp8_paged_mqa_logits_stage1 (no Preshuffle), not mapped"
        )
    _packed_pages(cache, "deepgemm_fp8_paged_mqa_logits (kv_cache.view(-1, KVBlockSize * index_dim))")
    if not _rows_of(table, table.shape[1]):
        raise Unsupported(f"block_table strides {table.strides}: the kernel reads kv_indices + batch * max_block_len")
    if logits.shape[1] > 1 and logits.strides[1] != 1:
        raise Unsupported("logits must have a unit column stride")
    call = Call("aiter.ops.triton.attention.pa_mqa_logits:deepgemm_fp8_paged_mqa_logits",
                (arg("q").as_dtype(fmt), arg("kv_cache").unsqueeze(2), arg("weights"), arg("logits"), arg("context_lens"),
                 arg("block_table"), logits.shape[1]),
                dict(ChunkK=256, Preshuffle=bs > 1, KVBlockSize=bs, WavePerEU=2))
    return Plan([call], "deepgemm_fp8_paged_mqa_logits")


def _topk_common(t, rows):
    logits, idx = _need(t, "logits"), _need(t, "topk_indices")
    ab.expect_dtype(logits, "f32")
    ab.expect_dtype(idx, "i32")
    ab.expect_ndim(logits, 2)
    ab.expect_ndim(idx, 2)
    k = idx.shape[1]
    if k < 1:
        raise Refuse(f"k = {k} < 1")
    if logits.shape[0] != rows or idx.shape[0] != rows:
        raise Refuse(f"logits {logits.shape} / topk_indices {idx.shape} are not {rows} rows")
    return logits, idx, k


def _topk_declines(logits, idx, k):
    if logits.shape[1] > 1 and logits.strides[1] != 1:
        raise Unsupported("logits must have a unit column stride (the kernel ignores stride1)")
    if not idx.is_contiguous():
        raise Unsupported(f"topk_indices strides {idx.strides}: the kernel writes rows of k = {k}")


def plan_indexer_topk_prefill(t, p, host, arch):
    ks, ke = _need(t, "cu_seqlen_ks"), _need(t, "cu_seqlen_ke")
    M = ks.shape[0]
    logits, idx, k = _topk_common(t, M)
    for x in (ks, ke):
        ab.expect_dtype(x, "i32")
        if not _contiguous_1d(x) or x.shape[0] != M:
            raise Refuse(f"'{x.name}' must be a contiguous [{M}]")
    _arch_supported(arch)
    _topk_declines(logits, idx, k)
    call = Call("aiter.ops.topk:top_k_per_row_prefill",
                (arg("logits"), arg("cu_seqlen_ks"), arg("cu_seqlen_ke"), arg("topk_indices"), None, M, logits.strides[0], 1), dict(k=k))
    return Plan([call, Localize(arg("topk_indices"), arg("cu_seqlen_ks"))], "top_k_per_row_prefill")


def plan_indexer_topk_decode(t, p, host, arch):
    lens = _need(t, "seq_lens")
    nn = int(p.get("next_n", 0))
    if nn < 1:
        raise Refuse(f"next_n = {nn} < 1")
    ab.expect_dtype(lens, "i32")
    if not _contiguous_1d(lens):
        raise Refuse("seq_lens must be contiguous")
    rows = lens.shape[0] * nn
    logits, idx, k = _topk_common(t, rows)
    _arch_supported(arch)
    _topk_declines(logits, idx, k)
    call = Call("aiter.ops.topk:top_k_per_row_decode",
                (arg("logits"), nn, arg("seq_lens"), arg("topk_indices"), rows, logits.strides[0], 1), dict(k=k))
    return Plan([call], "top_k_per_row_decode")


PLANS = {
    "mla_decode": plan_mla_decode,
    "sparse_mla": plan_sparse_mla,
    "kv_cache_write": plan_kv_cache_write,
    "kv_cache_write_pertoken_quant": plan_kv_cache_write_pertoken_quant,
    "rope_inplace": plan_rope_inplace,
    "rope_out_of_place": plan_rope_out_of_place,
    "indexer_qk_rope": plan_indexer_qk_rope,
    "indexer_k_cache": plan_indexer_k_cache,
    "indexer_gather": plan_indexer_gather,
    "indexer_logits_prefill": plan_indexer_logits_prefill,
    "indexer_logits_decode": plan_indexer_logits_decode,
    "indexer_topk_prefill": plan_indexer_topk_prefill,
    "indexer_topk_decode": plan_indexer_topk_decode,
}

_backend = None


def backend():
    """The process's backend; Unsupported with the reason when aiter cannot be imported."""
    global _backend
    if _backend is None:
        try:
            _backend = NumpyBackend() if BACKEND == "numpy" else TorchBackend()
            if BACKEND == "torch":
                importlib.import_module("aiter")
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001 - any import failure means AITER is not usable here
            _backend = None
            raise Unsupported(f"aiter is not importable here ({type(e).__name__}: {e})") from None
    return _backend


def gfx(be):
    chip = be.module("aiter.jit.utils.chip_info")
    return (getattr(chip, "get_gfx_runtime", None) or chip.get_gfx)()


def plan(op, t, p, host, arch):
    """The plan of entry ``op``, after asking the op whether the case is invalid."""
    ab.refuse_if_invalid()
    return PLANS[op](t, p, host, arch)


def _run(op, t, p):
    be = backend()
    execute(plan(op, t, p, lambda name: be.host_array(t[name]), gfx(be)), t, be)


def _entry(op):
    def fn(t, p):
        _run(op, t, p)

    fn.__name__ = op
    fn.__doc__ = PLANS[op].__doc__
    return fn


# deepgemm_fp8_paged_mqa_logits never writes the logits past each request's context (vLLM's top-k
# reads only up to it): declared, so the rest is judged (attncheck_bridge.aiter_triton_entries).
PARTIAL = {"indexer_logits_decode": {"unspecified": {"logits": "past_context"}}}
for _op in PLANS:
    ADAPTER.add(_op, _entry(_op), partial=PARTIAL.get(_op))

# With an AITER source tree named (ATTNCHECK_AITER_SRC), this adapter is AITER's Triton kernels run
# from that tree (attncheck_bridge.aiter_triton_entries, the entries py:aiter_triton has too): on
# any torch GPU, no aiter package needed.
if os.environ.get("ATTNCHECK_AITER_SRC") and BACKEND == "torch":
    from attncheck_bridge import aiter_triton_entries

    ADAPTER = aiter_triton_entries.adapter()
