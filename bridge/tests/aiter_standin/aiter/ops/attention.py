"""Stand-in for the persistent-decode metadata of aiter/ops/attention.py.

get_mla_metadata_info_v1 returns the six (shape, dtype) pairs of AITER's docstring, in AITER's
order (work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
reduce_partial_map); get_mla_metadata_v1 takes the buffers in *its* order (work_metadata_ptrs,
work_info_set, work_indptr, ...) and fills them with a schedule of its own: one work item per
request, never split (partial_index -1), each described as AITER's docstring describes work_info
(bs_index, partial_index, q_start, q_end, kv_start, kv_end in pages, kv_offset, pad). The
stand-in's mla_decode_fwd consumes exactly that schedule, so buffers passed in the wrong place
fail loudly. AITER's own schedule (CU partitions, KV splits, reduce maps) is not reproduced.
"""

from .._standin import check, cu_num


def get_mla_metadata_info_v1(
    batch_size,
    max_seqlen_qo,
    num_head_qo,
    q_dtype,
    kv_dtype,
    is_sparse,
    fast_mode=True,
    num_kv_splits=32,
    intra_batch_mode=False,
    max_split_per_batch=-1,
):
    check(num_head_qo % 8 == 0, "assert num_head_qo % 8 == 0")
    tiles = -(-max_seqlen_qo * num_head_qo // 16)
    cu = cu_num()
    max_work = (batch_size + cu - 1) * tiles
    tile_cnt = batch_size * tiles
    return (
        ((2,), "u64"),
        ((cu + 1,), "i32"),
        ((max_work, 8), "i32"),
        ((tile_cnt + 1,), "i32"),
        ((tile_cnt, 2), "i32"),
        ((max_work,), "i32"),
    )


def get_mla_metadata_v1(
    seqlens_qo_indptr,
    seqlens_kv_indptr,
    kv_last_page_lens,
    num_heads_per_head_k,
    num_heads_k,
    is_causal,
    work_metadata_ptrs,
    work_info_set,
    work_indptr,
    reduce_indptr,
    reduce_final_map,
    reduce_partial_map,
    page_size=1,
    kv_granularity=16,
    max_seqlen_qo=-1,
    uni_seqlen_qo=-1,
    fast_mode=True,
    topk=-1,
    max_split_per_batch=-1,
    intra_batch_mode=False,
    is_cp_round_robin=False,
    mla_version=None,
    dtype_q_nope=None,
    dtype_q_rope=None,
    dtype_kv_nope=None,
    dtype_kv_rope=None,
    dtype_q=None,
    dtype_kv=None,
):
    check(work_metadata_ptrs.shape == (2,) and work_metadata_ptrs.dtype == "u64", f"stand-in: work_metadata_ptrs must be [2] uint64, got {work_metadata_ptrs}")
    check(work_info_set.ndim == 2 and work_info_set.size(1) == 8, f"stand-in: work_info_set must be [max_work, 8], got {work_info_set}")
    check(work_indptr.ndim == 1 and work_indptr.size(0) == cu_num() + 1, f"stand-in: work_indptr must be [cu_num + 1], got {work_indptr}")
    check(reduce_final_map.ndim == 2 and reduce_final_map.size(1) == 2, f"stand-in: reduce_final_map must be [tiles, 2], got {reduce_final_map}")
    check(num_heads_k == 1 and is_causal, "stand-in: one kv head, causal")
    qo = seqlens_qo_indptr.arr
    kv = seqlens_kv_indptr.arr
    B = len(qo) - 1
    check(len(kv) == B + 1 and kv_last_page_lens.size(0) >= B, "stand-in: kv_indptr / kv_last_page_lens disagree with qo_indptr")
    check(work_info_set.size(0) >= B, f"stand-in: work_info_set holds {work_info_set.size(0)} items, {B} needed")
    work_info_set.arr[...] = 0
    for b in range(B):
        work_info_set.arr[b] = [b, -1, qo[b], qo[b + 1], kv[b], kv[b + 1], 0, 0]
    work_indptr.arr[...] = B
    work_indptr.arr[0] = 0
    work_metadata_ptrs.arr[...] = 0
    reduce_indptr.arr[...] = 0
    reduce_final_map.arr[...] = 0
    reduce_partial_map.arr[...] = 0
