"""AITER's (ROCm/aiter) Triton kernels as attncheck entries, executed from an AITER source tree on
any torch GPU (docs/adapters/aiter.md "AITER's Triton kernels"). Both AITER adapters serve them:
py:aiter_triton always, py:rocm_aiter whenever ATTNCHECK_AITER_SRC is set; neither adapter imports
the other. Loading is attncheck_bridge.upstream's (``aiter_load``), argument checks
attncheck_bridge.adapter_checks'.

======================  ===========================================================================
entry                   AITER function (file under aiter/ops/triton/attention/)
======================  ===========================================================================
mla_decode              ``decode_attention_fwd`` (mla_decode.py); with ATTNCHECK_AITER_MLA=decode_rope
                        ``decode_attention_fwd_grouped_rope`` (mla_decode_rope.py, use_rope=False)
sparse_mla              ``unified_attention_sparse_mla`` (unified_attention_sparse_mla.py); partial:
                        lse not produced (the function has no LSE output)
indexer_logits_prefill  ``fp8_mqa_logits`` (fp8_mqa_logits.py)
indexer_logits_decode   ``deepgemm_fp8_paged_mqa_logits`` (pa_mqa_logits.py); partial: logits past
                        each request's context unspecified (never written; vLLM's top-k reads only
                        up to the context length, and vLLM runs it with clean_logits=False)
======================  ===========================================================================

``ATTNCHECK_AITER_IMPL=torch_ref`` runs AITER's own torch references from
``op_tests/triton_tests/attention/`` through the same mapping instead (a third opinion beside
attncheck's reference): ``reference_torch`` (test_unified_attention_sparse_mla.py) for sparse_mla,
``ref_fp8_mqa_logits`` (test_fp8_mqa_logits.py) for indexer_logits_prefill; the other entries
decline there (no torch reference in that folder).

Every entry first asks the op whether the case is invalid (``ab.refuse_if_invalid()``: the MLA
16-head rule, the indexer heads, chunk_q and cache rules; docs/bridge.md "Validity") and refuses
with its reason. A file that cannot be found or fails to load declines every case of its entries
with one line naming the file and the error; a kernel that fails to compile on this GPU fails its
cases with Triton's error. Neither hides another entry.
"""

import os
import sys

import attncheck_bridge as ab
from attncheck_bridge import Unsupported, upstream
from attncheck_bridge import adapter_checks as checks

IMPL = os.environ.get("ATTNCHECK_AITER_IMPL", "kernel")
MLA_VARIANT = os.environ.get("ATTNCHECK_AITER_MLA", "decode")
for _var, _val, _known in (("ATTNCHECK_AITER_IMPL", IMPL, ("kernel", "torch_ref")),
                           ("ATTNCHECK_AITER_MLA", MLA_VARIANT, ("decode", "decode_rope"))):
    if _val not in _known:
        raise ValueError(f"{_var} must be one of {', '.join(_known)}, got {_val!r}")
if "ATTNCHECK_AITER_LSE" in os.environ:
    print("aiter_triton: ATTNCHECK_AITER_LSE is no longer read: sparse_mla declares lse not produced "
          "(a partial contract) and is judged on out", file=sys.stderr)

# Names the tests and callers reach here; they live in attncheck_bridge.upstream.
load, device_arch, platform_fp8, StandInUsed = (upstream.aiter_load, upstream.device_arch, upstream.platform_fp8,
                                                upstream.StandInUsed)
NAME = "aiter_triton" if IMPL == "kernel" else "aiter_triton (AITER torch references)"
SPARSE_PARTIAL = {"not_produced": ["lse"]}
LOGITS_DECODE_PARTIAL = {"unspecified": {"logits": "past_context"}}


def _fp8_dtype(fmt):
    import torch

    return {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fmt]


def _expect_platform_fp8(fmt, who):
    want = platform_fp8()
    if fmt != want:
        raise Unsupported(
            f"fp8_format {fmt}: {who} reads the platform's fp8 ({want} on {device_arch()}); "
            + ("Triton's fp8e4b8 (e4m3fnuz) is an AMD backend type" if fmt == "e4m3fnuz" else "AITER's dtypes.fp8 is fnuz here")
        )


# mla_decode.py's two stage-1 kernels round differently: the MHA one (one head per KV head, N = 1)
# sums q*k products in the 16-bit input type (tl.sum keeps a float operand's type); the grouped
# one accumulates tl.dot in fp32 and rounds p to the value type before tl.dot(p, v). The same as
# vLLM's triton_decode_attention.py, from which AITER's file is adapted (docs/adapters/vllm.md).
# mla_decode_rope.py's grouped kernel is tl.dot in fp32 with p.to(v.dtype): p-in-input-type only.
MLA_CONTRACT = "qk-products-in-input-type+p-in-input-type" if MLA_VARIANT == "decode" else "p-in-input-type"
# unified_attention_sparse_mla: tl.dot in fp32, P.to(V.dtype) before tl.dot(P, V).
SPARSE_CONTRACT = "p-in-input-type"


def mla_decode(t, p):
    """docs/ops/mla_decode.md. AITER's Triton decode kernels have one query row per batch entry and
    no qlen: every query token becomes its own entry over its causal prefix (b_seq_len / kv_indptr
    = kv_len - qlen + i + 1) with its request's pages; fewer than 16 heads run as they are (the
    kernels mask head tiles with BLOCK_H; nothing to pad)."""
    ab.refuse_if_invalid()
    f = checks.mla_common(t, p)
    req, causal, qlens = checks.mla_metadata(t, f)
    if IMPL == "torch_ref":
        raise Unsupported("op_tests/triton_tests/attention has no torch reference of MLA decode "
                          "(op_tests/triton_tests/utils/mla_decode_ref.py is Triton)")
    if f["fmt"] is not None:
        _expect_platform_fp8(f["fmt"], "mla_decode.py's fp8 cache")
    if MLA_VARIANT == "decode_rope":
        return _mla_decode_rope(t, f, req, causal)
    import torch

    fn = load("aiter.ops.triton.attention.mla_decode", "decode_attention_fwd")
    if f["N"] > 1 and t["lse"].strides[1] != 1:
        raise Unsupported(f"lse strides {t['lse'].strides}: stage 2 stores lse + b * stride(0) + h")
    table = t["block_table"]
    if bool((qlens == 1).all()) and f["T"] == table.shape[0]:
        if table.shape[1] > 1 and table.strides[1] != 1:
            raise Unsupported(f"block_table strides {table.strides}: the kernels read Req_to_tokens + b * stride(0) + page")
        req_to_token = torch.from_dlpack(table)
    else:
        # Spec-decode rows: every token reads its request's row of pages (host-built, contiguous).
        req_to_token = checks.host(t, "block_table")[req].to(torch.int32).contiguous().cuda()
    q, out, lse = (torch.from_dlpack(t[n]) for n in ("q", "out", "lse"))
    kv = torch.from_dlpack(t["kv_cache"])
    if f["fmt"] is not None:
        kv = kv.view(_fp8_dtype(f["fmt"]))
    k_buffer = kv.view(-1, 1, f["Lk"])  # page-size-1 rows; PAGE_SIZE addresses them as page * P + t % P
    v_buffer = k_buffer[..., : f["Lv"]]
    S = checks.num_kv_splits(p, int(causal.max()) if f["T"] else 1)
    attn_logits = torch.full((f["T"], f["N"], S, f["Lv"] + 1), float("nan"), dtype=torch.float32, device=q.device)
    b_seq_len = causal.to(torch.int32).cuda()
    scales = {}
    if f["fmt"] is not None:
        scales = {"k_scale": torch.tensor([f["kv_scale"]], dtype=torch.float32, device=q.device)}
        scales["v_scale"] = scales["k_scale"]
    fn(q, k_buffer, v_buffer, out, lse, req_to_token, b_seq_len, attn_logits, S, f["scale"],
       page_size=f["P"], logit_cap=0.0, **scales)


def _mla_decode_rope(t, f, req, causal):
    """mla_decode_rope.py with use_rope=False: paged through kv_indptr/kv_indices (page size 1),
    one KV split, because stage 2 merges the splits without storing the LSE and stage 1's record
    (e_max + log e_sum at offset kv_lora_rank) is the row's LSE only when there is one split."""
    import torch

    if f["fmt"] is not None:
        raise Unsupported("decode_attention_fwd_grouped_rope takes no kv scale: bf16/f16 caches only")
    fn = load("aiter.ops.triton.attention.mla_decode_rope", "decode_attention_fwd_grouped_rope")
    table = checks.host(t, "block_table").long()
    P = f["P"]
    rows = []
    for i in range(f["T"]):
        tok = torch.arange(int(causal[i]))
        rows.append(table[int(req[i]), tok // P] * P + tok % P)
    kv_indptr = torch.zeros(f["T"] + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(causal, 0).to(torch.int32)
    kv_indices = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(torch.int32).cuda()
    q, out, lse = (torch.from_dlpack(t[n]) for n in ("q", "out", "lse"))
    kv = torch.from_dlpack(t["kv_cache"]).view(-1, 1, f["Lk"])
    attn_logits = torch.full((f["T"], f["N"], 1, f["Lv"] + 1), float("nan"), dtype=torch.float32, device=q.device)
    config = _rope_config()
    fn(q, kv, kv[..., : f["Lv"]], out, kv_indptr.cuda(), kv_indices, None, f["Lv"], 0, None, None, attn_logits, 1,
       f["scale"], logit_cap=0.0, use_rope=False, is_neox_style=False, config=config)
    lse.copy_(attn_logits[:, :, 0, f["Lv"]])


def _rope_config():
    """The tree's gfx950 tuning of mla_decode_rope (NVIDIA has none; _get_config() looks one up by
    arch_info.get_arch()); AMD launch options in it are dropped at launch off ROCm."""
    import json

    arch = upstream.device_arch() if upstream.on_rocm() else "gfx950"
    path = os.path.join(upstream.aiter_root(), "aiter", "ops", "triton", "configs", f"{arch}-MLA_DECODE_ROPE-DEFAULT.json")
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise Unsupported(f"{path}: {e}") from e



def sparse_mla(t, p):
    """docs/ops/sparse_mla.md. Every token is its own request (cu_seqlens_q = 0..T, max_seqlen_q 1,
    as AITER's op test feeds decode); its top-k converted to global slots (the kernel's note:
    "topk_indices index the KV cache, not block_table"), -1 where invalid."""
    ab.refuse_if_invalid()
    f, r, local, slots = checks.sparse_common(t, p)
    if f["fmt"] is not None:
        # Read at e4048607: the wrapper's interface is a bfloat16 KV ("KV: ... dtype bfloat16") and
        # neither it nor the kernel takes a kv scale; vLLM's fp8 sparse MLA on ROCm is AITER's HIP
        # mla_decode_fwd (py:rocm_aiter without ATTNCHECK_AITER_SRC).
        raise Unsupported("an fp8 cache: unified_attention_sparse_mla reads a bfloat16 KV and takes no kv scale")
    if IMPL == "torch_ref":
        return _sparse_mla_torch_ref(t, f, r, local)
    import torch

    fn = load("aiter.ops.triton.attention.unified_attention_sparse_mla", "unified_attention_sparse_mla")
    T = f["T"]
    q, out = torch.from_dlpack(t["q"]), torch.from_dlpack(t["out"])
    kv = torch.from_dlpack(t["kv_cache"]).unsqueeze(2)  # [num_blocks, P, 1, Lk]
    cu = torch.arange(T + 1, dtype=torch.int32, device=q.device)
    used = torch.ones(T, dtype=torch.int32, device=q.device)  # seqused_k: read by no kernel line
    fn(q, kv, out, cu, 1, used, 1, f["scale"], slots.to(torch.int32).contiguous().cuda(),
       torch.from_dlpack(t["block_table"]), f["Lv"])


def _sparse_mla_torch_ref(t, f, r, local):
    """AITER's reference_torch over every token as its own batch (s_q = 1): block table row of its
    request, cache_seqlens = one past its largest valid index, request-local indices (-1 invalid).
    It runs on CPU tensors (its masks are built on the default device); the cache blocks it reads
    are gathered into a compact copy."""
    import torch

    if t["q"].dtype_name != "bf16":
        raise Unsupported("reference_torch returns bf16: f16 cases are not comparable")
    fn = load("op_tests.triton_tests.attention.test_unified_attention_sparse_mla", "reference_torch")
    T, P = f["T"], f["P"]
    table = checks.host(t, "block_table").long()[r]  # [T, W]
    seqlens = (local.max(dim=1).values + 1).clamp(min=0)
    nblk = (seqlens + P - 1) // P
    W = int(nblk.max()) if T else 0
    cache = torch.from_dlpack(t["kv_cache"])
    blocks = sorted({int(b) for i in range(T) for b in table[i, : int(nblk[i])].tolist()})
    where = {b: j for j, b in enumerate(blocks)}
    compact = cache[torch.tensor(blocks, dtype=torch.long, device=cache.device)].cpu().unsqueeze(2) if blocks else \
        torch.zeros(0, P, 1, f["Lk"], dtype=torch.bfloat16)
    remap = torch.zeros(T, max(W, 1), dtype=torch.int32)
    for i in range(T):
        for j in range(int(nblk[i])):
            remap[i, j] = where[int(table[i, j])]
    q = torch.from_dlpack(t["q"]).cpu().unsqueeze(1)  # [T, 1, N, Lk]
    ref = fn(seqlens.to(torch.int32), remap, q, compact, f["Lv"], f["scale"], False, local.to(torch.int32).unsqueeze(1))
    torch.from_dlpack(t["out"]).copy_(ref[:, 0].to(torch.from_dlpack(t["out"]).device))



def indexer_logits_prefill(t, p):
    """docs/ops/indexer.md through fp8_mqa_logits (its logits, allocated by it, copied into the
    harness's view)."""
    ab.refuse_if_invalid()
    fmt, (q, kf, ks, w, ks_, ke, logits), H = checks.indexer_logits_prefill_args(t, p)
    if IMPL == "kernel":
        _expect_platform_fp8(fmt, "fp8_mqa_logits")
    import torch

    dt = _fp8_dtype(fmt)
    qv, kv = torch.from_dlpack(q).view(dt), torch.from_dlpack(kf).view(dt)
    args = [torch.from_dlpack(x) for x in (ks, w, ks_, ke)]
    if IMPL == "torch_ref":
        fn = load("op_tests.triton_tests.attention.test_fp8_mqa_logits", "ref_fp8_mqa_logits")
        # The reference takes the keys as values: the fp8 codes times their per-token scale, in fp32.
        k_values = kv.float() * args[0].unsqueeze(1)
        got, _ = fn(qv, k_values, args[1], args[2], args[3])
    else:
        if H & (H - 1):
            raise Unsupported(f"{H} heads: fp8_mqa_logits asserts a power-of-two head count")
        fn = load("aiter.ops.triton.attention.fp8_mqa_logits", "fp8_mqa_logits")
        got = fn(qv, kv, args[0], args[1], args[2], args[3])
    torch.from_dlpack(logits).copy_(got)


def indexer_logits_decode(t, p):
    """docs/ops/indexer.md through deepgemm_fp8_paged_mqa_logits as vLLM's ROCm path calls it
    (ChunkK 256, ChunkQ = the head count, KVBlockSize = the block size), written into the harness's
    logits."""
    ab.refuse_if_invalid()
    import torch

    fmt, (q, cache, w, lens, table, logits), (B, nn, H, D), chunk, (nb, bs) = checks.indexer_logits_decode_args(t, p)
    if IMPL == "torch_ref":
        raise Unsupported("op_tests/triton_tests/attention has no torch reference of the paged MQA logits")
    _expect_platform_fp8(fmt, "deepgemm_fp8_paged_mqa_logits")
    if chunk != H:
        raise Unsupported(f"ChunkQ {chunk} < {H} heads: deepgemm_fp8_paged_mqa_logits' ChunkQ is the head count")
    if bs > 1 and not upstream.on_rocm():
        raise Unsupported(
            f"block size {bs} is the SHUFFLE layout, read with Preshuffle=True: pa_mqa_logits.py asserts "
            "'Preshuffle mode is only supported on gluon kernel' and its Gluon kernels are AMD-only"
        )
    checks.packed_pages(cache, "deepgemm_fp8_paged_mqa_logits (kv_cache.view(-1, KVBlockSize * index_dim))")
    if table.shape[0] > 1 and not (table.strides[0] == table.shape[1] and (table.shape[1] <= 1 or table.strides[1] == 1)):
        raise Unsupported(f"block_table strides {table.strides}: the kernel reads kv_indices + batch * max_blk_len + i")
    if logits.shape[1] > 1 and logits.strides[1] != 1:
        raise Unsupported("logits must have a unit column stride")
    fn = load("aiter.ops.triton.attention.pa_mqa_logits", "deepgemm_fp8_paged_mqa_logits")
    dt = _fp8_dtype(fmt)
    fn(torch.from_dlpack(q).view(dt), torch.from_dlpack(cache).unsqueeze(2), torch.from_dlpack(w),
       torch.from_dlpack(logits), torch.from_dlpack(lens), torch.from_dlpack(table), logits.shape[1],
       Preshuffle=bs > 1, KVBlockSize=bs, ChunkK=256, WavePerEU=2)


# The calls the entries make, for `attncheck repro --export pytest` (attncheck_bridge.Export): the
# same host-side preparation, written over the exported test's tensors.
SPARSE_EXPORT = ab.Export(
    module="aiter.ops.triton.attention.unified_attention_sparse_mla", function="unified_attention_sparse_mla",
    setup=[
        "dev = t['q'].device; T = t['q'].shape[0]; P = t['kv_cache'].shape[1]",
        "table = t['block_table'].long(); r = t['req_id_per_token'].long(); tok = t['topk_indices'].long()",
        "W = table.shape[1]; blk = torch.where(tok >= 0, tok // P, torch.full_like(tok, -1))",
        "ok = (tok >= 0) & (blk < W); page = table[r.unsqueeze(1).expand_as(tok), blk.clamp(0, W - 1)]",
        "slots = torch.where(ok, page * P + tok % P, torch.full_like(tok, -1)).to(torch.int32).contiguous()",
        "cu = torch.arange(T + 1, dtype=torch.int32, device=dev); used = torch.ones(T, dtype=torch.int32, device=dev)",
    ],
    args=["t['q']", "t['kv_cache'].unsqueeze(2)", "t['out']", "cu", "1", "used", "1", "float(p['scale'])", "slots",
          "t['block_table']", "t['out'].shape[2]"])
MLA_EXPORT = ab.Export(
    module="aiter.ops.triton.attention.mla_decode", function="decode_attention_fwd",
    setup=[
        "dev = t['q'].device; T, N, Lk = t['q'].shape; Lv = t['out'].shape[2]; P = t['kv_cache'].shape[1]",
        "lens = t['seq_lens'].long().cpu(); starts = t['query_start_loc'].long().cpu(); qlens = starts[1:] - starts[:-1]",
        "req = torch.repeat_interleave(torch.arange(lens.shape[0]), qlens); pos = torch.arange(T) - starts[req]",
        "causal = lens[req] - qlens[req] + pos + 1",
        "table = t['block_table']",
        "req_to_token = table if bool((qlens == 1).all()) and T == table.shape[0] else "
        "table.cpu()[req].to(torch.int32).contiguous().to(dev)",
        "s = int(p.get('num_kv_splits', 0) or 0); S = s or max(1, min(16, -(-int(causal.max() if T else 1) // 256)))",
        "fp8 = t['kv_cache'].dtype == torch.uint8",
        "kv = t['kv_cache'].view(getattr(torch, 'float8_' + p['fp8_format'])) if fp8 else t['kv_cache']",
        "k_buffer = kv.view(-1, 1, Lk); v_buffer = k_buffer[..., :Lv]",
        "attn_logits = torch.full((T, N, S, Lv + 1), float('nan'), dtype=torch.float32, device=dev)",
        "scale = torch.tensor([float(p.get('kv_scale', 1.0))], dtype=torch.float32, device=dev)",
        "extra = {'k_scale': scale, 'v_scale': scale} if fp8 else {}",
    ],
    args=["t['q']", "k_buffer", "v_buffer", "t['out']", "t['lse']", "req_to_token", "causal.to(torch.int32).to(dev)",
          "attn_logits", "S", "float(p['scale'])"],
    kwargs={"page_size": "P", "logit_cap": "0.0", "**": "extra"})


def register(adapter):
    """Adds the entries to ``adapter``."""
    kernel = IMPL == "kernel"
    adapter.entry("mla_decode", MLA_CONTRACT, export=MLA_EXPORT if kernel and MLA_VARIANT == "decode" else None)(mla_decode)
    adapter.entry("sparse_mla", SPARSE_CONTRACT, export=SPARSE_EXPORT if kernel else None,
                  partial=SPARSE_PARTIAL)(sparse_mla)
    adapter.add("indexer_logits_prefill", indexer_logits_prefill)
    adapter.add("indexer_logits_decode", indexer_logits_decode, partial=LOGITS_DECODE_PARTIAL)
    return adapter


def adapter():
    """A new adapter holding the entries."""
    return register(ab.Adapter(name=NAME, device="cuda"))
