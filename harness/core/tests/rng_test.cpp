// The generator must never drift: goldens are keyed by its exact output. Philox is checked
// against the published Random123 known answers; our distributions against pinned values.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/numeric.h"

namespace attncheck {
namespace {

struct Kat {
  std::array<uint32_t, 4> counter;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> expected;
};

TEST(Philox, Random123KnownAnswers) {
  // DEShawResearch/random123 tests/kat_vectors (commit 9545ff6), lines "philox4x32 10 ...";
  // the last two from the extended table in girving/random123-manual examples/kat_vectors.
  const Kat kats[] = {
      {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
       {0x00000000, 0x00000000},
       {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
      {{0x00000001, 0x00000000, 0x00000000, 0x00000000},
       {0x00000001, 0x00000000},
       {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
      {{0x00000000, 0x00000000, 0x00000000, 0x80000000},
       {0x00000000, 0x80000000},
       {0xf7a0b371, 0xe51dc93d, 0x56ce135d, 0x1d4b5580}},
  };
  for (const Kat& k : kats) EXPECT_EQ(philox4x32_10(k.counter, k.key), k.expected);
}

TEST(Rng, KeyDependsOnCaseTensorAndSeed) {
  const Rng base("mla_decode/h8", "q", 0);
  EXPECT_EQ(base.key(), Rng("mla_decode/h8", "q", 0).key());
  EXPECT_NE(base.key(), Rng("mla_decode/h16", "q", 0).key());
  EXPECT_NE(base.key(), Rng("mla_decode/h8", "kv", 0).key());
  EXPECT_NE(base.key(), Rng("mla_decode/h8", "q", 1).key());
  // The separator keeps ("ab", "c") and ("a", "bc") apart.
  EXPECT_NE(Rng("ab", "c").key(), Rng("a", "bc").key());
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);  // published FNV-1a 64 test vector
}

TEST(Rng, PinnedOutputs) {
  const Rng r("rng_test/case", "q", 7);
  EXPECT_EQ(r.key(), 0x21a06aa6f2498fefull);
  EXPECT_EQ(r.uniform_at(0), 0x1.bbd852ded76a4p-3);
  EXPECT_EQ(r.uniform_at(3), 0x1.1da19707c677p-4);
  EXPECT_EQ(r.normal_at(0), -0x1.4fa872p-1);
  EXPECT_EQ(r.normal_at(3), -0x1.6bc9d8p+0);

  Rng s("rng_test/case", "q", 7);
  const int64_t ints[] = {502, 295, 532, 277, 321, 868};
  for (int64_t want : ints) EXPECT_EQ(s.uniform_int(-5, 1000), want);

  Rng p("rng_test/case", "perm", 0);
  EXPECT_EQ(permutation(10, p), (std::vector<int64_t>{9, 4, 8, 5, 7, 6, 2, 3, 0, 1}));

  Rng q(42);
  EXPECT_EQ(q.next_u32(), 0x02933769u);
  EXPECT_EQ(q.next_u32(), 0x2051e913u);
  EXPECT_EQ(q.next_u64(), 0x3b68b038b62c409cull);
  EXPECT_EQ(q.uniform(), 0x1.07fc89cfee90cp-3);
  EXPECT_EQ(q.normal(), -0x1.eed86fp+0);
}

TEST(Rng, PinnedTensorFills) {
  Tensor bf = Tensor::empty(DType::bf16, {2, 4});
  fill_normal(bf, Rng("rng_test/case", "bf16", 0), 0.0, 2.0);
  const uint64_t bf_bits[] = {0xc04f, 0xc01f, 0xbff7, 0xbe8c, 0xbd4b, 0x3f10, 0xc09d, 0xc06c};
  bf.for_each_index([&](const Index& i, int64_t lin) { EXPECT_EQ(bf.get_bits(i), bf_bits[lin]); });

  Tensor f8 = Tensor::empty(DType::e4m3fnuz, {6});
  fill_fp8_codes(f8, Rng("rng_test/case", "fp8", 0), 4.0);
  const uint64_t f8_bits[] = {0x34, 0x4d, 0x04, 0x96, 0xaa, 0x26};
  f8.for_each_index([&](const Index& i, int64_t lin) { EXPECT_EQ(f8.get_bits(i), f8_bits[lin]); });

  Tensor in = Tensor::empty(DType::i32, {6});
  fill_uniform_int(in, Rng("rng_test/case", "int", 0), -3, 3);
  EXPECT_EQ(in.to_vector(), (std::vector<double>{3, 1, 0, -3, -2, 2}));

  Tensor un = Tensor::empty(DType::f32, {3});
  fill_uniform(un, Rng("rng_test/case", "uni", 0), -1.0, 1.0);
  EXPECT_EQ(un.to_vector(), (std::vector<double>{-0x1.1f3f5cp-2, 0x1.0239cp-1, 0x1.9e7b0cp-1}));
}

TEST(Rng, FillsDoNotDependOnTheLayout) {
  // Element k of the logical order always gets counter k, whatever the strides.
  const Rng rng("rng_test/layout", "x");
  Tensor dense = Tensor::empty(DType::bf16, {4, 6});
  fill_normal(dense, rng);
  Tensor base = Tensor::empty(DType::bf16, {6, 8});
  const Tensor view = base.slice(0, 0, 4).slice(1, 1, 7);  // [4, 6] inside an [6, 8] buffer
  fill_normal(view, rng);
  dense.for_each_index(
      [&](const Index& i, int64_t) { EXPECT_EQ(dense.get_bits(i), view.get_bits(i)); });
  EXPECT_EQ(base.get({5, 0}), 0.0);  // outside the view: untouched
}

TEST(Rng, NormalMomentsAndRange) {
  Rng r("rng_test/moments", "normal");
  const int n = 200000;
  double sum = 0, sum2 = 0, lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) {
    const double x = (i % 2) ? r.normal() : r.normal_at(static_cast<uint64_t>(i));
    sum += x;
    sum2 += x * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  // Standard errors: mean 1/sqrt(n) = 0.0022, variance sqrt(1.9/n) = 0.0031 (Irwin-Hall 12).
  EXPECT_NEAR(mean, 0.0, 0.012);
  EXPECT_NEAR(var, 1.0, 0.016);
  EXPECT_GE(lo, -6.0);
  EXPECT_LE(hi, 6.0);
  EXPECT_LT(lo, -3.5);  // a real bell, not a narrow bump
  EXPECT_GT(hi, 3.5);
}

TEST(Rng, UniformIntCoversTheRangeWithoutBias) {
  Rng r("rng_test/ints", "u");
  std::vector<int> counts(7, 0);
  const int n = 70000;
  for (int i = 0; i < n; ++i) {
    const int64_t x = r.uniform_int(-3, 3);
    ASSERT_GE(x, -3);
    ASSERT_LE(x, 3);
    ++counts[static_cast<size_t>(x + 3)];
  }
  for (int c : counts) EXPECT_NEAR(c, n / 7, 500);  // sd = sqrt(n p (1-p)) = 93
  EXPECT_EQ(r.uniform_int(5, 5), 5);
  EXPECT_THROW(r.uniform_int(2, 1), std::invalid_argument);
  for (int i = 0; i < 1000; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Rng, PermutationIsAPermutation) {
  Rng r("rng_test/perm", "p");
  auto p = permutation(1000, r);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(sorted[i], i);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += p[i] == i;
  EXPECT_LT(fixed, 10);  // expected 1 fixed point
  EXPECT_TRUE(permutation(0, r).empty());
}

TEST(Rng, Fp8CodesStayWithinTheMagnitude) {
  for (DType t : {DType::e4m3fn, DType::e4m3fnuz}) {
    Tensor x = Tensor::empty(t, {4096});
    fill_fp8_codes(x, Rng("rng_test/fp8", "x"), 8.0);
    std::set<uint64_t> codes;
    x.for_each_index([&](const Index& i, int64_t) {
      const double v = x.get(i);
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_LE(std::fabs(v), 8.0);
      codes.insert(x.get_bits(i));
    });
    EXPECT_GT(codes.size(), 150u);  // nearly every admissible code appears
  }
  Tensor not_fp8 = Tensor::empty(DType::bf16, {2});
  EXPECT_THROW(fill_fp8_codes(not_fp8, Rng(1), 1.0), std::invalid_argument);
}

TEST(Rng, PoisonFillsTheWholeStorage) {
  const Tensor f = Tensor::empty(DType::bf16, {4, 4});
  poison(f.slice(0, 1, 2));  // a view: the whole storage is poisoned anyway
  for (const auto& v : f.to_vector()) EXPECT_TRUE(std::isnan(v));
  const Tensor fn = Tensor::empty(DType::e4m3fnuz, {3});
  poison(fn);
  EXPECT_EQ(fn.get_bits({2}), 0x80u);
  const Tensor i = Tensor::empty(DType::i32, {2});
  poison(i);
  EXPECT_EQ(i.get_bits({1}), 0xFFFFFFFFu);
}

}  // namespace
}  // namespace attncheck
