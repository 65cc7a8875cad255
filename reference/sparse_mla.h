// Sparse MLA (docs/ops/sparse_mla.md, DeepSeek-V3.2 style): every query token
// attends, without a causal mask, to its own set of cache rows chosen by the indexer's top-k
// (request-local token positions, -1 = padding). Same absorbed-MLA math and 16-head rule as the
// dense decode (mla_decode.h).
//
// Empty rows: a token whose converted index set is empty gets out = 0 and lse = -inf. Reasons:
// -inf is the identity of the log-sum-exp merge (a split or a row with no key contributes
// nothing when partial results are combined), 0 is the value sum_t p_t v_t takes over an empty
// set, and neither is NaN, which would poison whatever consumes the row (vLLM's FlashMLA-based
// reference yields NaN there; kernels differ, so this harness fixes the contract).
#pragma once
#include "mla_decode.h"

namespace attncheck::ref {

// triton_convert_req_index_to_global_index, exactly: for token t of request r =
// req_id_per_token[t] and entry tok = topk_local[t, j]: tok < 0 -> -1; blk = tok / block_size; blk
// outside [0, W) with W = block_table.size(1) -> -1; else block_table[r, blk] * block_size +
// tok % block_size. int32 [T, topk]. (Table entries are not range-checked, as upstream.)
Tensor sparse_mla_global_indices(const Tensor& topk_local, const Tensor& req_id_per_token,
                                 const Tensor& block_table, int64_t block_size);

// Ragged packing: row t's entries != -1, in row order, at indices[indptr[t], indptr[t + 1]).
// (vLLM's fetch_id_to_ragged copies the first cnt[t] entries of each row and therefore assumes
// every -1 is at the end of its row; this packing does not.)
struct RaggedIndices {
  Tensor indptr;   // int32 [T + 1]
  Tensor indices;  // int32 [nnz], flat cache slots
};
RaggedIndices sparse_mla_pack(const Tensor& global_indices);

// out f64 [T, N, Lv], lse f64 [T, N] over each token's packed slots. Throws InvalidConfig for a
// head count the 16-head rule refuses (the helper-aware sparse backend pads heads like dense).
MlaResult sparse_mla(const Tensor& q, const LatentCache& kv, const RaggedIndices& indices,
                     double scale, int64_t lv);

}  // namespace attncheck::ref
