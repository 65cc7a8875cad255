"""vllm_triton: vLLM's Triton kernels, judged by attncheck (device "cuda"; docs/adapters/vllm.md).

    attncheck run --tier quick --op decode_attention --kernels py:vllm_triton

Entries, each calling the unmodified vLLM function on the harness's buffers (``torch.from_dlpack``:
zero-copy views with their strides), so every byte the function writes or must not write is checked:

=================  ==================================================================================
entry              vLLM function (file)
=================  ==================================================================================
kv_cache_write     ``triton_reshape_and_cache_flash`` (v1/attention/ops/triton_reshape_and_cache_flash.py)
decode_attention   ``decode_attention_fwd`` (v1/attention/ops/triton_decode_attention.py)
kv_gather          ``cp_mha_gather_cache`` (v1/attention/backends/rocm_aiter_fa.py)
indexer_k_cache    ``indexer_k_quant_and_cache_triton`` (v1/attention/ops/rocm_aiter_mla_sparse.py)
indexer_gather     ``cp_gather_indexer_k_quant_cache_triton`` (same file)
=================  ==================================================================================

Every entry first asks the op whether the case is invalid (``ab.refuse_if_invalid()``: heads not
a multiple of kv_heads, the indexer cache's block size and page stride rules, ...; docs/bridge.md
"Validity") and refuses with the op's reason; the adapter does not re-code those rules. What each
entry declines (``Unsupported``: the function does not serve that configuration) and refuses
(``Refuse``: arguments malformed under docs/ops/*.md "Refusals") is said at the entry. Declines never mean "the kernel got it wrong": a function that accepts a configuration
through its interface and computes it wrongly is called, and attncheck reports what it computed.

Where vLLM comes from (``_load``), first match wins:

- ``ATTNCHECK_VLLM_SRC=<dir>``, exclusively (a bisect must never fall back to another vLLM):
  a full checkout (``<dir>/vllm/__init__.py`` exists) is imported normally with ``<dir>`` first on
  ``sys.path``; if that import fails (vLLM's dependencies or compiled extensions missing), or the
  directory is a *partial tree* holding only some files at their repository paths, the kernel file
  is loaded from the tree by attncheck_bridge.upstream: the pure-Python ``vllm.*`` modules it imports
  are executed from the tree too, and only what cannot load is stood in (a compiled extension, a
  file the tree lacks, a module whose execution fails), each named on stderr;
- an installed ``vllm``;
- ``ATTNCHECK_VLLM_FILE=<path of triton_reshape_and_cache_flash.py>`` (kv_cache_write only): that
  one file, every ``vllm.*`` module stood in.

Stand-ins are permissive (import, subclass, subscript, call, decorate) so module-level code runs;
using one as a value raises ``StandInUsed``, an Unsupported naming the stood-in module and why it
is one. Platform probes answer for this device (attncheck_bridge.upstream.VLLM_PROBES):

- ``vllm.platforms.current_platform``: ``is_rocm()`` (``torch.version.hip`` is set), ``is_cuda()``,
  ``is_cuda_alike()``, ``is_xpu()``/``is_cpu()``/``is_tpu()`` (False: the adapter runs on a torch GPU),
  ``is_fp8_fnuz()`` (ROCm on gfx94x), ``fp8_dtype()`` (e4m3fnuz there, e4m3fn elsewhere),
  ``get_device_capability()``/``has_device_capability()`` (torch's), ``device_type`` ("cuda");
  other attributes are stand-ins;
- ``vllm.platforms.rocm``: ``_ON_GFX9``, ``_ON_GFX942``, ``_ON_GFX950`` from the device's
  ``gcnArchName`` (False off ROCm);
- ``vllm.triton_utils``: ``tl``, ``triton`` (the installed Triton), ``HAS_TRITON``;
- ``vllm.logger.init_logger``: a ``logging`` logger with vLLM's ``*_once`` methods (vLLM's own
  configures the process's logging at import).

rocm_aiter_fa.py defines the gather only ``if current_platform.is_rocm()``. Off ROCm the adapter
executes that file a second time with ``is_rocm()`` answering True for that file's own import of
``current_platform`` (every other platform answer stays real; nothing else sees the change): the
Triton kernel itself is portable, and this is how its NVIDIA runs are made (the load message says so).
"""

import inspect
import os
import sys

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported, upstream
from attncheck_bridge import adapter_checks as checks
from attncheck_bridge.adapter_checks import VLLM_INDEXER_HEAD_DIM as _HEAD_DIM

# Copies and fp8 quantization are exact ops: no arithmetic contract applies to kv_cache_write,
# kv_gather and the indexer entries. decode_attention declares its own (at the entry).
ADAPTER = ab.Adapter(name="vllm_triton", device="cuda")


# ------------------------------------------------------------------------------------------------
# Where each entry's function lives: (module name, repository path, function), older paths after.

_KERNELS = {
    "kv_cache_write": [
        ("vllm.attention.ops.triton_reshape_and_cache_flash",
         "vllm/attention/ops/triton_reshape_and_cache_flash.py", "triton_reshape_and_cache_flash"),
        ("vllm.v1.attention.ops.triton_reshape_and_cache_flash",
         "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py", "triton_reshape_and_cache_flash"),
    ],
    "decode_attention": [
        ("vllm.v1.attention.ops.triton_decode_attention",
         "vllm/v1/attention/ops/triton_decode_attention.py", "decode_attention_fwd"),
        ("vllm.attention.ops.triton_decode_attention",
         "vllm/attention/ops/triton_decode_attention.py", "decode_attention_fwd"),
    ],
    "kv_gather": [
        ("vllm.v1.attention.backends.rocm_aiter_fa",
         "vllm/v1/attention/backends/rocm_aiter_fa.py", "cp_mha_gather_cache"),
    ],
    "indexer_k_cache": [
        ("vllm.v1.attention.ops.rocm_aiter_mla_sparse",
         "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py", "indexer_k_quant_and_cache_triton"),
    ],
    "indexer_gather": [
        ("vllm.v1.attention.ops.rocm_aiter_mla_sparse",
         "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py", "cp_gather_indexer_k_quant_cache_triton"),
    ],
}

_loaded = {}  # entry -> (function, module, description)

# Kept for callers and tests that name it here; it lives in attncheck_bridge.upstream.
StandInUsed = upstream.StandInUsed


def source(entry="kv_cache_write"):
    """Where ``entry``'s function was loaded from (after its first call), or None."""
    got = _loaded.get(entry)
    return got[2] if got else None


def _load(entry):
    """(function, module, description) of ``entry`` (attncheck_bridge.upstream.vllm_load: the
    sources above); Unsupported with the reason when vLLM cannot give it."""
    if entry not in _loaded:
        _loaded[entry] = upstream.vllm_load(_KERNELS[entry], single_file=entry == "kv_cache_write")
        # The bridge points sys.stdout at stderr; say it on stderr in any case (worker logs).
        print(f"vllm_triton: {entry} <- {_loaded[entry][2]}", file=sys.stderr)
    return _loaded[entry]


# ------------------------------------------------------------------------------------------------
# Shared argument checks.


# ------------------------------------------------------------------------------------------------
# kv_cache_write (docs/ops/kv_cache_write.md)


@ADAPTER.entry("kv_cache_write")
def kv_cache_write(t, p):
    """Declines SHUFFLE caches (``reshape_and_cache_shuffle``'s), caches whose heads are not
    contiguous within a slot (the function asserts ``key_cache.stride(2) == head_size``: padded and
    packed caches), a value cache with other block/page strides than the key cache's (it addresses
    both with the key cache's), key/value rows whose heads and dims are not one run, and an fp8
    format other than the platform's."""
    ab.refuse_if_invalid()
    a = ab.kv_cache_write_args(t, p)
    key, value, kc, vc, slots = a.key, a.value, a.key_cache, a.value_cache, a.slot_mapping
    ks, vs, kv_dtype = a.k_scale, a.v_scale, a.kv_dtype
    if a.layout == "SHUFFLE":
        raise Unsupported("SHUFFLE caches: triton_reshape_and_cache_flash writes NHD caches only")
    fmt = checks.vllm_fp8_format(p, required=True) if kv_dtype == "fp8" else None
    for c in (kc, vc):
        ab.expect_ndim(c, 4)
    if kc.shape != vc.shape:
        raise Refuse(f"key_cache {kc.shape} and value_cache {vc.shape} differ")
    nb, P, H, D = kc.shape
    T = slots.shape[0]
    for x in (key, value):
        if x.ndim != 3 or x.shape != (T, H, D):
            raise Refuse(f"'{x.name}' {x.shape} is not [T={T}, Hkv={H}, D={D}]")

    # What the vLLM function can address (it takes no other strides).
    for c in (kc, vc):
        if c.strides[3] != 1 or c.strides[2] != D:
            raise Unsupported(
                f"'{c.name}' strides {c.strides}: the writer needs heads contiguous within a slot "
                f"(stride(2) == head_size = {D}, stride(3) == 1)"
            )
    if vc.strides[:2] != kc.strides[:2]:
        raise Unsupported(
            f"value_cache block/page strides {vc.strides[:2]} differ from key_cache's "
            f"{kc.strides[:2]}: the writer addresses both caches with the key cache's"
        )
    for x in (key, value):
        if x.strides[2] != 1 or x.strides[1] != D:
            raise Unsupported(f"'{x.name}' strides {x.strides}: each token's heads and dims must be one run")
    if slots.shape[0] > 1 and slots.strides[0] != 1:
        raise Unsupported("slot_mapping must be contiguous")

    writer = _load("kv_cache_write")[0]
    import torch

    if fmt is not None:
        checks.vllm_expect_platform_fp8(fmt)
    key_t, value_t = torch.from_dlpack(key), torch.from_dlpack(value)
    kc_t = ab.as_torch(kc, fmt) if fmt else torch.from_dlpack(kc)
    vc_t = ab.as_torch(vc, fmt) if fmt else torch.from_dlpack(vc)
    if T == 0 or nb == 0:
        return
    writer(key_t, value_t, kc_t, vc_t, torch.from_dlpack(slots), kv_dtype,
           torch.from_dlpack(ks), torch.from_dlpack(vs))


@ADAPTER.entry("kv_cache_write_pertoken_quant")
def kv_cache_write_pertoken_quant(t, p):
    """vLLM has no Triton per-token-quant writer: the variant is AITER's
    ``reshape_and_cache_with_pertoken_quant`` (py:rocm_aiter). Declared so that a run over the
    kv_cache_write family reports these cases as not served instead of as a missing entry."""
    ab.refuse_if_invalid()
    raise Unsupported(
        "vLLM's Triton writers quantize with one scale per tensor; the per-token-quant writer is "
        "AITER's reshape_and_cache_with_pertoken_quant (py:rocm_aiter)"
    )


# ------------------------------------------------------------------------------------------------
# decode_attention (docs/ops/decode_attention.md)

# How decode_attention_fwd computes, by path:
# - kv_group_num == 1 (MHA, _fwd_kernel_stage1): ``tl.sum(q[None, :] * k, 1)`` multiplies q and k
#   in the 16-bit input type, and tl.sum keeps a float input's element type (Triton's
#   _pick_sum_dtype widens only integers), so the sum is taken in it too: worse than
#   qk-products-in-input-type, which no contract name covers. p stays fp32 (p * v is fp32).
# - kv_group_num > 1 (GQA/MQA/MLA, _fwd_grouped_kernel_stage1): ``tl.dot(q, k)`` accumulates exact
#   products in fp32, and ``tl.dot(p.to(v.dtype), v)`` rounds p to the 16-bit type before P.V.
# - fp8 caches (revisions with k_scale): the MHA path rounds k * k_scale and v * v_scale to the
#   16-bit type before using them; the grouped path widens the codes exactly and folds the scales
#   into the scores and the output.
# The entry serves both paths, so it declares both deviations.
DECODE_CONTRACT = "qk-products-in-input-type+p-in-input-type"


# Invariance (docs/verification.md "Invariance"): decode_attention_fwd launches one program per
# (request, head group, split) (grid = (batch, heads, num_kv_splits)); a program reads only its
# request's row of req_to_token, its b_seq_len and its pages, takes its split bounds from its own
# length and the num_kv_splits it is given, and reduces its tokens in order; page ids only form
# addresses. So it is batch-invariant and page-order-invariant bitwise (measured on an H100: 94 of
# 94 quick cases each, docs/results.md), but not split-invariant (the split count changes the
# reduction). vLLM's backends choose num_kv_splits per batch; this entry passes the case's, so the
# declaration is the kernel's, not the backend's. ATTNCHECK_VLLM_DECODE_PROPERTIES (names of
# ab.PROPERTIES, comma-separated; empty: none) replaces it for an experiment.
DECODE_PROPERTIES = ab.property_names(
    os.environ.get("ATTNCHECK_VLLM_DECODE_PROPERTIES", "batch-invariant,page-order-invariant"))


# The call decode_attention() makes, for `attncheck repro --export pytest` (attncheck_bridge.Export):
# fp8 caches viewed as the platform's torch fp8 dtype, the NaN-filled split partials, is_mla and the
# scales only where the revision takes them.
_DECODE_EXPORT = ab.Export(
    module=[m for m, _, _ in _KERNELS["decode_attention"]], function="decode_attention_fwd",
    setup=[
        "fp8 = getattr(torch, 'float8_' + p['fp8_format']) if 'fp8_format' in p else None",
        "k = t['k_buffer'].view(fp8) if fp8 is not None else t['k_buffer']",
        "v = t['v_buffer'].view(fp8) if fp8 is not None else t['v_buffer']",
        "B, Hq, Lv = t['o'].shape",
        "logits = torch.full((B, Hq, p['num_kv_splits'], Lv + 1), float('nan'), "
        "dtype=torch.float32, device=t['q'].device)",
        "takes = inspect.signature(fn).parameters",
        "extra = {'is_mla': p['is_mla']} if 'is_mla' in takes else {}",
        "if fp8 is not None: extra.update(k_scale=torch.tensor([p['k_scale']], "
        "dtype=torch.float32, device=t['q'].device), v_scale=torch.tensor([p['v_scale']], "
        "dtype=torch.float32, device=t['q'].device))",
    ],
    args=["t['q']", "k", "v", "t['o']", "t['lse']", "t['req_to_token']", "t['b_seq_len']", "logits",
          "p['num_kv_splits']", "p['sm_scale']"],
    kwargs={"page_size": "p['page_size']", "logit_cap": "p['logit_cap']", "**": "extra"})


# graph_capturable: decode_attention_fwd reads b_seq_len and req_to_token only inside its Triton
# kernels (tl.load(B_Seqlen + cur_batch) in stage 1 and 2) and sizes its grids from shapes and
# num_kv_splits, as vLLM's Triton backend captures it in CUDA graphs; this entry reads no argument
# contents on the host either (attn_logits is allocated from shapes).
@ADAPTER.entry("decode_attention", contract=DECODE_CONTRACT, properties=DECODE_PROPERTIES,
               export=_DECODE_EXPORT, graph_capturable=True)
def decode_attention(t, p):
    """decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits,
    num_kv_splits, sm_scale, page_size, logit_cap[, k_scale, v_scale], is_mla); attn_logits, the
    [B, Hq, S, Lv + 1] fp32 split partials, is allocated here and NaN-filled before every call.

    Declines (the function cannot address it): a page table or b_seq_len whose last stride is not 1
    (it reads row b at b * stride(0) + column), lse whose head stride is not 1 (stage 2 writes
    lse + b * stride(0) + h), a 4-D cache whose page stride is not page_size x token stride when
    the revision addresses pages as PAGE_SIZE x token stride (no ``_page_stride``: cross-layer
    views), fp8 caches when the revision takes no k_scale/v_scale, an fp8 format other than the
    platform's, and is_mla when the revision has no is_mla."""
    ab.refuse_if_invalid()
    c = checks.decode_attention_args(t, p)
    q, kb, vb, table, lens, o, lse = (c[n] for n in ("q", "kb", "vb", "table", "lens", "o", "lse"))
    if table.strides[1] != 1:
        raise Unsupported(f"'req_to_token' strides {table.strides}: the kernel reads b * stride(0) + column")
    if lens.shape[0] > 1 and lens.strides[0] != 1:
        raise Unsupported("'b_seq_len' must be contiguous (the kernel reads b_seq_len + b)")
    if lse.shape[1] > 1 and lse.strides[1] != 1:
        raise Unsupported(f"'lse' strides {lse.strides}: stage 2 writes lse + b * stride(0) + h")

    fn, mod = _load("decode_attention")[:2]
    params = inspect.signature(fn).parameters
    fp8 = c["fmt"] is not None
    if fp8 and "k_scale" not in params:
        raise Unsupported("fp8 caches: this revision's decode_attention_fwd takes no k_scale/v_scale")
    if c["is_mla"] and "is_mla" not in params:
        raise Unsupported("is_mla: this revision's decode_attention_fwd has no is_mla")
    if kb.ndim == 4 and not hasattr(mod, "_page_stride"):
        for x in (kb, vb):
            if x.strides[0] != c["P"] * x.strides[1]:
                raise Unsupported(
                    f"'{x.name}' page stride {x.strides[0]} is not page_size x token stride "
                    f"({c['P']} x {x.strides[1]}): this revision addresses pages as "
                    "PAGE_SIZE * stride(-3) (no _page_stride)"
                )
    import torch

    if fp8:
        checks.vllm_expect_platform_fp8(c["fmt"])
    q_t, o_t, lse_t = torch.from_dlpack(q), torch.from_dlpack(o), torch.from_dlpack(lse)
    k_t = ab.as_torch(kb, c["fmt"]) if fp8 else torch.from_dlpack(kb)
    v_t = ab.as_torch(vb, c["fmt"]) if fp8 else torch.from_dlpack(vb)
    logits = torch.full((c["B"], c["Hq"], c["S"], c["Lv"] + 1), float("nan"), dtype=torch.float32,
                        device=q_t.device)
    kwargs = {"page_size": c["P"], "logit_cap": c["cap"]}
    if "is_mla" in params:
        kwargs["is_mla"] = c["is_mla"]
    if "k_scale" in params:
        # Device scalars filled by a kernel, as vLLM's attention layers hold them (_k_scale): a
        # tensor built from host values (torch.tensor(..., device=...), also the function's own
        # default when k_scale is None) is a host-to-device copy, which a CUDA graph capture
        # refuses. Without fp8 the kernel never reads them.
        for name in ("k_scale", "v_scale"):
            kwargs[name] = torch.full((1,), c[name] if fp8 else 1.0, dtype=torch.float32,
                                      device=q_t.device)
    fn(q_t, k_t, v_t, o_t, lse_t, torch.from_dlpack(table), torch.from_dlpack(lens), logits,
       c["S"], c["sm_scale"], **kwargs)


# ------------------------------------------------------------------------------------------------
# kv_gather (docs/ops/kv_gather.md)


# The call kv_gather() makes, for `attncheck repro --export pytest`: fp8 caches viewed as the case's
# torch fp8 type, SHUFFLE blocks handed over as the [nb, P, Hkv, D]-shaped view vLLM holds.
_GATHER_EXPORT = ab.Export(
    module=[m for m, _, _ in _KERNELS["kv_gather"]], function="cp_mha_gather_cache",
    setup=[
        "fp8 = getattr(torch, 'float8_' + p['fp8_format']) if p['dequant'] else None",
        "kc = t['key_cache'].view(fp8) if fp8 is not None else t['key_cache']",
        "vc = t['value_cache'].view(fp8) if fp8 is not None else t['value_cache']",
        "Hkv, D = t['key'].shape[1], t['key'].shape[2]",
        "if p['kv_cache_layout'] == 'SHUFFLE': P = kc.shape[3]; "
        "kc = kc.as_strided((kc.shape[0], P, Hkv, D), (kc.stride(0), Hkv * D, D, 1)); "
        "vc = vc.as_strided((vc.shape[0], P, Hkv, D), (vc.stride(0), Hkv * D, D, 1))",
    ],
    kwargs={"key_cache": "kc", "value_cache": "vc", "key": "t['key']", "value": "t['value']",
            "block_tables": "t['block_tables']", "k_scales": "t['k_scale']", "v_scales": "t['v_scale']",
            "cu_seqlens_kv": "t['cu_seqlens_kv']", "token_to_batch": "t['token_to_batch']",
            "seq_starts": "t['seq_starts']", "dequant": "p['dequant']",
            "kv_cache_layout": "p['kv_cache_layout']", "total_tokens": "p['total_tokens']"})


@ADAPTER.entry("kv_gather", export=_GATHER_EXPORT)
def kv_gather(t, p):
    """cp_mha_gather_cache(key_cache, value_cache, key, value, block_tables, k_scales, v_scales,
    cu_seqlens_kv, token_to_batch, seq_starts, dequant, kv_cache_layout, total_tokens).

    The caches go in as they are (NHD: any strides; the function reads or ignores them, which is
    what #37228 is about). SHUFFLE caches go in as vLLM holds them: an [nb, P, Hkv, D]-shaped view
    of the block's tile-ordered bytes (the function reinterprets each block as the tiles).

    Declines: a block table whose row stride is not its width (the function reads row b at
    b * block_tables.size(1)) or whose columns are strided; non-contiguous cu_seqlens_kv /
    token_to_batch / seq_starts; key/value whose tokens are not contiguous [Hkv, D] rows (written at
    t * Hkv * D); NHD caches with a non-unit last stride; SHUFFLE blocks that are not one contiguous
    run of tiles (the 4-D view cannot describe them); SHUFFLE with dequant and scales other than 1
    (the SHUFFLE path dequantizes with 1.0, as vLLM's SHUFFLE writer quantizes); head sizes the
    backend does not list (the kernel tiles a head with tl.arange(0, head_size)); and an fp8 format
    other than the platform's."""
    ab.refuse_if_invalid()
    c = checks.kv_gather_args(t, p)
    bt, key, value = c["bt"], c["key"], c["value"]
    Hkv, D, P, nb = c["Hkv"], c["D"], c["P"], c["nb"]
    if bt.strides[1] != 1 or (bt.shape[0] > 1 and bt.strides[0] != bt.shape[1]):
        raise Unsupported(
            f"'block_tables' strides {bt.strides}: cp_mha_gather_cache reads row b at "
            f"b * block_tables.size(1) = b * {bt.shape[1]}"
        )
    for x in (c["cu"], c["t2b"], c["starts"]):
        if x.shape[0] > 1 and x.strides[0] != 1:
            raise Unsupported(f"'{x.name}' must be contiguous (the kernel reads it at base + index)")
    for x in (key, value):
        if not checks.rows_contiguous(x):
            raise Unsupported(f"'{x.name}' strides {x.strides}: the kernel writes token t at t * Hkv * D")
    if c["layout"] == "NHD":
        for x in (c["kc"], c["vc"]):
            if x.strides[3] != 1:
                raise Unsupported(f"'{x.name}' strides {x.strides}: the kernel reads a head's D elements as one run")
    else:
        xw = c["kc"].shape[4]
        if c["kc"].strides[1:] != (P * D, P * xw, xw, 1) or c["vc"].strides[1:] != (P * D, D * xw, xw, 1):
            raise Unsupported(
                f"SHUFFLE strides {c['kc'].strides} / {c['vc'].strides}: the function reads each "
                "block as one contiguous run of tiles"
            )

    fn, mod = _load("kv_gather")[:2]
    sizes = _backend_head_sizes(mod)
    if D not in sizes:
        raise Unsupported(f"head size {D}: the kernel tiles a head with tl.arange(0, head_size); "
                          f"the backend supports {sizes}")
    import torch

    if c["dequant"]:
        checks.vllm_expect_platform_fp8(c["fmt"])
    as_cache = (lambda x: ab.as_torch(x, c["fmt"])) if c["dequant"] else torch.from_dlpack
    kc_t, vc_t = as_cache(c["kc"]), as_cache(c["vc"])
    ks_t, vs_t = torch.from_dlpack(c["ks"]), torch.from_dlpack(c["vs"])
    if c["layout"] == "SHUFFLE":
        if c["dequant"] and (float(ks_t[0]) != 1.0 or float(vs_t[0]) != 1.0):
            raise Unsupported(
                f"SHUFFLE with dequant and scales {float(ks_t[0])} / {float(vs_t[0])}: the SHUFFLE "
                "path multiplies by 1.0 (vLLM's SHUFFLE writer quantizes with scale 1)"
            )
        kc_t = kc_t.as_strided((nb, P, Hkv, D), (kc_t.stride(0), Hkv * D, D, 1))
        vc_t = vc_t.as_strided((nb, P, Hkv, D), (vc_t.stride(0), Hkv * D, D, 1))
    if c["total"] == 0:
        return
    fn(
        key_cache=kc_t, value_cache=vc_t, key=torch.from_dlpack(key), value=torch.from_dlpack(value),
        block_tables=torch.from_dlpack(bt), k_scales=ks_t, v_scales=vs_t,
        cu_seqlens_kv=torch.from_dlpack(c["cu"]), token_to_batch=torch.from_dlpack(c["t2b"]),
        seq_starts=torch.from_dlpack(c["starts"]), dequant=c["dequant"],
        kv_cache_layout=c["layout"], total_tokens=c["total"],
    )


def _backend_head_sizes(mod):
    """AiterFlashAttentionBackend.get_supported_head_sizes() where the revision has it, else the
    powers of two the kernel's tl.arange(0, head_size) can tile."""
    backend = getattr(mod, "AiterFlashAttentionBackend", None)
    try:
        sizes = backend.get_supported_head_sizes()
        if all(isinstance(s, int) for s in sizes):
            return list(sizes)
    except Exception:  # noqa: BLE001 - a revision without the method: powers of two
        pass
    return [1 << i for i in range(3, 11)]


# ------------------------------------------------------------------------------------------------
# indexer_k_cache, indexer_gather (docs/ops/indexer.md)

@ADAPTER.entry("indexer_k_cache")
def indexer_k_cache(t, p):
    """indexer_k_quant_and_cache_triton(k, kv_cache, slot_mapping, quant_block_size=128,
    scale_fmt="ue8m0"): ue8m0 (power-of-two) per-token scales, the layout chosen from the block
    size by the revision (#43781).

    Declines: k whose rows are not contiguous 128-element runs (the kernel reads token t at
    k + t * head_dim; vLLM hands it k_norm's contiguous output), a non-contiguous slot_mapping,
    quant_max other than the kernel's divisor (448 for e4m3fn, 224 for e4m3fnuz: 240 is AITER's HIP
    writer), and an fp8 format other than the platform's."""
    ab.refuse_if_invalid()
    k, slots, cache = ab.arg(t, "k"), ab.arg(t, "slot_mapping"), ab.arg(t, "kv_cache")
    fmt = checks.vllm_fp8_format(p, required=True)
    qmax = float(checks.param(p, "quant_max"))
    fp8_max = 448.0 if fmt == "e4m3fn" else 240.0
    if not 0 < qmax <= fp8_max:
        raise Refuse(f"quant_max {qmax} outside (0, {fp8_max}]")
    ab.expect_dtype(k, "bf16")
    ab.expect_ndim(k, 2)
    ab.expect_dtype(slots, "i64")
    ab.expect_ndim(slots, 1)
    if k.shape[1] != _HEAD_DIM or k.shape[0] < slots.shape[0]:
        raise Refuse(f"'k' {k.shape} is not [>= {slots.shape[0]}, {_HEAD_DIM}]")
    checks.indexer_cache_rows(cache)
    if k.strides != (_HEAD_DIM, 1) and k.shape[0] > 1:
        raise Unsupported(f"'k' strides {k.strides}: the kernel reads token t at k + t * {_HEAD_DIM}")
    if slots.shape[0] > 1 and slots.strides[0] != 1:
        raise Unsupported("'slot_mapping' must be contiguous")
    divisor = 448.0 if fmt == "e4m3fn" else 224.0
    if qmax != divisor:
        raise Unsupported(f"quant_max {qmax}: the Triton writer divides the amax by {divisor} for {fmt}")

    fn = _load("indexer_k_cache")[0]
    import torch

    checks.vllm_expect_platform_fp8(fmt)
    if slots.shape[0] == 0:
        return
    fn(torch.from_dlpack(k), torch.from_dlpack(cache), torch.from_dlpack(slots), _HEAD_DIM, "ue8m0")


@ADAPTER.entry("indexer_gather")
def indexer_gather(t, p):
    """cp_gather_indexer_k_quant_cache_triton(k_cache, k_fp8, k_fp8_scale, block_table, cu_seqlen,
    token_to_seq): token_to_seq (the request of every gathered row) is derived from cu_seq_lens
    as vLLM's metadata builder does. Bytes are copied, so the fp8 views (the platform's type on both
    sides) do not reinterpret anything.

    Declines: a block table with strided columns (the kernel reads b * stride(0) + column),
    non-contiguous cu_seq_lens / k_scale, and k_fp8 rows that are not contiguous (written at
    t * 128)."""
    ab.refuse_if_invalid()
    cache, table, cu = ab.arg(t, "kv_cache"), ab.arg(t, "block_table"), ab.arg(t, "cu_seq_lens")
    k_fp8, k_scale = ab.arg(t, "k_fp8"), ab.arg(t, "k_scale")
    checks.indexer_cache_rows(cache)
    ab.expect_dtype(table, "i32")
    ab.expect_ndim(table, 2)
    ab.expect_dtype(cu, "i32")
    ab.expect_ndim(cu, 1)
    ab.expect_dtype(k_fp8, "u8")
    ab.expect_ndim(k_fp8, 2)
    ab.expect_dtype(k_scale, "f32")
    ab.expect_ndim(k_scale, 1)
    R, N = table.shape[0], k_fp8.shape[0]
    if cu.shape[0] != R + 1 or k_fp8.shape[1] != _HEAD_DIM or k_scale.shape[0] != N:
        raise Refuse(f"'cu_seq_lens' {cu.shape} / 'k_fp8' {k_fp8.shape} / 'k_scale' {k_scale.shape} "
                     f"do not fit {R} requests of {_HEAD_DIM}-byte rows")
    if table.strides[1] != 1:
        raise Unsupported(f"'block_table' strides {table.strides}: the kernel reads b * stride(0) + column")
    for x in (cu, k_scale):
        if x.shape[0] > 1 and x.strides[0] != 1:
            raise Unsupported(f"'{x.name}' must be contiguous")
    if N > 1 and k_fp8.strides != (_HEAD_DIM, 1):
        raise Unsupported(f"'k_fp8' strides {k_fp8.strides}: the kernel writes row t at t * {_HEAD_DIM}")

    fn = _load("indexer_gather")[0]
    import torch

    fp8 = checks.vllm_platform_fp8()
    cu_t = torch.from_dlpack(cu)
    rows = (cu_t[1:] - cu_t[:-1]).to(torch.int64)
    token_to_seq = torch.repeat_interleave(torch.arange(R, dtype=torch.int32, device=cu_t.device), rows)
    if token_to_seq.numel() != N:
        raise Refuse(f"cu_seq_lens adds up to {token_to_seq.numel()} rows, k_fp8 has {N}")
    if N == 0:
        return
    fn(torch.from_dlpack(cache), torch.from_dlpack(k_fp8).view(fp8), torch.from_dlpack(k_scale),
       torch.from_dlpack(table), cu_t, token_to_seq)
