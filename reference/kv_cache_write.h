// Paged K/V cache write (vLLM reshape_and_cache_flash and its SHUFFLE / packed variants,
// docs/ops/kv_cache_write.md): new tokens key/value [T, Hkv, D] stored at slot_mapping[t]
// (block slot / P, offset slot % P; negative slots skipped) through the caches' real strides.
// The write half of kv_gather: whatever layout kv_gather reads (reference/kv_gather.h), this
// writes. Bitwise for 16-bit caches; fp8 caches quantize x / scale, computed in float64.
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

}  // namespace attncheck::ref
