#include "core/policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/tensor.h"
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

TEST(Contracts, NamesParseAndListInTheBridgesOrder) {
  std::vector<std::string> names;
  for (const auto& c : known_contracts()) names.push_back(c.name());
  EXPECT_EQ(names, (std::vector<std::string>{"fp32-accumulate", "qk-products-in-input-type",
                                             "p-in-input-type",
                                             "qk-products-in-input-type+p-in-input-type"}));
  for (const auto& c : known_contracts()) EXPECT_EQ(parse_contract(c.name()), c) << c.name();
  EXPECT_TRUE(known_contracts().front().is_default());
  const auto both = parse_contract("p-in-input-type+qk-products-in-input-type");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->name(), "qk-products-in-input-type+p-in-input-type");
  for (const char* bad :
       {"", "fp8-scores", "fp32-accumulate+p-in-input-type", "p-in-input-type+p-in-input-type",
        "qk-products-in-input-type+", "+p-in-input-type", "QK-products-in-input-type"})
    EXPECT_FALSE(parse_contract(bad)) << bad;
  EXPECT_TRUE(Contains(known_contract_names(), "fp32-accumulate, qk-products-in-input-type"));
}

// Each q.k product rounded to bf16, then summed in fp32 (sequentially, a worst order): the error
// against the exact dot stays within gamma_n (1 + u_in) sum|q k| + u_in sum|q k|, and the default
// bound (gamma_n sum|q k|) alone does not hold, so the term is needed, not decoration.
TEST(Contracts, ProductRoundingBoundHoldsAndIsNeeded) {
  const int n = 576;
  const DType in = DType::bf16;
  const double u = unit_roundoff(DType::f32);
  const Contract qk = *parse_contract("qk-products-in-input-type");
  EXPECT_EQ(qk_product_rounding_error(Contract{}, in, 5.0), 0.0);
  EXPECT_EQ(qk_rounded_products_growth(Contract{}, in), 1.0);
  EXPECT_EQ(qk_product_rounding_error(qk, in, 5.0), 5.0 * 0x1p-8);
  EXPECT_EQ(qk_rounded_products_growth(qk, DType::f16), 1.0 + 0x1p-11);
  EXPECT_TRUE(Contains(error_of([&] { qk_product_rounding_error(qk, in, -1.0); }), "negative"));
  const Rng rng("policy_test", "qk_products");
  double worst_ratio = 0;
  int beyond_default = 0;
  for (uint64_t trial = 0; trial < 50; ++trial) {
    float acc = 0;
    double exact = 0, abs_sum = 0;
    for (int i = 0; i < n; ++i) {
      const auto at = trial * n + static_cast<uint64_t>(i);
      const double q = decode_value(encode_value(rng.normal_at(2 * at), in), in);
      const double k = decode_value(encode_value(rng.normal_at(2 * at + 1), in), in);
      const double product = decode_value(encode_value(q * k, in), in);  // q k exact in double
      acc += static_cast<float>(product);
      exact += q * k;
      abs_sum += std::fabs(q * k);
    }
    const double err = std::fabs(static_cast<double>(acc) - exact);
    const double bound = gamma_n(n, u) * qk_rounded_products_growth(qk, in) * abs_sum +
                         qk_product_rounding_error(qk, in, abs_sum);
    worst_ratio = std::max(worst_ratio, err / bound);
    beyond_default += err > gamma_n(n, u) * abs_sum;
  }
  EXPECT_LE(worst_ratio, 1.0);
  EXPECT_GT(beyond_default, 25);
}

TEST(Contracts, ProbabilityRoundingIsTheInputTypesUnitRoundoff) {
  EXPECT_EQ(probability_rounding(Contract{}, DType::bf16), 0.0);
  EXPECT_EQ(probability_rounding(*parse_contract("qk-products-in-input-type"), DType::bf16), 0.0);
  EXPECT_EQ(probability_rounding(*parse_contract("p-in-input-type"), DType::bf16), 0x1p-8);
  EXPECT_EQ(probability_rounding(*parse_contract("qk-products-in-input-type+p-in-input-type"),
                                 DType::f16),
            0x1p-11);
}

// Scores moved by at most d: every softmax weight changes by a relative error of at most
// 2d + softmax_weight_remainder(d) = expm1(2d); the worst perturbation (+d on a small weight, -d on
// the rest) exceeds the first-order 2d, so the remainder is needed once d is not tiny.
TEST(Contracts, SoftmaxWeightRemainderCoversTheWorstPerturbation) {
  const double d = 0.1;
  const std::vector<double> s = {3.0, 2.5, 0.0, -4.0, -9.0};
  auto weights = [](const std::vector<double>& x) {
    std::vector<double> w(x.size());
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i) sum += w[i] = std::exp(x[i]);
    for (auto& v : w) v /= sum;
    return w;
  };
  const auto w = weights(s);
  double worst = 0;
  for (size_t up = 0; up < s.size(); ++up) {
    std::vector<double> moved = s;
    for (size_t i = 0; i < s.size(); ++i) moved[i] += i == up ? d : -d;
    const auto w2 = weights(moved);
    for (size_t i = 0; i < s.size(); ++i) worst = std::max(worst, std::fabs(w2[i] / w[i] - 1));
  }
  EXPECT_GT(worst, 2 * d);
  EXPECT_LE(worst, 2 * d + softmax_weight_remainder(d));
  EXPECT_DOUBLE_EQ(2 * d + softmax_weight_remainder(d), std::expm1(2 * d));
  EXPECT_EQ(softmax_weight_remainder(0), 0.0);
  EXPECT_TRUE(Contains(error_of([] { softmax_weight_remainder(-1); }), "negative"));
}

}  // namespace
}  // namespace attncheck
