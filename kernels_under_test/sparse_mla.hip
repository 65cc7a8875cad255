// sparse_mla: DeepSeek-V3.2-style sparse MLA (docs/ops/sparse_mla.md). Request-local top-k
// positions become flat cache slots exactly as triton_convert_req_index_to_global_index does, each
// row's valid slots are packed into a ragged list (order kept, -1 allowed anywhere in the row), and
// every token attends its own list without a causal mask through the same 16-head-group split-KV
// core as the dense decode (mla_common.h). A token with no valid slot gets out = 0 and lse = -inf.
#include <algorithm>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "mla_common.h"

namespace {

// One workgroup per token: slots of its top-k row, and how many are valid.
__global__ void convert_indices(int32_t* global, int32_t* counts, const int32_t* topk,
                                int64_t topk_row_stride, int64_t topk_col_stride, int k,
                                const int32_t* req_id, const int32_t* table, int64_t table_rows,
                                int64_t table_cols, int64_t max_blocks, int32_t P) {
  __shared__ int32_t valid;
  const int t = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) valid = 0;
  __syncthreads();
  const int32_t r = req_id[t];
  int32_t mine = 0;
  for (int j = static_cast<int>(threadIdx.x); j < k; j += static_cast<int>(blockDim.x)) {
    const int32_t tok = topk[t * topk_row_stride + j * topk_col_stride];
    int32_t slot = -1;
    if (tok >= 0) {
      const int32_t blk = tok / P;
      if (blk < max_blocks) slot = table[r * table_rows + blk * table_cols] * P + tok % P;
    }
    global[static_cast<int64_t>(t) * k + j] = slot;
    mine += slot != -1;
  }
  atomicAdd(&valid, mine);
  __syncthreads();
  if (threadIdx.x == 0) counts[t] = valid;
}

// One workgroup per token: copies the row's valid slots, in order, to packed[indptr[t] ...).
// Slots outside the cache raise `bad` (the host turns it into an error).
__global__ void pack_rows(int32_t* packed, int32_t* bad, const int32_t* global,
                          const int32_t* indptr, int k, int64_t num_slots) {
  extern __shared__ int32_t scan[];  // blockDim.x entries
  const int t = static_cast<int>(blockIdx.x), n = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  int32_t base = indptr[t];
  for (int j0 = 0; j0 < k; j0 += n) {
    const int j = j0 + tid;
    const int32_t slot = j < k ? global[static_cast<int64_t>(t) * k + j] : -1;
    const int32_t flag = slot != -1;
    scan[tid] = flag;
    __syncthreads();
    for (int step = 1; step < n; step *= 2) {  // inclusive prefix sum
      const int32_t add = tid >= step ? scan[tid - step] : 0;
      __syncthreads();
      scan[tid] += add;
      __syncthreads();
    }
    if (flag) {
      packed[base + scan[tid] - 1] = slot;
      if (slot < 0 || slot >= num_slots) atomicExch(bad, slot);  // never 0: slot 0 is valid
    }
    const int32_t chunk_total = scan[n - 1];
    __syncthreads();
    base += chunk_total;
  }
}

std::vector<int32_t> to_host(const void* p, size_t count) {
  std::vector<int32_t> v(count);
  if (count) mla::check(hipMemcpy(v.data(), p, count * 4, hipMemcpyDeviceToHost), "copy");
  return v;
}

void run_sparse_mla(const ack::KParams& p, const ack::KArgs& args) {
  mla::Attention a;
  const int64_t num_slots = mla::validate_common(p, args, a);
  const auto& table = args.get("block_table");
  const auto& req = args.get("req_id_per_token");
  const auto& topk = args.get("topk_indices");
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_dtype(req, "req_id_per_token", kDLInt, 32);
  ack::expect_dtype(topk, "topk_indices", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  ack::expect_ndim(req, "req_id_per_token", 1);
  ack::expect_ndim(topk, "topk_indices", 2);
  const int T = a.num_tokens, k = static_cast<int>(topk.size(1));
  if (req.size(0) != T || topk.size(0) != T)
    throw ack::Refusal("req_id_per_token must be [T] and topk_indices [T, topk] for q [T, ...]");
  if (req.stride(0) != 1) throw ack::Refusal("req_id_per_token must be contiguous");
  if (k < 1) throw ack::Refusal("topk must be >= 1");
  const int32_t P = static_cast<int32_t>(args.get("kv_cache").size(1));
  const auto req_h = to_host(req.data, static_cast<size_t>(T));
  for (int t = 0; t < T; ++t)
    if (req_h[static_cast<size_t>(t)] < 0 || req_h[static_cast<size_t>(t)] >= table.size(0))
      throw ack::Refusal("req_id_per_token[" + std::to_string(t) +
                         "] = " + std::to_string(req_h[static_cast<size_t>(t)]) +
                         " is not a row of block_table");
  if (T == 0) return;

  static mla::Workspace meta;
  meta.reset();
  const size_t global_at = meta.add(4 * static_cast<size_t>(T) * k);
  const size_t counts_at = meta.add(4 * static_cast<size_t>(T));
  const size_t indptr_at = meta.add(4 * (static_cast<size_t>(T) + 1));
  const size_t packed_at = meta.add(4 * static_cast<size_t>(T) * k);
  const size_t bad_at = meta.add(4);
  meta.allocate();
  int32_t* global = meta.at<int32_t>(global_at);
  int32_t* counts = meta.at<int32_t>(counts_at);
  int32_t* indptr = meta.at<int32_t>(indptr_at);
  int32_t* bad = meta.at<int32_t>(bad_at);
  hipLaunchKernelGGL(convert_indices, dim3(T), dim3(256), 0, 0, global, counts, topk.ptr<int32_t>(),
                     topk.stride(0), topk.stride(1), k, req.ptr<int32_t>(), table.ptr<int32_t>(),
                     table.stride(0), table.stride(1), table.size(1), P);
  mla::check(hipGetLastError(), "convert_indices launch");
  // Ragged offsets on the host, as vLLM's builder computes its indptr.
  const auto cnt = to_host(counts, static_cast<size_t>(T));
  std::vector<int32_t> offsets(static_cast<size_t>(T) + 1, 0);
  int max_len = 0;
  for (int t = 0; t < T; ++t) {
    offsets[static_cast<size_t>(t) + 1] =
        offsets[static_cast<size_t>(t)] + cnt[static_cast<size_t>(t)];
    max_len = std::max(max_len, cnt[static_cast<size_t>(t)]);
  }
  mla::check(hipMemcpy(indptr, offsets.data(), offsets.size() * 4, hipMemcpyHostToDevice),
             "copy indptr");
  mla::check(hipMemset(bad, 0, 4), "clear flag");
  hipLaunchKernelGGL(pack_rows, dim3(T), dim3(256), 256 * sizeof(int32_t), 0,
                     meta.at<int32_t>(packed_at), bad, global, indptr, k, num_slots);
  mla::check(hipGetLastError(), "pack_rows launch");
  if (const int32_t b = to_host(bad, 1)[0])
    throw std::runtime_error("sparse_mla: a top-k entry maps to cache slot " + std::to_string(b) +
                             ", outside the cache (" + std::to_string(num_slots) + " slots)");

  a.kv_indices = meta.at<int32_t>(packed_at);
  a.row_begin = indptr;
  a.row_len = counts;
  a.max_row_len = max_len;
  static mla::Workspace work;
  mla::run_attention(a, work);
}

// Bitwise: tokens are independent rows; the split count comes from the token count and the
// largest row (mla_common.h run_attention), which a permutation keeps and a token alone changes;
// each row reduces over its slots in top-k order and block ids only form addresses.
const ack::KernelRegistrar kRegister("sparse_mla", run_sparse_mla,
                                     "batch-order-invariant,page-order-invariant");

}  // namespace
