#include "reference/kv_gather.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"

namespace attncheck::ref {
namespace {

// Every (cache, block, slot, head, dim) gets its own value, exact in f32 for the small shapes used
// here: a read from the wrong block, slot, head or cache cannot match. Narrower dtypes round it.
double tag(int v, int64_t blk, int64_t s, int64_t h, int64_t d) {
  return static_cast<double>(((v * 16 + blk) * 64 + s) * 8 + h) + static_cast<double>(d) / 64.0;
}

void fill_tagged(const KvCacheViews& c, KvLayout layout) {
  const Tensor& K = c.key_cache;
  const int64_t x = layout == KvLayout::shuffle ? K.size(4) : 1;
  const int64_t nb = K.size(0);
  const int64_t P = layout == KvLayout::nhd ? K.size(1) : K.size(3);
  const int64_t H = layout == KvLayout::nhd ? K.size(2) : K.size(1);
  const int64_t D = layout == KvLayout::nhd ? K.size(3) : K.size(2) * x;
  for (int v = 0; v < 2; ++v)
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t s = 0; s < P; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            (v ? c.value_cache : c.key_cache)
                .set(kv_cache_index(layout, v == 1, x, b, s, h, d), tag(v, b, s, h, d));
}

struct Paged {
  Tensor context_lens;  // [B] int32
  Tensor block_tables;  // [B, W] int32, ids permuted so no request owns consecutive blocks
};

Paged paged(const std::vector<int32_t>& lens, int64_t P, int64_t num_blocks) {
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t W = 1;
  for (auto l : lens) W = std::max<int64_t>(W, (l + P - 1) / P);
  Paged pg{Tensor::empty(DType::i32, {B}), Tensor::full(DType::i32, {B, W + 2}, -7).slice(1, 0, W)};
  Rng rng("kv_gather_test", "blocks");
  const auto ids = permutation(num_blocks, rng);
  size_t next = 0;
  for (int64_t r = 0; r < B; ++r) {
    pg.context_lens.at<int32_t>({r}) = lens[r];
    for (int64_t j = 0; j < (lens[r] + P - 1) / P; ++j)
      pg.block_tables.at<int32_t>({r, j}) = static_cast<int32_t>(ids.at(next++));
  }
  return pg;
}

KvGatherArgs args_for(const KvCacheViews& c, KvLayout layout, const Paged& pg,
                      const KvGatherMeta& m) {
  KvGatherArgs a;
  a.key_cache = c.key_cache;
  a.value_cache = c.value_cache;
  a.block_tables = pg.block_tables;
  a.cu_seqlens_kv = m.cu_seqlens_kv;
  a.token_to_batch = m.token_to_batch;
  a.seq_starts = m.seq_starts;
  a.layout = layout;
  a.total_tokens = m.total_tokens;
  a.out_dtype = c.key_cache.dtype();
  return a;
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  int64_t diffs = 0;
  a.for_each_index([&](const Index& i, int64_t) { diffs += a.get_bits(i) != b.get_bits(i); });
  EXPECT_EQ(diffs, 0);
}

TEST(KvGather, HybridViewsInterleaveKAndVPerBlock) {
  const int64_t P = 16, Hkv = 2, D = 64, H = P * Hkv * D;
  const auto c = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::hybrid, 5, P, Hkv, D);
  EXPECT_EQ(c.key_cache.storage(), c.value_cache.storage());
  EXPECT_EQ(c.key_cache.strides(), (Shape{2 * H, Hkv * D, D, 1}));
  EXPECT_EQ(c.key_cache.element_offset(Index{1, 0, 0, 0}), 2 * H);    // K1 after V0
  EXPECT_EQ(c.value_cache.element_offset(Index{0, 0, 0, 0}), H);      // V0 after K0
  EXPECT_EQ(c.value_cache.element_offset(Index{3, 0, 0, 0}), 7 * H);  // V3
  EXPECT_EQ(static_cast<int64_t>(c.key_cache.storage()->bytes.size()), 2 * 5 * H * 2);
}

TEST(KvGather, HybridGatherEqualsContiguousGather) {
  const int64_t P = 16, Hkv = 2, D = 64, nb = 12;
  for (DType dt : {DType::bf16, DType::f32}) {
    const auto pg = paged({0, 1, 15, 16, 17, 50}, P, nb);
    const auto m = chunk_meta(pg.context_lens, 64, 0, 3);
    const auto hyb = make_kv_cache(dt, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
    const auto con = make_kv_cache(dt, KvLayout::nhd, KvStrides::contiguous, nb, P, Hkv, D);
    const auto pad = make_kv_cache(dt, KvLayout::nhd, KvStrides::padded, nb, P, Hkv, D);
    for (const auto* c : {&hyb, &con, &pad}) fill_tagged(*c, KvLayout::nhd);
    const auto a = kv_gather(args_for(hyb, KvLayout::nhd, pg, m));
    const auto b = kv_gather(args_for(con, KvLayout::nhd, pg, m));
    const auto p = kv_gather(args_for(pad, KvLayout::nhd, pg, m));
    expect_bitwise_equal(a.key, b.key);
    expect_bitwise_equal(a.value, b.value);
    expect_bitwise_equal(a.key, p.key);
    expect_bitwise_equal(a.value, p.value);
    // And it is the right content: token t of request r at position pos is block table entry
    // pos / P, slot pos % P.
    ASSERT_EQ(m.total_tokens, 0 + 1 + 15 + 16 + 17 + 50);
    const int64_t t = 1 + 15 + 16 + 17 + 37;  // request 5, position 37
    const int64_t blk = pg.block_tables.at<int32_t>({5, 37 / P});
    EXPECT_EQ(a.key.get({t, 1, 5}), decode_value(encode_value(tag(0, blk, 37 % P, 1, 5), dt), dt));
    EXPECT_EQ(a.value.get({t, 0, 63}),
              decode_value(encode_value(tag(1, blk, 37 % P, 0, 63), dt), dt));
  }
}

TEST(KvGather, PackedAndSeparateCachesGatherLikeContiguousOnes) {
  // Packed (vLLM #44455): one (nb, Hkv, P, 2D) tensor; V of a slot starts D elements after its K,
  // heads are P*2D apart, so neither view is contiguous within a block.
  const int64_t P = 16, Hkv = 2, D = 64, nb = 12;
  const auto pk = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::packed, nb, P, Hkv, D);
  EXPECT_EQ(pk.key_cache.storage(), pk.value_cache.storage());
  EXPECT_EQ(pk.key_cache.strides(), (Shape{Hkv * P * 2 * D, 2 * D, P * 2 * D, 1}));
  EXPECT_EQ(pk.value_cache.element_offset(Index{3, 5, 1, 0}),
            pk.key_cache.element_offset(Index{3, 5, 1, 0}) + D);
  const auto sep = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::separate, nb, P, Hkv, D);
  EXPECT_NE(sep.key_cache.storage(), sep.value_cache.storage());
  const auto con = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::contiguous, nb, P, Hkv, D);
  for (const auto* c : {&pk, &sep, &con}) fill_tagged(*c, KvLayout::nhd);
  const auto pg = paged({0, 1, 15, 16, 17, 50}, P, nb);
  const auto m = window_meta(pg.context_lens, 20, 2);
  const auto a = kv_gather(args_for(pk, KvLayout::nhd, pg, m));
  const auto b = kv_gather(args_for(sep, KvLayout::nhd, pg, m));
  const auto c = kv_gather(args_for(con, KvLayout::nhd, pg, m));
  expect_bitwise_equal(a.key, c.key);
  expect_bitwise_equal(a.value, c.value);
  expect_bitwise_equal(b.key, c.key);
  expect_bitwise_equal(b.value, c.value);
}

TEST(KvGather, ContiguousBlockStrideOnHybridCacheReadsOtherBlocks) {
  // The seed bug (#35925): block blk read at blk * H instead of blk * 2H. The tagged data must
  // expose it, otherwise the hybrid cases could not catch the pre-fix kernel.
  const int64_t P = 16, Hkv = 1, D = 64, nb = 8, H = P * Hkv * D;
  const auto pg = paged({40, 33}, P, nb);
  const auto m = chunk_meta(pg.context_lens, 64, 0, 0);
  const auto hyb = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
  fill_tagged(hyb, KvLayout::nhd);
  KvCacheViews prefix = hyb;
  prefix.key_cache = hyb.key_cache.as_strided(hyb.key_cache.shape(), {H, Hkv * D, D, 1}, 0);
  prefix.value_cache = hyb.key_cache.as_strided(hyb.key_cache.shape(), {H, Hkv * D, D, 1}, H);
  const auto good = kv_gather(args_for(hyb, KvLayout::nhd, pg, m));
  const auto bad = kv_gather(args_for(prefix, KvLayout::nhd, pg, m));
  int64_t diffs = 0;
  good.key.for_each_index(
      [&](const Index& i, int64_t) { diffs += good.key.get_bits(i) != bad.key.get_bits(i); });
  EXPECT_GT(diffs, good.key.numel() * 9 / 10);
}

// A SHUFFLE writer from the flat formulas of docs/ops/kv_gather.md, through the real block stride:
// independent of the 5-d views the gather reads.
void write_shuffle(const KvCacheViews& c, const Tensor& tokens_k, const Tensor& tokens_v,
                   const Paged& pg, int64_t P) {
  const Tensor& K = c.key_cache;
  const int64_t x = K.size(4), Hkv = K.size(1), D = K.size(2) * x;
  auto& bytes = K.storage()->bytes;
  const auto es = static_cast<int64_t>(K.element_size());
  int64_t t = 0;
  for (int64_t r = 0; r < pg.context_lens.size(0); ++r)
    for (int64_t pos = 0; pos < pg.context_lens.at<int32_t>({r}); ++pos, ++t) {
      const int64_t blk = pg.block_tables.at<int32_t>({r, pos / P}), s = pos % P;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t k_off = c.key_cache.offset() + blk * c.key_cache.stride(0) + h * (D * P) +
                                (d / x) * (P * x) + s * x + d % x;
          const int64_t v_off = c.value_cache.offset() + blk * c.value_cache.stride(0) +
                                h * (D * P) + (s / x) * (D * x) + d * x + s % x;
          const uint64_t kb = tokens_k.get_bits({t, h, d}), vb = tokens_v.get_bits({t, h, d});
          std::memcpy(&bytes[static_cast<size_t>(k_off * es)], &kb, static_cast<size_t>(es));
          std::memcpy(&bytes[static_cast<size_t>(v_off * es)], &vb, static_cast<size_t>(es));
        }
    }
}

TEST(KvGather, ShuffleRoundTripThroughAFlatFormulaWriter) {
  const int64_t P = 32, Hkv = 2, D = 128, nb = 9;
  for (KvStrides st : {KvStrides::contiguous, KvStrides::hybrid}) {
    for (DType dt : {DType::bf16, DType::e4m3fnuz}) {
      const auto pg = paged({70, 3, 32, 33}, P, nb);
      const auto m = chunk_meta(pg.context_lens, 1000, 0, 0);
      Tensor tk = Tensor::empty(dt, {m.total_tokens, Hkv, D});
      Tensor tv = Tensor::empty(dt, {m.total_tokens, Hkv, D});
      if (is_fp8(dt)) {
        fill_fp8_codes(tk, Rng("rt", "k"), 200);
        fill_fp8_codes(tv, Rng("rt", "v"), 200);
      } else {
        fill_normal(tk, Rng("rt", "k"));
        fill_normal(tv, Rng("rt", "v"));
      }
      const auto c = make_kv_cache(dt, KvLayout::shuffle, st, nb, P, Hkv, D);
      write_shuffle(c, tk, tv, pg, P);
      KvGatherArgs a = args_for(c, KvLayout::shuffle, pg, m);
      if (is_fp8(dt)) {
        a.dequant = KvDequant{1.0f, 1.0f};
        a.out_dtype = DType::bf16;  // fp8 values embed exactly: the round trip is still exact
      }
      const auto g = kv_gather(a);
      if (is_fp8(dt)) {
        const Tensor ek = tk.to(DType::bf16), ev = tv.to(DType::bf16);
        expect_bitwise_equal(g.key, ek);
        expect_bitwise_equal(g.value, ev);
      } else {
        expect_bitwise_equal(g.key, tk);
        expect_bitwise_equal(g.value, tv);
      }
    }
  }
}

TEST(KvGather, ShuffleAndNhdGatherTheSameTokens) {
  const int64_t P = 16, Hkv = 1, D = 64, nb = 10;
  const auto pg = paged({17, 40, 16}, P, nb);
  const auto m = window_meta(pg.context_lens, 20, 2);
  const auto nhd = make_kv_cache(DType::f16, KvLayout::nhd, KvStrides::padded, nb, P, Hkv, D);
  const auto shf = make_kv_cache(DType::f16, KvLayout::shuffle, KvStrides::padded, nb, P, Hkv, D);
  fill_tagged(nhd, KvLayout::nhd);
  fill_tagged(shf, KvLayout::shuffle);
  const auto a = kv_gather(args_for(nhd, KvLayout::nhd, pg, m));
  const auto b = kv_gather(args_for(shf, KvLayout::shuffle, pg, m));
  expect_bitwise_equal(a.key, b.key);
  expect_bitwise_equal(a.value, b.value);
}

TEST(KvGather, ChunkMetadataSkipsEmptyRequestsAndStartsMidBlock) {
  Tensor lens = Tensor::empty(DType::i32, {4});
  const int32_t ctx[] = {0, 5, 40, 17};
  for (int64_t r = 0; r < 4; ++r) lens.at<int32_t>({r}) = ctx[r];
  const auto m = chunk_meta(lens, 16, 1, 2);
  EXPECT_EQ(m.total_tokens, 16 + 1);
  EXPECT_EQ(m.cu_seqlens_kv.to_vector(), (std::vector<double>{0, 0, 0, 16, 17}));
  EXPECT_EQ(m.seq_starts.to_vector(), (std::vector<double>{16, 16, 16, 16}));
  std::vector<double> t2b(16, 2.0);
  t2b.insert(t2b.end(), {3, 4, 4});  // last real token, then the pad (= B)
  EXPECT_EQ(m.token_to_batch.to_vector(), t2b);

  const auto w = window_meta(lens, 8, 0);
  EXPECT_EQ(w.seq_starts.to_vector(), (std::vector<double>{0, 0, 32, 9}));
  EXPECT_EQ(w.cu_seqlens_kv.to_vector(), (std::vector<double>{0, 0, 5, 13, 21}));
}

TEST(KvGather, ChunksConcatenateToTheFullGather) {
  const int64_t P = 16, Hkv = 2, D = 64, nb = 14;
  const auto pg = paged({0, 1, 15, 16, 17, 100}, P, nb);
  const auto c = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
  fill_tagged(c, KvLayout::nhd);
  const auto full_m = chunk_meta(pg.context_lens, 1000, 0, 0);
  const auto full = kv_gather(args_for(c, KvLayout::nhd, pg, full_m));
  const int64_t chunk = 24;
  for (int64_t ci = 0; ci * chunk < 100; ++ci) {
    const auto m = chunk_meta(pg.context_lens, chunk, ci, 1);
    const auto g = kv_gather(args_for(c, KvLayout::nhd, pg, m));
    for (int64_t t = 0; t < m.total_tokens; ++t) {
      const int64_t r = m.token_to_batch.at<int32_t>({t});
      const int64_t pos = t - m.cu_seqlens_kv.at<int32_t>({r}) + ci * chunk;
      const int64_t ft = full_m.cu_seqlens_kv.at<int32_t>({r}) + pos;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; d += 7) {
          ASSERT_EQ(g.key.get_bits({t, h, d}), full.key.get_bits({ft, h, d}));
          ASSERT_EQ(g.value.get_bits({t, h, d}), full.value.get_bits({ft, h, d}));
        }
    }
  }
}

TEST(KvGather, DequantMultipliesInFp32AndRoundsOnceToTheOutputDtype) {
  const int64_t P = 16, Hkv = 1, D = 64, nb = 4;
  for (DType dt : {DType::e4m3fn, DType::e4m3fnuz}) {
    const auto pg = paged({30}, P, nb);
    const auto m = chunk_meta(pg.context_lens, 64, 0, 0);
    const auto c = make_kv_cache(dt, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
    fill_fp8_codes(c.key_cache, Rng("dq", "k"), 200);
    fill_fp8_codes(c.value_cache, Rng("dq", "v"), 200);
    KvGatherArgs a = args_for(c, KvLayout::nhd, pg, m);
    a.dequant = KvDequant{0.0371f, 1.7f};
    a.out_dtype = DType::bf16;
    const auto g = kv_gather(a);
    int64_t requant_differs = 0;
    for (int64_t t = 0; t < m.total_tokens; ++t) {
      const int64_t blk = pg.block_tables.at<int32_t>({0, t / P});
      for (int64_t d = 0; d < D; ++d) {
        const auto code = static_cast<uint8_t>(c.value_cache.get_bits({blk, t % P, 0, d}));
        const float prod = static_cast<float>(fp8_decode(code, dt)) * 1.7f;
        ASSERT_EQ(g.value.get_bits({t, 0, d}), bf16_from_float(prod));
        // The pre-fix kernel stored the product in the cache dtype: lossy for scale != 1.
        const double requant = fp8_decode(fp8_encode(prod, dt), dt);
        requant_differs += bf16_from_float(static_cast<float>(requant)) != bf16_from_float(prod);
      }
    }
    EXPECT_GT(requant_differs, m.total_tokens * D / 2);
  }
}

// Paged attention straight from the cache, and dense attention over gathered K/V: identical in
// double, which ties the gather's metadata to what attention means by "context".
std::vector<double> attend(const std::vector<double>& q, const std::vector<std::vector<double>>& k,
                           const std::vector<std::vector<double>>& v) {
  std::vector<double> logits(k.size()), out(v.empty() ? 0 : v[0].size(), 0.0);
  double mx = -INFINITY, den = 0;
  for (size_t j = 0; j < k.size(); ++j) {
    for (size_t d = 0; d < q.size(); ++d) logits[j] += q[d] * k[j][d];
    mx = std::max(mx, logits[j]);
  }
  for (size_t j = 0; j < k.size(); ++j) den += std::exp(logits[j] - mx);
  for (size_t j = 0; j < k.size(); ++j)
    for (size_t d = 0; d < out.size(); ++d) out[d] += std::exp(logits[j] - mx) / den * v[j][d];
  return out;
}

TEST(KvGather, GatherThenDenseAttentionEqualsPagedAttention) {
  const int64_t P = 16, Hkv = 2, Hq = 4, D = 64, nb = 9;
  const auto pg = paged({17, 33, 1, 48}, P, nb);
  const auto c = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::hybrid, nb, P, Hkv, D);
  fill_normal(c.key_cache, Rng("attn", "k"));
  fill_normal(c.value_cache, Rng("attn", "v"));
  const auto m = chunk_meta(pg.context_lens, 1000, 0, 0);
  const auto g = kv_gather(args_for(c, KvLayout::nhd, pg, m));
  Tensor q = Tensor::empty(DType::f64, {4, Hq, D});
  fill_normal(q, Rng("attn", "q"), 0.0, 0.125);
  auto row = [&](const Tensor& t, Index idx) {
    std::vector<double> r(static_cast<size_t>(D));
    idx.push_back(0);
    for (int64_t d = 0; d < D; ++d) {
      idx.back() = d;
      r[d] = t.get(idx);
    }
    return r;
  };
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hkv);
      std::vector<std::vector<double>> pk, pv, dk, dv;
      for (int64_t pos = 0; pos < pg.context_lens.at<int32_t>({r}); ++pos) {
        const int64_t blk = pg.block_tables.at<int32_t>({r, pos / P});
        pk.push_back(row(c.key_cache, {blk, pos % P, kh}));
        pv.push_back(row(c.value_cache, {blk, pos % P, kh}));
        const int64_t t = m.cu_seqlens_kv.at<int32_t>({r}) + pos;
        dk.push_back(row(g.key, {t, kh}));
        dv.push_back(row(g.value, {t, kh}));
      }
      const auto qr = row(q, {r, h});
      const auto a = attend(qr, pk, pv), b = attend(qr, dk, dv);
      for (int64_t d = 0; d < D; ++d) ASSERT_NEAR(a[d], b[d], 1e-12);
    }
}

TEST(KvGather, RejectsInconsistentArguments) {
  const int64_t P = 16, Hkv = 1, D = 64, nb = 4;
  const auto pg = paged({20}, P, nb);
  const auto m = chunk_meta(pg.context_lens, 64, 0, 0);
  const auto fp8 =
      make_kv_cache(DType::e4m3fn, KvLayout::nhd, KvStrides::contiguous, nb, P, Hkv, D);
  const auto bf = make_kv_cache(DType::bf16, KvLayout::nhd, KvStrides::contiguous, nb, P, Hkv, D);
  auto expect_msg = [](const KvGatherArgs& a, const std::string& what) {
    try {
      (void)kv_gather(a);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KvGatherArgs a = args_for(fp8, KvLayout::nhd, pg, m);
  a.out_dtype = DType::bf16;
  expect_msg(a, "fp8 caches need dequant");
  a = args_for(bf, KvLayout::nhd, pg, m);
  a.dequant = KvDequant{};
  expect_msg(a, "dequant requested for a non-fp8 cache");
  a = args_for(bf, KvLayout::nhd, pg, m);
  a.out_dtype = DType::f16;
  expect_msg(a, "output dtype must be the cache's");
  a = args_for(bf, KvLayout::nhd, pg, m);
  a.token_to_batch = Tensor::full(DType::i32, {m.total_tokens}, 3);
  expect_msg(a, "token_to_batch[0] = 3");
  a = args_for(bf, KvLayout::shuffle, pg, m);
  expect_msg(a, "SHUFFLE caches must be 5-d");
  try {
    (void)make_kv_cache(DType::e4m3fn, KvLayout::shuffle, KvStrides::hybrid, nb, 8, Hkv, D);
    ADD_FAILURE() << "SHUFFLE with P = 8 and x = 16 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of x = 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attncheck::ref
