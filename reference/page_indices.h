// Page-index expansion (docs/abi.md, page_indices): block table -> per-token flat slots
// for the flattened page-size-1 view the MLA decode kernels see.
#pragma once
#include <string>

#include "core/tensor.h"

namespace attncheck::ref {

// block_table [B, W] int32 (any strides), seq_lens [B] int32. Returns int32 [sum(seq_lens)]:
// out[cu[r] + t] = block_table[r, t / K] * K + t % K for t < seq_lens[r]. Entries of the table past
// ceil(seq_lens[r] / K) are never read. A slot past 2^31 - 1 (a block id past 2^31 / K) has no
// int32 value: the expansion is refused (InvalidConfig naming the request and the block), never
// wrapped.
Tensor page_indices(const Tensor& block_table, const Tensor& seq_lens, int64_t kernel_block_size);
// The refusal's text.
std::string page_indices_overflow_message(int64_t request, int64_t block, int64_t K);

// [0, cumsum(seq_lens)] as int32 [B + 1].
Tensor cumulative_lengths(const Tensor& seq_lens);

}  // namespace attncheck::ref
