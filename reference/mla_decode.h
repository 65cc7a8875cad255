// Absorbed MLA decode over a paged latent cache (docs/ops/mla_decode.md, Semantics):
// one shared latent KV row per token, N query heads, scores over all Lk dims, V = the first Lv
// dims of the same row, bottom-right causal rule among the qlen query positions of a request.
// Float64 over the exact input values (fp8 rows times kv_scale, exactly).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace attncheck::ref {

// ---- the 16-head rule of AITER's decode kernels (16 = the MMA tile's M dimension) ----
inline constexpr int64_t kMlaHeadTile = 16;
// Valid: a multiple of 16, or a divisor of 16 (1, 2, 4, 8).
bool mla_num_heads_valid(int64_t num_heads);
// AITER's AssertionError text, verbatim (two lines).
std::string mla_num_heads_message(int64_t num_heads);
// Throws InvalidConfig(mla_num_heads_message(n)) for an invalid head count.
void mla_check_num_heads(int64_t num_heads);
int64_t mla_padded_heads(int64_t num_heads);  // max(16, n)
// q [T, N, L]: N < 16 -> a new contiguous [T, 16, L] tensor where padded head j is real head
// j / (16 / N) (repeat-interleave); N >= 16 -> q itself (no copy).
Tensor mla_pad_q(const Tensor& q);
// o [T, 16, L] -> the strided view o[:, ::r, :] with r = 16 / num_heads (padded heads 0, r, 2r, ...
// are real heads 0, 1, 2, ...); num_heads >= 16 -> o itself. Never copies.
Tensor mla_unpad_o(const Tensor& o, int64_t num_heads);

// ---- inputs and outputs ----
// The latent cache as the math sees it: element value times kv_scale (kv_scale is 1 for bf16/f16
// caches; for fp8 caches it is the per-tensor dequantization scale).
struct LatentCache {
  Tensor cache;  // [num_blocks, P, Lk], any strides, any float dtype (fp8 included)
  double kv_scale = 1.0;
};

struct MlaResult {
  Tensor out;  // f64 [T, N, Lv]
  Tensor lse;  // f64 [T, N]: natural-log sum of exp(scores); -inf for a row that sees no key
};

// Dense decode. q [T, N, Lk] (any dtype, any strides); block_table [B, W] int32;
// seq_lens [B] int32 = KV length including the request's query tokens; query_start_loc [B+1]
// int32 (ragged qlen allowed). Local query i of a request with qlen rows and kv_len keys sees key
// t iff t <= kv_len - qlen + i. Throws InvalidConfig for a head count the 16-head rule refuses and
// std::invalid_argument for malformed metadata (kv_len < qlen, table too narrow, block id out of
// range).
MlaResult mla_decode(const Tensor& q, const LatentCache& kv, const Tensor& block_table,
                     const Tensor& seq_lens, const Tensor& query_start_loc, double scale,
                     int64_t lv);

// ---- shared by the dense and sparse references ----
// Row r of `rows` as doubles: cache row `slot` of the flattened [num_blocks * P, Lk] view.
// Contiguous f64 [slots.size(), Lk].
Tensor gather_latent_rows(const LatentCache& kv, const std::vector<int64_t>& slots);
// Throws std::out_of_range when a row of `slots` lies outside a sparse cache's host window (call
// before parallel loops: an exception may not leave one).
void check_rows_held(const Tensor& cache, const std::vector<int64_t>& slots);
// Query rows of token t: f64 [N, Lk].
Tensor query_rows(const Tensor& q, int64_t token);
// Softmax attention of query rows q [R, Lk] over keys k [L, Lk] (f64, contiguous), row r seeing
// keys [0, visible[r]). Writes out [R, Lv] (V = first lv columns of k) and lse [R] (f64,
// contiguous views supplied by the caller). A row that sees no key gets out = 0, lse = -inf.
void attend_rows(const Tensor& q, const Tensor& k, const std::vector<int64_t>& visible,
                 double scale, int64_t lv, const Tensor& out, const Tensor& lse);

// Magnitudes the comparison budget is derived from (harness/ops/mla_decode.cpp, docs).
struct MlaInputScales {
  double q_norm_max = 0;   // max over (token, head) of ||q||_2
  double kv_norm_max = 0;  // max over referenced cache rows of ||kv_scale * c||_2 (all Lk dims)
  double v_abs_max = 0;    // max over referenced rows of |kv_scale * c[d]|, d < Lv
  int64_t keys_max = 0;    // longest key set of any query row
};
MlaInputScales mla_input_scales(const Tensor& q, const LatentCache& kv,
                                const std::vector<int64_t>& slots, int64_t lv, int64_t keys_max);

}  // namespace attncheck::ref
