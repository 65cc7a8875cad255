#include "reference/decode_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace attncheck::ref {
namespace {

Tensor from_values(DType t, Shape shape, const std::vector<double>& values) {
  Tensor x = Tensor::empty(t, std::move(shape));
  x.for_each_index([&](const Index& idx, int64_t lin) { x.set(idx, values.at(lin)); });
  return x;
}

Tensor i32(Shape shape, const std::vector<double>& values) {
  return from_values(DType::i32, std::move(shape), values);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// A random paged problem: pages handed out in a shuffled order, ragged lengths.
DecodeAttentionInputs random_problem(const std::string& name, int64_t B, int64_t Hq, int64_t Hkv,
                                     int64_t Lk, int64_t Lv, int64_t P, std::vector<int64_t> lens,
                                     bool mla) {
  int64_t pages_needed = 0, W = 0;
  for (auto l : lens) {
    pages_needed += (l + P - 1) / P;
    W = std::max(W, (l + P - 1) / P);
  }
  const int64_t num_pages = pages_needed + 2;
  Rng prng(name, "pages");
  const auto ids = permutation(num_pages, prng);
  std::vector<double> table(static_cast<size_t>(B * W), -1), seq;
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < (lens[b] + P - 1) / P; ++j)
      table[static_cast<size_t>(b * W + j)] = static_cast<double>(ids[next++]);
    seq.push_back(static_cast<double>(lens[b]));
  }
  DecodeAttentionInputs in;
  in.q = Tensor::empty(DType::bf16, {B, Hq, Lk});
  fill_normal(in.q, Rng(name, "q"));
  in.k_buffer = Tensor::empty(DType::bf16, {num_pages, P, Hkv, Lk});
  fill_normal(in.k_buffer, Rng(name, "k"));
  if (mla) {
    in.v_buffer = in.k_buffer.slice(3, 0, Lv);
  } else {
    in.v_buffer = Tensor::empty(DType::bf16, {num_pages, P, Hkv, Lv});
    fill_normal(in.v_buffer, Rng(name, "v"));
  }
  in.req_to_token = i32({B, W}, table);
  in.seq_lens = i32({B}, seq);
  in.sm_scale = 1.0 / std::sqrt(static_cast<double>(Lk));
  return in;
}

// Straight loops, no Eigen, no page bookkeeping shared with the implementation under test.
DecodeAttentionResult naive(const DecodeAttentionInputs& in) {
  const int64_t B = in.q.size(0), Hq = in.q.size(1), Lk = in.q.size(2);
  const int64_t Hkv = in.k_buffer.size(-2), Lv = in.v_buffer.size(-1);
  const int64_t P = in.k_buffer.ndim() == 4 ? in.k_buffer.size(1) : 1;
  DecodeAttentionResult r{Tensor::empty(DType::f64, {B, Hq, Lv}),
                          Tensor::empty(DType::f64, {B, Hq})};
  auto kv = [&](const Tensor& buf, int64_t page, int64_t slot, int64_t h, int64_t d) {
    return buf.ndim() == 4 ? buf.get({page, slot, h, d}) : buf.get({page, h, d});
  };
  for (int64_t b = 0; b < B; ++b) {
    const auto L = static_cast<int64_t>(in.seq_lens.get({b}));
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv);
      std::vector<double> s(static_cast<size_t>(L));
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t n = 0; n < L; ++n) {
        const auto page = static_cast<int64_t>(in.req_to_token.get({b, n / P}));
        double dot = 0;
        for (int64_t d = 0; d < Lk; ++d)
          dot += in.q.get({b, h, d}) * kv(in.k_buffer, page, n % P, kvh, d) * in.k_scale;
        double x = dot * in.sm_scale;
        if (in.logit_cap > 0) x = in.logit_cap * std::tanh(x / in.logit_cap);
        s[n] = x;
        m = std::max(m, x);
      }
      double l = 0;
      for (auto& x : s) l += std::exp(x - m);
      for (int64_t d = 0; d < Lv; ++d) {
        double acc = 0;
        for (int64_t n = 0; n < L; ++n) {
          const auto page = static_cast<int64_t>(in.req_to_token.get({b, n / P}));
          acc += std::exp(s[n] - m) / l * kv(in.v_buffer, page, n % P, kvh, d) * in.v_scale;
        }
        r.o.set({b, h, d}, acc);
      }
      r.lse.set({b, h}, m + std::log(l));
    }
  }
  return r;
}

TEST(DecodeAttention, HandComputedTwoTokens) {
  // q = [1, 0]; k0 = [2, 0], k1 = [0, 5]; sm_scale 0.5 -> s = [1, 0].
  DecodeAttentionInputs in;
  in.q = from_values(DType::bf16, {1, 1, 2}, {1, 0});
  in.k_buffer = from_values(DType::bf16, {2, 1, 2}, {2, 0, 0, 5});
  in.v_buffer = from_values(DType::bf16, {2, 1, 2}, {1, 2, 3, 4});
  in.req_to_token = i32({1, 2}, {1, 0});  // token 0 lives in row 1, token 1 in row 0
  in.seq_lens = i32({1}, {2});
  in.sm_scale = 0.5;
  const auto r = decode_attention(in);
  // s = [q.k(row 1), q.k(row 0)] * 0.5 = [0, 1]: weights 1/(1+e), e/(1+e) on v rows 1 and 0.
  const double e = std::exp(1.0), w0 = e / (1 + e), w1 = 1 / (1 + e);
  EXPECT_NEAR(r.o.get({0, 0, 0}), w0 * 1 + w1 * 3, 1e-15);
  EXPECT_NEAR(r.o.get({0, 0, 1}), w0 * 2 + w1 * 4, 1e-15);
  EXPECT_NEAR(r.lse.get({0, 0}), std::log(1 + e), 1e-15);
}

TEST(DecodeAttention, HandComputedLogitCapAndScales) {
  // One token: o = v * v_scale whatever the score; lse = capped score.
  DecodeAttentionInputs in;
  in.q = from_values(DType::f16, {1, 1, 2}, {3, 1});
  in.k_buffer = from_values(DType::e4m3fn, {1, 1, 1, 2}, {4, 8});
  in.v_buffer = from_values(DType::e4m3fn, {1, 1, 1, 2}, {-2, 0.5});
  in.req_to_token = i32({1, 1}, {0});
  in.seq_lens = i32({1}, {1});
  in.sm_scale = 0.25;
  in.k_scale = 0.5;
  in.v_scale = 3;
  in.logit_cap = 2;
  const auto r = decode_attention(in);
  // s = 0.25 * 0.5 * (3*4 + 1*8) = 2.5; capped: 2 tanh(1.25).
  EXPECT_NEAR(r.lse.get({0, 0}), 2 * std::tanh(1.25), 1e-15);
  EXPECT_DOUBLE_EQ(r.o.get({0, 0, 0}), -6);
  EXPECT_DOUBLE_EQ(r.o.get({0, 0, 1}), 1.5);
}

TEST(DecodeAttention, CapChangesTheWeights) {
  // Two tokens with scores 4 and 0; cap 1 turns them into tanh(4) and 0.
  DecodeAttentionInputs in;
  in.q = from_values(DType::bf16, {1, 1, 1}, {1});
  in.k_buffer = from_values(DType::bf16, {2, 1, 1}, {4, 0});
  in.v_buffer = from_values(DType::bf16, {2, 1, 1}, {1, 0});
  in.req_to_token = i32({1, 2}, {0, 1});
  in.seq_lens = i32({1}, {2});
  in.logit_cap = 1;
  const double a = std::tanh(4.0);
  EXPECT_NEAR(decode_attention(in).o.get({0, 0, 0}), std::exp(a) / (std::exp(a) + 1), 1e-15);
  in.logit_cap = 0;
  EXPECT_NEAR(decode_attention(in).o.get({0, 0, 0}), std::exp(4.0) / (std::exp(4.0) + 1), 1e-15);
}

TEST(DecodeAttention, MatchesNaiveLoopsGqaPagedCapped) {
  auto in = random_problem("naive", 3, 8, 2, 40, 24, 4, {1, 9, 17}, false);
  in.logit_cap = 1.5;
  const auto r = decode_attention(in), n = naive(in);
  EXPECT_LT(max_abs_diff(r.o, n.o), 1e-13);
  EXPECT_LT(max_abs_diff(r.lse, n.lse), 1e-13);
}

TEST(DecodeAttention, MatchesNaiveLoopsFp8Mla) {
  auto in = random_problem("fp8", 2, 4, 1, 40, 32, 8, {5, 19}, true);
  for (DType t : {DType::e4m3fn, DType::e4m3fnuz}) {
    Tensor k8 = Tensor::empty(t, in.k_buffer.shape());
    fill_normal(k8, Rng("fp8", "k8"), 0, 40);
    in.k_buffer = k8;
    in.v_buffer = k8.slice(3, 0, 32);  // MLA: V is the latent prefix of K, same storage
    in.k_scale = in.v_scale = 0.0173;
    const auto r = decode_attention(in), n = naive(in);
    EXPECT_LT(max_abs_diff(r.o, n.o), 1e-12) << dtype_name(t);
    EXPECT_LT(max_abs_diff(r.lse, n.lse), 1e-12) << dtype_name(t);
  }
}

TEST(DecodeAttention, MlaSharedStorageEqualsSeparateCopy) {
  auto in = random_problem("mla", 2, 16, 1, 72, 64, 16, {3, 40}, true);
  ASSERT_EQ(in.v_buffer.storage(), in.k_buffer.storage());
  auto copy = in;
  copy.v_buffer = in.v_buffer.contiguous();
  const auto a = decode_attention(in), b = decode_attention(copy);
  EXPECT_EQ(max_abs_diff(a.o, b.o), 0.0);
  EXPECT_EQ(max_abs_diff(a.lse, b.lse), 0.0);
}

TEST(DecodeAttention, SplitBoundsFollowB2) {
  using B = std::pair<int64_t, int64_t>;
  EXPECT_EQ(split_bounds(5, 4, 0), B(0, 2));
  EXPECT_EQ(split_bounds(5, 4, 1), B(2, 4));
  EXPECT_EQ(split_bounds(5, 4, 2), B(4, 5));
  EXPECT_EQ(split_bounds(5, 4, 3), B(6, 5));  // empty
  EXPECT_EQ(split_bounds(3, 16, 2), B(2, 3));
  EXPECT_EQ(split_bounds(3, 16, 3), B(3, 3));  // more splits than tokens: empty
  EXPECT_EQ(split_bounds(17, 16, 8), B(16, 17));
  EXPECT_EQ(split_bounds(17, 16, 9), B(18, 17));
}

TEST(DecodeAttention, AnySplitCountEqualsOnePass) {
  auto in = random_problem("splits", 4, 8, 8, 32, 32, 4, {1, 3, 16, 33}, false);
  in.logit_cap = 2;
  const auto one = decode_attention(in);
  for (int64_t S : {1, 2, 3, 4, 7, 8, 16, 64}) {
    const Tensor partials = decode_stage1(in, S);
    const auto merged = decode_stage2(partials, in.seq_lens);
    EXPECT_LT(max_abs_diff(merged.o, one.o), 1e-14) << "S=" << S;
    EXPECT_LT(max_abs_diff(merged.lse, one.lse), 1e-13) << "S=" << S;
    // Slots of empty splits are left alone (NaN here); non-empty ones are finite.
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t s = 0; s < S; ++s) {
        const auto [start, end] = split_bounds(static_cast<int64_t>(in.seq_lens.get({b})), S, s);
        EXPECT_EQ(std::isnan(partials.get({b, 0, s, 32})), end <= start) << b << " " << s;
      }
  }
}

TEST(DecodeAttention, SplitPartialIsAttentionOverItsTokens) {
  auto in = random_problem("partial", 1, 2, 1, 16, 8, 1, {10}, false);
  const Tensor partials = decode_stage1(in, 3);  // splits [0,4) [4,8) [8,10)
  auto tail = in;
  // The tail split alone: a request whose pages are tokens 8 and 9 of the original.
  tail.req_to_token = i32({1, 2}, {in.req_to_token.get({0, 8}), in.req_to_token.get({0, 9})});
  tail.seq_lens = i32({1}, {2});
  const auto r = decode_attention(tail);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 8; ++d)
      EXPECT_NEAR(partials.get({0, h, 2, d}), r.o.get({0, h, d}), 1e-15);
    EXPECT_NEAR(partials.get({0, h, 2, 8}), r.lse.get({0, h}), 1e-15);
  }
}

TEST(DecodeAttention, TokenTablePageSizeOneEqualsPagedView) {
  // B.8: a 3-D [T, H, D] buffer with a token table and its 4-D [T/P, P, H, D] view with the page
  // table give identical outputs.
  constexpr int64_t P = 16;
  auto paged = random_problem("b8", 3, 8, 2, 48, 32, P, {1, 16, 37}, false);
  const int64_t pages = paged.k_buffer.size(0), W = paged.req_to_token.size(1);
  auto flat = paged;
  flat.k_buffer = paged.k_buffer.reshape({pages * P, 2, 48});
  flat.v_buffer = paged.v_buffer.reshape({pages * P, 2, 32});
  std::vector<double> tokens(static_cast<size_t>(3 * W * P), 0);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t n = 0; n < static_cast<int64_t>(paged.seq_lens.get({b})); ++n)
      tokens[static_cast<size_t>(b * W * P + n)] =
          paged.req_to_token.get({b, n / P}) * P + static_cast<double>(n % P);
  flat.req_to_token = i32({3, W * P}, tokens);
  const auto a = decode_attention(paged), b = decode_attention(flat);
  EXPECT_EQ(max_abs_diff(a.o, b.o), 0.0);
  EXPECT_EQ(max_abs_diff(a.lse, b.lse), 0.0);
}

TEST(DecodeAttention, StridedViewsGiveTheSameResult) {
  auto in = random_problem("strided", 2, 4, 2, 24, 16, 4, {7, 12}, false);
  auto wide = in;
  Tensor qbuf = Tensor::full(DType::bf16, {2, 4, 40}, 99.0);
  wide.q = qbuf.slice(2, 8, 32);
  wide.q.copy_from(in.q);
  Tensor kbuf = Tensor::full(DType::bf16, {in.k_buffer.size(0), 2, 4, 2, 30}, -99.0);
  wide.k_buffer = kbuf.select(1, 1).slice(3, 0, 24);  // cross-layer pages, padded head rows
  wide.k_buffer.copy_from(in.k_buffer);
  Tensor tbuf = Tensor::full(DType::i32, {2, in.req_to_token.size(1) + 3}, -7);
  wide.req_to_token = tbuf.slice(1, 0, in.req_to_token.size(1));
  wide.req_to_token.copy_from(in.req_to_token);
  const auto a = decode_attention(in), b = decode_attention(wide);
  EXPECT_EQ(max_abs_diff(a.o, b.o), 0.0);
  EXPECT_EQ(max_abs_diff(a.lse, b.lse), 0.0);
}

TEST(DecodeAttention, Stage2OfAnEmptyRequestIsNanLikeUpstream) {
  Tensor partials = Tensor::full(DType::f64, {1, 1, 2, 3}, std::nan(""));
  const auto r = decode_stage2(partials, i32({1}, {0}));
  EXPECT_TRUE(std::isnan(r.o.get({0, 0, 0})));
  EXPECT_EQ(r.lse.get({0, 0}), -std::numeric_limits<double>::infinity());
}

TEST(DecodeAttention, ErrorTermsHandComputed) {
  DecodeAttentionInputs in;
  in.q = from_values(DType::bf16, {1, 1, 2}, {1, -2});
  in.k_buffer = from_values(DType::bf16, {2, 1, 2}, {3, 1, -1, 1});
  in.v_buffer = from_values(DType::bf16, {2, 1, 1}, {-4, 2});
  in.req_to_token = i32({1, 2}, {0, 1});
  in.seq_lens = i32({1}, {2});
  in.sm_scale = 0.5;
  const auto t = decode_error_terms(in);
  // |q||k|: 3 + 2 = 5 and 1 + 2 = 3; times 0.5.
  EXPECT_DOUBLE_EQ(t.score_abs.get({0, 0}), 2.5);
  // s = 0.5 * [1, -3] = [0.5, -1.5]: w = [1, e^-2] / (1 + e^-2); sum w|v| = (4 + 2 e^-2) / (1 +
  // e^-2).
  const double e2 = std::exp(-2.0);
  EXPECT_NEAR(t.weighted_abs_v.get({0, 0}), (4 + 2 * e2) / (1 + e2), 1e-15);
  EXPECT_NEAR(t.weighted_abs_v_rest.get({0, 0}), 2 * e2 / (1 + e2), 1e-15);  // token 0 is n*
  // o = (-4 + 2 e^-2) / (1 + e^-2); spread = w0 |-4 - o| + w1 |2 - o| = 2 * w0 * w1 * 6.
  EXPECT_NEAR(t.weighted_spread.get({0, 0}), 12 * e2 / ((1 + e2) * (1 + e2)), 1e-15);
  EXPECT_DOUBLE_EQ(t.score_gap.get({0, 0}), 2.0);
  EXPECT_EQ(t.v_abs_max.get({0, 0}), 4.0);
  // One token: nothing but the top token, no spread, an infinite gap.
  in.seq_lens = i32({1}, {1});
  const auto one = decode_error_terms(in);
  EXPECT_EQ(one.weighted_abs_v_rest.get({0, 0}), 0.0);
  EXPECT_EQ(one.weighted_spread.get({0, 0}), 0.0);
  EXPECT_TRUE(std::isinf(one.score_gap.get({0, 0})));
}

void expect_invalid(const DecodeAttentionInputs& in, const std::string& message) {
  try {
    decode_attention(in);
    FAIL() << "accepted: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(e.what(), message);
  }
}

TEST(DecodeAttention, RejectsBadInputsWithMessages) {
  const auto good = random_problem("bad", 2, 4, 2, 8, 8, 4, {3, 6}, false);
  auto in = good;
  in.seq_lens = i32({2}, {3, 0});
  expect_invalid(in, "request 1 has length 0: undefined (vLLM's stage 2 computes 0 / 0)");
  in = good;
  in.seq_lens = i32({2}, {3, 9});
  expect_invalid(in, "request 1 needs 3 pages, the table has 2");
  in = good;
  in.req_to_token = i32({2, 2}, {0, -1, 1, 7});
  expect_invalid(in, "request 1 page 1 is 7, outside [0, 5)");
  in = good;
  in.q = Tensor::empty(DType::bf16, {2, 3, 8});
  expect_invalid(in, "Hq 3 is not a multiple of Hkv 2");
  in = good;
  in.q = Tensor::empty(DType::bf16, {2, 4, 16});
  expect_invalid(in, "q has Lk 16 but k_buffer 8");
}

}  // namespace
}  // namespace attncheck::ref
