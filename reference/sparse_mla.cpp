#include "sparse_mla.h"

#include <stdexcept>
#include <string>

#include "eigen_bridge.h"

namespace attncheck::ref {

Tensor sparse_mla_global_indices(const Tensor& topk_local, const Tensor& req_id_per_token,
                                 const Tensor& block_table, int64_t block_size) {
  if (block_size < 1) throw std::invalid_argument("block size must be >= 1");
  if (topk_local.ndim() != 2 || req_id_per_token.ndim() != 1 ||
      req_id_per_token.size(0) != topk_local.size(0))
    throw std::invalid_argument("topk indices [T, topk] and req_id_per_token [T] must agree");
  const int64_t T = topk_local.size(0), K = topk_local.size(1), W = block_table.size(1);
  Tensor out = Tensor::empty(DType::i32, {T, K});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = req_id_per_token.at<int32_t>({t});
    if (r < 0 || r >= block_table.size(0))
      throw std::invalid_argument("token " + std::to_string(t) + " names request " +
                                  std::to_string(r) + " outside the block table");
    for (int64_t j = 0; j < K; ++j) {
      const int64_t tok = topk_local.at<int32_t>({t, j});
      int64_t slot = -1;
      if (tok >= 0) {
        const int64_t blk = tok / block_size;
        if (blk < W) slot = block_table.at<int32_t>({r, blk}) * block_size + tok % block_size;
      }
      out.at<int32_t>({t, j}) = static_cast<int32_t>(slot);
    }
  }
  return out;
}

RaggedIndices sparse_mla_pack(const Tensor& global) {
  const int64_t T = global.size(0), K = global.size(1);
  std::vector<int32_t> packed;
  Tensor indptr = Tensor::empty(DType::i32, {T + 1});
  indptr.at<int32_t>({0}) = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = global.at<int32_t>({t, j});
      if (s != -1) packed.push_back(s);
    }
    indptr.at<int32_t>({t + 1}) = static_cast<int32_t>(packed.size());
  }
  Tensor indices = Tensor::empty(DType::i32, {static_cast<int64_t>(packed.size())});
  for (size_t i = 0; i < packed.size(); ++i)
    indices.at<int32_t>({static_cast<int64_t>(i)}) = packed[i];
  return {indptr, indices};
}

MlaResult sparse_mla(const Tensor& q, const LatentCache& kv, const RaggedIndices& idx, double scale,
                     int64_t lv) {
  if (q.ndim() != 3) throw std::invalid_argument("q must be [T, N, Lk], got " + q.describe());
  const int64_t T = q.size(0), N = q.size(1), Lk = q.size(2);
  mla_check_num_heads(N);
  if (kv.cache.ndim() != 3 || kv.cache.size(2) != Lk)
    throw std::invalid_argument("cache must be [num_blocks, P, " + std::to_string(Lk) + "], got " +
                                kv.cache.describe());
  if (lv < 1 || lv > Lk) throw std::invalid_argument("Lv must be in [1, Lk]");
  if (idx.indptr.size(0) != T + 1) throw std::invalid_argument("indptr must have T + 1 entries");
  const int64_t num_slots = kv.cache.size(0) * kv.cache.size(1);
  for (int64_t i = 0; i < idx.indices.size(0); ++i) {
    const int64_t s = idx.indices.at<int32_t>({i});
    if (s < 0 || s >= num_slots)
      throw std::invalid_argument("packed index " + std::to_string(i) + " = " + std::to_string(s) +
                                  " is not a cache slot");
  }
  std::vector<int64_t> all(static_cast<size_t>(idx.indices.size(0)));
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = idx.indices.at<int32_t>({static_cast<int64_t>(i)});
  check_rows_held(kv.cache, all);  // before the parallel loop, which may not throw
  const Tensor qp = mla_pad_q(q);
  const int64_t Np = qp.size(1);
  Tensor out_p = Tensor::zeros(DType::f64, {T, Np, lv});
  Tensor lse_p = Tensor::zeros(DType::f64, {T, Np});
  auto token = [&](int64_t t) {
    const int64_t begin = idx.indptr.at<int32_t>({t}), end = idx.indptr.at<int32_t>({t + 1});
    std::vector<int64_t> slots;
    for (int64_t i = begin; i < end; ++i) slots.push_back(idx.indices.at<int32_t>({i}));
    const Tensor keys = gather_latent_rows(kv, slots);
    const std::vector<int64_t> visible(static_cast<size_t>(Np), end - begin);
    attend_rows(query_rows(qp, t), keys, visible, scale, lv, out_p.select(0, t),
                lse_p.select(0, t));
  };
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < T; ++t) token(t);
  return {mla_unpad_o(out_p, N).contiguous(),
          mla_unpad_o(lse_p.unsqueeze(2), N).select(2, 0).contiguous()};
}

}  // namespace attncheck::ref
