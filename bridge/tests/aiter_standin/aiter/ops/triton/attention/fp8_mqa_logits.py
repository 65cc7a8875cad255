"""Stand-in for aiter/ops/triton/attention/fp8_mqa_logits.py: fp8_mqa_logits(Q, KV, kv_scales,
weights, cu_starts, cu_ends, clean_logits=True) returns fp32 logits [seq_len, seq_len_kv] (a view
of a row-padded buffer it allocates): logit[i, j] = sum_h w[i, h] * relu(k_scale[j] * q[i, h] . k[j])
for cu_starts[i] <= j < cu_ends[i], -inf elsewhere. Asserts power-of-two heads and head size."""

import numpy as np

from ...._standin import HostTensor, check, platform_fp8


def fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True):
    M, H, D = Q.shape
    N = KV.shape[0]
    check(H & (H - 1) == 0, "num q. heads should be power of 2.")
    check(D & (D - 1) == 0, "head size should be power of 2.")
    for name, x in (("Q", Q), ("KV", KV)):
        check(x.dtype == platform_fp8(), f"stand-in: {name} is {x.dtype}; Triton's fp8 on this arch is {platform_fp8()}")
    q, k, s, w = Q.values(), KV.values(), kv_scales.values(), weights.values()
    aligned = -(-N // 256) * 256
    logits = HostTensor.empty((M, aligned), "f32", fill=-np.inf if clean_logits else None)[:, :N]
    dots = np.einsum("mhd,nd->mhn", q, k) * s[None, None, :]
    full = np.einsum("mh,mhn->mn", w, np.maximum(dots, 0.0))
    vals = np.full((M, N), -np.inf)
    for i in range(M):
        lo, hi = max(int(cu_starts.arr[i]), 0), min(int(cu_ends.arr[i]), N)
        vals[i, lo:hi] = full[i, lo:hi]
    logits.store(vals.astype(np.float32))
    return logits
