// Input generation shared by the indexer ops (harness/ops/indexer*.cpp): quantizer-edge bf16 rows,
// paged fp8 caches written through the reference writer, prefill windows, logits budgets.
#pragma once
#include <string>
#include <vector>

#include "core/compare.h"
#include "ops/op.h"
#include "ops/paged.h"
#include "reference/indexer.h"

namespace attncheck::indexer_ops {

namespace ix = ref::indexer;

// Axis helpers.
Axis fp8_axis();
Axis quant_max_axis();
DType fp8_of(const Params& p);
float quant_max_of(const Params& p);  // from "fp8" and "quant_max" (vllm when the op has no axis)
std::string block_size_problem(int64_t block_size);  // "" when valid, else the refusal reason

// How generated q / K rows are spread. `edges`: every 16 rows, rows on the quantizer's edges (all
// zero: the amax floor; a peak of exactly M * 2^e; the next bf16 above it; a geometric sweep into
// fp8 subnormals and underflow), the rest at magnitudes 2^-18 .. 2^6 (quantization ops, compared
// bitwise). `model`: rows of comparable size, N(0,1) * 2^{-2..2}, every 16th all zero (logits
// ops: a budget relative to the largest terms stays tight for every element).
enum class RowMix { edges, model };
void fill_quant_rows(const Tensor& rows, const std::string& case_id, const std::string& name,
                     int64_t seed, float quant_max, RowMix mix);

// fp8 special codes in the value bytes of a paged cache (docs/formats.md):
//   ordinary: what the writer wrote;
//   decoded (logits): the tokens written carry the saturation codes and, in e4m3fn, -0
//     (fp8_special_code, element k = position + dim); every other value byte of the held pages
//     holds a NaN code, which a kernel must never read;
//   copied (gather): the tokens written carry those and NaN codes too (k % 11 == 3): a byte copy
//     keeps every code, a copy through float does not.
enum class CacheCodes { ordinary, decoded, copied };

// A paged indexer cache u8 [first_block + num_blocks, BS, 132] with page stride BS*132 + pad:
// random bytes everywhere (stale memory), then every position < seq_lens[r] of every request
// written by the reference writer in the layout the block size selects (the table's ids already
// shifted by first_block). Invalid block sizes get random bytes only. first_block > 0 (large
// offsets): a sparse storage whose host window holds pages [first_block, first_block + num_blocks).
Tensor paged_cache(const std::string& case_id, const PagedLayout& layout, int64_t block_size,
                   int64_t pad, DType fp8, int64_t seed, RowMix mix, int64_t first_block = 0,
                   CacheCodes codes = CacheCodes::ordinary);

// fp8_codes = special for a contiguous fp8 tensor whose every element is read (q, prefill k):
// element i holds fp8_special_code(i) where it has one.
void plant_fp8_specials(const Tensor& fp8_values);

// Prefill requests (vLLM BuildPrefillChunkMetadata): request r has L_r keys and q_r = min(qlen,
// L_r) queries; query i of r sees keys [cu[r], cu[r] + L_r - q_r + 1 + i) ("causal"), or a random
// window of [0, N] including empty and full ones ("random").
struct PrefillWindows {
  int64_t M = 0, N = 0;
  Tensor ks, ke;  // i32 [M]
};
PrefillWindows prefill_windows(const std::string& case_id, int64_t batch, int64_t max_ctx,
                               int64_t qlen, const std::string& mask, int64_t seed);

// A tensor of `shape` inside a larger storage whose rows are `row_stride` long (row-major), so
// writes past the end of a row land outside the view.
Tensor padded_rows(DType dtype, const Shape& shape, int64_t row_stride);
int64_t padded_stride(int64_t width);  // round up to 16, plus 16 columns nobody may write

// Budget of fp32 indexer logits (docs/ops/indexer.md): per q.k, fp32 accumulation of 128 exact
// products in any order (tensor cores may truncate: 2 gamma_128), then the weight product and
// the H-head sum (gamma_{H+1}), and the fp32 stores. Terms are bounded by R_i * C_j with
// R_i = sum_h |w_ih| sum_d |q_ihd| and C_j = k_scale_j max_d |k_jd|; atol uses their maxima.
Budget logits_budget(const Tensor& q, const Tensor& weights, double max_key_factor);
// max_j k_scale[j] * max_d |k[j, d]| over fp8 rows.
double key_factor(const Tensor& k_fp8, const Tensor& k_scale);

Tensor i32_tensor(const std::vector<int64_t>& v);

}  // namespace attncheck::indexer_ops
