// Top-k against a second formulation (threshold + count), with ties, short windows (-1 fill) and
// request-local indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/rng.h"
#include "reference/indexer.h"

namespace attncheck::ref::indexer {
namespace {

TEST(IndexerTopk, TiesTakeTheLowerColumn) {
  const float v[] = {1, 5, 3, 5, 5, 2};
  EXPECT_EQ(topk_window(v, 0, 6, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(topk_window(v, 2, 6, 3), (std::vector<int32_t>{1, 2, 0}));  // local to begin = 2
  EXPECT_EQ(topk_window(v, 4, 6, 5), (std::vector<int32_t>{0, 1}));     // window shorter than k
  EXPECT_TRUE(topk_window(v, 3, 3, 5).empty());
}

TEST(IndexerTopk, SetMatchesThresholdFormulation) {
  Rng rng("indexer_topk_test", "values");
  const int64_t M = 40, N = 300, k = 64;
  Tensor logits = Tensor::empty(DType::f32, {M, N});
  Tensor ks = Tensor::empty(DType::i32, {M}), ke = Tensor::empty(DType::i32, {M});
  for (int64_t i = 0; i < M; ++i) {
    const int64_t a = rng.uniform_int(0, N), b = rng.uniform_int(0, N);
    ks.at<int32_t>({i}) = static_cast<int32_t>(std::min(a, b));
    ke.at<int32_t>({i}) = static_cast<int32_t>(std::max(a, b));
    for (int64_t j = 0; j < N; ++j)  // few distinct values: many ties at the threshold
      logits.at<float>({i, j}) = static_cast<float>(rng.uniform_int(-20, 20)) * 0.25f;
  }
  const Tensor out = topk_prefill(logits, ks, ke, k);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t lo = ks.at<int32_t>({i}), hi = ke.at<int32_t>({i});
    std::vector<float> window;
    for (int64_t j = lo; j < hi; ++j) window.push_back(logits.at<float>({i, j}));
    std::sort(window.begin(), window.end(), std::greater<>());
    const int64_t take = std::min<int64_t>(k, hi - lo);
    // Threshold formulation: everything above the k-th value, then the lowest-column ties.
    std::set<int32_t> want;
    if (take > 0) {
      const float thr = window[static_cast<size_t>(take - 1)];
      for (int64_t j = lo; j < hi; ++j)
        if (logits.at<float>({i, j}) > thr) want.insert(static_cast<int32_t>(j - lo));
      for (int64_t j = lo; j < hi && static_cast<int64_t>(want.size()) < take; ++j)
        if (logits.at<float>({i, j}) == thr) want.insert(static_cast<int32_t>(j - lo));
    }
    std::set<int32_t> got;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t x = out.at<int32_t>({i, j});
      if (j < take) {
        ASSERT_GE(x, 0) << "row " << i;
        got.insert(x);
      } else {
        ASSERT_EQ(x, -1) << "row " << i << " col " << j;
      }
    }
    EXPECT_EQ(got, want) << "row " << i;
  }
}

TEST(IndexerTopk, DecodeWindowsFollowNextN) {
  const int64_t B = 2, NN = 3, W = 10, k = 4;
  Tensor logits = Tensor::empty(DType::f32, {B * NN, W});
  for (int64_t r = 0; r < B * NN; ++r)
    for (int64_t p = 0; p < W; ++p)
      logits.at<float>({r, p}) = static_cast<float>(p);  // last is largest
  Tensor lens = Tensor::empty(DType::i32, {B});
  lens.at<int32_t>({0}) = 4;  // rows see p < 2, 3, 4
  lens.at<int32_t>({1}) = 9;  // rows see p < 7, 8, 9
  const Tensor out = topk_decode(logits, lens, NN, k);
  EXPECT_EQ(out.at<int32_t>({0, 0}), 1);
  EXPECT_EQ(out.at<int32_t>({0, 2}), -1);
  EXPECT_EQ(out.at<int32_t>({2, 0}), 3);
  EXPECT_EQ(out.at<int32_t>({2, 3}), 0);
  EXPECT_EQ(out.at<int32_t>({3, 0}), 6);
  EXPECT_EQ(out.at<int32_t>({5, 0}), 8);
  EXPECT_EQ(out.at<int32_t>({5, 3}), 5);
}

}  // namespace
}  // namespace attncheck::ref::indexer
