// Indexer quantizers, checked against second formulations: the ue8m0 scale as the smallest power of
// two >= amax/M found by doubling, dequantized values within half an fp8 step, fn vs fnuz bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "reference/indexer.h"

namespace attncheck::ref::indexer {
namespace {

// Smallest power of two >= s, by doubling from the bottom of the fp32 normal range.
float pow2_at_least(float s) {
  float p = std::ldexp(1.0f, -126);
  while (p < s) p *= 2.0f;
  return p;
}

TEST(IndexerQuant, Ue8m0MatchesDoubling) {
  Rng rng("indexer_quant_test", "amax");
  for (int i = 0; i < 20000; ++i) {
    const auto amax = static_cast<float>(
        std::ldexp(rng.uniform(0.5, 1.0), static_cast<int>(rng.uniform_int(-40, 40))));
    for (float M : {448.0f, 224.0f, 240.0f}) {
      const float s = std::max(amax, kKAmaxFloor) / M;
      ASSERT_EQ(ue8m0_scale(amax, kKAmaxFloor, M), pow2_at_least(s)) << amax << " / " << M;
    }
  }
}

TEST(IndexerQuant, Ue8m0Boundaries) {
  // amax exactly M * 2^k: the scale is 2^k and the peak encodes to M.
  for (float M : {448.0f, 224.0f, 240.0f})
    for (int k : {-12, -3, 0, 5}) {
      const float amax = std::ldexp(M, k);
      EXPECT_EQ(ue8m0_scale(amax, kKAmaxFloor, M), std::ldexp(1.0f, k));
      // The next bf16 above crosses to 2^(k+1).
      const float above = bf16_to_float(static_cast<uint16_t>(bf16_from_float(amax) + 1));
      EXPECT_EQ(ue8m0_scale(above, kKAmaxFloor, M), std::ldexp(1.0f, k + 1));
    }
  // All-zero group: the floor decides (1e-4 / 448 -> 2^-22, 1e-10 / 448 -> 2^-42).
  EXPECT_EQ(ue8m0_scale(0.0f, kKAmaxFloor, 448.0f), std::ldexp(1.0f, -22));
  EXPECT_EQ(ue8m0_scale(0.0f, kQAmaxFloor, 448.0f), std::ldexp(1.0f, -42));
  // 224 and 240 disagree for amax in (224 * 2^k, 240 * 2^k].
  EXPECT_EQ(ue8m0_scale(232.0f, kKAmaxFloor, 224.0f), 2.0f);
  EXPECT_EQ(ue8m0_scale(232.0f, kKAmaxFloor, 240.0f), 1.0f);
}

TEST(IndexerQuant, PeakRowEncodesToMaxCode) {
  std::vector<float> x(kHeadDim, 0.5f);
  x[7] = -448.0f * 4;
  std::vector<uint8_t> bytes(kHeadDim);
  EXPECT_EQ(
      quantize_group(x.data(), kHeadDim, kKAmaxFloor, 448.0f, DType::e4m3fn, false, bytes.data()),
      4.0f);
  EXPECT_EQ(bytes[7], 0xFE);  // -448
  EXPECT_EQ(fp8_decode(bytes[0], DType::e4m3fn), 0.125);
}

TEST(IndexerQuant, FnAndFnuzShareBytesAtHalfTheMax) {
  // e4m3fnuz decodes every code to half its e4m3fn value, so quantizing against 448 (fn) and 224
  // (fnuz) gives identical bytes with scales a factor 2 apart.
  Rng rng("indexer_quant_test", "fn_fnuz");
  std::vector<float> x(kHeadDim);
  for (int row = 0; row < 200; ++row) {
    for (auto& v : x)
      v = bf16_to_float(bf16_from_float(
          static_cast<float>(std::fabs(rng.normal()) * std::ldexp(1.0, row % 30 - 15))));
    std::vector<uint8_t> fn(kHeadDim), fnuz(kHeadDim);
    const float s_fn =
        quantize_group(x.data(), kHeadDim, kKAmaxFloor, 448.0f, DType::e4m3fn, false, fn.data());
    const float s_fnuz = quantize_group(x.data(), kHeadDim, kKAmaxFloor, 224.0f, DType::e4m3fnuz,
                                        false, fnuz.data());
    EXPECT_EQ(s_fnuz, 2.0f * s_fn);
    EXPECT_EQ(fn, fnuz) << "row " << row;
  }
}

TEST(IndexerQuant, DequantizedWithinHalfAnFp8Step) {
  Rng rng("indexer_quant_test", "dequant");
  for (DType fmt : {DType::e4m3fn, DType::e4m3fnuz}) {
    const float M = quant_max(fmt, QuantMaxVariant::vllm);
    Tensor k = Tensor::empty(DType::bf16, {64, kHeadDim});
    fill_normal(k, rng, 0.0, 3.0);
    const auto q = quantize_k(k, fmt, M);
    const double min_normal = std::ldexp(1.0, fmt == DType::e4m3fn ? -6 : -7);
    for (int64_t t = 0; t < 64; ++t) {
      const double s = q.scales.at<float>({t});
      for (int64_t d = 0; d < kHeadDim; ++d) {
        const double x = k.get({t, d});
        const double y = fp8_decode(static_cast<uint8_t>(q.values.get_bits(Index{t, d})), fmt) * s;
        // Half a step: 2^-4 relative for normals, half the subnormal spacing below.
        const double bound =
            std::max(std::fabs(x) * std::ldexp(1.0, -4), min_normal * s * std::ldexp(1.0, -4));
        ASSERT_LE(std::fabs(x - y), bound) << "t " << t << " d " << d;
      }
    }
  }
}

TEST(IndexerQuant, RoundsHalfwayToEven) {
  // 17 lies halfway between the e4m3 neighbours 16 and 18: the even mantissa (16) wins; 19 -> 20.
  std::vector<float> x(kHeadDim, 0.0f);
  x[0] = 448.0f;
  x[1] = 17.0f;
  x[2] = 19.0f;
  std::vector<uint8_t> b(kHeadDim);
  quantize_group(x.data(), kHeadDim, kKAmaxFloor, 448.0f, DType::e4m3fn, false, b.data());
  EXPECT_EQ(fp8_decode(b[1], DType::e4m3fn), 16.0);
  EXPECT_EQ(fp8_decode(b[2], DType::e4m3fn), 20.0);
}

TEST(IndexerQuant, QWeightsFollowTheVllmProductOrder) {
  Rng rng("indexer_quant_test", "q");
  const int64_t T = 5, H = 32;
  Tensor q = Tensor::empty(DType::bf16, {T, H, kHeadDim});
  Tensor raw = Tensor::empty(DType::bf16, {T, H});
  fill_normal(q, rng);
  fill_normal(raw, Rng("indexer_quant_test", "raw"));
  q.set({2, 3, 0}, 0.0);  // one all-zero group below: the 1e-10 floor decides its scale
  for (int64_t d = 0; d < kHeadDim; ++d) q.set({1, 4, d}, 0.0);
  const auto out = quantize_q(q, raw, DType::e4m3fn, 448.0f);
  EXPECT_EQ(out.q_scale.at<float>({1, 4}), std::ldexp(1.0f, -42));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float amax = 0;
      for (int64_t d = 0; d < kHeadDim; ++d)
        amax = std::max(amax, static_cast<float>(std::fabs(q.get({t, h, d}))));
      const float s = out.q_scale.at<float>({t, h});
      EXPECT_EQ(s, pow2_at_least(std::max(amax, kQAmaxFloor) / 448.0f));
      const double w = raw.get({t, h}) * s / std::sqrt(128.0) / std::sqrt(static_cast<double>(H));
      EXPECT_NEAR(out.weights.at<float>({t, h}), w, std::fabs(w) * 3 * std::ldexp(1.0, -24));
    }
}

}  // namespace
}  // namespace attncheck::ref::indexer
