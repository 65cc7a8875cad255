"""Stand-in for deepgemm_fp8_paged_mqa_logits of aiter/ops/triton/attention/pa_mqa_logits.py.

q_fp8 [B, next_n, H, D] (any strides but a unit d stride), kv_cache [num_blocks, KVBlockSize, 1,
D + 4] bytes viewed as (num_blocks, KVBlockSize * (D + 4)) -- a view, so pages must be contiguous
-- with a page's values first (NORMAL t * D + d, or the 16x16 MFMA tiles with Preshuffle) and its
fp32 scales after them; context_lens [B]; kv_indices [B, max_block_len] read as rows of
max_block_len; out_logits written through its row stride. Row r = b * next_n + n sees positions
p <= context_lens[b] - next_n + n; the stand-in writes -inf at every other position below
max_model_len (what attncheck's contract asks; whether the kernel writes the masked positions is
what the harness checks on the GPU).
"""

import numpy as np

from ...._standin import HostTensor, check, platform_fp8


def deepgemm_fp8_paged_mqa_logits(
    q_fp8,
    kv_cache,
    weights,
    out_logits,
    context_lens,
    kv_indices,
    max_model_len,
    Preshuffle=False,
    KVBlockSize=1,
    ChunkK=256,
    TotalCuCount=None,
    WavePerEU=2,
    VarCtxSchedule=None,
):
    B, next_n, H, D = q_fp8.shape
    nb, bs, one, index_dim = kv_cache.shape
    check(one == 1 and index_dim == D + 4, f"stand-in: kv_cache must be [num_blocks, block_size, 1, {D + 4}], got {kv_cache.shape}")
    check(ChunkK % KVBlockSize == 0 or KVBlockSize % ChunkK == 0, "assert ChunkK % KVBlockSize == 0 or KVBlockSize % ChunkK == 0")
    check(bs == KVBlockSize, "assert block_Size == KVBlockSize")
    if Preshuffle:
        check(KVBlockSize % 16 == 0, f"Preshuffle mode only supports KVBlockSize aligned to 16. Got KVBlockSize={KVBlockSize}")
    pages = kv_cache.view(-1, KVBlockSize * index_dim)  # raises where torch's view would
    check(q_fp8.dtype == platform_fp8(), f"stand-in: q is {q_fp8.dtype}; the kernel reads {platform_fp8()}")
    check(q_fp8.stride(3) == 1, "stand-in: unit d stride")
    check(kv_indices.stride(1) == 1 and (B <= 1 or kv_indices.stride(0) == kv_indices.size(1)), f"stand-in: kv_indices strides {kv_indices.stride()}: read as rows of max_block_len")
    check(out_logits.dtype == "f32" and out_logits.stride(1) == 1, "stand-in: fp32 logits with a unit column stride")
    check(out_logits.shape[0] == B * next_n and out_logits.shape[1] >= max_model_len, "stand-in: out_logits [B * next_n, >= max_model_len]")
    raw = pages.arr
    q = q_fp8.values()
    w = weights.values()
    table = kv_indices.arr
    d = np.arange(D)
    for b in range(B):
        L = int(context_lens.arr[b])
        for n in range(next_n):
            r = b * next_n + n
            limit = min(max(L - next_n + n + 1, 0), max_model_len)
            row = np.full(max_model_len, -np.inf)
            for p in range(limit):
                blk = int(table[b, p // bs])
                check(0 <= blk < nb, f"stand-in: block {blk} outside the cache")
                t = p % bs
                if Preshuffle:
                    off = (t // 16) * (16 * D) + (d // 16) * 256 + (t % 16) * 16 + d % 16
                else:
                    off = t * D + d
                kvals = raw[blk, off].astype(np.uint8)
                kf = HostTensor(kvals, platform_fp8()).values()
                so = bs * D + 4 * t
                sc = float(np.frombuffer(raw[blk, so : so + 4].tobytes(), np.float32)[0])
                dots = q[b, n] @ kf * sc
                row[p] = float(np.sum(w[r] * np.maximum(dots, 0.0)))
            out_logits.store(row.astype(np.float32), (r, slice(0, max_model_len)))
