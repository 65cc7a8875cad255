// Top-k over the indexer logits (docs/ops/indexer.md, Top-k): the k largest values of each row's
// window, as request-local indices, valid ones first, -1 after. The reference breaks ties by the
// lower column; kernels may break them differently (checks compare sets with a tie rule).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "indexer.h"
#include "indexer_internal.h"

namespace attncheck::ref::indexer {

using detail::expect;

std::vector<int32_t> topk_window(const float* values, int64_t begin, int64_t end, int64_t k) {
  std::vector<std::pair<float, int64_t>> cand;
  cand.reserve(static_cast<size_t>(std::max<int64_t>(0, end - begin)));
  for (int64_t j = begin; j < end; ++j) {
    if (std::isnan(values[j])) detail::fail("NaN logit at column " + std::to_string(j));
    cand.emplace_back(values[j], j);
  }
  const auto take = static_cast<size_t>(std::min<int64_t>(k, end - begin > 0 ? end - begin : 0));
  auto larger = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(take), cand.end(),
                    larger);
  std::vector<int32_t> out(take);
  for (size_t i = 0; i < take; ++i) out[i] = static_cast<int32_t>(cand[i].second - begin);
  return out;
}

namespace {
Tensor topk_rows(const Tensor& logits, int64_t k, const std::vector<int64_t>& begin,
                 const std::vector<int64_t>& end) {
  detail::expect_dtype(logits, DType::f32, "logits");
  expect(logits.ndim() == 2, "logits must be 2-D, got " + logits.describe());
  expect(k >= 1, "top-k needs k >= 1, got " + std::to_string(k));
  const Tensor dense = detail::dense(logits);
  const int64_t rows = dense.size(0), width = dense.size(1);
  Tensor out = Tensor::full(DType::i32, {rows, k}, -1);
  for (int64_t i = 0; i < rows; ++i) {
    const auto idx = topk_window(detail::raw<float>(dense) + i * width, begin[i], end[i], k);
    for (size_t j = 0; j < idx.size(); ++j) out.at<int32_t>({i, static_cast<int64_t>(j)}) = idx[j];
  }
  return out;
}
}  // namespace

Tensor topk_prefill(const Tensor& logits, const Tensor& ks, const Tensor& ke, int64_t k) {
  const int64_t M = logits.size(0), N = logits.size(1);
  expect(ks.numel() == M && ke.numel() == M, "cu_seqlen_ks/ke must be [M]");
  std::vector<int64_t> begin(M), end(M);
  for (int64_t i = 0; i < M; ++i) {
    begin[i] = std::clamp<int64_t>(ks.at<int32_t>({i}), 0, N);
    end[i] = std::clamp<int64_t>(ke.at<int32_t>({i}), 0, N);
  }
  return topk_rows(logits, k, begin, end);
}

Tensor topk_decode(const Tensor& logits, const Tensor& seq_lens, int64_t next_n, int64_t k) {
  expect(next_n >= 1, "next_n must be >= 1");
  const int64_t rows = logits.size(0), width = logits.size(1);
  expect(seq_lens.numel() * next_n == rows, "logits must have B*next_n rows");
  std::vector<int64_t> begin(rows, 0), end(rows);
  for (int64_t r = 0; r < rows; ++r)
    end[r] = decode_row_end(seq_lens.at<int32_t>({r / next_n}), next_n, r % next_n, width);
  return topk_rows(logits, k, begin, end);
}

}  // namespace attncheck::ref::indexer
