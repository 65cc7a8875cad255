#include "page_indices.h"

#include <climits>
#include <stdexcept>
#include <string>

#include "core/case.h"

namespace attncheck::ref {

Tensor cumulative_lengths(const Tensor& seq_lens) {
  const int64_t B = seq_lens.size(0);
  Tensor cu = Tensor::empty(DType::i32, {B + 1});
  int64_t acc = 0;
  cu.at<int32_t>({0}) = 0;
  for (int64_t r = 0; r < B; ++r) {
    acc += seq_lens.at<int32_t>({r});
    cu.at<int32_t>({r + 1}) = static_cast<int32_t>(acc);
  }
  return cu;
}

std::string page_indices_overflow_message(int64_t request, int64_t block, int64_t K) {
  return "request " + std::to_string(request) + ": block id " + std::to_string(block) + " * " +
         std::to_string(K) + " is past the int32 slot range";
}

Tensor page_indices(const Tensor& block_table, const Tensor& seq_lens, int64_t K) {
  if (K < 1)
    throw std::invalid_argument("kernel block size must be >= 1, got " + std::to_string(K));
  const int64_t B = seq_lens.size(0);
  if (block_table.size(0) != B)
    throw std::invalid_argument("block_table rows != number of requests");
  const Tensor cu = cumulative_lengths(seq_lens);
  Tensor out = Tensor::empty(DType::i32, {cu.at<int32_t>({B})});
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = seq_lens.at<int32_t>({r});
    if (len < 0)
      throw std::invalid_argument("negative sequence length for request " + std::to_string(r));
    if ((len + K - 1) / K > block_table.size(1))
      throw std::invalid_argument("request " + std::to_string(r) +
                                  " needs more blocks than the table has");
    for (int64_t t = 0; t < len; ++t) {
      const int64_t blk = block_table.at<int32_t>({r, t / K});
      const int64_t slot = blk * K + t % K;
      if (slot > INT32_MAX) throw InvalidConfig(page_indices_overflow_message(r, blk, K));
      out.at<int32_t>({cu.at<int32_t>({r}) + t}) = static_cast<int32_t>(slot);
    }
  }
  return out;
}

}  // namespace attncheck::ref
