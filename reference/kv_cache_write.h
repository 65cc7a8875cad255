// Paged K/V cache write (vLLM reshape_and_cache_flash and its SHUFFLE / packed variants,
// docs/ops/kv_cache_write.md): new tokens key/value [T, Hkv, D] stored at slot_mapping[t]
// (block slot / P, offset slot % P; negative slots skipped) through the caches' real strides.
// The write half of kv_gather: whatever layout kv_gather reads (reference/kv_gather.h), this
// writes. Bitwise for 16-bit caches; fp8 caches quantize x / scale, computed in float64.
// The per-token-quant variant (AITER reshape_and_cache_with_pertoken_quant) computes one scale per
// (token, head) from the row's amax and stores it beside the codes.
#pragma once
#include <optional>

#include "core/tensor.h"
#include "reference/kv_gather.h"

namespace attncheck::ref {

struct KvQuant {
  float k_scale = 1.0f;  // per-tensor scales (k_scale[0], v_scale[0]); the cache holds x / scale
  float v_scale = 1.0f;
};

struct KvCacheWriteArgs {
  Tensor key, value;              // [T, Hkv, D] bf16/f16, any strides
  Tensor key_cache, value_cache;  // layout-shaped views (kv_gather's), any strides, may alias
  Tensor slot_mapping;            // [T] int64; < 0: padding token, nothing written
  KvLayout layout = KvLayout::nhd;
  std::optional<KvQuant> quant;  // required for fp8 caches, refused for others
};

struct KvCaches {
  Tensor key_cache, value_cache;  // the same views over copies of the caches' storages
};

// One element of an fp8 cache: code = RNE_fp8(fp32(x) / scale), saturated to +-max finite.
// The quotient is formed in float64 and rounded once to float32, which equals the correctly
// rounded fp32 division (53 >= 2*24 + 2 bits: double rounding is innocuous for division).
uint8_t kv_quantize(double x, float scale, DType fp8);

// The caches after the write: copies of their storages (aliasing kept: K and V of one storage
// stay one storage) with every slot of a non-negative slot_mapping entry overwritten and every
// other byte as it was. Throws std::invalid_argument for inconsistent arguments, a slot past the
// cache, or two tokens mapped to one slot (the result would depend on the write order).
KvCaches kv_cache_write(const KvCacheWriteArgs& a);

// ---- per-token quant (AITER reshape_and_cache_with_pertoken_quant) ----
// K is always the SHUFFLE K tile [nb, Hkv, D/x, P, x]; V is the SHUFFLE V tile
// [nb, Hkv, P/x, D, x] with asm_layout, else vLLM's paged-attention V [nb, Hkv, D, P]. Caches are
// 1-byte codes (x = 16): fp8 (e4m3fn, e4m3fnuz) or int8. The dequant scales are f32, one per slot
// and head: [nb, Hkv, P] with asm_layout, else [Hkv, nb * P].

// The per-row constant M that amax is divided by: the cache format's largest finite value (448
// e4m3fn, 240 e4m3fnuz) or 127 for int8 (opus::finfo<cache_t>::max()).
double pertoken_dtype_max(DType cache);
// scale = fp32(amax / M): one correctly rounded fp32 division (amax is exact in fp32).
float pertoken_scale(double amax, DType cache);
// One code of a row with dequant scale `scale`: q = fp32(x * fp32(1 / max(scale, 1e-12f))), then
// RNE to fp8 saturated (|q| <= M (1 + 2^-22), so saturation never changes a code) or, for int8,
// truncation toward zero (a C++ float -> int8 conversion). Every fp32 step is formed in float64 and
// rounded once (exact products; innocuous double rounding for the quotients).
uint8_t pertoken_code(double x, float scale, DType cache);

// (blk, s, h, d) of the value cache and (blk, s, h) of the scale tensors, per asm_layout.
Index pertoken_value_index(bool asm_layout, int64_t x, int64_t blk, int64_t s, int64_t h,
                           int64_t d);
Index pertoken_scale_index(bool asm_layout, int64_t P, int64_t blk, int64_t s, int64_t h);

// The two caches of a per-token layout with kv_gather's storage arrangements (contiguous, hybrid,
// padded, separate; not packed), every storage element poisoned before the caller fills the views.
// With asm_layout this is make_kv_cache(SHUFFLE). Throws std::invalid_argument for packed, for
// D not a multiple of x = 16, and (asm_layout) P not a multiple of x.
KvCacheViews make_pertoken_cache(DType cache, bool asm_layout, KvStrides strides, int64_t nb,
                                 int64_t P, int64_t Hkv, int64_t D);

struct KvPertokenWriteArgs {
  Tensor key, value;                          // [T, Hkv, D] bf16/f16, any strides
  Tensor key_cache, value_cache;              // per-token layout views, any strides, may alias
  Tensor k_dequant_scales, v_dequant_scales;  // f32, any strides
  Tensor slot_mapping;                        // [T] int64; < 0: padding token, nothing written
  bool asm_layout = true;
};

struct KvPertokenWritten {
  Tensor key_cache, value_cache, k_dequant_scales, v_dequant_scales;  // copies, aliasing kept
};

// For every token with slot >= 0 and every head h: amax over the row's D values, its scale stored
// at the slot, every element's code stored at the slot; everything else keeps its bytes. Throws
// std::invalid_argument for inconsistent arguments, a slot past the cache or one mapped twice.
KvPertokenWritten kv_cache_write_pertoken_quant(const KvPertokenWriteArgs& a);

}  // namespace attncheck::ref
