"""Stand-in for aiter.mla.mla_decode_fwd (absorbed MLA decode over a paged latent cache).

Follows the signature of aiter/mla.py and the checks of mla_decode_stage1_asm_fwd
(csrc/py_itfs_cu/asm_mla.cu): q contiguous, one kv head, bf16 or fp8 q, bf16 or fp8 kv, a kernel
that exists for (q dtype, kv dtype, heads, persistent, qlen) on the arch (hsa/<arch>/mla/mla_asm.csv,
decode rows), and the persistent path's head folding. The attention itself is computed in float64
from the paged cache the metadata describes and rounded once into o; a row with no key gets what
the split-KV path's Triton stage 2 computes for it (0 / 0).
"""

import numpy as np

from ._standin import FP8, HostTensor, StandinError, check, gfx, platform_fp8

# Decode rows (prefill 0, causal 1, no context-parallel variant) of hsa/<arch>/mla/mla_asm.csv:
# (q, kv, gqa, persistent, qSeqLen, lse).
_ASM_ROWS = {
    "gfx942": {
        ("bf16", "bf16", 128, 0, 0, 0),
        ("bf16", "bf16", 16, 1, 4, 0),
        ("bf16", "bf16", 16, 0, 1, 0),
        ("bf16", "bf16", 16, 0, 4, 0),
        ("bf16", "bf16", 16, 0, 8, 0),
        ("bf16", "fp8", 16, 1, 4, 0),
        ("fp8", "fp8", 16, 1, 1, 0),
        ("fp8", "fp8", 64, 1, 1, 0),
        ("fp8", "fp8", 64, 1, 1, 1),
        ("fp8", "fp8", 16, 1, 2, 0),
        ("fp8", "fp8", 16, 1, 4, 0),
        ("fp8", "fp8", 16, 0, 1, 0),
        ("fp8", "fp8", 16, 0, 2, 0),
        ("fp8", "fp8", 16, 0, 4, 0),
        ("fp8", "fp8", 128, 0, 0, 0),
        ("fp8", "fp8", 128, 1, 0, 0),
        ("bf16", "bf16", 32, 0, 0, 0),
        ("bf16", "bf16", 64, 0, 0, 0),
        ("bf16", "bf16", 8, 0, 1, 0),
        ("fp8", "fp8", 8, 0, 1, 0),
        ("bf16", "bf16", 8, 1, 2, 0),
    },
    "gfx950": {
        ("bf16", "bf16", 128, 0, 0, 0),
        ("bf16", "bf16", 16, 1, 4, 0),
        ("bf16", "bf16", 16, 1, 4, 1),
        ("bf16", "bf16", 16, 0, 1, 0),
        ("bf16", "bf16", 16, 0, 4, 0),
        ("bf16", "bf16", 16, 0, 8, 0),
        ("bf16", "fp8", 16, 1, 4, 0),
        ("fp8", "fp8", 16, 1, 1, 0),
        ("fp8", "fp8", 16, 1, 1, 1),
        ("fp8", "fp8", 16, 1, 2, 0),
        ("fp8", "fp8", 16, 1, 4, 0),
        ("fp8", "fp8", 16, 1, 4, 1),
        ("fp8", "fp8", 16, 0, 1, 0),
        ("fp8", "fp8", 16, 0, 2, 0),
        ("fp8", "fp8", 16, 0, 4, 0),
        ("fp8", "fp8", 32, 1, 4, 0),
        ("fp8", "fp8", 32, 1, 4, 1),
        ("fp8", "fp8", 32, 1, 1, 0),
        ("fp8", "fp8", 32, 1, 1, 1),
        ("fp8", "fp8", 128, 0, 0, 0),
        ("bf16", "bf16", 32, 0, 0, 0),
        ("bf16", "bf16", 64, 0, 0, 0),
        ("bf16", "bf16", 64, 0, 1, 0),
        ("bf16", "bf16", 8, 0, 1, 0),
        ("bf16", "bf16", 8, 0, 2, 0),
        ("fp8", "fp8", 8, 0, 1, 0),
        ("fp8", "fp8", 8, 1, 4, 0),
        ("fp8", "fp8", 8, 1, 4, 1),
        ("bf16", "bf16", 32, 1, 4, 0),
        ("bf16", "bf16", 32, 1, 4, 1),
        ("bf16", "bf16", 64, 1, 1, 0),
        ("bf16", "bf16", 64, 1, 1, 1),
    },
}


def _kernel_key(q_type, kv_type, gqa, persistent, qlen, arch, lse):
    """The (q, kv, gqa, ps, qSeqLen) row mla_decode_stage1_asm_fwd looks up, or a StandinError with
    its message when the dispatch itself rejects the combination."""
    cfg_q, cfg_gqa, ps = qlen, gqa, 1 if persistent else 0
    if gqa == 128:
        cfg_q = 0
        if q_type == "bf16" and kv_type == "bf16" and arch == "gfx942":
            ps = 0
    elif gqa == 16:
        if q_type == "bf16" and kv_type == "bf16":
            if persistent:
                cfg_q = 4 if qlen <= 4 else qlen
            else:
                cfg_q = 1 if qlen == 1 else (4 if qlen <= 4 else 8)
        elif q_type == "bf16":
            if persistent and qlen <= 4:
                cfg_q = 4
        else:
            if qlen <= 2:
                cfg_q = qlen
            elif qlen <= 4:
                cfg_q = 4
            elif persistent and arch == "gfx950":
                cfg_q, cfg_gqa = 4, 32
            else:
                raise StandinError("mla_decode_stage1_asm_fwd:only support gqa_ratio=16 fp8 mla decoding with qo_len <= 4")
    elif gqa == 32 and q_type == "bf16" and kv_type == "bf16" and not persistent:
        cfg_q = 0
    elif gqa == 64 and q_type == "bf16" and kv_type == "bf16" and not persistent:
        cfg_q = 1 if qlen == 1 else 0
    if arch == "gfx950" and q_type == "bf16" and kv_type == "bf16" and persistent:
        if (gqa * qlen >= 128 or gqa > 64) and gqa != 48:
            cfg_q, cfg_gqa = 4, 32
        elif gqa * qlen >= 64 or gqa >= 16:
            cfg_q, cfg_gqa = 1, 64
    # The LSE variant is asked for only in persistent mode (lse_flag = lse != nullptr && persistent).
    return (q_type, kv_type, cfg_gqa, ps, cfg_q, 1 if (lse and persistent) else 0)


def find_kernel(q_type, kv_type, gqa, persistent, qlen, lse=False, arch=None):
    arch = arch or gfx()
    key = _kernel_key(q_type, kv_type, gqa, persistent, qlen, arch, lse)
    if key not in _ASM_ROWS.get(arch, set()):
        raise StandinError(f"mla_decode_stage1_asm_fwd: cannot find suitable kernel ({arch}: {key})")
    return key


def _kind(t, what):
    if t.dtype == "bf16":
        return "bf16"
    if t.dtype in FP8:
        check(t.dtype == platform_fp8(), f"stand-in: {what} is {t.dtype} but {gfx()} runs {platform_fp8()} (aiter.dtypes.fp8)")
        return "fp8"
    raise StandinError(f"mla_decode_stage1_asm_fwd: unsupport {what} dtype:{t.dtype}")


def mla_decode_fwd(
    q,
    kv_buffer,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_last_page_lens,
    max_seqlen_q,
    page_size=1,
    nhead_kv=1,
    sm_scale=None,
    logit_cap=0.0,
    num_kv_splits=None,
    num_kv_splits_indptr=None,
    work_meta_data=None,
    work_indptr=None,
    work_info_set=None,
    reduce_indptr=None,
    reduce_final_map=None,
    reduce_partial_map=None,
    q_scale=None,
    kv_scale=None,
    intra_batch_mode=False,
    return_logits=False,
    return_lse=False,
    g_kv_indptr=None,
    cp_world_size=1,
    cp_rank=0,
    causal=True,
):
    check(logit_cap <= 0, f"logit_cap={logit_cap} is not support yet")
    check(q.ndim == 3 and o.ndim == 3 and kv_buffer.ndim == 4, "stand-in: q [T, H, D], kv_buffer [pages, page_size, nhead_kv, D], o [T, H, Dv]")
    check(q.is_contiguous(), "mla_decode_stage1_asm_fwd:only support Q.is_contiguous() for now")
    check(nhead_kv == 1 and kv_buffer.size(2) == 1, "mla_decode_stage1_asm_fwd:only support num_kv_heads==1 for now")
    check(q.size(2) == kv_buffer.size(3), "mla_decode_stage1_asm_fwd:only support head_size == KV.size(3) for now")
    check(kv_buffer.size(1) == page_size, f"stand-in: kv_buffer pages hold {kv_buffer.size(1)} tokens, page_size={page_size}")
    qt, kvt = _kind(q, "Q"), _kind(kv_buffer, "KV")
    if qt == "fp8":
        check(q_scale is not None and kv_scale is not None, "mla_decode_stage1_asm_fwd: fp8 Q requires q_scale and kv_scale")
    T, nhead, Dv = o.shape
    check(q.size(0) == T and q.size(1) == nhead, f"stand-in: q {q.shape} and o {o.shape} disagree")
    check(o.is_contiguous(), "stand-in: o is used through o.view(total_s, num_kv_splits, nhead, v_head_dim)")
    for name, x in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("kv_last_page_lens", kv_last_page_lens)):
        check(x.dtype == "i32" and x.ndim == 1, f"stand-in: {name} must be a 1-D int32 tensor, got {x.dtype} {x.shape}")
    qo, kvp, idx, last = (x.arr.astype(np.int64) for x in (qo_indptr, kv_indptr, kv_indices, kv_last_page_lens))
    B = len(qo) - 1
    check(len(kvp) == B + 1 and len(last) >= B, "stand-in: kv_indptr / kv_last_page_lens disagree with qo_indptr on the batch")
    check(qo[0] == 0 and qo[-1] == T, f"stand-in: qo_indptr must run from 0 to {T}")
    # The ASM kernels address request b's queries at b * max_seqlen_q rows (s_Q_Bs).
    check(all(qo[b + 1] - qo[b] == max_seqlen_q for b in range(B)), "stand-in: the decode kernels assume every request has max_seqlen_q query rows")

    persistent = work_meta_data is not None
    gqa = nhead
    if persistent:
        native = nhead == 16 or (gfx() == "gfx950" and qt == "bf16" and kvt == "bf16")
        if not native:
            check(nhead in range(32, 129, 16), f"nhead={nhead} and max_seqlen_q={max_seqlen_q} not supported")
            gqa = 16
    find_kernel(qt, kvt, gqa, persistent, max_seqlen_q, lse=return_lse)

    scale = float(sm_scale) if sm_scale is not None else 1.0 / np.sqrt(q.size(2))
    kv_s = float(kv_scale.values().reshape(-1)[0]) if (kv_scale is not None and kvt == "fp8") else 1.0
    q_s = float(q_scale.values().reshape(-1)[0]) if (q_scale is not None and qt == "fp8") else 1.0
    qv = q.values() * q_s
    cache = kv_buffer.values()[:, :, 0, :] * kv_s  # [pages, page_size, D]
    n_pages = cache.shape[0]
    out = np.full((T, nhead, Dv), np.nan)
    lse = np.full((T, nhead), np.nan)

    def attend(b, rows, p0, p1):
        npage = p1 - p0
        kv_len = 0 if npage == 0 else (npage - 1) * page_size + int(last[b])
        tok = np.arange(kv_len)
        pages = idx[p0 + tok // page_size] if kv_len else np.zeros(0, np.int64)
        check(bool(np.all((pages >= 0) & (pages < n_pages))), f"stand-in: request {b} names a page outside the kv_buffer")
        keys = cache[pages, tok % page_size] if kv_len else np.zeros((0, cache.shape[2]))
        qlen = qo[b + 1] - qo[b]
        for i, row in enumerate(rows):
            local = row - qo[b]
            visible = kv_len - qlen + local + 1 if causal else kv_len
            k = keys[: max(visible, 0)]
            s = scale * (qv[row] @ k.T)  # [nhead, n]
            if k.shape[0] == 0:
                # Split-KV: _fwd_kernel_stage2_asm merges min(splits, cdiv(0, mgc)) = 0 splits and
                # stores acc / e_sum = 0 / 0 and e_max + log(e_sum) = -inf (a single split copied
                # straight from stage 1 is not modelled). The persistent path's empty rows are
                # the ASM kernel's business: the stand-in writes 0 there.
                out[row], lse[row] = (np.nan if not persistent else 0.0), -np.inf
                continue
            m = s.max(axis=1, keepdims=True)
            w = np.exp(s - m)
            den = w.sum(axis=1)
            out[row] = (w @ k[:, :Dv]) / den[:, None]
            lse[row] = m[:, 0] + np.log(den)

    if persistent:
        check(work_info_set.ndim == 2 and work_info_set.size(1) == 8, f"stand-in: work_info_set must be [max_work, 8], got {work_info_set.shape}")
        check(work_indptr.ndim == 1 and work_indptr.dtype == "i32", "stand-in: work_indptr must be 1-D int32")
        n_work = int(work_indptr.arr[-1])
        info = work_info_set.arr.astype(np.int64)
        for w in range(n_work):
            b, partial, q0, q1, p0, p1 = (int(v) for v in info[w, :6])
            check(0 <= b < B and partial == -1, f"stand-in: work {w} is not one of the stand-in schedule's items")
            attend(b, range(q0, q1), p0, p1)
    else:
        for b in range(B):
            attend(b, range(qo[b], qo[b + 1]), kvp[b], kvp[b + 1])
    o.store(out)
    final_lse = HostTensor.from_values(lse.astype(np.float32), "f32") if return_lse else None
    logits = HostTensor.empty((T, 1, nhead, Dv), "f32")
    return logits, final_lse
