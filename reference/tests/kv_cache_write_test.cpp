#include "reference/kv_cache_write.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "reference/kv_gather.h"

namespace attncheck::ref {
namespace {

struct CacheSetup {
  KvLayout layout;
  KvStrides strides;
  DType cache;
};

std::vector<CacheSetup> every_layout() {
  std::vector<CacheSetup> out;
  for (DType dt : {DType::bf16, DType::f16, DType::e4m3fn, DType::e4m3fnuz}) {
    for (KvStrides st : {KvStrides::contiguous, KvStrides::hybrid, KvStrides::padded,
                         KvStrides::separate, KvStrides::packed})
      out.push_back({KvLayout::nhd, st, dt});
    for (KvStrides st :
         {KvStrides::contiguous, KvStrides::hybrid, KvStrides::padded, KvStrides::separate})
      out.push_back({KvLayout::shuffle, st, dt});
  }
  return out;
}

void fill_old_contents(const KvCacheViews& c, const std::string& tag) {
  if (is_fp8(c.key_cache.dtype())) {
    fill_fp8_codes(c.key_cache, Rng(tag, "old_k"), 200);
    fill_fp8_codes(c.value_cache, Rng(tag, "old_v"), 200);
  } else {
    fill_normal(c.key_cache, Rng(tag, "old_k"));
    fill_normal(c.value_cache, Rng(tag, "old_v"));
  }
}

// Distinct slots in a random order, the cache's very last slot included, some tokens padding (-1).
Tensor scattered_slots(int64_t T, int64_t total_slots, const std::string& tag) {
  Rng rng(tag, "slots");
  auto perm = permutation(total_slots, rng);
  Tensor slots = Tensor::empty(DType::i64, {T});
  for (int64_t t = 0; t < T; ++t) {
    int64_t s = perm[static_cast<size_t>(t)];
    if (t == T / 2) s = total_slots - 1;
    if (t != T / 2 && perm[static_cast<size_t>(t)] == total_slots - 1) s = -1;
    if (t % 7 == 3) s = -1;
    slots.at<int64_t>({t}) = s;
  }
  return slots;
}

// Independent fp8 quantizer: the code nearest to q among all finite codes of q's sign (ties to
// the even code), searching the table instead of rounding the bits.
uint8_t nearest_code(float q, DType fp8) {
  int best = -1;
  double best_err = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    const double v = fp8_decode(static_cast<uint8_t>(code), fp8);
    if (std::isnan(v)) continue;
    const bool negative_code = (code & 0x80) != 0;
    if (negative_code != std::signbit(q) && code != 0) continue;
    const double err = std::fabs(v - static_cast<double>(q));
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

// Reads the whole cache in slot order: one request whose block table is 0, 1, ..., nb-1.
KvGathered gather_all(const KvCacheViews& c, KvLayout layout, int64_t nb, int64_t P,
                      std::optional<KvDequant> dequant) {
  Tensor lens = Tensor::full(DType::i32, {1}, static_cast<double>(nb * P));
  Tensor table = Tensor::empty(DType::i32, {1, nb});
  for (int64_t b = 0; b < nb; ++b) table.at<int32_t>({0, b}) = static_cast<int32_t>(b);
  const KvGatherMeta m = chunk_meta(lens, nb * P, 0, 0);
  KvGatherArgs a;
  a.key_cache = c.key_cache;
  a.value_cache = c.value_cache;
  a.block_tables = table;
  a.cu_seqlens_kv = m.cu_seqlens_kv;
  a.token_to_batch = m.token_to_batch;
  a.seq_starts = m.seq_starts;
  a.layout = layout;
  a.total_tokens = m.total_tokens;
  a.dequant = dequant;
  a.out_dtype = dequant ? DType::bf16 : c.key_cache.dtype();
  return kv_gather(a);
}

// Second formulation: write, then gather every slot back with kv_gather's reference. Written slots
// hold the tokens (16-bit: bitwise; fp8: the nearest code of x / scale, dequantized), every other
// slot reads exactly what it held before.
TEST(KvCacheWrite, WriteThenGatherReturnsTheTokensInEveryLayout) {
  const int64_t P = 16, Hkv = 2, D = 64, nb = 7, T = 40;
  for (const CacheSetup& su : every_layout()) {
    const std::string tag = "rt" + std::to_string(static_cast<int>(su.layout)) + "_" +
                            std::to_string(static_cast<int>(su.strides)) + "_" +
                            std::string(dtype_name(su.cache));
    SCOPED_TRACE(tag);
    const bool fp8 = is_fp8(su.cache);
    const DType in = su.cache == DType::f16 ? DType::f16 : DType::bf16;
    const auto c = make_kv_cache(su.cache, su.layout, su.strides, nb, P, Hkv, D);
    fill_old_contents(c, tag);
    // Tokens inside a wider row (key, value interleaved per token, like a fused qkv output).
    Tensor kv = Tensor::empty(in, {T, 2, Hkv, D});
    fill_normal(kv, Rng(tag, "kv"));
    KvCacheWriteArgs a;
    a.key = kv.select(1, 0);
    a.value = kv.select(1, 1);
    a.key_cache = c.key_cache;
    a.value_cache = c.value_cache;
    a.slot_mapping = scattered_slots(T, nb * P, tag);
    a.layout = su.layout;
    const KvQuant q{1.7f, 0.0071f};  // v_scale small enough that some |x| / scale saturate
    if (fp8) a.quant = q;
    const KvCaches w = kv_cache_write(a);
    EXPECT_EQ(w.key_cache.storage() == w.value_cache.storage(),
              c.key_cache.storage() == c.value_cache.storage());

    const std::optional<KvDequant> dq =
        fp8 ? std::optional<KvDequant>(KvDequant{q.k_scale, q.v_scale}) : std::nullopt;
    const KvGathered before = gather_all(c, su.layout, nb, P, dq);
    const KvGathered after = gather_all({w.key_cache, w.value_cache}, su.layout, nb, P, dq);
    std::vector<int64_t> token_of(static_cast<size_t>(nb * P), -1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = a.slot_mapping.at<int64_t>({t});
      if (s >= 0) token_of[static_cast<size_t>(s)] = t;
    }
    int64_t wrong = 0, saturated = 0;
    for (int64_t slot = 0; slot < nb * P; ++slot) {
      const int64_t t = token_of[static_cast<size_t>(slot)];
      for (int v = 0; v < 2; ++v) {
        const Tensor& got = v ? after.value : after.key;
        const Tensor& old = v ? before.value : before.key;
        const Tensor& src = v ? a.value : a.key;
        const float scale = v ? q.v_scale : q.k_scale;
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            uint64_t want;
            if (t < 0) {
              want = old.get_bits({slot, h, d});
            } else if (!fp8) {
              want = src.get_bits({t, h, d});
            } else {
              const float quotient = static_cast<float>(src.get({t, h, d})) / scale;
              const uint8_t code = nearest_code(quotient, su.cache);
              saturated += std::fabs(quotient) > max_finite(su.cache);
              want = bf16_from_float(static_cast<float>(fp8_decode(code, su.cache)) * scale);
            }
            wrong += got.get_bits({slot, h, d}) != want;
          }
      }
    }
    EXPECT_EQ(wrong, 0);
    if (fp8) {
      EXPECT_GT(saturated, 0) << "the cases should reach the saturation path";
    }
  }
}

// Every storage byte that is not an element of a written slot keeps its value: other slots, other
// blocks, the other half of a hybrid or packed block, and padding outside the views.
TEST(KvCacheWrite, BytesOutsideTheWrittenSlotsAreUnchanged) {
  const int64_t P = 16, Hkv = 2, D = 64, nb = 5, T = 20;
  for (const CacheSetup& su : every_layout()) {
    SCOPED_TRACE(static_cast<int>(su.strides));
    const auto c = make_kv_cache(su.cache, su.layout, su.strides, nb, P, Hkv, D);
    fill_old_contents(c, "bytes");
    Tensor key = Tensor::empty(su.cache == DType::f16 ? DType::f16 : DType::bf16, {T, Hkv, D});
    Tensor value = Tensor::empty(key.dtype(), {T, Hkv, D});
    fill_normal(key, Rng("bytes", "k"));
    fill_normal(value, Rng("bytes", "v"));
    KvCacheWriteArgs a{
        key,       value,       c.key_cache, c.value_cache, scattered_slots(T, nb * P, "b"),
        su.layout, std::nullopt};
    if (is_fp8(su.cache)) a.quant = KvQuant{0.5f, 2.0f};
    const KvCaches w = kv_cache_write(a);
    std::set<std::pair<const Storage*, int64_t>> written;  // (storage, byte)
    const int64_t x = su.layout == KvLayout::shuffle ? shuffle_x(su.cache) : 1;
    const auto es = static_cast<int64_t>(dtype_size(su.cache));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = a.slot_mapping.at<int64_t>({t});
      if (s < 0) continue;
      for (int v = 0; v < 2; ++v)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const Tensor& view = v ? c.value_cache : c.key_cache;
            const int64_t off =
                view.element_offset(kv_cache_index(su.layout, v == 1, x, s / P, s % P, h, d));
            for (int64_t b = 0; b < es; ++b) written.insert({view.storage().get(), off * es + b});
          }
    }
    int64_t changed_outside = 0, changed_inside = 0;
    for (const auto* pair : {&c.key_cache, &c.value_cache}) {
      const Tensor& orig = *pair;
      const Tensor& now = pair == &c.key_cache ? w.key_cache : w.value_cache;
      const auto& ob = orig.storage()->bytes;
      const auto& nbytes = now.storage()->bytes;
      ASSERT_EQ(ob.size(), nbytes.size());
      for (size_t b = 0; b < ob.size(); ++b) {
        const bool in = written.count({orig.storage().get(), static_cast<int64_t>(b)}) > 0;
        (in ? changed_inside : changed_outside) += ob[b] != nbytes[b];
      }
    }
    EXPECT_EQ(changed_outside, 0);
    EXPECT_GT(changed_inside, 0);
  }
}

// The SHUFFLE writer bug (vLLM #39192, AITER #3492): block offset blk * Hkv * D * P from the shape.
// On a hybrid cache that lands in other blocks, so the round trip must expose it.
TEST(KvCacheWrite, ShapeDerivedShuffleBlockOffsetBreaksTheHybridRoundTrip) {
  const int64_t P = 16, Hkv = 1, D = 64, nb = 6, H = P * Hkv * D, T = 30;
  const auto hyb = make_kv_cache(DType::bf16, KvLayout::shuffle, KvStrides::hybrid, nb, P, Hkv, D);
  fill_old_contents(hyb, "bug");
  KvCacheViews wrong = hyb;  // the caches as the buggy writer addresses them
  wrong.key_cache = hyb.key_cache.as_strided(hyb.key_cache.shape(),
                                             Tensor::contiguous_strides(hyb.key_cache.shape()), 0);
  wrong.value_cache = hyb.key_cache.as_strided(
      hyb.value_cache.shape(), Tensor::contiguous_strides(hyb.value_cache.shape()), H);
  Tensor key = Tensor::empty(DType::bf16, {T, Hkv, D}),
         value = Tensor::empty(DType::bf16, {T, Hkv, D});
  fill_normal(key, Rng("bug", "k"));
  fill_normal(value, Rng("bug", "v"));
  const Tensor slots = scattered_slots(T, nb * P, "bug");
  const KvCaches good =
      kv_cache_write({key, value, hyb.key_cache, hyb.value_cache, slots, KvLayout::shuffle, {}});
  const KvCaches bad = kv_cache_write(
      {key, value, wrong.key_cache, wrong.value_cache, slots, KvLayout::shuffle, {}});
  const auto& gb = good.key_cache.storage()->bytes;
  const auto& bb = bad.key_cache.storage()->bytes;
  int64_t diffs = 0;
  for (size_t i = 0; i < gb.size(); ++i) diffs += gb[i] != bb[i];
  EXPECT_GT(diffs, static_cast<int64_t>(gb.size()) / 10);
}

TEST(KvCacheWrite, QuantizeRoundsToNearestEvenAndSaturates) {
  for (DType dt : {DType::e4m3fn, DType::e4m3fnuz}) {
    const double mx = max_finite(dt);
    EXPECT_EQ(kv_quantize(1000.0, 1.0f, dt), fp8_encode(mx, dt));
    EXPECT_EQ(kv_quantize(-1000.0, 1.0f, dt), fp8_encode(-mx, dt));
    EXPECT_EQ(fp8_decode(kv_quantize(1.0625, 1.0f, dt), dt), 1.0);   // tie -> even mantissa
    EXPECT_EQ(fp8_decode(kv_quantize(1.1875, 1.0f, dt), dt), 1.25);  // tie -> even mantissa
    EXPECT_EQ(fp8_decode(kv_quantize(3.0, 2.0f, dt), dt), 1.5);      // x / scale
    // Every bf16 value in [-600, 600] through a scale agrees with the table search.
    for (uint32_t bits = 0; bits < 0x10000; bits += 3) {
      const double x = decode_minifloat(bits, DType::bf16);
      if (!std::isfinite(x) || std::fabs(x) > 600) continue;
      const float qt = static_cast<float>(x) / 0.37f;
      ASSERT_EQ(kv_quantize(x, 0.37f, dt), nearest_code(qt, dt)) << x;
    }
  }
}

// ---- per-token quant (AITER reshape_and_cache_with_pertoken_quant) ----

// The flat element number AITER's kernel computes for a contiguous cache or scale tensor, turned
// into an index of `shape` (row-major), so the test does not reuse the reference's index maps.
Index unravel(int64_t flat, const Shape& shape) {
  Index idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return idx;
}

double code_value(uint64_t bits, DType cache) {
  if (cache == DType::i8) return static_cast<double>(static_cast<int8_t>(bits));
  return fp8_decode(static_cast<uint8_t>(bits), cache);
}

// Spacing of the fp8 codes around |v| (normal binades and the subnormal range alike).
double fp8_spacing(double v, DType fp8) {
  const int emin = fp8 == DType::e4m3fn ? -6 : -7;
  const int e = v > 0 ? std::max(static_cast<int>(std::floor(std::log2(v))), emin) : emin;
  return std::ldexp(1.0, e - 3);
}

struct PertokenSetup {
  bool asm_layout;
  KvStrides strides;
  DType cache;
  DType in;
};

std::vector<PertokenSetup> every_pertoken_layout() {
  std::vector<PertokenSetup> out;
  for (bool asm_layout : {true, false})
    for (KvStrides st :
         {KvStrides::contiguous, KvStrides::hybrid, KvStrides::padded, KvStrides::separate})
      for (DType cache : {DType::e4m3fn, DType::e4m3fnuz, DType::i8})
        for (DType in : {DType::bf16, DType::f16}) out.push_back({asm_layout, st, cache, in});
  return out;
}

// Second formulation: write, then read every slot back through AITER's flat offsets (K
// blk*Hkv*D*P + h*D*P + (d/16)*P*16 + s*16 + d%16; V asm blk*Hkv*D*P + h*D*P + (s/16)*D*16 +
// d*16 + s%16, else blk*Hkv*D*P + h*D*P + d*P + s; scale asm blk*Hkv*P + h*P + s, else
// h*nb*P + slot) and dequantize: code * scale returns the token within half a code step (fp8) or
// one step (int8 truncates), the row's amax maps to the format's max, zero rows to scale 0 and
// code 0; slots not written read what they held. Every storage byte outside the written elements
// and scales is unchanged.
TEST(KvCacheWritePertoken, WriteThenDequantReturnsTheTokensInEveryLayout) {
  const int64_t P = 16, Hkv = 3, D = 64, nb = 6, T = 36, x = 16;
  const float kEps = 1e-12f;
  for (const PertokenSetup& su : every_pertoken_layout()) {
    const std::string tag = std::string("pt") + (su.asm_layout ? "asm" : "paged") +
                            std::to_string(static_cast<int>(su.strides)) +
                            std::string(dtype_name(su.cache)) + std::string(dtype_name(su.in));
    SCOPED_TRACE(tag);
    const auto c = make_pertoken_cache(su.cache, su.asm_layout, su.strides, nb, P, Hkv, D);
    if (su.cache == DType::i8) {
      fill_uniform_int(c.key_cache, Rng(tag, "old_k"), -128, 127);
      fill_uniform_int(c.value_cache, Rng(tag, "old_v"), -128, 127);
    } else {
      fill_fp8_codes(c.key_cache, Rng(tag, "old_k"), 200);
      fill_fp8_codes(c.value_cache, Rng(tag, "old_v"), 200);
    }
    const Shape s_shape = su.asm_layout ? Shape{nb, Hkv, P} : Shape{Hkv, nb * P};
    Tensor ks = Tensor::empty(DType::f32, s_shape), vs = Tensor::empty(DType::f32, s_shape);
    fill_normal(ks, Rng(tag, "old_ks"));
    fill_normal(vs, Rng(tag, "old_vs"));
    Tensor kv = Tensor::empty(su.in, {T, 2, Hkv, D});
    fill_normal(kv, Rng(tag, "kv"));
    for (int64_t t = 1; t < T; t += 5)  // head 1 of K (even t) or V (odd t) all zero: scale 0
      for (int64_t d = 0; d < D; ++d) kv.set({t, t % 2, 1, d}, 0.0);
    KvPertokenWriteArgs a;
    a.key = kv.select(1, 0);
    a.value = kv.select(1, 1);
    a.key_cache = c.key_cache;
    a.value_cache = c.value_cache;
    a.k_dequant_scales = ks;
    a.v_dequant_scales = vs;
    a.slot_mapping = scattered_slots(T, nb * P, tag);
    a.asm_layout = su.asm_layout;
    const KvPertokenWritten w = kv_cache_write_pertoken_quant(a);
    EXPECT_EQ(w.key_cache.storage() == w.value_cache.storage(),
              c.key_cache.storage() == c.value_cache.storage());

    const Shape k_flat{nb, Hkv, D / x, P, x};
    const Shape v_flat = su.asm_layout ? Shape{nb, Hkv, P / x, D, x} : Shape{nb, Hkv, D, P};
    const double M = su.cache == DType::e4m3fn ? 448 : su.cache == DType::e4m3fnuz ? 240 : 127;
    std::vector<int64_t> token_of(static_cast<size_t>(nb * P), -1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = a.slot_mapping.at<int64_t>({t});
      if (s >= 0) token_of[static_cast<size_t>(s)] = t;
    }
    std::set<std::pair<const Storage*, int64_t>> written;  // (storage, byte)
    int64_t wrong = 0, zero_rows = 0, rows = 0;
    for (int64_t slot = 0; slot < nb * P; ++slot) {
      const int64_t t = token_of[static_cast<size_t>(slot)], blk = slot / P, s = slot % P;
      for (int v = 0; v < 2; ++v) {
        const Tensor& cache = v ? w.value_cache : w.key_cache;
        const Tensor& old_cache = v ? c.value_cache : c.key_cache;
        const Tensor& scales = v ? w.v_dequant_scales : w.k_dequant_scales;
        const Tensor& old_scales = v ? vs : ks;
        const Tensor& src = v ? a.value : a.key;
        for (int64_t h = 0; h < Hkv; ++h) {
          const Index si =
              unravel(su.asm_layout ? blk * Hkv * P + h * P + s : h * nb * P + slot, s_shape);
          if (t < 0) {
            wrong += scales.get_bits(si) != old_scales.get_bits(si);
          } else {
            written.insert({old_scales.storage().get(), old_scales.element_offset(si) * 4});
          }
          const double scale = scales.get(si);
          double amax = 0;
          if (t >= 0)
            for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(src.get({t, h, d})));
          if (t >= 0) {
            ++rows;
            zero_rows += amax == 0;
            if (amax == 0 && scale != 0) ++wrong;
            // amax / M rounded once to fp32, relative error <= 2^-24.
            if (std::fabs(scale - amax / M) > std::ldexp(amax / M, -24)) ++wrong;
          }
          const double eff = std::max(static_cast<float>(scale), kEps);
          for (int64_t d = 0; d < D; ++d) {
            const int64_t base = (blk * Hkv + h) * D * P;
            const int64_t flat =
                v ? (su.asm_layout ? base + (s / x) * D * x + d * x + s % x : base + d * P + s)
                  : base + (d / x) * P * x + s * x + d % x;
            const Index ci = unravel(flat, v ? v_flat : k_flat);
            if (t < 0) {
              wrong += cache.get_bits(ci) != old_cache.get_bits(ci);
              continue;
            }
            written.insert({old_cache.storage().get(), old_cache.element_offset(ci)});
            const double xv = src.get({t, h, d});
            const double code = code_value(cache.get_bits(ci), su.cache);
            const double q = xv / eff;  // the exact quotient the codes approximate
            const double slack = std::fabs(q) * std::ldexp(1.0, -21);  // the fp32 roundings
            if (su.cache == DType::i8) {
              // Truncation: the code lies between 0 and q, less than one step from q.
              if (std::fabs(code) > std::fabs(q) + slack || std::fabs(q - code) >= 1 + slack ||
                  (code != 0 && std::signbit(code) != std::signbit(q)))
                ++wrong;
            } else if (std::fabs(q - code) > fp8_spacing(std::fabs(q), su.cache) / 2 + slack) {
              ++wrong;
            }
            if (amax > 0 && std::fabs(xv) == amax && scale >= kEps) {
              // The row's largest element maps to the format's max (int8: trunc may give 126).
              if (su.cache == DType::i8 ? std::fabs(code) < M - 1 : std::fabs(code) != M) ++wrong;
            }
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(zero_rows, 0);
    EXPECT_GT(rows, 2 * Hkv * 20);
    // No byte outside the written elements and scales changed (padding, other halves, blocks).
    int64_t changed_outside = 0;
    auto compare_storage = [&](const Tensor& before, const Tensor& after, size_t es) {
      const auto& ob = before.storage()->bytes;
      const auto& nbytes = after.storage()->bytes;
      ASSERT_EQ(ob.size(), nbytes.size());
      for (size_t b = 0; b < ob.size(); ++b) {
        const auto el = static_cast<int64_t>(b / es) * static_cast<int64_t>(es == 4 ? 4 : 1);
        if (!written.count({before.storage().get(), el})) changed_outside += ob[b] != nbytes[b];
      }
    };
    compare_storage(c.key_cache, w.key_cache, 1);
    if (c.value_cache.storage() != c.key_cache.storage())
      compare_storage(c.value_cache, w.value_cache, 1);
    compare_storage(ks, w.k_dequant_scales, 4);
    compare_storage(vs, w.v_dequant_scales, 4);
    EXPECT_EQ(changed_outside, 0);
  }
}

// The contract is the AITER kernel's fp32 arithmetic. Formulated here with the host's fp32
// operations (IEEE, round to nearest even) instead of the reference's float64-then-round steps.
TEST(KvCacheWritePertoken, CodesAndScalesAreTheKernelsFp32Arithmetic) {
  for (DType cache : {DType::e4m3fn, DType::e4m3fnuz, DType::i8}) {
    const float M = cache == DType::e4m3fn ? 448.0f : cache == DType::e4m3fnuz ? 240.0f : 127.0f;
    EXPECT_EQ(pertoken_dtype_max(cache), static_cast<double>(M));
    int64_t checked = 0;
    for (uint32_t abits = 0x3000; abits < 0x5000; abits += 37) {  // amax in bf16, 2^-31 .. 2^33
      volatile float amax = bf16_to_float(static_cast<uint16_t>(abits));
      volatile float scale = amax / M;
      ASSERT_EQ(pertoken_scale(amax, cache), scale) << amax;
      volatile float inv = 1.0f / std::max(static_cast<float>(scale), 1e-12f);
      for (uint32_t xbits = 0; xbits < 0x10000; xbits += 97) {
        const float xf = bf16_to_float(static_cast<uint16_t>(xbits));
        if (!(std::fabs(xf) <= amax)) continue;
        volatile float q = xf * inv;
        const uint8_t want = cache == DType::i8
                                 ? static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(q)))
                                 : fp8_encode(static_cast<double>(q), cache, Saturation::saturate);
        ASSERT_EQ(pertoken_code(xf, scale, cache), want) << xf << " / " << scale;
        ++checked;
      }
    }
    EXPECT_GT(checked, 10000);
    // Hand values: amax M gives scale 1; int8 truncates toward zero; scale 0 gives code 0.
    EXPECT_EQ(pertoken_scale(M, cache), 1.0f);
    if (cache == DType::i8) {
      EXPECT_EQ(pertoken_code(1.9, 1.0f, cache), 1);
      EXPECT_EQ(static_cast<int8_t>(pertoken_code(-1.9, 1.0f, cache)), -1);
      EXPECT_EQ(pertoken_code(126.99, 1.0f, cache), 126);
    } else {
      EXPECT_EQ(fp8_decode(pertoken_code(1.0625, 1.0f, cache), cache), 1.0);  // tie -> even
      EXPECT_EQ(fp8_decode(pertoken_code(-M, 1.0f, cache), cache), -M);
    }
    EXPECT_EQ(pertoken_code(0.0, 0.0f, cache), 0);
    // Below the eps the clamped scale quantizes: x = 2^-40 with scale 1e-20 gives x * 1e12.
    const double tiny = std::ldexp(1.0, -40);
    const float inv12 = 1.0f / 1e-12f;
    const auto q = static_cast<float>(static_cast<float>(tiny) * inv12);
    EXPECT_EQ(pertoken_code(tiny, 1e-20f, cache), cache == DType::i8
                                                      ? static_cast<uint8_t>(static_cast<int>(q))
                                                      : fp8_encode(q, cache));
  }
}

// Why the codes are compared bitwise against this one formula: dividing by the scale (AITER's own
// torch reference does) instead of multiplying by the fp32 reciprocal moves some codes by one step
// where x / scale lies within a few fp32 ulps of an fp8 rounding midpoint. Both forms are
// legitimate arithmetic; the contract is the kernel's, and a dividing writer is reported.
TEST(KvCacheWritePertoken, ReciprocalAndDivisionFormsDifferOnSomeCodes) {
  for (DType cache : {DType::e4m3fn, DType::e4m3fnuz}) {
    Tensor rows = Tensor::empty(DType::bf16, {4096, 64});
    fill_normal(rows, Rng("recip", dtype_name(cache)));
    int64_t differ = 0, far = 0;
    for (int64_t r = 0; r < rows.size(0); ++r) {
      double amax = 0;
      for (int64_t d = 0; d < 64; ++d) amax = std::max(amax, std::fabs(rows.get({r, d})));
      const float scale = pertoken_scale(amax, cache);
      for (int64_t d = 0; d < 64; ++d) {
        const double xv = rows.get({r, d});
        const uint8_t recip = pertoken_code(xv, scale, cache);
        const uint8_t divided = fp8_encode(static_cast<float>(xv / scale), cache);
        differ += recip != divided;
        far += std::fabs(fp8_decode(recip, cache) - fp8_decode(divided, cache)) >
               fp8_spacing(std::fabs(xv / scale), cache);
      }
    }
    std::printf("[%s] reciprocal vs division form: %lld of %lld codes differ\n",
                std::string(dtype_name(cache)).c_str(), static_cast<long long>(differ),
                static_cast<long long>(rows.numel()));
    EXPECT_GT(differ, 0) << "the two forms should be distinguishable on normal data";
    EXPECT_EQ(far, 0) << "they never differ by more than one code step";
  }
}

TEST(KvCacheWritePertoken, RejectsInconsistentArguments) {
  const int64_t P = 16, Hkv = 2, D = 32, nb = 3;
  const auto paged = make_pertoken_cache(DType::e4m3fn, false, KvStrides::hybrid, nb, P, Hkv, D);
  Tensor key = Tensor::full(DType::bf16, {2, Hkv, D}, 1.0);
  Tensor slots = Tensor::empty(DType::i64, {2});
  slots.at<int64_t>({0}) = 3;
  slots.at<int64_t>({1}) = 40;
  Tensor ks = Tensor::full(DType::f32, {Hkv, nb * P}, 0.0);
  auto expect_msg = [](const KvPertokenWriteArgs& a, const std::string& what) {
    try {
      (void)kv_cache_write_pertoken_quant(a);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KvPertokenWriteArgs a{key, key, paged.key_cache, paged.value_cache, ks, ks.clone(), slots, false};
  EXPECT_NO_THROW((void)kv_cache_write_pertoken_quant(a));
  a.asm_layout = true;
  expect_msg(a, "does not match key_cache");
  a.asm_layout = false;
  a.k_dequant_scales = Tensor::full(DType::f32, {nb, Hkv, P}, 0.0);
  expect_msg(a, "dequant scales must be f32 [Hkv, nb * P]");
  a.k_dequant_scales = ks;
  Tensor past = slots.clone();
  past.at<int64_t>({1}) = nb * P;
  a.slot_mapping = past;
  expect_msg(a, "past the cache's 48 slots");
  const auto bf = make_kv_cache(DType::bf16, KvLayout::shuffle, KvStrides::separate, nb, P, Hkv, D);
  a = {key, key, bf.key_cache, bf.value_cache, ks, ks, slots, true};
  expect_msg(a, "per-token quant caches are fp8 e4m3 or int8");
  EXPECT_THROW((void)make_pertoken_cache(DType::i8, false, KvStrides::contiguous, nb, P, Hkv, 24),
               std::invalid_argument);
  EXPECT_THROW((void)make_pertoken_cache(DType::i8, true, KvStrides::contiguous, nb, 8, Hkv, D),
               std::invalid_argument);
  EXPECT_THROW((void)make_pertoken_cache(DType::i8, false, KvStrides::packed, nb, P, Hkv, D),
               std::invalid_argument);
}

TEST(KvCacheWrite, RejectsInconsistentArguments) {
  const int64_t P = 16, Hkv = 1, D = 64, nb = 3;
  const auto bf = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
  const auto f8 = make_kv_cache(DType::e4m3fn, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
  Tensor key = Tensor::full(DType::bf16, {2, Hkv, D}, 1.0);
  Tensor slots = Tensor::empty(DType::i64, {2});
  slots.at<int64_t>({0}) = 3;
  slots.at<int64_t>({1}) = 5;
  auto expect_msg = [](const KvCacheWriteArgs& a, const std::string& what) {
    try {
      (void)kv_cache_write(a);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KvCacheWriteArgs a{key, key, bf.key_cache, bf.value_cache, slots, KvLayout::nhd, std::nullopt};
  EXPECT_NO_THROW((void)kv_cache_write(a));
  a.key_cache = f8.key_cache;
  a.value_cache = f8.value_cache;
  expect_msg(a, "fp8 caches need quant");
  a = {key, key, bf.key_cache, bf.value_cache, slots, KvLayout::nhd, KvQuant{}};
  expect_msg(a, "quant requested for a non-fp8 cache");
  Tensor dup = slots.clone();
  dup.at<int64_t>({1}) = 3;
  a = {key, key, bf.key_cache, bf.value_cache, dup, KvLayout::nhd, std::nullopt};
  expect_msg(a, "slot 3 is mapped twice");
  Tensor past = slots.clone();
  past.at<int64_t>({1}) = nb * P;
  a.slot_mapping = past;
  expect_msg(a, "past the cache's 48 slots");
  a = {key.to(DType::f16), key.to(DType::f16), bf.key_cache, bf.value_cache, slots,
       KvLayout::nhd,      std::nullopt};
  expect_msg(a, "without quant the cache dtype must be the key's");
  a = {key, key, bf.key_cache, bf.value_cache, slots, KvLayout::shuffle, std::nullopt};
  expect_msg(a, "SHUFFLE caches must be 5-d");
  EXPECT_THROW(
      (void)make_kv_cache(DType::bf16, KvLayout::shuffle, KvStrides::packed, nb, P, Hkv, D),
      std::invalid_argument);
}

}  // namespace
}  // namespace attncheck::ref
