// The sparse-attention indexer with MXFP4 keys and queries (docs/ops/indexer_mxfp4.md), in the
// paged cache layout of AITER's paged MXFP4 MQA-logits kernel and vLLM's ROCm MXFP4 indexer
// (indexer_kv_dtype = "mxfp4"): a page of S entries holds S * D/2 bytes of packed e2m1 values
// (element 2i in the low nibble), then S * D/32 e8m0 scale bytes, each region either in token
// order ("natural") or preshuffled into MFMA tiles of n_per_tile tokens (16 or 32).
//
// The same ops with NVFP4 keys (format nvfp4): a page holds S * D/2 bytes of packed e2m1 values
// (element 2i in the low nibble), then S * D/16 e4m3fn block scales in token order, and the cache
// has one fp32 global scale; element d of a key is e2m1 * e4m3(scale[d / 16]) * global. Queries
// stay MXFP4.
//
// Decoding follows the format definition (core/fp4.h): every q.k product is an exact double, and
// logits accumulate in double.
#pragma once
#include <cstdint>

#include "core/fp4.h"
#include "core/tensor.h"

namespace attncheck::ref::mxfp4 {

inline constexpr int64_t kShuffleWidth = 16;  // bytes of one token's run in a shuffled group
inline constexpr int64_t kWarp = 64;          // the scale shuffle spreads a tile over 64 lanes

enum class KeyFormat : uint8_t { mxfp4, nvfp4 };

// One page's geometry. n_per_tile 0: natural order; 16 or 32: preshuffled (scale mode "wide", MXFP4
// only). global_scale: the NVFP4 cache's fp32 tensor scale (unused by MXFP4).
struct CacheGeometry {
  int64_t head_dim = 128;
  int64_t page_size = 64;
  int64_t n_per_tile = 0;
  KeyFormat format = KeyFormat::mxfp4;
  float global_scale = 1.0f;
  int64_t block() const { return format == KeyFormat::nvfp4 ? fp4::kNvfp4Block : fp4::kMxfp4Block; }
  int64_t value_bytes() const { return head_dim / 2; }
  int64_t scale_count() const { return head_dim / block(); }
  int64_t entry_bytes() const { return value_bytes() + scale_count(); }
  int64_t page_bytes() const { return page_size * entry_bytes(); }
};
// Throws std::invalid_argument naming what does not fit: head_dim a multiple of 32; a shuffled
// page a multiple of n_per_tile with at least 64 / n_per_tile scales per token; NVFP4 pages in
// natural order with a finite global scale > 0.
void check_geometry(const CacheGeometry& g);

// Byte offsets inside a page: value byte c (elements 2c, 2c+1) and scale s of entry t.
int64_t value_offset(const CacheGeometry& g, int64_t t, int64_t c);
int64_t scale_offset(const CacheGeometry& g, int64_t t, int64_t s);

// The cache: u8 [num_pages, page_size, D/2 + D/block], each page contiguous, stride(0) >= the page.
void check_cache(const Tensor& cache, const CacheGeometry& g);

// Quantizes rows of k (bf16 [T', D], T' >= T) with `rule` (MXFP4) or fp4::nvfp4_quantize (NVFP4:
// block scale e4m3fn(amax / (6 * global)), nearest even, saturating at 448, no floor; elements
// x / (e4m3 * global) nearest-even, all zero when the scale byte is 0) into the slots
// of slot_mapping (i64 [T]; slot = page * page_size + entry, < 0 writes nothing). Returns a copy of
// `cache` with the writes applied (bytes outside the written entries unchanged).
Tensor write_k_cache(const Tensor& cache, const Tensor& k, const Tensor& slot_mapping,
                     const CacheGeometry& g, fp4::MxScaleRule rule);

// The D decoded values of entry t of page `page`.
void read_key(const Tensor& cache, const CacheGeometry& g, int64_t page, int64_t t, double* out);

// logits[r, p] = sum_h w[r, h] * relu(q[r, h] . k[p]) for p < decode_row_end (the indexer's causal
// rule: context_len - next_n + n + 1, clamped to [0, max_model_len]), -inf for the other columns.
// q u8 [B, next_n, H, D/2] + q_scale u8 [B, next_n, H, D/32], weights f32 [B*next_n, H],
// context_lens i32 [B], block_table i32 [B, W]. Returns f32 [B*next_n, max_model_len].
Tensor paged_logits(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                    const CacheGeometry& g, const Tensor& weights, const Tensor& context_lens,
                    const Tensor& block_table, int64_t max_model_len);
// max over rows r and visible positions p of sum_h |w[r, h]| * sum_d |q[r, h, d] * k[p, d]|: the
// magnitude the rounding errors of an fp32 kernel scale with (0 when no position is visible).
double max_logit_terms(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                       const CacheGeometry& g, const Tensor& weights, const Tensor& context_lens,
                       const Tensor& block_table, int64_t max_model_len);

// Valid positions of decode row n of a request with context length L: p <= L - next_n + n,
// clamped to [0, width] (AITER's default for cu_ends).
int64_t decode_row_end(int64_t context_len, int64_t next_n, int64_t n, int64_t width);

}  // namespace attncheck::ref::mxfp4
