#include "reference/kv_cache_write.h"

#include <gtest/gtest.h>

#include <cmath>
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
