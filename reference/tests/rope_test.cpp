#include "reference/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/numeric.h"
#include "core/rng.h"

namespace attncheck::ref {
namespace {

Tensor positions_of(std::initializer_list<int64_t> p) {
  Tensor t = Tensor::empty(DType::i64, {static_cast<int64_t>(p.size())});
  int64_t i = 0;
  for (int64_t v : p) t.at<int64_t>({i++}) = v;
  return t;
}

TEST(Rope, CacheRowIsCosThenSin) {
  const Tensor c = rope_cos_sin_cache(4096, 64, 10000.0, DType::f32);
  EXPECT_EQ(c.get({7, 0}), static_cast<double>(static_cast<float>(std::cos(7.0))));  // θ_0 = 1
  EXPECT_EQ(c.get({7, 32}), static_cast<double>(static_cast<float>(std::sin(7.0))));
  const double theta_5 = std::pow(10000.0, -10.0 / 64.0);
  EXPECT_EQ(c.get({4095, 5}), static_cast<double>(static_cast<float>(std::cos(4095 * theta_5))));
  EXPECT_EQ(c.get({0, 3}), 1.0);
  EXPECT_EQ(c.get({0, 35}), 0.0);
}

TEST(Rope, PairsOfBothStylesByHand) {
  // rot = 4: cos/sin pairs (c0, s0) = (0.6, 0.8) and (c1, s1) = (0, 1) at position 1.
  Tensor cache = Tensor::empty(DType::f64, {2, 4});
  const double row0[] = {1, 1, 0, 0}, row1[] = {0.6, 0.0, 0.8, 1.0};
  for (int64_t j = 0; j < 4; ++j) {
    cache.set({0, j}, row0[j]);
    cache.set({1, j}, row1[j]);
  }
  Tensor x = Tensor::empty(DType::f64, {1, 4});
  for (int64_t j = 0; j < 4; ++j) x.set({0, j}, static_cast<double>(j + 1));
  const Tensor n = rope(x, positions_of({1}), cache, RopeStyle::neox);  // pairs (0,2), (1,3)
  EXPECT_DOUBLE_EQ(n.get({0, 0}), 1 * 0.6 - 3 * 0.8);
  EXPECT_DOUBLE_EQ(n.get({0, 2}), 3 * 0.6 + 1 * 0.8);
  EXPECT_DOUBLE_EQ(n.get({0, 1}), 2 * 0.0 - 4 * 1.0);
  EXPECT_DOUBLE_EQ(n.get({0, 3}), 4 * 0.0 + 2 * 1.0);
  const Tensor g = rope(x, positions_of({1}), cache, RopeStyle::gptj);  // pairs (0,1), (2,3)
  EXPECT_DOUBLE_EQ(g.get({0, 0}), 1 * 0.6 - 2 * 0.8);
  EXPECT_DOUBLE_EQ(g.get({0, 1}), 2 * 0.6 + 1 * 0.8);
  EXPECT_DOUBLE_EQ(g.get({0, 2}), 3 * 0.0 - 4 * 1.0);
  EXPECT_DOUBLE_EQ(g.get({0, 3}), 4 * 0.0 + 3 * 1.0);
}

TEST(Rope, RotatingByPlusThenMinusPReturnsTheInput) {
  const Tensor cache = rope_cos_sin_cache(8192, 64, 10000.0, DType::f32);
  const Tensor inverse = rope_inverse_cache(cache);
  const Tensor pos = positions_of({0, 1, 7, 4095, 8191, 2, 300, 5000});
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    for (DType dt : {DType::f64, DType::bf16}) {
      Tensor x = Tensor::empty(dt, {8, 3, 64});
      fill_normal(x, Rng("rope_test", "x"));
      const Tensor back = rope(rope(x, pos, cache, style), pos, inverse, style);
      // f64: only the f32 cache's cos^2 + sin^2 != 1 (a few f32 ulps) remains. bf16: two roundings
      // of a value of a pair of norm <= |a| + |b| <= 12, each <= u = 2^-9 relative.
      const double tol = dt == DType::f64 ? 4e-7 * 12 : 2 * 12 * std::ldexp(1.0, -9) * 1.5;
      double worst = 0;
      x.for_each_index([&](const Index& i, int64_t) {
        worst = std::max(worst, std::fabs(back.get(i) - x.get(i)));
      });
      EXPECT_LE(worst, tol) << dtype_name(dt);
      EXPECT_GT(worst, 0.0) << "the rotation was the identity";
    }
  }
}

TEST(Rope, NeoxAndGptjDifferExceptAtPositionZero) {
  const Tensor cache = rope_cos_sin_cache(1024, 64, 10000.0, DType::f32);
  Tensor x = Tensor::empty(DType::bf16, {3, 4, 64});
  fill_normal(x, Rng("rope_test", "styles"));
  const Tensor pos = positions_of({0, 1, 1000});
  const Tensor n = rope(x, pos, cache, RopeStyle::neox);
  const Tensor g = rope(x, pos, cache, RopeStyle::gptj);
  int64_t unchanged = 0, differ[3] = {0, 0, 0};
  x.for_each_index([&](const Index& i, int64_t) {
    differ[i[0]] += n.get_bits(i) != g.get_bits(i);
    if (i[0] == 0) unchanged += n.get_bits(i) == x.get_bits(i) && g.get_bits(i) == x.get_bits(i);
  });
  EXPECT_EQ(unchanged, 4 * 64);  // position 0 is the identity for both styles
  EXPECT_EQ(differ[0], 0);
  // At position 1 the slow frequencies (θ_i down to 10^-4) move few values by a bf16 ulp; at 1000
  // nearly every pair turns.
  EXPECT_GT(differ[1], 4 * 64 / 2);
  EXPECT_GT(differ[2], 4 * 64 * 9 / 10);
}

TEST(Rope, InPlaceOnAStridedSliceLeavesTheOtherDimsUntouched) {
  const Tensor cache = rope_cos_sin_cache(128, 64, 10000.0, DType::bf16);
  const Tensor pos = positions_of({0, 1, 7, 100, 127});
  for (bool back : {false, true}) {
    Tensor q = Tensor::empty(DType::bf16, {5, 4, 128});
    fill_normal(q, Rng("rope_test", "q"));
    const Tensor before = q.contiguous();
    const int64_t lo = back ? 64 : 0;
    const Tensor view = q.slice(-1, lo, lo + 64);
    ASSERT_FALSE(view.is_contiguous());
    const Tensor expected = rope(before.slice(-1, lo, lo + 64), pos, cache, RopeStyle::gptj);
    rope_inplace(view, pos, cache, RopeStyle::gptj);
    int64_t outside_changed = 0, inside_wrong = 0;
    q.for_each_index([&](const Index& i, int64_t) {
      if (i[2] >= lo && i[2] < lo + 64)
        inside_wrong += q.get_bits(i) != expected.get_bits({i[0], i[1], i[2] - lo});
      else
        outside_changed += q.get_bits(i) != before.get_bits(i);
    });
    EXPECT_EQ(outside_changed, 0);
    EXPECT_EQ(inside_wrong, 0);
  }
}

TEST(Rope, IndexerCompositeEqualsSplitRotateConcat) {
  const Tensor cache = rope_cos_sin_cache(4096, 64, 10000.0, DType::f32);
  const Tensor pos = positions_of({0, 1, 7, 4095});
  const int64_t T = 4, H = 8, D = 128;
  Tensor q = Tensor::empty(DType::bf16, {T, H, D});
  Tensor kw = Tensor::empty(DType::bf16, {T, D + H});  // k is a strided view of the fused GEMM
  fill_normal(q, Rng("rope_test", "iq"));
  fill_normal(kw, Rng("rope_test", "ik"));
  const Tensor k = kw.slice(1, 0, D);
  const auto r = indexer_qk_rope(q, k, pos, cache, RopeStyle::neox);
  // Generic path: split [64 | 64], rotate the pe half out of place, concatenate.
  const Tensor q_pe = rope(q.slice(-1, 0, 64), pos, cache, RopeStyle::neox);
  const Tensor k_pe = rope(k.slice(-1, 0, 64), pos, cache, RopeStyle::neox);
  int64_t wrong = 0;
  r.q.for_each_index([&](const Index& i, int64_t) {
    wrong += r.q.get_bits(i) != (i[2] < 64 ? q_pe.get_bits(i) : q.get_bits(i));
  });
  r.k.for_each_index([&](const Index& i, int64_t) {
    wrong += r.k.get_bits(i) != (i[1] < 64 ? k_pe.get_bits(i) : k.get_bits(i));
  });
  EXPECT_EQ(wrong, 0);
}

TEST(Rope, RejectsBadArguments) {
  const Tensor cache = rope_cos_sin_cache(16, 64, 10000.0, DType::f32);
  auto expect_msg = [](auto&& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Tensor x = Tensor::zeros(DType::bf16, {2, 64});
  expect_msg(
      [&] {
        (void)rope(x, positions_of({0, 16}), cache, RopeStyle::neox);
      },
      "position 16 of token 1 outside the cache [0, 16)");
  expect_msg(
      [&] {
        (void)rope(x.slice(1, 0, 32), positions_of({0, 1}), cache, RopeStyle::neox);
      },
      "x must be [T, ..., rot] with rot = 64");
  expect_msg([&] { (void)rope(x, positions_of({0}), cache, RopeStyle::neox); },
             "positions must be [T] with T = 2");
  expect_msg([&] { (void)rope_cos_sin_cache(16, 63, 10000.0, DType::f32); }, "even rot");
}

}  // namespace
}  // namespace attncheck::ref
