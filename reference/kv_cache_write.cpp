#include "kv_cache_write.h"

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/numeric.h"

namespace attncheck::ref {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

struct Geometry {
  int64_t nb, P, Hkv, D, x;
};

// Block count, block size, heads, head size and tile width of a pair of layout-shaped caches.
Geometry cache_geometry(const Tensor& K, const Tensor& V, KvLayout layout) {
  if (K.dtype() != V.dtype())
    throw std::invalid_argument("kv_cache_write: key_cache and value_cache dtypes differ");
  if (layout == KvLayout::nhd) {
    if (K.ndim() != 4 || K.shape() != V.shape())
      throw std::invalid_argument("kv_cache_write: NHD caches must both be [nb, P, Hkv, D], got " +
                                  K.describe() + " and " + V.describe());
    return {K.size(0), K.size(1), K.size(2), K.size(3), 1};
  }
  const int64_t x = shuffle_x(K.dtype());
  if (K.ndim() != 5 || V.ndim() != 5 || K.size(4) != x || V.size(4) != x)
    throw std::invalid_argument("kv_cache_write: SHUFFLE caches must be 5-d with x = " + str(x) +
                                ", got " + K.describe() + " and " + V.describe());
  const Geometry g{K.size(0), K.size(3), K.size(1), K.size(2) * x, x};
  if (V.shape() != Shape{g.nb, g.Hkv, g.P / x, g.D, x})
    throw std::invalid_argument("kv_cache_write: SHUFFLE value_cache " + V.describe() +
                                " does not match key_cache " + K.describe());
  return g;
}

}  // namespace

uint8_t kv_quantize(double x, float scale, DType fp8) {
  const auto q = static_cast<float>(x / static_cast<double>(scale));  // == fp32 x / scale
  return fp8_encode(static_cast<double>(q), fp8, Saturation::saturate);
}

KvCaches kv_cache_write(const KvCacheWriteArgs& a) {
  const Geometry g = cache_geometry(a.key_cache, a.value_cache, a.layout);
  const DType cache_dtype = a.key_cache.dtype();
  if (is_fp8(cache_dtype) != a.quant.has_value())
    throw std::invalid_argument(is_fp8(cache_dtype)
                                    ? "kv_cache_write: fp8 caches need quant (scales)"
                                    : "kv_cache_write: quant requested for a non-fp8 cache");
  const DType in = a.key.dtype();
  if ((in != DType::bf16 && in != DType::f16) || a.value.dtype() != in)
    throw std::invalid_argument("kv_cache_write: key and value must both be bf16 or f16");
  if (!a.quant && cache_dtype != in)
    throw std::invalid_argument("kv_cache_write: without quant the cache dtype must be the key's");
  if (a.key.ndim() != 3 || a.key.shape() != a.value.shape() || a.key.size(1) != g.Hkv ||
      a.key.size(2) != g.D)
    throw std::invalid_argument("kv_cache_write: key and value must be [T, Hkv=" + str(g.Hkv) +
                                ", D=" + str(g.D) + "], got " + a.key.describe() + " and " +
                                a.value.describe());
  const int64_t T = a.key.size(0);
  if (a.slot_mapping.dtype() != DType::i64 || a.slot_mapping.ndim() != 1 ||
      a.slot_mapping.size(0) != T)
    throw std::invalid_argument("kv_cache_write: slot_mapping must be int64 [T = " + str(T) + "]");

  // Copies of the storages, one per distinct storage, so aliased caches stay aliased.
  std::map<const Storage*, std::shared_ptr<Storage>> copies;
  auto rebase = [&](const Tensor& t) {
    auto& c = copies[t.storage().get()];
    if (!c) c = std::make_shared<Storage>(*t.storage());
    return t.rebased(c);
  };
  KvCaches out{rebase(a.key_cache), rebase(a.value_cache)};

  std::vector<bool> used(static_cast<size_t>(g.nb * g.P), false);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = a.slot_mapping.at<int64_t>({t});
    if (slot < 0) continue;  // padding token
    if (slot >= g.nb * g.P)
      throw std::invalid_argument("kv_cache_write: slot_mapping[" + str(t) + "] = " + str(slot) +
                                  " is past the cache's " + str(g.nb * g.P) + " slots");
    if (used[static_cast<size_t>(slot)])
      throw std::invalid_argument("kv_cache_write: slot " + str(slot) + " is mapped twice");
    used[static_cast<size_t>(slot)] = true;
    const int64_t blk = slot / g.P, s = slot % g.P;
    for (int v = 0; v < 2; ++v) {
      const Tensor& src = v ? a.value : a.key;
      const Tensor& dst = v ? out.value_cache : out.key_cache;
      for (int64_t h = 0; h < g.Hkv; ++h)
        for (int64_t d = 0; d < g.D; ++d) {
          const Index to = kv_cache_index(a.layout, v == 1, g.x, blk, s, h, d);
          if (!a.quant) {
            dst.set_bits(to, src.get_bits({t, h, d}));
            continue;
          }
          const float scale = v ? a.quant->v_scale : a.quant->k_scale;
          dst.set_bits(to, kv_quantize(src.get({t, h, d}), scale, cache_dtype));
        }
    }
  }
  return out;
}

}  // namespace attncheck::ref
