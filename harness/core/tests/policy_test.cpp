#include "core/policy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/numeric.h"
#include "core/rng.h"
#include "test_util.h"

namespace attncheck {
namespace {

using testing_util::Contains;
using testing_util::error_of;

TEST(Policy, GammaN) {
  const double u = unit_roundoff(DType::f32);
  EXPECT_EQ(gamma_n(0, u), 0.0);
  EXPECT_DOUBLE_EQ(gamma_n(1000, u), 1000 * u / (1 - 1000 * u));
  EXPECT_GT(gamma_n(1000, u), 1000 * u);
  EXPECT_TRUE(Contains(error_of([] { gamma_n(300, unit_roundoff(DType::bf16)); }), ">= 1"));
  // Probabilistic: about lambda sqrt(n) u, far below n u for long sums.
  const double p = gamma_n_probabilistic(1 << 20, u);
  EXPECT_NEAR(p, kLambda * 1024 * u, 1e-3 * p);
  EXPECT_LT(p, gamma_n(1 << 20, u) / 100);
}

TEST(Policy, WorstCaseBoundHoldsForAnAdversarialFloatSum) {
  // 1 + many tiny terms each below half an ulp of the running sum: the float sum stagnates at 1.
  const int n = 4096;
  float s = 1.0f;
  double exact = 1.0, abs_sum = 1.0;
  for (int i = 0; i < n; ++i) {
    s += 0x1p-25f;
    exact += 0x1p-25;
    abs_sum += 0x1p-25;
  }
  const double err = std::fabs(static_cast<double>(s) - exact);
  EXPECT_GT(err, 0.0);
  EXPECT_LE(err, gamma_n(n + 1, unit_roundoff(DType::f32)) * abs_sum);
}

TEST(Policy, ProbabilisticBoundHoldsForRandomDotProducts) {
  const int n = 8192;
  const double u = unit_roundoff(DType::f32);
  const Rng rng("policy_test", "dot");
  double worst_ratio = 0;
  for (uint64_t trial = 0; trial < 20; ++trial) {
    float acc = 0;
    double exact = 0, abs_sum = 0;
    for (int i = 0; i < n; ++i) {
      const auto k = trial * n + static_cast<uint64_t>(i);
      const float x = static_cast<float>(rng.normal_at(2 * k));
      const float y = static_cast<float>(rng.normal_at(2 * k + 1));
      acc += x * y;
      exact += static_cast<double>(x) * static_cast<double>(y);
      abs_sum += std::fabs(static_cast<double>(x) * static_cast<double>(y));
    }
    worst_ratio = std::max(worst_ratio, std::fabs(acc - exact) / abs_sum);
  }
  EXPECT_LE(worst_ratio, gamma_n_probabilistic(n, u));
  EXPECT_LE(worst_ratio, gamma_n(n, u));
}

TEST(Policy, SubnormalHalfSpacing) {
  EXPECT_EQ(subnormal_half_spacing(DType::bf16), 0x1p-134);
  EXPECT_EQ(subnormal_half_spacing(DType::f16), 0x1p-25);
  EXPECT_EQ(subnormal_half_spacing(DType::e4m3fn), 0x1p-10);
  EXPECT_EQ(subnormal_half_spacing(DType::e4m3fnuz), 0x1p-11);
  EXPECT_EQ(subnormal_half_spacing(DType::f32), 0x1p-150);
  EXPECT_EQ(subnormal_half_spacing(DType::i32), 0.0);
}

TEST(Policy, OutputRoundingCoversEveryRoundedValue) {
  // Any double stored as bf16 lies within the budget of the exact value.
  const Budget b = output_rounding_budget(DType::bf16, 0.0, "test");
  const Rng rng("policy_test", "round");
  for (uint64_t k = 0; k < 10000; ++k) {
    const double x = std::ldexp(rng.normal_at(k), static_cast<int>(k % 260) - 140);  // no overflow
    const double r = decode_value(encode_value(x, DType::bf16), DType::bf16);
    ASSERT_LE(std::fabs(r - x), b.atol + b.rtol * std::fabs(x)) << x;
  }
  EXPECT_TRUE(Contains(b.why, "rtol u(bf16) 0.00391"));
  const Budget scaled = output_rounding_budget(DType::bf16, 2.0, "attention output");
  EXPECT_EQ(scaled.atol, 2.0 * 0x1p-8 + 0x1p-134);
}

TEST(Policy, BuilderSumsTermsAndExplainsThem) {
  const Budget b = BudgetBuilder("o")
                       .accumulation(512, DType::f32, 3.0, Bound::worst_case, "p.v sum")
                       .output_rounding(DType::bf16)
                       .absolute(1e-6, "softmax exp error")
                       .max_calc_diff(1e-5, "aggregate")
                       .build();
  const double g = gamma_n(512, unit_roundoff(DType::f32));
  EXPECT_DOUBLE_EQ(b.atol, g * 3.0 + 0x1p-134 + 1e-6);
  EXPECT_EQ(b.rtol, 0x1p-8);
  EXPECT_EQ(b.max_calc_diff, 1e-5);
  EXPECT_EQ(b.kind, Budget::Kind::numeric);
  EXPECT_TRUE(Contains(b.why, "gamma_512(f32)"));
  EXPECT_TRUE(Contains(b.why, "p.v sum"));
  EXPECT_TRUE(Contains(b.why, "u(bf16)"));
  EXPECT_TRUE(Contains(b.why, "softmax exp error"));
  EXPECT_TRUE(Contains(error_of([] { BudgetBuilder("x").absolute(-1, "bad"); }), "negative"));
  const Budget p =
      BudgetBuilder("s").accumulation(4096, DType::f32, 1.0, Bound::probabilistic, "dot").build();
  EXPECT_TRUE(Contains(p.why, "gamma~_4096(lambda 6)"));
  EXPECT_EQ(exact_budget("bytes").kind, Budget::Kind::exact);
  EXPECT_EQ(topk_budget(0.5, "ties").tie_tol, 0.5);
}

}  // namespace
}  // namespace attncheck
