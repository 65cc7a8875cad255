#include "kv_cache_write.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"

namespace attncheck::ref {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

// Copies of the storages, one per distinct storage, so aliased views stay aliased.
class StorageCopies {
 public:
  Tensor operator()(const Tensor& t) {
    auto& c = copies_[t.storage().get()];
    if (!c) c = std::make_shared<Storage>(*t.storage());
    return t.rebased(c);
  }

 private:
  std::map<const Storage*, std::shared_ptr<Storage>> copies_;
};

// slot_mapping[t] for a slot inside the cache and not mapped before, or -1 for a padding token.
class SlotChecker {
 public:
  explicit SlotChecker(int64_t total) : total_(total), used_(static_cast<size_t>(total), false) {}
  int64_t operator()(const Tensor& slot_mapping, int64_t t) {
    const int64_t slot = slot_mapping.at<int64_t>({t});
    if (slot < 0) return -1;
    if (slot >= total_)
      throw std::invalid_argument("kv_cache_write: slot_mapping[" + str(t) + "] = " + str(slot) +
                                  " is past the cache's " + str(total_) + " slots");
    if (used_[static_cast<size_t>(slot)])
      throw std::invalid_argument("kv_cache_write: slot " + str(slot) + " is mapped twice");
    used_[static_cast<size_t>(slot)] = true;
    return slot;
  }

 private:
  int64_t total_;
  std::vector<bool> used_;
};

void check_tokens(const Tensor& key, const Tensor& value, const Tensor& slot_mapping, int64_t Hkv,
                  int64_t D) {
  const DType in = key.dtype();
  if ((in != DType::bf16 && in != DType::f16) || value.dtype() != in)
    throw std::invalid_argument("kv_cache_write: key and value must both be bf16 or f16");
  if (key.ndim() != 3 || key.shape() != value.shape() || key.size(1) != Hkv || key.size(2) != D)
    throw std::invalid_argument("kv_cache_write: key and value must be [T, Hkv=" + str(Hkv) +
                                ", D=" + str(D) + "], got " + key.describe() + " and " +
                                value.describe());
  if (slot_mapping.dtype() != DType::i64 || slot_mapping.ndim() != 1 ||
      slot_mapping.size(0) != key.size(0))
    throw std::invalid_argument(
        "kv_cache_write: slot_mapping must be int64 [T = " + str(key.size(0)) + "]");
}

// Row-major strides with `pad` extra elements after every row of every dimension but the last.
Shape padded_strides(const Shape& shape, int64_t pad) {
  Shape s(shape.size(), 1);
  for (size_t i = shape.size() - 1; i-- > 0;) s[i] = s[i + 1] * shape[i + 1] + pad;
  return s;
}

constexpr int64_t kPertokenX = 16;  // SHUFFLE tile width of a 1-byte cache

}  // namespace

uint8_t kv_quantize(double x, float scale, DType fp8) {
  const auto q = static_cast<float>(x / static_cast<double>(scale));  // == fp32 x / scale
  return fp8_encode(static_cast<double>(q), fp8, Saturation::saturate);
}

KvCaches kv_cache_write(const KvCacheWriteArgs& a) {
  const KvCacheGeometry g =
      kv_cache_geometry(a.key_cache, a.value_cache, a.layout, "kv_cache_write");
  const DType cache_dtype = a.key_cache.dtype();
  if (is_fp8(cache_dtype) != a.quant.has_value())
    throw std::invalid_argument(is_fp8(cache_dtype)
                                    ? "kv_cache_write: fp8 caches need quant (scales)"
                                    : "kv_cache_write: quant requested for a non-fp8 cache");
  check_tokens(a.key, a.value, a.slot_mapping, g.Hkv, g.D);
  if (!a.quant && cache_dtype != a.key.dtype())
    throw std::invalid_argument("kv_cache_write: without quant the cache dtype must be the key's");
  const int64_t T = a.key.size(0);

  StorageCopies rebase;
  KvCaches out{rebase(a.key_cache), rebase(a.value_cache)};
  SlotChecker checked_slot(g.nb * g.P);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = checked_slot(a.slot_mapping, t);
    if (slot < 0) continue;  // padding token
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

double pertoken_dtype_max(DType cache) {
  if (cache == DType::i8) return 127.0;
  if (cache == DType::e4m3fn || cache == DType::e4m3fnuz) return max_finite(cache);
  throw std::invalid_argument(
      std::string("kv_cache_write: per-token quant caches are fp8 e4m3 or ") + "int8, got " +
      std::string(dtype_name(cache)));
}

float pertoken_scale(double amax, DType cache) {
  return static_cast<float>(amax / pertoken_dtype_max(cache));
}

uint8_t pertoken_code(double x, float scale, DType cache) {
  static const float kEps = 1e-12f;  // AITER's k_pertoken_quant_scale_eps
  const auto inv = static_cast<float>(1.0 / static_cast<double>(std::max(scale, kEps)));
  const auto q = static_cast<float>(x * static_cast<double>(inv));  // exact product, one rounding
  if (cache == DType::i8) {
    const double r = std::trunc(static_cast<double>(q));
    if (!(std::fabs(r) <= 127.0))
      throw std::invalid_argument("kv_cache_write: int8 code " + std::to_string(q) +
                                  " out of range (x = " + std::to_string(x) + ")");
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
  return fp8_encode(static_cast<double>(q), cache, Saturation::saturate);
}

Index pertoken_value_index(bool asm_layout, int64_t x, int64_t blk, int64_t s, int64_t h,
                           int64_t d) {
  if (asm_layout) return kv_cache_index(KvLayout::shuffle, true, x, blk, s, h, d);
  return {blk, h, d, s};
}

Index pertoken_scale_index(bool asm_layout, int64_t P, int64_t blk, int64_t s, int64_t h) {
  if (asm_layout) return {blk, h, s};
  return {h, blk * P + s};
}

KvCacheViews make_pertoken_cache(DType cache, bool asm_layout, KvStrides strides, int64_t nb,
                                 int64_t P, int64_t Hkv, int64_t D) {
  (void)pertoken_dtype_max(cache);  // refuses other dtypes
  if (nb < 1 || P < 1 || Hkv < 1 || D < 1)
    throw std::invalid_argument("make_pertoken_cache: every dimension must be >= 1");
  if (strides == KvStrides::packed)
    throw std::invalid_argument("the packed (nb, Hkv, P, 2D) cache is an NHD layout");
  if (D % kPertokenX != 0)
    throw std::invalid_argument("per-token quant caches need head_dim a multiple of 16, got " +
                                str(D));
  if (asm_layout) return make_kv_cache(cache, KvLayout::shuffle, strides, nb, P, Hkv, D);
  const int64_t x = kPertokenX;
  const Shape k_shape{nb, Hkv, D / x, P, x}, v_shape{nb, Hkv, D, P};
  const int64_t H = P * Hkv * D;
  if (strides == KvStrides::separate) {
    Tensor k = Tensor::empty(cache, k_shape), v = Tensor::empty(cache, v_shape);
    poison(k);
    poison(v);
    return {k, v};
  }
  Shape k_strides = Tensor::contiguous_strides(k_shape);
  Shape v_strides = Tensor::contiguous_strides(v_shape);
  int64_t total = 2 * nb * H, k_offset = 0, v_offset = nb * H;
  if (strides == KvStrides::hybrid) {
    k_strides[0] = v_strides[0] = 2 * H;
    v_offset = H;
  } else if (strides == KvStrides::padded) {
    const int64_t pad = 16;  // one 16-byte line of a 1-byte cache
    k_strides = padded_strides(k_shape, pad);
    v_strides = padded_strides(v_shape, pad);
    const int64_t k_region = k_strides[0] * nb + pad, v_region = v_strides[0] * nb + pad;
    k_offset = pad;
    v_offset = pad + k_region;
    total = k_region + v_region + 2 * pad;
  }
  Tensor storage = Tensor::empty(cache, {total});
  poison(storage);
  return {storage.as_strided(k_shape, k_strides, k_offset),
          storage.as_strided(v_shape, v_strides, v_offset)};
}

KvPertokenWritten kv_cache_write_pertoken_quant(const KvPertokenWriteArgs& a) {
  const Tensor& K = a.key_cache;
  const Tensor& V = a.value_cache;
  const DType cache = K.dtype();
  if (V.dtype() != cache)
    throw std::invalid_argument("kv_cache_write: key_cache and value_cache dtypes differ");
  (void)pertoken_dtype_max(cache);
  const int64_t x = kPertokenX;
  if (K.ndim() != 5 || K.size(4) != x)
    throw std::invalid_argument(
        "kv_cache_write: per-token key_cache must be [nb, Hkv, D/16, P, "
        "16], got " +
        K.describe());
  const int64_t nb = K.size(0), Hkv = K.size(1), D = K.size(2) * x, P = K.size(3);
  const Shape v_shape = a.asm_layout ? Shape{nb, Hkv, P / x, D, x} : Shape{nb, Hkv, D, P};
  if (V.shape() != v_shape || (a.asm_layout && P % x != 0))
    throw std::invalid_argument(
        std::string("kv_cache_write: value_cache ") + V.describe() + " does not match key_cache " +
        K.describe() +
        (a.asm_layout ? " (asm_layout: V [nb, Hkv, P/16, D, 16])" : " (V [nb, Hkv, D, P])"));
  const Shape s_shape = a.asm_layout ? Shape{nb, Hkv, P} : Shape{Hkv, nb * P};
  for (const Tensor* sc : {&a.k_dequant_scales, &a.v_dequant_scales})
    if (sc->dtype() != DType::f32 || sc->shape() != s_shape)
      throw std::invalid_argument(std::string("kv_cache_write: dequant scales must be f32 ") +
                                  (a.asm_layout ? "[nb, Hkv, P]" : "[Hkv, nb * P]") + ", got " +
                                  sc->describe());
  check_tokens(a.key, a.value, a.slot_mapping, Hkv, D);
  const int64_t T = a.key.size(0);

  StorageCopies rebase;
  KvPertokenWritten out{rebase(K), rebase(V), rebase(a.k_dequant_scales),
                        rebase(a.v_dequant_scales)};
  SlotChecker checked_slot(nb * P);
  std::vector<double> row(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = checked_slot(a.slot_mapping, t);
    if (slot < 0) continue;  // padding token: neither codes nor scales
    const int64_t blk = slot / P, s = slot % P;
    for (int v = 0; v < 2; ++v) {
      const Tensor& src = v ? a.value : a.key;
      for (int64_t h = 0; h < Hkv; ++h) {
        double amax = 0;
        for (int64_t d = 0; d < D; ++d) {
          row[static_cast<size_t>(d)] = src.get({t, h, d});
          amax = std::max(amax, std::fabs(row[static_cast<size_t>(d)]));
        }
        const float scale = pertoken_scale(amax, cache);
        (v ? out.v_dequant_scales : out.k_dequant_scales)
            .set(pertoken_scale_index(a.asm_layout, P, blk, s, h), scale);
        for (int64_t d = 0; d < D; ++d) {
          const Index to = v ? pertoken_value_index(a.asm_layout, x, blk, s, h, d)
                             : kv_cache_index(KvLayout::shuffle, false, x, blk, s, h, d);
          (v ? out.value_cache : out.key_cache)
              .set_bits(to, pertoken_code(row[static_cast<size_t>(d)], scale, cache));
        }
      }
    }
  }
  return out;
}

}  // namespace attncheck::ref
