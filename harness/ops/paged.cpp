#include "ops/paged.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "core/numeric.h"
#include "core/rng.h"

namespace attncheck {

PagedLayout paged_layout(const std::string& case_id, int64_t batch, int64_t max_ctx, int64_t K,
                         bool strided, int64_t seed, int64_t min_len, int64_t long_from,
                         int64_t column_step) {
  if (batch < 1 || max_ctx < 1 || K < 1)
    throw std::invalid_argument("paged_layout: batch, max_ctx, K must be >= 1");
  if (long_from < 0 || long_from >= batch)
    throw std::invalid_argument("paged_layout: long_from " + std::to_string(long_from) +
                                " is not a request of " + std::to_string(batch));
  if (column_step < 1)
    throw std::invalid_argument("paged_layout: column_step " + std::to_string(column_step) +
                                " is not >= 1");
  Rng rng(case_id, "paged_layout", static_cast<uint64_t>(seed));
  // Edge lengths first, the rest random; the last request is always max_ctx long.
  std::vector<int64_t> edges = {0, 1, K - 1, K, K + 1, 2 * K + 1};
  Tensor seq_lens = Tensor::empty(DType::i32, {batch});
  const int64_t edged = batch - long_from;  // the requests edges and random lengths apply to
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t e = r - long_from;
    int64_t len = r + 1 == batch ? max_ctx
                  : e < 0        ? 1
                  : e < static_cast<int64_t>(edges.size()) && edged > 2
                      ? edges[e]
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
  const int64_t row_stride = (strided ? W + 5 : W) * column_step;
  // The entries between interleaved columns hold the first spare block (ids[needed]): a valid
  // page of random data, so a unit-stride reader gets a wrong answer rather than a fault.
  const double filler = column_step > 1 ? static_cast<double>(ids[needed]) : -7.0;
  Tensor storage = Tensor::full(DType::i32, {batch, row_stride}, filler);
  Tensor table = storage.as_strided({batch, W}, {row_stride, column_step}, 0);
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t j = 0; j < W; ++j) table.at<int32_t>({r, j}) = -7;
  int64_t next = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t nb = (seq_lens.at<int32_t>({r}) + K - 1) / K;
    for (int64_t j = 0; j < nb; ++j) table.at<int32_t>({r, j}) = static_cast<int32_t>(ids[next++]);
  }
  return {seq_lens, table, num_blocks};
}

}  // namespace attncheck

namespace attncheck {

Axis offset_log2_axis(const std::string& help) {
  return {"offset_log2", "offlog", 0, {0, 31, 32}, help, false};
}

int64_t first_block_past(int64_t offset_log2, int64_t block_bytes) {
  if (offset_log2 == 0) return 0;
  if (offset_log2 < 0 || offset_log2 > 40 || block_bytes < 1)
    throw std::invalid_argument("first_block_past: offset_log2 " + std::to_string(offset_log2) +
                                " or block bytes " + std::to_string(block_bytes) + " out of range");
  return (int64_t{1} << offset_log2) / block_bytes + 1;
}

Tensor paged_storage(int64_t first, int64_t pages, int64_t stride, int64_t offset) {
  const int64_t bytes = (first + pages) * stride + offset;
  return first > 0 ? Tensor::sparse(DType::u8, {bytes}, first * stride + offset, pages * stride)
                   : Tensor::empty(DType::u8, {bytes});
}

void shift_block_ids(const PagedLayout& layout, int64_t first) {
  if (first == 0) return;
  const Tensor& t = layout.block_table;
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t j = 0; j < t.size(1); ++j) {
      auto& id = t.at<int32_t>({r, j});
      if (id < 0) continue;
      const int64_t moved = id + first;
      if (moved < 0 || moved > INT32_MAX)
        throw std::invalid_argument("shift_block_ids: block id " + std::to_string(moved) +
                                    " is not an int32");
      id = static_cast<int32_t>(moved);
    }
}

Axis fp8_codes_axis(const std::string& help) {
  return {"fp8_codes", "fp8", "ordinary", {"ordinary", "special"}, help, false};
}

std::optional<uint8_t> fp8_special_code(int64_t k, DType fp8) {
  if (k % 11 == 0) {
    const auto max_code = static_cast<uint8_t>(encode_value(max_finite(fp8), fp8));
    return static_cast<uint8_t>(max_code | ((k / 11) % 2 ? 0x80 : 0x00));
  }
  if (fp8 == DType::e4m3fn && k % 11 == 5) return uint8_t{0x80};  // -0
  return std::nullopt;
}

uint8_t fp8_nan_code(int64_t i, DType fp8) {
  if (fp8 == DType::e4m3fn) return i % 2 ? 0xFF : 0x7F;
  if (fp8 == DType::e4m3fnuz) return 0x80;
  throw std::invalid_argument("fp8_nan_code: " + std::string(dtype_name(fp8)) +
                              " is not an e4m3 format");
}

}  // namespace attncheck
