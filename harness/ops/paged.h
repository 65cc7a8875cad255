// Paged-cache metadata shared by the paged ops (MLA decode, decode attention, indexer, KV gather):
// ragged sequence lengths with block-edge cases, and block tables of permuted, non-contiguous ids.
#pragma once
#include <string>

#include "core/tensor.h"

namespace attncheck {

struct PagedLayout {
  Tensor seq_lens;     // [B] int32: includes 0, 1, K-1, K, K+1 and max_ctx where the batch allows
  Tensor block_table;  // [B, W] int32 view; W = ceil(max_ctx / K) + 1; unused entries hold -7
                       // (a kernel that reads them gets an invalid block id)
  int64_t num_blocks;  // size of the block pool; ids are a random permutation of [0, num_blocks)
};

// strided_table: the table is a view into rows of width W + 5 (row stride != W).
PagedLayout paged_layout(const std::string& case_id, int64_t batch, int64_t max_ctx,
                         int64_t block_size, bool strided_table, int64_t seed, int64_t min_len = 0);

}  // namespace attncheck
