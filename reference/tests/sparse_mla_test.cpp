// Sparse MLA reference: the index conversion against hand-written expectations, the packing with
// -1 anywhere in a row, the empty-row contract, and the full causal index set of every token
// against a second formulation of the attention (and the dense decode, which shares attend_rows).
#include "reference/sparse_mla.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "core/case.h"

namespace attncheck::ref {
namespace {

Tensor i32(Shape shape, const std::vector<int32_t>& values) {
  Tensor x = Tensor::empty(DType::i32, std::move(shape));
  x.for_each_index([&](const Index& idx, int64_t lin) { x.at<int32_t>(idx) = values.at(lin); });
  return x;
}
std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v;
  t.for_each_index([&](const Index& idx, int64_t) { v.push_back(t.at<int32_t>(idx)); });
  return v;
}
Tensor random_tensor(DType t, Shape shape, const char* name, double stddev = 1.0) {
  Tensor x = Tensor::empty(t, std::move(shape));
  fill_normal(x, Rng("sparse_mla_test", name), 0.0, stddev);
  return x;
}

TEST(SparseMlaIndices, ConversionFollowsTritonConvertExactly) {
  // Block size 4, two requests, table width 3 (max_blocks_per_req = 3 -> tokens 0..11 in range).
  const Tensor table = i32({2, 3}, {7, 2, 5, 1, 9, 4});
  const Tensor req = i32({3}, {0, 1, 1});
  const Tensor topk = i32({3, 5}, {0, 5, 11, -1, 12,   //
                                   3, -2, 4, 100, -1,  //
                                   8, 9, 10, 7, 6});
  const auto g = sparse_mla_global_indices(topk, req, table, 4);
  EXPECT_EQ(ints(g), (std::vector<int32_t>{7 * 4 + 0, 2 * 4 + 1, 5 * 4 + 3, -1, -1,  //
                                           1 * 4 + 3, -1, 9 * 4 + 0, -1, -1,         //
                                           4 * 4 + 0, 4 * 4 + 1, 4 * 4 + 2, 9 * 4 + 3, 9 * 4 + 2}));
  // Block size 1: a plain table lookup.
  const auto g1 = sparse_mla_global_indices(i32({1, 4}, {2, 0, 3, -1}), i32({1}, {1}), table, 1);
  EXPECT_EQ(ints(g1), (std::vector<int32_t>{4, 1, -1, -1}));
  EXPECT_THROW(sparse_mla_global_indices(topk, i32({3}, {0, 2, 1}), table, 4),
               std::invalid_argument);
}

TEST(SparseMlaIndices, PackingKeepsEveryValidEntryInOrder) {
  const Tensor g =
      i32({4, 4}, {5, 6, -1, -1,    //
                   -1, 3, -1, 8,    // interior -1: vLLM's first-cnt copy would take -1, 3
                   -1, -1, -1, -1,  // empty row
                   1, 2, 3, 4});
  const auto p = sparse_mla_pack(g);
  EXPECT_EQ(ints(p.indptr), (std::vector<int32_t>{0, 2, 4, 4, 8}));
  EXPECT_EQ(ints(p.indices), (std::vector<int32_t>{5, 6, 3, 8, 1, 2, 3, 4}));
}

TEST(SparseMla, EmptyRowGivesZeroOutputAndMinusInfinityLse) {
  const Tensor q = random_tensor(DType::bf16, {2, 4, 32}, "empty_q");
  const LatentCache kv{random_tensor(DType::bf16, {2, 4, 32}, "empty_kv"), 1.0};
  const RaggedIndices idx{i32({3}, {0, 0, 2}), i32({2}, {3, 6})};
  const auto r = sparse_mla(q, kv, idx, 0.2, 16);
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_EQ(r.lse.get({0, h}), -std::numeric_limits<double>::infinity());
    for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(r.out.get({0, h, d}), 0.0);
    EXPECT_TRUE(std::isfinite(r.lse.get({1, h})));
  }
}

// Hand-computed: scale ln 2 makes softmax weights powers of two.
TEST(SparseMla, HandComputedIntegerCase) {
  const Tensor q = i32({1, 1, 2}, {1, 0}).to(DType::f64);
  // slots 0..3 hold [t, 10 - t]; token attends slots {3, 1} in that order.
  const Tensor cache = i32({2, 2, 2}, {0, 10, 1, 9, 2, 8, 3, 7}).to(DType::f64);
  const auto r =
      sparse_mla(q, {cache, 1.0}, {i32({2}, {0, 2}), i32({2}, {3, 1})}, std::log(2.0), 2);
  // weights 2^3 (slot 3) and 2^1 (slot 1): (8 [3, 7] + 2 [1, 9]) / 10
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 0}), 26.0 / 10);
  EXPECT_DOUBLE_EQ(r.out.get({0, 0, 1}), 74.0 / 10);
  EXPECT_DOUBLE_EQ(r.lse.get({0, 0}), std::log(10.0));
}

TEST(SparseMla, InvalidHeadCountsAreRefused) {
  for (int64_t n : {3, 5, 12, 24, 40}) {
    const Tensor q = Tensor::zeros(DType::bf16, {1, n, 8});
    try {
      sparse_mla(q, {Tensor::zeros(DType::bf16, {1, 1, 8}), 1.0}, {i32({2}, {0, 1}), i32({1}, {0})},
                 1.0, 4);
      ADD_FAILURE() << n << " heads accepted";
    } catch (const InvalidConfig& e) {
      EXPECT_EQ(std::string(e.what()), mla_num_heads_message(n));
    }
  }
}

// A second formulation of causal MLA attention, independent of attend_rows (which sparse_mla and
// mla_decode share): per (token, head) a naive two-pass softmax in long double, max first, then
// exp(s - max) and the sums, over the token's request-local positions 0..last read straight from
// the paged cache through the block table. out [T][N][Lv], lse [T][N].
struct SecondFormulation {
  std::vector<std::vector<std::vector<long double>>> out;
  std::vector<std::vector<long double>> lse;
};
SecondFormulation naive_causal_mla(const Tensor& q, const Tensor& cache, const Tensor& table,
                                   const std::vector<int32_t>& req,
                                   const std::vector<int32_t>& last, double scale, int64_t lv) {
  const int64_t T = q.size(0), N = q.size(1), Lk = q.size(2), P = cache.size(1);
  SecondFormulation r;
  for (int64_t t = 0; t < T; ++t) {
    const auto ts = static_cast<size_t>(t);
    std::vector<Index> rows;  // (block, offset) of each visible key
    for (int64_t pos = 0; pos <= last[ts]; ++pos)
      rows.push_back({table.at<int32_t>({req[ts], pos / P}), pos % P});
    r.out.emplace_back();
    r.lse.emplace_back();
    for (int64_t h = 0; h < N; ++h) {
      std::vector<long double> s;
      long double m = -std::numeric_limits<long double>::infinity(), l = 0;
      for (const auto& row : rows) {
        long double dot = 0;
        for (int64_t d = 0; d < Lk; ++d)
          dot += static_cast<long double>(q.get({t, h, d})) * cache.get({row[0], row[1], d});
        s.push_back(scale * dot);
        m = std::max(m, s.back());
      }
      std::vector<long double> o(static_cast<size_t>(lv), 0);
      for (size_t j = 0; j < rows.size(); ++j) {
        const long double w = std::exp(s[j] - m);
        l += w;
        for (int64_t d = 0; d < lv; ++d)
          o[static_cast<size_t>(d)] += w * cache.get({rows[j][0], rows[j][1], d});
      }
      for (auto& x : o) x /= l;
      r.out.back().push_back(o);
      r.lse.back().push_back(m + std::log(l));
    }
  }
  return r;
}

// The full causal index set of every query token (all request-local positions 0..kv_len - qlen + i,
// shuffled, -1 padded) through conversion and packing: the sparse reference and the dense decode
// over the same paged cache both agree with the second formulation above (f64 against long double,
// keys summed in other orders: agreement to 1e-12, not bits).
TEST(SparseMla, FullCausalIndexSetMatchesASecondFormulationAndTheDenseDecode) {
  const int64_t P = 16, Lk = 576, Lv = 512, N = 8;
  const std::vector<int32_t> lens = {3, 40, 17}, qlens = {2, 1, 3};
  const int64_t T = 6, W = 3, topk = 48;
  const double scale = 0.07;
  const Tensor table = i32({3, W}, {4, -7, -7, 0, 6, 2, 1, 5, -7});
  Tensor cache = random_tensor(DType::bf16, {7, P, Lk}, "dense_cache");
  const Tensor q = random_tensor(DType::bf16, {T, N, Lk}, "dense_q", 2.0);
  std::vector<int32_t> req, local, lasts;
  Rng rng("sparse_mla_test", "shuffle");
  for (int32_t b = 0; b < 3; ++b)
    for (int32_t i = 0; i < qlens[static_cast<size_t>(b)]; ++i) {
      req.push_back(b);
      const int32_t last = lens[static_cast<size_t>(b)] - qlens[static_cast<size_t>(b)] + i;
      lasts.push_back(last);
      std::vector<int64_t> order = permutation(last + 1, rng);
      for (int64_t j = 0; j < topk; ++j)
        local.push_back(j <= last ? static_cast<int32_t>(order[static_cast<size_t>(j)]) : -1);
    }
  const Tensor g = sparse_mla_global_indices(i32({T, topk}, local), i32({T}, req), table, P);
  const auto sparse = sparse_mla(q, {cache, 1.0}, sparse_mla_pack(g), scale, Lv);
  const auto dense =
      mla_decode(q, {cache, 1.0}, table, i32({3}, lens), i32({4}, {0, 2, 3, 6}), scale, Lv);
  const SecondFormulation second = naive_causal_mla(q, cache, table, req, lasts, scale, Lv);
  for (const auto* result : {&sparse, &dense}) {
    SCOPED_TRACE(result == &sparse ? "sparse_mla" : "mla_decode");
    double worst = 0, worst_lse = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < N; ++h) {
        const auto ts = static_cast<size_t>(t), hs = static_cast<size_t>(h);
        worst_lse =
            std::max(worst_lse,
                     static_cast<double>(std::fabs(result->lse.get({t, h}) - second.lse[ts][hs])));
        for (int64_t d = 0; d < Lv; ++d)
          worst = std::max(
              worst, static_cast<double>(std::fabs(result->out.get({t, h, d}) -
                                                   second.out[ts][hs][static_cast<size_t>(d)])));
      }
    EXPECT_LT(worst, 1e-12);
    EXPECT_LT(worst_lse, 1e-12);
  }
}

}  // namespace
}  // namespace attncheck::ref
