// Indexer logits against a direct loop (scale applied inside the relu, as the AITER kernels do),
// -inf windows, and paged decode against gather-then-prefill through both cache layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/numeric.h"
#include "core/rng.h"
#include "reference/indexer.h"

namespace attncheck::ref::indexer {
namespace {

struct Inputs {
  Tensor q, k, k_scale, weights;
};

Inputs make_inputs(int64_t M, int64_t H, int64_t N, DType fmt, const char* tag) {
  Tensor qb = Tensor::empty(DType::bf16, {M, H, kHeadDim});
  Tensor raw = Tensor::empty(DType::bf16, {M, H});
  Tensor kb = Tensor::empty(DType::bf16, {N, kHeadDim});
  fill_normal(qb, Rng("indexer_logits_test", tag, 1));
  fill_normal(raw, Rng("indexer_logits_test", tag, 2));
  fill_normal(kb, Rng("indexer_logits_test", tag, 3), 0.0, 5.0);
  const float M8 = quant_max(fmt, QuantMaxVariant::vllm);
  auto q = quantize_q(qb, raw, fmt, M8);
  auto k = quantize_k(kb, fmt, M8);
  return {q.q_fp8, k.values, k.scales, q.weights};
}

Tensor i32(std::vector<int64_t> v) {
  Tensor t = Tensor::empty(DType::i32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i)
    t.at<int32_t>({static_cast<int64_t>(i)}) = static_cast<int32_t>(v[i]);
  return t;
}

TEST(IndexerLogits, PrefillMatchesDirectLoop) {
  for (DType fmt : {DType::e4m3fn, DType::e4m3fnuz}) {
    const int64_t M = 6, H = 8, N = 50;
    const auto in = make_inputs(M, H, N, fmt, "prefill");
    // Windows: full, empty, a single column, clamped past N, ordinary.
    const Tensor ks = i32({0, 10, 7, 40, -3, 5});
    const Tensor ke = i32({50, 10, 8, 70, 20, 33});
    const Tensor out = mqa_logits(in.q, in.k, in.k_scale, in.weights, ks, ke);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const int64_t lo = std::max<int64_t>(0, ks.at<int32_t>({i}));
        const int64_t hi = std::min<int64_t>(N, ke.at<int32_t>({i}));
        const double got = out.get({i, j});
        if (j < lo || j >= hi) {
          ASSERT_TRUE(std::isinf(got) && got < 0) << i << "," << j;
          continue;
        }
        long double acc = 0, mag = 0;
        for (int64_t h = 0; h < H; ++h) {
          long double dot = 0;
          for (int64_t d = 0; d < kHeadDim; ++d)
            dot += static_cast<long double>(in.q.get({i, h, d})) * in.k.get({j, d});
          const long double term =
              in.weights.get({i, h}) * std::max(0.0L, dot * in.k_scale.get({j}));
          acc += term;
          mag += std::fabs(term);
        }
        // The expected output is fp32: one rounding of the exact value.
        ASSERT_NEAR(got, static_cast<double>(acc),
                    static_cast<double>(std::fabs(acc)) * std::ldexp(1.0, -24) +
                        1e-12 * static_cast<double>(mag))
            << i << "," << j;
      }
  }
}

TEST(IndexerLogits, DecodeRowEndFollowsNextN) {
  // L counts the next_n tokens being decoded: row n sees p <= L - next_n + n.
  EXPECT_EQ(decode_row_end(100, 1, 0, 4096), 100);
  EXPECT_EQ(decode_row_end(100, 4, 0, 4096), 97);
  EXPECT_EQ(decode_row_end(100, 4, 3, 4096), 100);
  EXPECT_EQ(decode_row_end(1, 2, 0, 4096), 0);
  EXPECT_EQ(decode_row_end(5000, 1, 0, 4096), 4096);
}

TEST(IndexerLogits, PagedEqualsGatherThenPrefill) {
  for (int64_t bs : {1, 16, 64}) {
    const CacheLayout layout = layout_for_block_size(bs);
    const DType fmt = bs == 16 ? DType::e4m3fnuz : DType::e4m3fn;
    const int64_t B = 3, NN = 2, H = 16, max_len = 200;
    const int64_t lens[B] = {2, 77, 150};
    const int64_t W = (max_len + bs - 1) / bs;
    int64_t total = 0, need = 0;
    for (auto L : lens) total += L, need += (L + bs - 1) / bs;
    const int64_t blocks = need + 2;
    Tensor table = Tensor::full(DType::i32, {B, W}, -7);
    Tensor slot = Tensor::empty(DType::i64, {total});
    Tensor cu = Tensor::empty(DType::i32, {B + 1});
    int64_t next = 0, row = 0;
    cu.at<int32_t>({0}) = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < (lens[b] + bs - 1) / bs; ++j)
        table.at<int32_t>({b, j}) = static_cast<int32_t>((next++ * 7) % blocks);
      for (int64_t p = 0; p < lens[b]; ++p)
        slot.at<int64_t>({row++}) = table.at<int32_t>({b, p / bs}) * bs + p % bs;
      cu.at<int32_t>({b + 1}) = static_cast<int32_t>(row);
    }
    Tensor kb = Tensor::empty(DType::bf16, {total, kHeadDim});
    fill_normal(kb, Rng("indexer_logits_test", "paged_k", static_cast<uint64_t>(bs)));
    Tensor cache = Tensor::filled_bytes(DType::u8, {blocks, bs, kTokenBytes}, std::byte{0});
    cache = write_k_cache(cache, kb, slot, layout, fmt, quant_max(fmt, QuantMaxVariant::vllm));
    const auto in = make_inputs(B * NN, H, 1, fmt, "paged_q");
    const Tensor q = in.q.reshape({B, NN, H, kHeadDim});
    const Tensor ctx = i32({lens[0], lens[1], lens[2]});
    const CacheView view{cache, bs, layout};
    const Tensor paged = paged_mqa_logits(q, view, in.weights, ctx, table, max_len);
    const auto g = gather_k_cache(view, table, cu, fmt);
    // Prefill over the gathered rows: row b*NN+n sees [cu[b], cu[b] + row_end).
    std::vector<int64_t> ks, ke;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < NN; ++n) {
        ks.push_back(cu.at<int32_t>({b}));
        ke.push_back(cu.at<int32_t>({b}) + decode_row_end(lens[b], NN, n, max_len));
      }
    const Tensor pre = mqa_logits(in.q, g.values, g.scales, in.weights, i32(ks), i32(ke));
    for (int64_t r = 0; r < B * NN; ++r)
      for (int64_t p = 0; p < max_len; ++p) {
        const double a = paged.get({r, p});
        const int64_t end = ke[r] - ks[r];
        if (p >= end) {
          ASSERT_TRUE(std::isinf(a) && a < 0) << "bs " << bs << " row " << r << " p " << p;
          continue;
        }
        const double e = pre.get({r, ks[r] + p});
        ASSERT_NEAR(a, e, std::fabs(e) * 1e-6) << "bs " << bs << " row " << r << " p " << p;
      }
    // Reading the same SHUFFLE pages row-major (the Preshuffle-only-at-BS-64 seed bug) does not
    // give these logits.
    if (layout == CacheLayout::shuffle) {
      const Tensor wrong =
          paged_mqa_logits(q, {cache, bs, CacheLayout::normal}, in.weights, ctx, table, max_len);
      int64_t differ = 0;
      for (int64_t p = 0; p < 150; ++p) differ += wrong.get({5, p}) != paged.get({5, p});
      EXPECT_GT(differ, 100) << "bs " << bs;
    }
  }
}

}  // namespace
}  // namespace attncheck::ref::indexer
