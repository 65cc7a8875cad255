// Dense MLA decode reference: second formulations that share no code with reference/mla_decode.cpp
// (naive un-absorbed MLA with explicit projections, hand-computed cases), plus invariances the
// kernels rely on (block size, head padding, ragged qlen) and the 16-head rule's refusal text.
#include "reference/mla_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/case.h"

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
Tensor random_tensor(DType t, Shape shape, const char* name, double stddev = 1.0) {
  Tensor x = Tensor::empty(t, std::move(shape));
  fill_normal(x, Rng("mla_decode_test", name), 0.0, stddev);
  return x;
}
double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

// Logical KV rows per request placed into a paged cache of block size P with a shuffled,
// non-contiguous block assignment (spare blocks hold NaN: reading one shows up in the output).
struct Paged {
  Tensor cache, block_table, seq_lens;
};
Paged place(const std::vector<Tensor>& rows_per_request, int64_t P, const char* perm_name) {
  const int64_t B = static_cast<int64_t>(rows_per_request.size());
  const int64_t Lk = rows_per_request[0].size(1);
  int64_t needed = 0, W = 1;
  for (const auto& r : rows_per_request) {
    needed += (r.size(0) + P - 1) / P;
    W = std::max(W, (r.size(0) + P - 1) / P);
  }
  const int64_t nb = needed + 3;
  Rng rng("mla_decode_test", perm_name);
  const auto ids = permutation(nb, rng);
  Paged p{Tensor::full(DType::f64, {nb, P, Lk}, std::nan("")), Tensor::full(DType::i32, {B, W}, -1),
          Tensor::empty(DType::i32, {B})};
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Tensor& r = rows_per_request[static_cast<size_t>(b)];
    p.seq_lens.at<int32_t>({b}) = static_cast<int32_t>(r.size(0));
    for (int64_t j = 0; j * P < r.size(0); ++j)
      p.block_table.at<int32_t>({b, j}) = static_cast<int32_t>(ids[next++]);
    for (int64_t t = 0; t < r.size(0); ++t)
      p.cache.select(0, p.block_table.at<int32_t>({b, t / P}))
          .select(0, t % P)
          .copy_from(r.select(0, t));
  }
  return p;
}

TEST(MlaHeads, ValidCountsAreMultiplesOrDivisorsOf16) {
  for (int64_t n : {1, 2, 4, 8, 16, 32, 48, 64, 128}) EXPECT_TRUE(mla_num_heads_valid(n)) << n;
  for (int64_t n : {0, 3, 5, 6, 7, 9, 12, 15, 17, 24, 40, 100})
    EXPECT_FALSE(mla_num_heads_valid(n)) << n;
  EXPECT_EQ(mla_padded_heads(4), 16);
  EXPECT_EQ(mla_padded_heads(48), 48);
}

TEST(MlaHeads, InvalidCountsAreRefusedWithAitersMessage) {
  for (int64_t n : {3, 5, 12, 24, 40}) {
    const std::string want =
        "Aiter MLA requires that num_heads be multiples or divisors of 16, "
        "but provided " +
        std::to_string(n) + " number of heads.\nTry adjusting tensor_parallel_size value.";
    EXPECT_EQ(mla_num_heads_message(n), want);
    try {
      mla_check_num_heads(n);
      ADD_FAILURE() << n << " heads accepted";
    } catch (const InvalidConfig& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
    // The decode itself refuses before touching any data.
    const Tensor q = Tensor::zeros(DType::bf16, {1, n, 8});
    const LatentCache kv{Tensor::zeros(DType::bf16, {2, 1, 8}), 1.0};
    EXPECT_THROW(mla_decode(q, kv, i32({1, 1}, {0}), i32({1}, {1}), i32({2}, {0, 1}), 1.0, 4),
                 InvalidConfig);
  }
}

TEST(MlaHeads, PadRepeatInterleavesAndUnpadIsAStridedViewRoundTrip) {
  for (int64_t n : {1, 2, 4, 8}) {
    const Tensor q = random_tensor(DType::bf16, {3, n, 24}, "pad_q");
    const Tensor p = mla_pad_q(q);
    ASSERT_EQ(p.shape(), (Shape{3, 16, 24}));
    const int64_t r = 16 / n;
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t j = 0; j < 16; ++j)
        for (int64_t d = 0; d < 24; ++d)
          ASSERT_EQ(p.get_bits({t, j, d}), q.get_bits({t, j / r, d})) << n << " " << j;
    const Tensor back = mla_unpad_o(p, n);
    EXPECT_EQ(back.storage(), p.storage());  // a view, not a copy
    EXPECT_EQ(back.stride(1), r * 24);       // head stride r * L: not contiguous for r > 1
    EXPECT_EQ(back.is_contiguous(), r == 1);
    EXPECT_TRUE(bitwise_equal(back, q));
  }
}

TEST(MlaHeads, SixteenOrMoreHeadsAreZeroCopy) {
  for (int64_t n : {16, 48}) {
    const Tensor q = random_tensor(DType::f16, {2, n, 8}, "zero_copy");
    const Tensor p = mla_pad_q(q);
    EXPECT_EQ(p.storage(), q.storage());
    EXPECT_EQ(p.strides(), q.strides());
    EXPECT_EQ(mla_unpad_o(p, n).storage(), q.storage());
  }
  EXPECT_THROW(mla_pad_q(Tensor::zeros(DType::bf16, {1, 12, 8})), InvalidConfig);
}

// Scores are powers of two when scale = ln 2 and q . c is an integer: every number is exact.
TEST(MlaDecode, HandComputedIntegerCase) {
  // One request, 3 keys, Lk = 4, Lv = 2, one head, qlen 2.
  // keys c_t = [t, 0, 10 t, -t]; q rows [1, 0, 0, 0] and [0, 0, 0, -1]: q . c_t = t for both rows.
  const double ln2 = std::log(2.0);
  const Tensor q = from_values(DType::f64, {2, 1, 4}, {1, 0, 0, 0, 0, 0, 0, -1});
  std::vector<double> c(4 * 1 * 4, 0.0);  // 4 blocks of size 1
  const int table[3] = {2, 0, 3};         // token t lives in block table[t]
  for (int t = 0; t < 3; ++t) {
    c[static_cast<size_t>(table[t] * 4 + 0)] = t;
    c[static_cast<size_t>(table[t] * 4 + 2)] = 10 * t;
    c[static_cast<size_t>(table[t] * 4 + 3)] = -t;
  }
  c[1 * 4 + 0] = std::nan("");  // block 1 is not in the table
  const LatentCache kv{from_values(DType::f64, {4, 1, 4}, c), 1.0};
  const auto r = mla_decode(q, kv, i32({1, 3}, {2, 0, 3}), i32({1}, {3}), i32({2}, {0, 2}), ln2, 2);
  // Row 0 (position 0 of 2, kv_len 3) sees keys 0, 1: weights 1, 2 over 3.
  // Row 1 sees keys 0..2: weights 1, 2, 4 over 7.
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 0}), (0 * 1 + 1 * 2) / 3.0);
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 1}), 0.0);
  EXPECT_DOUBLE_EQ(r.out.get({1, 0, 0}), (0 * 1 + 1 * 2 + 2 * 4) / 7.0);
  EXPECT_DOUBLE_EQ(r.lse.get({0, 0}), std::log(3.0));
  EXPECT_DOUBLE_EQ(r.lse.get({1, 0}), std::log(7.0));
}

TEST(MlaDecode, FewHeadsTwoRequestsHandComputed) {
  // Two heads (padded to 16 inside), two requests of qlen 1, block size 2, Lk = Lv = 2.
  const double ln2 = std::log(2.0);
  // head 0 scores keys by c[0], head 1 by c[1].
  const Tensor q = from_values(DType::f64, {2, 2, 2}, {1, 0, 0, 1, 1, 0, 0, 1});
  // Request 0: keys [0,3], [2,1] (block 1). Request 1: keys [1,1] (block 0, slot 0).
  const Tensor cache = from_values(DType::f64, {2, 2, 2}, {1, 1, NAN, NAN, 0, 3, 2, 1});
  const LatentCache kv{cache, 1.0};
  const auto r =
      mla_decode(q, kv, i32({2, 1}, {1, 0}), i32({2}, {2, 1}), i32({3}, {0, 1, 2}), ln2, 2);
  // head 0: weights 2^0, 2^2 -> (1 [0,3] + 4 [2,1]) / 5 ; head 1: weights 2^3, 2^1 -> (8 [0,3] + 2
  // [2,1]) / 10
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 0}), 8.0 / 5);
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 1}), 7.0 / 5);
  EXPECT_DOUBLE_EQ(r.out.get({0, 1, 0}), 4.0 / 10);
  EXPECT_DOUBLE_EQ(r.out.get({0, 1, 1}), 26.0 / 10);
  EXPECT_DOUBLE_EQ(r.lse.get({0, 0}), std::log(5.0));
  EXPECT_DOUBLE_EQ(r.lse.get({0, 1}), std::log(10.0));
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_DOUBLE_EQ(r.out.get({1, h, 0}), 1.0);
    EXPECT_DOUBLE_EQ(r.lse.get({1, h}), ln2);
  }
}

// Naive (non-absorbed) MLA with explicit per-head projections, written as plain loops:
//   k_nope[n,t] = W_UK[n] c_lat[t] (128), k_pe[t] = c[t, 512:576], v[n,t] = W_UV[n]^T c_lat[t]
//   (128) out[n] = sum_t softmax_t(scale (q_nope . k_nope + q_pe . k_pe)) v[n,t]
// against the absorbed form: q = [q_nope W_UK[n], q_pe], out = (absorbed latent out) W_UV[n].
TEST(MlaDecode, AbsorbedEqualsNaiveWithRandomProjections) {
  const int64_t N = 4, R = 512, Dr = 64, Dn = 128, Dv = 128;
  const std::vector<int64_t> lens = {5, 19}, qlens = {1, 3};
  const int64_t T = 4;
  const double scale = 1.0 / std::sqrt(192.0);
  const Tensor w_uk = random_tensor(DType::f64, {N, Dn, R}, "w_uk", 0.05);
  const Tensor w_uv = random_tensor(DType::f64, {N, R, Dv}, "w_uv", 0.05);
  const Tensor q_nope = random_tensor(DType::f64, {T, N, Dn}, "q_nope");
  const Tensor q_pe = random_tensor(DType::f64, {T, N, Dr}, "q_pe");
  std::vector<Tensor> rows;
  for (size_t b = 0; b < lens.size(); ++b)
    rows.push_back(random_tensor(DType::bf16, {lens[b], R + Dr}, b ? "c1" : "c0"));
  const Tensor qsl = i32({3}, {0, 1, 4});

  // Absorbed query.
  Tensor q = Tensor::zeros(DType::f64, {T, N, R + Dr});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < R; ++j) {
        double s = 0;
        for (int64_t i = 0; i < Dn; ++i) s += q_nope.get({t, n, i}) * w_uk.get({n, i, j});
        q.set({t, n, j}, s);
      }
      for (int64_t j = 0; j < Dr; ++j) q.set({t, n, R + j}, q_pe.get({t, n, j}));
    }
  const Paged pg = place(rows, 16, "absorbed");
  const auto lat = mla_decode(q, {pg.cache, 1.0}, pg.block_table, pg.seq_lens, qsl, scale, R);

  const auto uk = w_uk.to_vector(), uv = w_uv.to_vector();
  const auto qn = q_nope.to_vector(), qr = q_pe.to_vector();
  for (int64_t b = 0; b < 2; ++b) {
    const auto c = rows[static_cast<size_t>(b)].to_vector();  // [L, R + Dr]
    const int64_t L = lens[static_cast<size_t>(b)], ql = qlens[static_cast<size_t>(b)];
    for (int64_t n = 0; n < N; ++n) {
      // Explicit per-head keys and values.
      std::vector<double> k_nope(static_cast<size_t>(L * Dn), 0.0),
          v(static_cast<size_t>(L * Dv), 0.0);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t j = 0; j < R; ++j) {
          const double cj = c[static_cast<size_t>(t * (R + Dr) + j)];
          for (int64_t a = 0; a < Dn; ++a)
            k_nope[static_cast<size_t>(t * Dn + a)] +=
                uk[static_cast<size_t>((n * Dn + a) * R + j)] * cj;
          for (int64_t e = 0; e < Dv; ++e)
            v[static_cast<size_t>(t * Dv + e)] +=
                cj * uv[static_cast<size_t>((n * R + j) * Dv + e)];
        }
      for (int64_t i = 0; i < ql; ++i) {
        const int64_t tq = qsl.at<int32_t>({b}) + i;
        std::vector<double> s;
        for (int64_t t = 0; t < L; ++t) {
          if (t - (L - ql) > i)
            break;  // key t is draft token t - (L - ql): later drafts are hidden
          double dot = 0;
          for (int64_t a = 0; a < Dn; ++a)
            dot += qn[static_cast<size_t>((tq * N + n) * Dn + a)] *
                   k_nope[static_cast<size_t>(t * Dn + a)];
          for (int64_t a = 0; a < Dr; ++a)
            dot += qr[static_cast<size_t>((tq * N + n) * Dr + a)] *
                   c[static_cast<size_t>(t * (R + Dr) + R + a)];
          s.push_back(scale * dot);
        }
        ASSERT_EQ(static_cast<int64_t>(s.size()), L - ql + i + 1);
        const double m = *std::max_element(s.begin(), s.end());
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - m));
        for (int64_t e = 0; e < Dv; ++e) {
          double naive = 0;
          for (size_t t = 0; t < s.size(); ++t)
            naive += s[t] / l * v[t * static_cast<size_t>(Dv) + static_cast<size_t>(e)];
          double absorbed = 0;
          for (int64_t j = 0; j < R; ++j)
            absorbed += lat.out.get({tq, n, j}) * uv[static_cast<size_t>((n * R + j) * Dv + e)];
          ASSERT_NEAR(absorbed, naive, 1e-11 * (1 + std::fabs(naive))) << b << " " << i << " " << n;
        }
        EXPECT_NEAR(lat.lse.get({tq, n}), m + std::log(l), 1e-12 * (1 + std::fabs(m)));
      }
    }
  }
}

// The page layout is invisible to the math: the same logical rows under block sizes 1, 16 and 64
// with different shuffled tables give bitwise identical outputs.
TEST(MlaDecode, BlockSizesOverRemappedTablesAgreeBitwise) {
  const std::vector<int64_t> lens = {1, 17, 64, 65, 130};
  std::vector<Tensor> rows;
  for (size_t b = 0; b < lens.size(); ++b)
    rows.push_back(
        random_tensor(DType::bf16, {lens[b], 576}, ("rows" + std::to_string(b)).c_str()));
  const Tensor q = random_tensor(DType::bf16, {9, 8, 576}, "q_bs", 2.0);
  const Tensor qsl = i32({6}, {0, 1, 3, 5, 7, 9});  // qlen 1 for the 1-token request
  MlaResult first;
  for (int64_t P : {1, 16, 64}) {
    const Paged pg = place(rows, P, P == 1 ? "perm1" : P == 16 ? "perm16" : "perm64");
    const auto r = mla_decode(q, {pg.cache, 1.0}, pg.block_table, pg.seq_lens, qsl, 1 / 24.0, 512);
    if (P == 1) {
      first = r;
      continue;
    }
    EXPECT_TRUE(bitwise_equal(r.out, first.out)) << "block size " << P;
    EXPECT_TRUE(bitwise_equal(r.lse, first.lse)) << "block size " << P;
  }
  for (double v : first.out.to_vector()) ASSERT_TRUE(std::isfinite(v));  // no NaN block was read
}

// Padding to 16 heads changes nothing: N real heads equal the corresponding heads of a 16-head
// problem whose query is the padded query.
TEST(MlaDecode, HeadPaddingIsInvisible) {
  std::vector<Tensor> rows = {random_tensor(DType::bf16, {40, 96}, "pad_rows")};
  const Paged pg = place(rows, 16, "pad_perm");
  const Tensor qsl = i32({2}, {0, 3});
  for (int64_t n : {1, 2, 4, 8}) {
    const Tensor q = random_tensor(DType::f16, {3, n, 96}, "pad_q2", 2.0);
    const auto small = mla_decode(q, {pg.cache, 1.0}, pg.block_table, pg.seq_lens, qsl, 0.1, 64);
    const auto big =
        mla_decode(mla_pad_q(q), {pg.cache, 1.0}, pg.block_table, pg.seq_lens, qsl, 0.1, 64);
    EXPECT_TRUE(bitwise_equal(small.out, mla_unpad_o(big.out, n))) << n;
    EXPECT_TRUE(bitwise_equal(small.lse, mla_unpad_o(big.lse.unsqueeze(2), n).select(2, 0))) << n;
  }
}

// Ragged qlen inside one batch equals running each request alone; strided q equals contiguous q.
TEST(MlaDecode, RaggedBatchEqualsRequestsAloneAndStridesDoNotMatter) {
  const std::vector<int64_t> lens = {4, 33, 9}, qlens = {1, 3, 2};
  std::vector<Tensor> rows;
  for (size_t b = 0; b < lens.size(); ++b)
    rows.push_back(
        random_tensor(DType::bf16, {lens[b], 80}, ("ragged" + std::to_string(b)).c_str()));
  const Paged pg = place(rows, 16, "ragged_perm");
  // q interleaved in a wider buffer with gaps holding NaN.
  Tensor buf = Tensor::full(DType::bf16, {6, 16, 100}, std::nan(""));
  const Tensor q = buf.slice(2, 7, 87);
  fill_normal(q, Rng("mla_decode_test", "ragged_q"), 0.0, 2.0);
  const auto all =
      mla_decode(q, {pg.cache, 1.0}, pg.block_table, pg.seq_lens, i32({4}, {0, 1, 4, 6}), 0.2, 64);
  EXPECT_TRUE(bitwise_equal(all.out, mla_decode(q.contiguous(), {pg.cache, 1.0}, pg.block_table,
                                                pg.seq_lens, i32({4}, {0, 1, 4, 6}), 0.2, 64)
                                         .out));
  int64_t q0 = 0;
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t ql = qlens[static_cast<size_t>(b)];
    const auto one =
        mla_decode(q.slice(0, q0, q0 + ql), {pg.cache, 1.0}, pg.block_table.slice(0, b, b + 1),
                   pg.seq_lens.slice(0, b, b + 1), i32({2}, {0, static_cast<double>(ql)}), 0.2, 64);
    EXPECT_TRUE(bitwise_equal(one.out, all.out.slice(0, q0, q0 + ql))) << b;
    EXPECT_TRUE(bitwise_equal(one.lse, all.lse.slice(0, q0, q0 + ql))) << b;
    q0 += ql;
  }
}

// Causality: position i's output ignores every later draft token (changing their values moves
// only later rows), and different positions give different outputs (the aiter #2720 symptom).
TEST(MlaDecode, CausalRuleSeparatesQueryPositions) {
  Tensor rows = random_tensor(DType::bf16, {20, 64}, "causal_rows");
  const Tensor q = random_tensor(DType::bf16, {6, 16, 64}, "causal_q", 2.0);
  Tensor q_same = Tensor::empty(DType::bf16, {6, 16, 64});
  for (int64_t i = 0; i < 6; ++i) q_same.select(0, i).copy_from(q.select(0, 0));
  const Tensor qsl = i32({2}, {0, 6});
  const Paged a = place({rows}, 16, "causal_perm");
  const auto ra = mla_decode(q_same, {a.cache, 1.0}, a.block_table, a.seq_lens, qsl, 0.125, 32);
  for (int64_t i = 1; i < 6; ++i)  // identical queries, growing key sets: outputs must differ
    EXPECT_GT(max_abs_diff(ra.out.select(0, i), ra.out.select(0, 0)), 1e-6) << i;
  Tensor rows2 = rows.contiguous();
  rows2.select(0, 17).copy_from(random_tensor(DType::bf16, {64}, "causal_change"));  // draft 3 of 6
  const Paged b = place({rows2}, 16, "causal_perm");
  const auto ra2 = mla_decode(q, {a.cache, 1.0}, a.block_table, a.seq_lens, qsl, 0.125, 32);
  const auto rb = mla_decode(q, {b.cache, 1.0}, b.block_table, b.seq_lens, qsl, 0.125, 32);
  for (int64_t i = 0; i < 6; ++i) {  // key 17 = kv_len - qlen + 3: visible from position 3 on
    const double d = max_abs_diff(ra2.out.select(0, i), rb.out.select(0, i));
    if (i < 3)
      EXPECT_EQ(d, 0.0) << i;
    else
      EXPECT_GT(d, 0.0) << i;
  }
}

// fp8 rows are decoded exactly and scaled by kv_scale in f64: the same problem with an f64 cache
// holding decode(code) * kv_scale gives bitwise identical results, for both e4m3 flavours.
TEST(MlaDecode, Fp8CacheDequantizationIsExact) {
  EXPECT_EQ(fp8_decode(0x7E, DType::e4m3fn), 448.0);
  EXPECT_EQ(fp8_decode(0x7F, DType::e4m3fnuz), 240.0);
  EXPECT_EQ(fp8_decode(0x01, DType::e4m3fn), std::ldexp(1.0, -9));
  EXPECT_EQ(fp8_decode(0x01, DType::e4m3fnuz), std::ldexp(1.0, -10));
  const double kv_scale = 0.0371;
  for (DType t : {DType::e4m3fn, DType::e4m3fnuz}) {
    Tensor codes = Tensor::empty(t, {3, 16, 96});
    fill_fp8_codes(codes, Rng("mla_decode_test", "fp8", static_cast<uint64_t>(t)), 240.0);
    const Tensor gathered = gather_latent_rows({codes, kv_scale}, {0, 17, 47});
    for (int64_t d = 0; d < 96; ++d) {
      EXPECT_EQ(gathered.get({1, d}),
                fp8_decode(static_cast<uint8_t>(codes.get_bits({1, 1, d})), t) * kv_scale);
      EXPECT_EQ(gathered.get({2, d}),
                fp8_decode(static_cast<uint8_t>(codes.get_bits({2, 15, d})), t) * kv_scale);
    }
    Tensor dequant = Tensor::empty(DType::f64, {3, 16, 96});
    codes.for_each_index([&](const Index& idx, int64_t) {
      dequant.set(idx, fp8_decode(static_cast<uint8_t>(codes.get_bits(idx)), t) * kv_scale);
    });
    const Tensor q = random_tensor(DType::bf16, {2, 4, 96}, "fp8_q");
    const Tensor table = i32({1, 3}, {2, 0, 1}), lens = i32({1}, {40}), qsl = i32({2}, {0, 2});
    const auto a = mla_decode(q, {codes, kv_scale}, table, lens, qsl, 0.3, 64);
    const auto b = mla_decode(q, {dequant, 1.0}, table, lens, qsl, 0.3, 64);
    EXPECT_TRUE(bitwise_equal(a.out, b.out));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  }
}

TEST(MlaDecode, MalformedMetadataIsRejected) {
  const Tensor q = Tensor::zeros(DType::bf16, {2, 4, 16});
  const LatentCache kv{Tensor::zeros(DType::bf16, {4, 4, 16}), 1.0};
  const Tensor table = i32({1, 2}, {0, 1});
  // kv_len 1 < qlen 2
  EXPECT_THROW(mla_decode(q, kv, table, i32({1}, {1}), i32({2}, {0, 2}), 1.0, 8),
               std::invalid_argument);
  // table too narrow for 9 tokens of block size 4
  EXPECT_THROW(mla_decode(q, kv, table, i32({1}, {9}), i32({2}, {0, 2}), 1.0, 8),
               std::invalid_argument);
  // block id outside the cache
  EXPECT_THROW(mla_decode(q, kv, i32({1, 2}, {0, 9}), i32({1}, {6}), i32({2}, {0, 2}), 1.0, 8),
               std::invalid_argument);
  // query_start_loc not ending at T
  EXPECT_THROW(mla_decode(q, kv, table, i32({1}, {6}), i32({2}, {0, 1}), 1.0, 8),
               std::invalid_argument);
}

}  // namespace
}  // namespace attncheck::ref
