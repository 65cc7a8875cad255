// Decode attention over a paged KV cache (docs/ops/decode_attention.md): one query token
// per request, softmax(sm_scale * q k^T [soft-capped]) v over the request's tokens found through
// the page table. Covers MHA/GQA/MQA/MLA (kv_group_num = Hq / Hkv) and fp8 KV with per-tensor
// scales. Also emulates vLLM's split-KV evaluation: stage-1 partials per split and the LSE
// merge of stage 2, so that tests can show any split count equals the one-pass result.
#pragma once
#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace attncheck::ref {

struct DecodeAttentionInputs {
  Tensor q;             // [B, Hq, Lk], any strides
  Tensor k_buffer;      // [num_pages, P, Hkv, Lk], or [num_tokens, Hkv, Lk] (token table, P = 1)
  Tensor v_buffer;      // same leading dims as k_buffer, last dim Lv (MLA: a view of k_buffer)
  Tensor req_to_token;  // [B, W] int32 page ids; entries past ceil(L / P) are never read
  Tensor seq_lens;      // [B] int32
  double sm_scale = 1.0;
  double logit_cap = 0.0;  // > 0: s = cap * tanh(s / cap), applied after sm_scale
  double k_scale = 1.0;    // dequantization: K = k_buffer * k_scale (fp8 caches)
  double v_scale = 1.0;    // V = v_buffer * v_scale
};

struct DecodeAttentionResult {
  Tensor o;    // f64 [B, Hq, Lv]
  Tensor lse;  // f64 [B, Hq], natural log of sum_n exp(s_n)
};

// One pass over every request's tokens. Throws std::invalid_argument for inconsistent shapes, page
// ids outside the cache, and L = 0 (undefined: vLLM's stage 2 computes 0 / 0).
DecodeAttentionResult decode_attention(const DecodeAttentionInputs& in);

// Tokens [start, end) of split `split` out of `num_splits` for a request of `len` tokens:
// len_per_split = ceil(len / S), start = split * len_per_split, end = min(start + len_per_split,
// len). end <= start means the split is empty (stage 1 writes nothing, stage 2 skips it).
std::pair<int64_t, int64_t> split_bounds(int64_t len, int64_t num_splits, int64_t split);

// Stage 1: f64 [B, Hq, S, Lv + 1]; [..., 0:Lv] = the split's normalized partial output, [..., Lv] =
// the split's log-sum-exp. Slots of empty splits hold NaN (upstream leaves them unwritten).
Tensor decode_stage1(const DecodeAttentionInputs& in, int64_t num_splits);

// Stage 2: merges the partials of the non-empty splits (bounds recomputed from seq_lens) as vLLM
// does. A request with L = 0 gets o = NaN and lse = -inf, as upstream.
DecodeAttentionResult decode_stage2(const Tensor& partials, const Tensor& seq_lens);

// Data magnitudes the tolerance derivation needs, per (request, head); all f64 [B, Hq], with w the
// softmax weights, o the output, n* the highest-scoring token.
struct DecodeErrorTerms {
  Tensor score_abs;            // max_n sum_i |q_i k_ni| * |sm_scale| (k dequantized)
  Tensor weighted_abs_v;       // W1  = max_j sum_n w_n |v_nj|
  Tensor weighted_abs_v_rest;  // W1' = max_j sum_{n != n*} w_n |v_nj|
  Tensor weighted_spread;      // W2  = max_j sum_n w_n |v_nj - o_j|
  Tensor score_gap;            // s_n* minus the second highest score (+inf for one token)
  Tensor v_abs_max;            // max_nj |v_nj| over the request's tokens
};
DecodeErrorTerms decode_error_terms(const DecodeAttentionInputs& in);

}  // namespace attncheck::ref
