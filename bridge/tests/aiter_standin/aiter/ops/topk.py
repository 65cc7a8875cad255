"""Stand-in for the per-row top-k of aiter/ops/topk.py (csrc/kernels/topk_per_row_kernels.cu).

Row i of ``logits`` starts at i * stride0 (stride1 is ignored: unit column stride). Prefill: the
window is [rowStarts[i], rowEnds[i]) and an index is the column (i + rowStart in the kernel's
terms, i.e. absolute); decode: row r = b * next_n + n covers [0, seqLens[b] - next_n + n + 1).
The k largest, sorted, ties to the lower column; -1 after a window shorter than k. ``indices`` is
written as [numRows, k] rows of k.
"""

import numpy as np

from .._standin import check


def _rows(logits, numRows, stride0, indices, k):
    check(logits.dtype == "f32" and indices.dtype == "i32", "stand-in: fp32 logits, int32 indices")
    check(logits.stride(0) == stride0 and logits.stride(1) == 1, f"stand-in: logits strides {logits.stride()} vs stride0 {stride0}: rows are read at i * stride0 with a unit column stride")
    check(indices.ndim == 2 and indices.shape == (numRows, k) and indices.is_contiguous(), f"stand-in: indices must be a contiguous [{numRows}, {k}], got {indices}")
    return logits.values()


def _select(row, lo, hi, k):
    lo, hi = max(lo, 0), max(hi, lo)
    cols = np.arange(lo, hi)
    order = np.lexsort((cols, -row[lo:hi]))[:k]
    out = np.full(k, -1, np.int64)
    out[: len(order)] = cols[order]
    return out


def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k=2048, stable=False):
    if numRows <= 0:
        return
    x = _rows(logits, numRows, stride0, indices, k)
    check(values is None, "stand-in: values are not emulated")
    for i in range(numRows):
        indices.arr[i] = _select(x[i], int(rowStarts.arr[i]), int(rowEnds.arr[i]), k)


def top_k_per_row_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048, stable=False):
    if numRows <= 0:
        return
    x = _rows(logits, numRows, stride0, indices, k)
    for r in range(numRows):
        n = int(seqLens.arr[r // next_n]) - next_n + r % next_n + 1
        indices.arr[r] = _select(x[r], 0, n, k)
