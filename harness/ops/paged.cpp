#include "ops/paged.h"

#include <algorithm>
#include <stdexcept>

#include "core/rng.h"

namespace attncheck {

PagedLayout paged_layout(const std::string& case_id, int64_t batch, int64_t max_ctx, int64_t K,
                         bool strided, int64_t seed, int64_t min_len) {
  if (batch < 1 || max_ctx < 1 || K < 1)
    throw std::invalid_argument("paged_layout: batch, max_ctx, K must be >= 1");
  Rng rng(case_id, "paged_layout", static_cast<uint64_t>(seed));
  // Edge lengths first, the rest random; the last request is always max_ctx long.
  std::vector<int64_t> edges = {0, 1, K - 1, K, K + 1, 2 * K + 1};
  Tensor seq_lens = Tensor::empty(DType::i32, {batch});
  for (int64_t r = 0; r < batch; ++r) {
    int64_t len = r + 1 == batch ? max_ctx
                  : r < static_cast<int64_t>(edges.size()) && batch > 2
                      ? edges[r]
                      : rng.uniform_int(1, max_ctx);
    len = std::clamp<int64_t>(len, min_len, max_ctx);
    seq_lens.at<int32_t>({r}) = static_cast<int32_t>(len);
  }
  const int64_t W = (max_ctx + K - 1) / K + 1;
  int64_t needed = 0;
  for (int64_t r = 0; r < batch; ++r) needed += (seq_lens.at<int32_t>({r}) + K - 1) / K;
  const int64_t num_blocks = needed + 3;  // spare blocks nobody owns
  Rng prng(case_id, "block_ids", static_cast<uint64_t>(seed));
  const auto ids = permutation(num_blocks, prng);
  const int64_t row_stride = strided ? W + 5 : W;
  Tensor storage = Tensor::full(DType::i32, {batch, row_stride}, -7);
  Tensor table = storage.slice(1, 0, W);
  int64_t next = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t nb = (seq_lens.at<int32_t>({r}) + K - 1) / K;
    for (int64_t j = 0; j < nb; ++j) table.at<int32_t>({r, j}) = static_cast<int32_t>(ids[next++]);
  }
  return {seq_lens, table, num_blocks};
}

}  // namespace attncheck
