"""deepgemm: DeepGEMM's fp8 MQA-logits kernels (the sparse-attention indexer's scores), judged by
attncheck (device "cuda", SM90).

    attncheck run --tier quick --op indexer_logits_prefill --op indexer_logits_decode --kernels py:deepgemm

Entries (docs/ops/indexer.md, docs/adapters/deepgemm_flashmla.md):

- ``indexer_logits_prefill`` -> ``deep_gemm.fp8_mqa_logits(q, (k_fp8, k_scale), weights, ks, ke,
  clean_logits=True)``. DeepGEMM returns a new ``[M, N]`` view of a buffer with its own row stride;
  the adapter copies it into the harness's ``logits`` view.
- ``indexer_logits_decode`` -> ``deep_gemm.get_paged_mqa_logits_metadata`` +
  ``deep_gemm.fp8_paged_mqa_logits(..., clean_logits=False)``. DeepGEMM takes one context length
  per row (``[B, next_n]``, row ``n`` of request ``b`` sees ``L_b - next_n + n + 1`` keys) and
  leaves every column at or past that end as it happens to be (it cannot clean 2-D context
  lengths); the adapter copies the columns before each row's end and writes ``-inf`` after it,
  the op's contract (what vLLM's top-k consumer assumes instead).

Everything the SM90 kernels do not serve is declined (``Unsupported``) with DeepGEMM's reason:
e4m3fnuz, head counts other than 32 and 64, next_n other than 1 and 2, cache block sizes other
than 64, non-contiguous q / k / weights, TMA-misaligned buffers, and the cache layout: attncheck's
block-size-64 pages are SHUFFLE (MFMA-preshuffled, docs/ops/indexer.md "Cache pages") while
DeepGEMM reads row-major pages. ``ATTNCHECK_DEEPGEMM_UNSHUFFLE=1`` re-lays such pages out row-major
into a scratch cache before the call (then the run checks DeepGEMM's paged read, not its handling
of the harness's layout; the library string says so). Configurations the op calls invalid (heads
outside [1, 128], the cache's block size and page stride rules, chunk_q) are the op's answer, asked
first (``ab.refuse_if_invalid()``, docs/bridge.md "Validity") and refused with its reason; malformed
arguments are refused (``Refuse``) with theirs.

The mapping (``plan_prefill``, ``plan_decode``, ``decode_row_ends``, ``normal_from_shuffle``) is
plain Python/NumPy and runs without torch; only ``_execute_*`` import torch and ``deep_gemm``.
``deep_gemm`` comes from ``ATTNCHECK_DEEPGEMM_SRC`` (an in-place build, put first on
``sys.path``) or an installed package.
"""

import os

import attncheck_bridge as ab
from attncheck_bridge import Refuse, Unsupported

UNSHUFFLE = os.environ.get("ATTNCHECK_DEEPGEMM_UNSHUFFLE", "") not in ("", "0", "off")

ADAPTER = ab.Adapter(name="deepgemm+unshuffle" if UNSHUFFLE else "deepgemm", device="cuda")

HEAD_DIM = 128
TOKEN_BYTES = HEAD_DIM + 4  # fp8 values + one fp32 scale per token (block-flat pages)
SM90_HEADS = (32, 64)  # csrc/apis/attention.hpp: fp8 q on arch 9 takes 32 or 64 heads
SM90_BLOCK_KV = 64  # csrc/apis/attention.hpp: paged cache on arch 9 has block_kv 64
SM90_NEXT_N = (1, 2)  # csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp (paged)
TMA_ALIGN = 16  # bytes: cuTensorMapEncodeTiled needs 16-byte aligned addresses and strides

_deep_gemm = None


_arg = ab.arg


def _fp8_format(p):
    fmt = p.get("fp8_format")
    if fmt not in ("e4m3fn", "e4m3fnuz"):
        raise Refuse(f"fp8_format must be e4m3fn or e4m3fnuz, got {fmt!r}")
    return fmt


def _shape(x, *want):
    if x.shape != tuple(want):
        raise Refuse(f"'{x.name}' is {list(x.shape)}, expected {list(want)}")


def _contiguous(x, why):
    if not x.is_contiguous():
        raise Unsupported(f"'{x.name}' strides {x.strides} (shape {list(x.shape)}) are not contiguous: {why}")


def _tma_aligned(x, outer_bytes=None):
    """DeepGEMM builds a TMA descriptor over x: its address and row stride must be 16-byte multiples."""
    if x.ptr % TMA_ALIGN:
        raise Unsupported(f"'{x.name}' starts {x.ptr % TMA_ALIGN} bytes past a 16-byte boundary: DeepGEMM loads it through TMA")
    if outer_bytes is not None and outer_bytes % TMA_ALIGN:
        raise Unsupported(f"'{x.name}' row stride {outer_bytes} B is not a multiple of 16: DeepGEMM loads it through TMA")


def _decline_fnuz(fmt):
    if fmt != "e4m3fn":
        raise Unsupported(f"fp8_format {fmt}: DeepGEMM takes torch.float8_e4m3fn only (csrc/apis/attention.hpp)")


def _decline_heads(H):
    if H not in SM90_HEADS:
        raise Unsupported(f"heads {H}: DeepGEMM's SM90 MQA-logits kernels take 32 or 64 heads (csrc/apis/attention.hpp)")


# ------------------------------------------------------------------------------------------------
# indexer_logits_prefill


def plan_prefill(t, p):
    """Validate an indexer_logits_prefill call; returns {M, H, N} or raises Refuse/Unsupported."""
    ab.refuse_if_invalid()
    names = ("q", "k_fp8", "k_scale", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "logits")
    q, k, ks, w, lo, hi, out = (_arg(t, n) for n in names)
    fmt = _fp8_format(p)
    for x, dt in ((q, "u8"), (k, "u8"), (ks, "f32"), (w, "f32"), (lo, "i32"), (hi, "i32"), (out, "f32")):
        ab.expect_dtype(x, dt)
    ab.expect_ndim(q, 3)
    M, H, D = q.shape
    if D != HEAD_DIM:
        raise Refuse(f"'q' head dim {D}, expected {HEAD_DIM}")
    ab.expect_ndim(k, 2)
    N = k.shape[0]
    _shape(k, N, HEAD_DIM)
    _shape(ks, N)
    _shape(w, M, H)
    _shape(lo, M)
    _shape(hi, M)
    _shape(out, M, N)
    if N > 0 and (k.strides[1] != 1 or (N > 1 and k.strides[0] % 4)):
        raise Refuse(f"'k_fp8' rows must be unit-stride and 4-byte aligned, strides {k.strides}")

    _decline_fnuz(fmt)
    _decline_heads(H)
    _contiguous(q, "fp8_mqa_logits asserts q.is_contiguous()")
    _contiguous(k, "fp8_mqa_logits asserts kv.is_contiguous()")
    _contiguous(ks, "fp8_mqa_logits asserts the kv scales are contiguous")
    # DeepGEMM checks only weights.stride(1) == 1 but builds the weights' TMA descriptor with
    # `num_heads` as the row stride (sm90_fp8_mqa_logits.hpp): a wider row would be misread.
    _contiguous(w, "DeepGEMM reads weights rows at a stride of num_heads")
    _contiguous(lo, "fp8_mqa_logits asserts cu_seq_len_k_start.is_contiguous()")
    _contiguous(hi, "fp8_mqa_logits asserts cu_seq_len_k_end.is_contiguous()")
    for x in (q, k, ks, w):
        _tma_aligned(x)
    return {"M": M, "H": H, "N": N}


def check_prefill_windows(ks, ke, N):
    """DeepGEMM reads the windows as uint32 and does not clamp them to [0, N] (the op does):
    decline windows the two would treat differently. ks, ke: integer sequences of the host."""
    for i, (a, b) in enumerate(zip(ks, ke)):
        a, b = int(a), int(b)
        if a < 0 or b > N or a > b:
            raise Unsupported(f"row {i}: window [{a}, {b}) is not inside [0, {N}]: DeepGEMM does not clamp windows")


@ADAPTER.entry("indexer_logits_prefill", contract="fp32-accumulate")
def indexer_logits_prefill(t, p):
    plan = plan_prefill(t, p)
    _execute_prefill(t, plan)


def _execute_prefill(t, plan):
    torch, dg = _load()
    lo, hi = torch.from_dlpack(t["cu_seqlen_ks"]), torch.from_dlpack(t["cu_seqlen_ke"])
    check_prefill_windows(lo.cpu().tolist(), hi.cpu().tolist(), plan["N"])
    out = torch.from_dlpack(t["logits"])
    if out.numel() == 0:
        return
    logits = dg.fp8_mqa_logits(
        ab.as_torch(t["q"], "e4m3fn"),
        (ab.as_torch(t["k_fp8"], "e4m3fn"), torch.from_dlpack(t["k_scale"])),
        torch.from_dlpack(t["weights"]),
        lo,
        hi,
        clean_logits=True,
    )
    out.copy_(logits)  # DeepGEMM allocates its own row stride; the harness's view has another


# ------------------------------------------------------------------------------------------------
# indexer_logits_decode


def plan_decode(t, p, unshuffle=None):
    """Validate an indexer_logits_decode call; returns {B, next_n, H, NB, BS, W, page_bytes,
    max_model_len, unshuffle} or raises Refuse/Unsupported."""
    ab.refuse_if_invalid()
    unshuffle = UNSHUFFLE if unshuffle is None else unshuffle
    names = ("q", "kv_cache", "weights", "context_lens", "block_table", "logits")
    q, cache, w, lens, table, out = (_arg(t, n) for n in names)
    fmt = _fp8_format(p)
    for x, dt in ((q, "u8"), (cache, "u8"), (w, "f32"), (lens, "i32"), (table, "i32"), (out, "f32")):
        ab.expect_dtype(x, dt)
    ab.expect_ndim(q, 4)
    B, next_n, H, D = q.shape
    ab.expect_ndim(cache, 3)
    NB, BS, width = cache.shape
    page_bytes = cache.strides[0]
    if D != HEAD_DIM or width != TOKEN_BYTES:
        raise Refuse(f"q head dim {D} / cache row {width}: expected {HEAD_DIM} / {TOKEN_BYTES}")
    if cache.strides[1:] != (TOKEN_BYTES, 1) or (NB > 1 and page_bytes < BS * TOKEN_BYTES):
        raise Refuse(f"'kv_cache' strides {cache.strides}: pages must be contiguous, stride(0) >= {BS * TOKEN_BYTES}")
    if next_n < 1:
        raise Refuse(f"next_n {next_n} < 1")
    _shape(w, B * next_n, H)
    _shape(lens, B)
    ab.expect_ndim(table, 2)
    if table.shape[0] != B:
        raise Refuse(f"'block_table' has {table.shape[0]} rows, context_lens {B}")
    ab.expect_ndim(out, 2)
    if out.shape[0] != B * next_n:
        raise Refuse(f"'logits' has {out.shape[0]} rows, expected B * next_n = {B * next_n}")
    max_model_len = out.shape[1]

    _decline_fnuz(fmt)
    _decline_heads(H)
    if next_n not in SM90_NEXT_N:
        raise Unsupported(f"next_n {next_n}: DeepGEMM's SM90 paged kernel takes next_n 1 or 2 (sm90_fp8_mqa_logits.hpp)")
    if BS != SM90_BLOCK_KV:
        raise Unsupported(f"block size {BS}: DeepGEMM's SM90 paged kernel takes block_kv 64 (csrc/apis/attention.hpp)")
    _tma_aligned(cache, page_bytes)
    _contiguous(q, "fp8_paged_mqa_logits asserts q.is_contiguous()")
    _contiguous(w, "fp8_paged_mqa_logits asserts weights.is_contiguous()")
    _contiguous(lens, "context lengths are passed as one contiguous int32 array")
    if table.shape[1] > 1 and table.strides[1] != 1:
        raise Unsupported(f"'block_table' strides {table.strides}: fp8_paged_mqa_logits asserts block_table.stride(1) == 1")
    for x in (q, w):
        _tma_aligned(x)
    if not unshuffle:  # last, so that it names only the cases DeepGEMM would otherwise serve
        raise Unsupported(
            "block size 64 pages are SHUFFLE (16x16 MFMA tiles, docs/ops/indexer.md 'Cache pages'); DeepGEMM "
            "reads row-major pages [64 x 128 fp8 | 64 fp32 scales] (set ATTNCHECK_DEEPGEMM_UNSHUFFLE=1 to re-lay them out)"
        )
    return {
        "B": B,
        "next_n": next_n,
        "H": H,
        "NB": NB,
        "BS": BS,
        "W": table.shape[1],
        "page_bytes": page_bytes,
        "max_model_len": max_model_len,
        "unshuffle": unshuffle,
    }


def decode_row_ends(context_lens, next_n, max_model_len):
    """Per-row key counts: row b*next_n + n sees positions p <= L_b - next_n + n, clamped to
    [0, max_model_len] (docs/ops/indexer.md "Logits"); DeepGEMM's 2-D context_lens."""
    return [[min(max(int(L) - next_n + n + 1, 0), max_model_len) for n in range(next_n)] for L in context_lens]


def normal_from_shuffle(block_size):
    """Byte index map of one page's value region: NORMAL byte t*128 + d of the re-laid-out page
    reads SHUFFLE byte (t//16)*2048 + (d//16)*256 + (t%16)*16 + d%16 (docs/ops/indexer.md)."""
    import numpy as np

    tok = np.arange(block_size, dtype=np.int64)[:, None]
    dim = np.arange(HEAD_DIM, dtype=np.int64)[None, :]
    src = (tok // 16) * 2048 + (dim // 16) * 256 + (tok % 16) * 16 + dim % 16
    return src.reshape(-1)


@ADAPTER.entry("indexer_logits_decode", contract="fp32-accumulate")
def indexer_logits_decode(t, p):
    plan = plan_decode(t, p)
    _execute_decode(t, plan)


def _execute_decode(t, plan):
    torch, dg = _load()
    nn, BS, W, L = plan["next_n"], plan["BS"], plan["W"], plan["max_model_len"]
    out = torch.from_dlpack(t["logits"])
    lens = torch.from_dlpack(t["context_lens"])
    ends = decode_row_ends(lens.cpu().tolist(), nn, L)
    for b, row in enumerate(ends):
        if -(-row[-1] // BS) > W:
            raise Unsupported(f"request {b} needs {-(-row[-1] // BS)} blocks, the table has {W} columns: DeepGEMM reads past it")
    if out.numel() == 0:
        return
    dev = out.device
    ctx2d = torch.tensor(ends, dtype=torch.int32, device=dev)
    cache = torch.from_dlpack(t["kv_cache"])
    if plan["unshuffle"]:
        cache = _unshuffled(torch, cache, BS)
    meta = dg.get_paged_mqa_logits_metadata(ctx2d, BS, dg.get_num_sms())
    logits = dg.fp8_paged_mqa_logits(
        ab.as_torch(t["q"], "e4m3fn"),
        cache.unsqueeze(2),  # [NB, BS, 1, 132]: DeepGEMM's fused fp8 + scale pages
        torch.from_dlpack(t["weights"]),
        ctx2d,
        torch.from_dlpack(t["block_table"]),
        meta,
        L,
        clean_logits=False,
    )
    # DeepGEMM writes whole 64-key blocks (and nothing past the last one it visits): keep each
    # row's first `end` columns, -inf after them.
    ends_t = ctx2d.reshape(-1, 1)
    cols = torch.arange(L, device=dev, dtype=torch.int32).reshape(1, -1)
    out.copy_(torch.where(cols < ends_t, logits, torch.full_like(logits, float("-inf"))))


def _unshuffled(torch, cache, BS):
    """A scratch cache with the harness cache's page stride whose pages hold the same values laid
    out row-major (NORMAL) and the same scales; padding bytes are zero (never read)."""
    NB, page_bytes = cache.shape[0], cache.stride(0)
    src = torch.as_tensor(normal_from_shuffle(BS), device=cache.device)
    pages = cache.as_strided((NB, BS * TOKEN_BYTES), (page_bytes, 1))
    scratch = torch.zeros(max(NB - 1, 0) * page_bytes + BS * TOKEN_BYTES, dtype=cache.dtype, device=cache.device)
    normal = scratch.as_strided((NB, BS * TOKEN_BYTES), (page_bytes, 1))
    normal[:, : BS * HEAD_DIM] = pages[:, : BS * HEAD_DIM].index_select(1, src)
    normal[:, BS * HEAD_DIM :] = pages[:, BS * HEAD_DIM :]
    return scratch.as_strided((NB, BS, TOKEN_BYTES), (page_bytes, TOKEN_BYTES, 1))


# ------------------------------------------------------------------------------------------------
# Loading DeepGEMM and the device check


def _load():
    """(torch, deep_gemm) after checking the device; raises Unsupported with the reason."""
    global _deep_gemm
    import torch

    if torch.version.hip is not None:
        raise Unsupported("DeepGEMM is a CUDA library; this torch is a ROCm build")
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        raise Unsupported(f"device sm_{major}{minor}: this adapter maps DeepGEMM's SM90 kernels (their head/block rules)")
    if _deep_gemm is None:
        _deep_gemm = ab.import_upstream("deep_gemm", "ATTNCHECK_DEEPGEMM_SRC", "build it (docs/adapters/deepgemm_flashmla.md)")
    return torch, _deep_gemm
