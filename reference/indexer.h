// DeepSeek-V3.2 / GLM-5 sparse-attention indexer (docs/ops/indexer.md): K quantization and the
// paged fp8 cache (block-flat NORMAL / SHUFFLE layouts), the prefill gather, q quantization with
// the head weights, fp8 MQA logits (prefill ks/ke windows, paged decode with next_n) and top-k.
//
// Quantization is reproduced bit for bit (fp32 amax / division, exact power-of-two ue8m0 scales,
// round-to-nearest-even fp8). Logits accumulate in float64 over the exact fp8 values: every q.k
// dot of 128 fp8 products is exact in double, so the reference is exact up to the final products.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace attncheck::ref::indexer {

inline constexpr int64_t kHeadDim = 128;      // index_head_dim of both models
inline constexpr int64_t kTokenBytes = 132;   // 128 fp8 values + one fp32 scale per token
inline constexpr int64_t kTile = 16;          // SHUFFLE tile: 16 tokens x 16 dims
inline constexpr float kKAmaxFloor = 1e-4f;   // K writer: max(amax, 1e-4)
inline constexpr float kQAmaxFloor = 1e-10f;  // per_token_group_quant_fp8 eps

// ---- quantization (indexer_quant.cpp) ----

// The constant the quantizers divide amax by: 448 for e4m3fn; for e4m3fnuz vLLM uses 224
// (get_fp8_min_max) and AITER's HIP writer 240 (finfo max).
enum class QuantMaxVariant { vllm, aiter };
float quant_max(DType fp8, QuantMaxVariant variant);

// fp32 (max(amax, floor) / quant_max), rounded up to a power of two exactly (bit-level ceil-log2,
// not a libm log2 that can be one ulp low).
float ue8m0_scale(float amax, float floor, float quant_max);

// Quantizes n values with one scale: bytes[i] = fp8(x[i] / scale) (RNE, saturating; `clamp`
// limits to +-quant_max first). Returns the scale.
float quantize_group(const float* x, int64_t n, float floor, float quant_max, DType fp8, bool clamp,
                     uint8_t* bytes);

// Per-token K quantization as the cache writer does it: k bf16 [T, 128] -> fp8 [T, 128] and
// fp32 scales [T].
struct QuantizedK {
  Tensor values;  // fp8 [T, 128]
  Tensor scales;  // f32 [T]
};
QuantizedK quantize_k(const Tensor& k, DType fp8, float quant_max);

// q bf16 [T, H, 128] -> q_fp8 [T, H, 128], q_scale f32 [T, H] (one group per (token, head), amax
// floor 1e-10, clamp +-M), and the head weights f32 [T, H]:
// w = ((weights_raw * q_scale) * fl32(128^-0.5)) * fl32(H^-0.5), every product rounded to fp32
// (vLLM: weights.unsqueeze(-1) * q_scale * softmax_scale * n_head**-0.5).
struct QuantizedQ {
  Tensor q_fp8;
  Tensor q_scale;
  Tensor weights;
};
QuantizedQ quantize_q(const Tensor& q, const Tensor& weights_raw, DType fp8, float quant_max);

// ---- paged cache (indexer_cache.cpp) ----

enum class CacheLayout { normal, shuffle };
const char* layout_name(CacheLayout layout);
// The fixed invariant (vLLM #43781): NORMAL iff block size 1, SHUFFLE for multiples of 16.
// Throws std::invalid_argument for other block sizes.
CacheLayout layout_for_block_size(int64_t block_size);

// Byte offsets inside one block (add block * block_stride). Block-flat: BS*128 value bytes, then
// BS fp32 scales.
int64_t value_offset(CacheLayout layout, int64_t block_size, int64_t t, int64_t d);
int64_t scale_offset(int64_t block_size, int64_t t);

// The cache is u8 [num_blocks, BS, 132] with stride(0) >= BS*132 (padded pages allowed) and the
// block contiguous inside.
struct CacheView {
  const Tensor& cache;
  int64_t block_size;
  CacheLayout layout;
};
// Writes token rows of k (bf16 [T', 128], any row stride) to the slots of slot_mapping (i64 [T']);
// slot < 0 writes nothing. Returns the new cache (a copy of `cache` with the writes applied).
Tensor write_k_cache(const Tensor& cache, const Tensor& k, const Tensor& slot_mapping,
                     CacheLayout layout, DType fp8, float quant_max);
// Raw bytes (128 values, then the 4 scale bytes) of token t of block b.
void read_token(const CacheView& c, int64_t block, int64_t t, uint8_t* values, float* scale);

// cp_gather_indexer_k_quant_cache: row i of request r (cu_seq_lens[r] <= i < cu_seq_lens[r+1]) is
// position p = i - cu[r], read from block block_table[r, p / BS], token p % BS.
struct GatheredK {
  Tensor values;  // fp8 [N, 128], copied bit for bit
  Tensor scales;  // f32 [N]
};
GatheredK gather_k_cache(const CacheView& c, const Tensor& block_table, const Tensor& cu_seq_lens,
                         DType fp8);

// ---- logits (indexer_logits.cpp) ----

// logits[i, j] = sum_h w[i,h] * relu(sum_d q[i,h,d] * k[j,d]) * k_scale[j] for ks[i] <= j < ke[i]
// (clamped to [0, N]), -inf elsewhere. q fp8 [M, H, 128], k fp8 [N, 128], k_scale f32 [N],
// weights f32 [M, H], ks/ke i32 [M]. Returns f32 [M, N].
Tensor mqa_logits(const Tensor& q, const Tensor& k, const Tensor& k_scale, const Tensor& weights,
                  const Tensor& ks, const Tensor& ke);

// Paged decode: q fp8 [B, next_n, H, 128], weights f32 [B*next_n, H], context_lens i32 [B],
// block_table i32 [B, W]. Row r = b*next_n + n sees positions p < row_end(b, n) (decode_row_end),
// K read from the cache through its layout. Returns f32 [B*next_n, max_model_len], -inf outside.
Tensor paged_mqa_logits(const Tensor& q, const CacheView& c, const Tensor& weights,
                        const Tensor& context_lens, const Tensor& block_table,
                        int64_t max_model_len);

// Valid positions of decode row n of a request with context length L: p <= L - next_n + n,
// clamped to [0, width].
int64_t decode_row_end(int64_t context_len, int64_t next_n, int64_t n, int64_t width);

// ---- top-k (indexer_topk.cpp) ----

// The k largest of values[begin, end) (ties: lower column first), as indices relative to `begin`,
// largest first; fewer than k when the window is shorter.
std::vector<int32_t> topk_window(const float* values, int64_t begin, int64_t end, int64_t k);
// logits f32 [M, N], ks/ke i32 [M] -> i32 [M, k]: request-local indices (col - ks), -1 fill.
Tensor topk_prefill(const Tensor& logits, const Tensor& ks, const Tensor& ke, int64_t k);
// logits f32 [B*next_n, W], seq_lens i32 [B] -> i32 [B*next_n, k] over [0, decode_row_end).
Tensor topk_decode(const Tensor& logits, const Tensor& seq_lens, int64_t next_n, int64_t k);

}  // namespace attncheck::ref::indexer
