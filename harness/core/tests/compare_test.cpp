#include "core/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "test_util.h"

namespace attncheck {
namespace {

using testing_util::Contains;
using testing_util::error_of;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor vec(DType t, const std::vector<double>& v) {
  Tensor x = Tensor::empty(t, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) x.set({static_cast<int64_t>(i)}, v[i]);
  return x;
}

Tensor mat(DType t, int64_t rows, int64_t cols, const std::vector<double>& v) {
  return vec(t, v).reshape({rows, cols});
}

Budget numeric(double atol, double rtol) {
  Budget b;
  b.atol = atol;
  b.rtol = rtol;
  b.why = "test";
  return b;
}

TEST(CompareNumeric, MetricsOnAHandBuiltPair) {
  const Tensor e = vec(DType::f64, {1.0, -2.0, 4.0, 0.5});
  const Tensor a = vec(DType::f64, {1.1, -2.0, 3.0, 0.5});
  const CheckResult r = compare_numeric("out", e, a, numeric(0.0, 0.125));
  const Metrics& m = r.metrics;
  EXPECT_EQ(m.count, 4);
  EXPECT_NEAR(m.max_abs, 1.0, 1e-15);
  EXPECT_NEAR(m.max_rel, 0.25, 1e-15);  // |3 - 4| / 4
  // rel_l2 = sqrt(0.1^2 + 1^2) / sqrt(1 + 4 + 16 + 0.25)
  EXPECT_NEAR(m.rel_l2, std::sqrt(1.01 / 21.25), 1e-14);
  // DeepGEMM calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2)
  const double sxy = 1.1 + 4.0 + 12.0 + 0.25, sxx = 21.25, syy = 1.21 + 4 + 9 + 0.25;
  EXPECT_NEAR(m.calc_diff, 1.0 - 2.0 * sxy / (sxx + syy), 1e-14);
  EXPECT_NEAR(m.cosine, sxy / std::sqrt(sxx * syy), 1e-14);
  // 1.1 vs 1: err 0.1 <= 0.125 * 1; 3 vs 4: err 1 > 0.125 * 4 (ratio 2).
  EXPECT_EQ(m.mismatches, 1);
  EXPECT_DOUBLE_EQ(m.mismatch_frac, 0.25);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(m.worst.index, (Index{2}));
  EXPECT_EQ(m.worst.expected, 4.0);
  EXPECT_EQ(m.worst.actual, 3.0);
  EXPECT_EQ(m.worst.ratio, 2.0);
  EXPECT_TRUE(Contains(r.message, "worst at [2] expected 4 actual 3"));
}

TEST(CompareNumeric, MismatchFractionBudget) {
  const Tensor e = vec(DType::f32, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  const Tensor a = vec(DType::f32, {0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
  Budget b = numeric(0.5, 0.0);
  EXPECT_FALSE(compare_numeric("o", e, a, b).passed);
  b.max_mismatch_frac = 0.1;
  EXPECT_TRUE(compare_numeric("o", e, a, b).passed);
  b.max_mismatch_frac = 0.09;
  EXPECT_FALSE(compare_numeric("o", e, a, b).passed);
}

TEST(CheckMargin, WorstElementFractionCalcDiffAndFailures) {
  const Tensor e = vec(DType::f32, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  const Tensor a = vec(DType::f32, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0.25});
  Budget b = numeric(0.5, 0.0);
  EXPECT_DOUBLE_EQ(check_margin(compare_numeric("o", e, a, b)), 0.5);  // worst |a - e| / atol
  const Tensor far = vec(DType::f32, {0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
  EXPECT_DOUBLE_EQ(check_margin(compare_numeric("o", e, far, b)), 2.0);
  b.max_mismatch_frac = 0.2;  // 1 of 10 elements outside, half the allowance used
  EXPECT_DOUBLE_EQ(check_margin(compare_numeric("o", e, far, b)), 0.5);
  const auto nan = compare_numeric("o", vec(DType::f32, {1, kNaN}), vec(DType::f32, {1, 1}), b);
  EXPECT_TRUE(std::isinf(check_margin(nan)));
  const auto bits = compare_exact("o", vec(DType::i32, {1, 2}), vec(DType::i32, {1, 3}));
  EXPECT_TRUE(std::isinf(check_margin(bits)));
  EXPECT_EQ(check_margin(compare_exact("o", vec(DType::i32, {1, 2}), vec(DType::i32, {1, 2}))), 0);
  CheckResult missing;  // failed for a reason no metric scales: never below the edge
  missing.passed = false;
  EXPECT_TRUE(std::isinf(check_margin(missing)));
}

TEST(CompareNumeric, CalcDiffBudget) {
  const Tensor e = vec(DType::f64, {1, 2, 3, 4});
  const Tensor a = vec(DType::f64, {1, 2, 3, 4.5});
  Budget b = numeric(1.0, 0.0);  // elementwise inside
  b.max_calc_diff = 1e-3;
  const auto r = compare_numeric("o", e, a, b);
  EXPECT_GT(r.metrics.calc_diff, 1e-3);  // 1 - 2*32/(30+34.25) = 0.0039
  EXPECT_FALSE(r.passed);
  b.max_calc_diff = 1e-2;
  EXPECT_TRUE(compare_numeric("o", e, a, b).passed);
}

TEST(CompareNumeric, NaNNeverPassesEvenAgainstNaN) {
  const Budget loose = numeric(1e9, 1e9);
  const auto both =
      compare_numeric("o", vec(DType::f32, {1, kNaN}), vec(DType::f32, {1, kNaN}), loose);
  EXPECT_FALSE(both.passed);
  EXPECT_EQ(both.metrics.nan_actual, 1);
  EXPECT_EQ(both.metrics.nan_expected, 1);
  const auto act =
      compare_numeric("o", vec(DType::bf16, {1, 2}), vec(DType::bf16, {1, kNaN}), loose);
  EXPECT_FALSE(act.passed);
  EXPECT_EQ(act.metrics.worst.index, (Index{1}));
  EXPECT_TRUE(Contains(act.message, "NaN 1"));
  // Even with every element allowed to mismatch.
  Budget all = loose;
  all.max_mismatch_frac = 1.0;
  EXPECT_FALSE(compare_numeric("o", vec(DType::f32, {1}), vec(DType::f32, {kNaN}), all).passed);
}

TEST(CompareNumeric, NegativeInfinityMasksCompareExactly) {
  Budget all = numeric(1e9, 1e9);
  all.max_mismatch_frac = 1.0;
  // -inf vs -inf: equal, passes, and stays out of the error sums.
  const auto same = compare_numeric("lse", vec(DType::f32, {-kInf, 1.0}),
                                    vec(DType::f32, {-kInf, 1.0}), numeric(0, 0));
  EXPECT_TRUE(same.passed);
  EXPECT_EQ(same.metrics.max_abs, 0.0);
  EXPECT_EQ(same.metrics.calc_diff, 0.0);
  // A masked position the kernel filled, or an unmasked one it masked: fails under any budget.
  const auto filled =
      compare_numeric("lse", vec(DType::f32, {-kInf, 1.0}), vec(DType::f32, {-1e30, 1.0}), all);
  EXPECT_FALSE(filled.passed);
  EXPECT_EQ(filled.metrics.neginf_mask_mismatch, 1);
  EXPECT_TRUE(Contains(filled.message, "-inf mask mismatches 1"));
  const auto masked =
      compare_numeric("lse", vec(DType::f32, {0.0, 1.0}), vec(DType::f32, {-kInf, 1.0}), all);
  EXPECT_FALSE(masked.passed);
  // +inf where -inf was expected is a mask mismatch too.
  EXPECT_FALSE(
      compare_numeric("lse", vec(DType::f32, {-kInf}), vec(DType::f32, {kInf}), all).passed);
}

TEST(CompareNumeric, WorstElementHasTheMultiDimensionalIndex) {
  Tensor e = Tensor::full(DType::f32, {2, 3, 4}, 1.0);
  Tensor a = Tensor::full(DType::f32, {2, 3, 4}, 1.0);
  a.set({1, 2, 0}, 1.5);
  a.set({0, 1, 3}, 1.1);
  const auto r = compare_numeric("o", e, a, numeric(0.01, 0.0));
  EXPECT_EQ(r.metrics.worst.index, (Index{1, 2, 0}));
  EXPECT_EQ(r.metrics.mismatches, 2);
  EXPECT_TRUE(Contains(r.message, "worst at [1,2,0]"));
}

TEST(CompareNumeric, UlpDistanceInTheActualDtype) {
  // bf16 neighbours of 1.0: 0x3F81 = 1 + 2^-7, 0x3F83 = 1 + 3 * 2^-7.
  Tensor a = Tensor::empty(DType::bf16, {3});
  a.set_bits({0}, 0x3F80);
  a.set_bits({1}, 0x3F81);
  a.set_bits({2}, 0x3F83);
  const Tensor e = vec(DType::f64, {1.0, 1.0, 1.0});
  EXPECT_EQ(compare_numeric("o", e, a, numeric(1, 0)).metrics.max_ulp, 3);
  // Across zero: -2^-133 to +2^-133 (smallest subnormals) is 2 ulp.
  Tensor b = Tensor::empty(DType::bf16, {1});
  b.set_bits({0}, 0x0001);
  EXPECT_EQ(compare_numeric("o", vec(DType::f64, {-0x1p-133}), b, numeric(1, 0)).metrics.max_ulp,
            2);
}

TEST(CompareNumeric, StridedAndMixedDtypeInputs) {
  // expected f64 contiguous, actual a transposed bf16 view of another buffer.
  Tensor base = Tensor::empty(DType::bf16, {3, 2});
  Tensor e = Tensor::empty(DType::f64, {2, 3});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      e.set({i, j}, static_cast<double>(10 * i + j));
      base.set({j, i}, static_cast<double>(10 * i + j));
    }
  const Tensor a = base.permute({1, 0});
  EXPECT_TRUE(compare_numeric("o", e, a, numeric(0, 0)).passed);
  base.set({2, 1}, 99.0);  // element (1, 2) of the view
  const auto r = compare_numeric("o", e, a, numeric(0, 0));
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.metrics.worst.index, (Index{1, 2}));
  EXPECT_TRUE(
      Contains(error_of([&] { compare_numeric("o", e, base, numeric(0, 0)); }), "shape mismatch"));
}

TEST(CompareExact, ReportsBitMismatchesIncludingNaNPayloads) {
  Tensor e = Tensor::empty(DType::bf16, {2, 2});
  Tensor a = Tensor::empty(DType::bf16, {2, 2});
  e.set_bits({1, 0}, 0x7FC0);  // canonical NaN (PyTorch)
  a.set_bits({1, 0}, 0x7FFF);  // HIP's NaN: same class, other bits
  const auto r = compare_exact("cache", e, a);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.metrics.bit_mismatches, 1);
  EXPECT_EQ(r.metrics.worst.index, (Index{1, 0}));
  EXPECT_TRUE(Contains(r.message, "1 of 4 elements differ bitwise"));
  // -0 vs +0 differ bitwise.
  e.set_bits({1, 0}, 0x8000);
  a.set_bits({1, 0}, 0x0000);
  EXPECT_FALSE(compare_exact("cache", e, a).passed);
  a.set_bits({1, 0}, 0x8000);
  EXPECT_TRUE(compare_exact("cache", e, a).passed);
  // Identical NaN bits are identical bytes: an exact op (a gather) may copy NaN through.
  e.set_bits({0, 0}, 0x7FC1);
  a.set_bits({0, 0}, 0x7FC1);
  EXPECT_TRUE(compare_exact("cache", e, a).passed);
  EXPECT_TRUE(
      Contains(error_of([&] { compare_exact("c", e, a.to(DType::f32)); }), "different dtypes"));
}

TEST(CompareExact, DispatchKeepsTheWhy) {
  Budget b;
  b.kind = Budget::Kind::exact;
  b.why = "gather: bytes copied";
  const auto r = compare("x", vec(DType::i32, {1, 2}), vec(DType::i32, {1, 3}), b);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.budget.why, "gather: bytes copied");
  b.kind = Budget::Kind::topk_set;
  EXPECT_TRUE(
      Contains(error_of([&] { compare("x", vec(DType::i32, {1}), vec(DType::i32, {1}), b); }),
               "compare_topk"));
}

// --- top-k ---------------------------------------------------------------------------------------
Budget topk_budget(double tie_tol) {
  Budget b;
  b.kind = Budget::Kind::topk_set;
  b.tie_tol = tie_tol;
  return b;
}

// One row of 8 reference values: index 3 (9.0) > 5 (8.0) > 1 (7.0) ~ 6 (7.0 + 1e-6) > rest.
const Tensor& row_values() {
  static const Tensor v = mat(DType::f32, 1, 8, {0.5, 7.0, 1.0, 9.0, 2.0, 8.0, 7.000001, 3.0});
  return v;
}

CheckResult topk(const std::vector<double>& expected, const std::vector<double>& actual,
                 double tie_tol = 1e-5) {
  const auto k = static_cast<int64_t>(expected.size());
  return compare_topk("topk", mat(DType::i32, 1, k, expected), mat(DType::i32, 1, k, actual),
                      row_values(), {}, topk_budget(tie_tol));
}

TEST(CompareTopk, PermutedOrderPasses) {
  const auto r = topk({3, 5, 6}, {6, 3, 5});
  EXPECT_TRUE(r.passed) << r.message;
  EXPECT_EQ(r.metrics.count, 3);
}

TEST(CompareTopk, SwapWithinTheTieTolerancePasses) {
  // k = 3: index 6 (7.000001) and index 1 (7.0) tie within 1e-5.
  EXPECT_TRUE(topk({3, 5, 6}, {3, 5, 1}).passed);
  const auto strict = topk({3, 5, 6}, {3, 5, 1}, 1e-9);  // no tie under a tighter bound
  EXPECT_FALSE(strict.passed);
  EXPECT_EQ(strict.metrics.topk_missing, 1);
}

TEST(CompareTopk, NonTieSwapFailsAndCountsOnce) {
  const auto r = topk({3, 5, 6}, {3, 7, 6});  // 8.0 replaced by 3.0
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.metrics.topk_missing, 1);
  EXPECT_TRUE(Contains(r.message, "first bad row 0"));
  EXPECT_TRUE(Contains(r.message, "not chosen (first 8)"));
  EXPECT_TRUE(Contains(r.message, "chosen instead e.g. value 3"));
  // Dropping the largest shifts every rank, but it is still one wrong index.
  const auto shifted = topk({3, 5, 6, 1}, {5, 6, 1, 7});
  EXPECT_EQ(shifted.metrics.topk_missing, 1);
}

TEST(CompareTopk, InvalidIndicesAreFlagged) {
  const auto dup = topk({3, 5, 6}, {3, 3, 6});
  EXPECT_FALSE(dup.passed);
  EXPECT_GE(dup.metrics.topk_invalid, 1);
  EXPECT_TRUE(Contains(dup.message, "duplicate index 3"));

  const auto range = topk({3, 5, 6}, {3, 8, 6});
  EXPECT_FALSE(range.passed);
  EXPECT_TRUE(Contains(range.message, "index 8 out of range at column 1"));
  EXPECT_TRUE(Contains(topk({3, 5, 6}, {3, -2, 6}).message, "index -2 out of range"));

  const auto padding = topk({3, 5, -1}, {3, -1, 5});
  EXPECT_FALSE(padding.passed);
  EXPECT_TRUE(Contains(padding.message, "valid index 5 after -1 padding at column 2"));

  const auto fewer = topk({3, 5, 6}, {3, 5, -1});
  EXPECT_FALSE(fewer.passed);
  EXPECT_EQ(fewer.metrics.topk_missing, 1);
  EXPECT_TRUE(Contains(fewer.message, "2 valid indices, expected 3"));

  const auto more = topk({3, 5, -1}, {3, 5, 6});
  EXPECT_FALSE(more.passed);
  EXPECT_EQ(more.metrics.topk_invalid, 1);
  EXPECT_TRUE(Contains(more.message, "3 valid indices, expected 2"));

  EXPECT_TRUE(topk({3, 5, -1}, {5, 3, -1}).passed);  // equal padding
}

TEST(CompareTopk, RowOffsetsAndManyRows) {
  // Two rows sharing one value row layout: row 1's indices are relative to column 4.
  const Tensor values = mat(DType::f32, 2, 8,
                            {5, 4, 3, 2, 0, 0, 0, 0,  //
                             0, 0, 0, 0, 1, 9, 8, 7});
  const Tensor e = mat(DType::i32, 2, 2, {0, 1, 1, 2});
  const Tensor good = mat(DType::i32, 2, 2, {1, 0, 2, 1});
  const Tensor bad = mat(DType::i32, 2, 2, {0, 1, 1, 3});
  EXPECT_TRUE(compare_topk("t", e, good, values, {0, 4}, topk_budget(0)).passed);
  const auto r = compare_topk("t", e, bad, values, {0, 4}, topk_budget(0));
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.metrics.worst.index, (Index{1}));
  EXPECT_TRUE(Contains(
      error_of([&] {
        compare_topk("t", e, mat(DType::i32, 1, 4, {0, 1, 2, 3}), values, {}, topk_budget(0));
      }),
      "equal shape"));
}

}  // namespace
}  // namespace attncheck
