// fp8 MQA logits of the indexer (docs/ops/indexer.md, Logits). q.k over 128 fp8 products is
// exact in float64 (fp8 values are multiples of 2^-10 below 2^9, so a dot product needs < 53
// bits), so the Eigen product is exact whatever its summation order; only the products with the
// fp32 head weights round.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "eigen_bridge.h"
#include "indexer.h"
#include "indexer_internal.h"

namespace attncheck::ref::indexer {

using detail::expect;

namespace {

// fp8 [rows..., 128] -> row-major double matrix [rows, 128].
MatD fp8_rows(const Tensor& t) {
  const Tensor d = detail::dense(t);
  const auto lut = detail::fp8_table(t.dtype());
  const int64_t rows = d.numel() / kHeadDim;
  MatD m(rows, kHeadDim);
  const auto* src = detail::raw<uint8_t>(d);
  for (int64_t i = 0; i < rows * kHeadDim; ++i) m.data()[i] = lut[src[i]];
  return m;
}

MatD f32_matrix(const Tensor& t, int64_t rows, int64_t cols) {
  const Tensor d = detail::dense(t);
  const auto* src = detail::raw<float>(d);
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = static_cast<double>(src[i]);
  return m;
}

// out[j] = (sum_h w[h] * relu(S[h, j])) * scale[j] for the H rows of S starting at row0.
void head_sum(const MatD& relu_scores, int64_t row0, int64_t H, const MatD& w, int64_t w_row,
              const Eigen::VectorXd& scale, Eigen::RowVectorXd& out) {
  out.noalias() = w.row(w_row) * relu_scores.middleRows(row0, H);
  out = out.cwiseProduct(scale.transpose());
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Score blocks are kept below this many doubles (the product is formed a query block at a time).
constexpr int64_t kScoreBudget = int64_t{1} << 22;

}  // namespace

Tensor mqa_logits(const Tensor& q, const Tensor& k, const Tensor& k_scale, const Tensor& weights,
                  const Tensor& ks, const Tensor& ke) {
  detail::expect_fp8(q, "q");
  expect(k.dtype() == q.dtype(), "k_fp8 and q must have the same fp8 format");
  expect(q.ndim() == 3 && q.size(2) == kHeadDim, "q must be [M, H, 128], got " + q.describe());
  expect(k.ndim() == 2 && k.size(1) == kHeadDim, "k_fp8 must be [N, 128], got " + k.describe());
  const int64_t M = q.size(0), H = q.size(1), N = k.size(0);
  detail::expect_dtype(k_scale, DType::f32, "k_scale");
  detail::expect_dtype(weights, DType::f32, "weights");
  detail::expect_dtype(ks, DType::i32, "cu_seqlen_ks");
  detail::expect_dtype(ke, DType::i32, "cu_seqlen_ke");
  expect(k_scale.numel() == N && weights.ndim() == 2 && weights.size(0) == M &&
             weights.size(1) == H && ks.numel() == M && ke.numel() == M,
         "k_scale [N], weights [M, H], ks/ke [M] expected");
  const MatD Q = fp8_rows(q), K = fp8_rows(k), W = f32_matrix(weights, M, H);
  Eigen::VectorXd scale(N);
  for (int64_t j = 0; j < N; ++j) scale[j] = k_scale.at<float>({j});
  std::vector<int64_t> lo(M), hi(M);
  for (int64_t i = 0; i < M; ++i) {
    lo[i] = std::clamp<int64_t>(ks.at<int32_t>({i}), 0, N);
    hi[i] = std::clamp<int64_t>(ke.at<int32_t>({i}), 0, N);
  }
  Tensor out = Tensor::full(DType::f32, {M, N}, -std::numeric_limits<double>::infinity());
  auto* dst = reinterpret_cast<float*>(out.data());
  const int64_t block = std::max<int64_t>(1, kScoreBudget / std::max<int64_t>(1, H * N));
  for (int64_t i0 = 0; i0 < M; i0 += block) {
    const int64_t i1 = std::min(M, i0 + block);
    int64_t c0 = N, c1 = 0;  // union of the windows of this query block
    for (int64_t i = i0; i < i1; ++i) {
      if (lo[i] >= hi[i]) continue;
      c0 = std::min(c0, lo[i]);
      c1 = std::max(c1, hi[i]);
    }
    if (c0 >= c1) continue;
    MatD S = Q.middleRows(i0 * H, (i1 - i0) * H) * K.middleRows(c0, c1 - c0).transpose();
    S = S.cwiseMax(0.0);
    const Eigen::VectorXd sc = scale.segment(c0, c1 - c0);
#pragma omp parallel for
    for (int64_t i = i0; i < i1; ++i) {
      if (lo[i] >= hi[i]) continue;
      Eigen::RowVectorXd row;
      head_sum(S, (i - i0) * H, H, W, i, sc, row);
      for (int64_t j = lo[i]; j < hi[i]; ++j) dst[i * N + j] = static_cast<float>(row[j - c0]);
    }
  }
  return out;
}

int64_t decode_row_end(int64_t context_len, int64_t next_n, int64_t n, int64_t width) {
  return std::clamp<int64_t>(context_len - next_n + n + 1, 0, width);
}

Tensor paged_mqa_logits(const Tensor& q, const CacheView& c, const Tensor& weights,
                        const Tensor& context_lens, const Tensor& block_table,
                        int64_t max_model_len) {
  detail::expect_fp8(q, "q");
  expect(q.ndim() == 4 && q.size(3) == kHeadDim,
         "q must be [B, next_n, H, 128], got " + q.describe());
  const int64_t B = q.size(0), NN = q.size(1), H = q.size(2), BS = c.block_size;
  detail::expect_dtype(weights, DType::f32, "weights");
  detail::expect_dtype(context_lens, DType::i32, "context_lens");
  detail::expect_dtype(block_table, DType::i32, "block_table");
  expect(weights.ndim() == 2 && weights.size(0) == B * NN && weights.size(1) == H,
         "weights must be [B*next_n, H]");
  expect(context_lens.numel() == B && block_table.ndim() == 2 && block_table.size(0) == B,
         "context_lens [B] and block_table [B, W] expected");
  expect(c.layout == CacheLayout::normal || BS % kTile == 0,
         "a SHUFFLE page needs a block size that is a multiple of 16");
  const MatD Q = fp8_rows(q), W = f32_matrix(weights, B * NN, H);
  const auto lut = detail::fp8_table(q.dtype());
  Tensor out =
      Tensor::full(DType::f32, {B * NN, max_model_len}, -std::numeric_limits<double>::infinity());
  auto* dst = reinterpret_cast<float*>(out.data());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = context_lens.at<int32_t>({b});
    expect(L >= 0, "negative context length");
    const int64_t len = decode_row_end(L, NN, NN - 1, max_model_len);  // the last row sees most
    if (len == 0) continue;
    expect((len + BS - 1) / BS <= block_table.size(1),
           "request " + std::to_string(b) + " needs more blocks than the table has");
    MatD K(len, kHeadDim);
    Eigen::VectorXd scale(len);
    const Tensor table_row = detail::dense(block_table.select(0, b));
    const auto* table = detail::raw<int32_t>(table_row);
    // Validated here: nothing may throw inside the parallel loop (read_token throws for a page
    // a sparse cache does not hold on the host).
    for (int64_t j = 0; j < (len + BS - 1) / BS; ++j) {
      if (table[j] < 0 || table[j] >= c.cache.size(0))
        detail::fail("request " + std::to_string(b) + " maps to block " + std::to_string(table[j]) +
                     " outside the cache");
      uint8_t bytes[kHeadDim];
      float s = 0;
      read_token(c, table[j], 0, bytes, &s);
    }
#pragma omp parallel for
    for (int64_t p = 0; p < len; ++p) {
      uint8_t bytes[kHeadDim];
      float s = 0;
      read_token(c, table[p / BS], p % BS, bytes, &s);
      for (int64_t d = 0; d < kHeadDim; ++d) K(p, d) = lut[bytes[d]];
      scale[p] = s;
    }
    MatD S = Q.middleRows(b * NN * H, NN * H) * K.transpose();
    S = S.cwiseMax(0.0);
    Eigen::RowVectorXd row;
    for (int64_t n = 0; n < NN; ++n) {
      const int64_t r = b * NN + n, end = decode_row_end(L, NN, n, max_model_len);
      head_sum(S, n * H, H, W, r, scale, row);
      for (int64_t p = 0; p < end; ++p) dst[r * max_model_len + p] = static_cast<float>(row[p]);
    }
  }
  return out;
}

}  // namespace attncheck::ref::indexer
