// mla_decode: absorbed MLA decode over a paged latent cache, built the way the AITER path is
// (docs/ops/mla_decode.md): page-index expansion on the device into the flattened page-size-1 view
// (kernel block size = cache block size), per-token causal limits for qlen 1..8, heads in groups
// of 16 with padding for N < 16, split-KV stage 1 + LSE merge (mla_common.h). ABI in
// docs/ops/mla_decode.md.
#include <algorithm>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "mla_common.h"

namespace {

// page_indices[indptr[r] + t] = block_table[r, t / K] * K + t % K for t < seq_lens[r].
__global__ void expand_page_indices(int32_t* out, const int32_t* table, int64_t row_stride,
                                    int64_t col_stride, const int32_t* seq_lens,
                                    const int32_t* indptr, int32_t K) {
  const int r = static_cast<int>(blockIdx.x);
  const int32_t len = seq_lens[r], base = indptr[r];
  for (int32_t t = static_cast<int32_t>(threadIdx.x); t < len;
       t += static_cast<int32_t>(blockDim.x))
    out[base + t] = table[r * row_stride + (t / K) * col_stride] * K + t % K;
}

// Row lists of the query tokens: token t (local position i of a request with qlen rows and
// kv_len keys) attends the request's first kv_len - qlen + i + 1 slots (the causal rule).
__global__ void causal_rows(int32_t* row_begin, int32_t* row_len, const int32_t* qsl, int B,
                            const int32_t* seq_lens, const int32_t* indptr, int T) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= T) return;
  int lo = 0, hi = B - 1;  // the request b with qsl[b] <= t < qsl[b + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qsl[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int b = lo, qlen = qsl[b + 1] - qsl[b];
#if defined(AC_MUTANT_MLA_QLEN_BROADCAST)
  const int i = 0;  // seed bug (aiter #2720 class): every position gets position 0's key set
#else
  const int i = t - qsl[b];
#endif
  row_begin[t] = indptr[b];
  row_len[t] = seq_lens[b] - qlen + i + 1;
}

std::vector<int32_t> to_host(const ack::KTensor& t, int64_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  if (count) mla::check(hipMemcpy(v.data(), t.data, v.size() * 4, hipMemcpyDeviceToHost), "copy");
  return v;
}

void run_mla_decode(const ack::KParams& p, const ack::KArgs& args) {
  mla::Attention a;
  const int64_t num_slots = mla::validate_common(p, args, a);
  const auto& table = args.get("block_table");
  const auto& lens = args.get("seq_lens");
  const auto& qsl_t = args.get("query_start_loc");
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_dtype(lens, "seq_lens", kDLInt, 32);
  ack::expect_dtype(qsl_t, "query_start_loc", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  if (lens.stride(0) != 1 || qsl_t.stride(0) != 1)
    throw ack::Refusal("seq_lens and query_start_loc must be contiguous");
  const int B = static_cast<int>(lens.size(0)), T = a.num_tokens;
  const int64_t K = args.get("kv_cache").size(1), W = table.size(1);
  if (qsl_t.size(0) != B + 1 || table.size(0) != B)
    throw ack::Refusal("query_start_loc must have B + 1 entries and block_table B rows");

  // Metadata on the host, as the vLLM builder has it: validate, and size the work.
  const auto seq = to_host(lens, B), qsl = to_host(qsl_t, B + 1);
  if (qsl[0] != 0 || qsl[static_cast<size_t>(B)] != T)
    throw ack::Refusal("query_start_loc must run from 0 to the number of query tokens");
  std::vector<int32_t> indptr(static_cast<size_t>(B) + 1, 0);
  int max_len = 0;
  for (int b = 0; b < B; ++b) {
    const int qlen = qsl[b + 1] - qsl[b], L = seq[static_cast<size_t>(b)];
    if (qlen < 0) throw ack::Refusal("query_start_loc is not ascending");
    if (qlen > 0 && L < qlen)
      throw ack::Refusal("request " + std::to_string(b) + ": seq_len " + std::to_string(L) +
                         " is shorter than its " + std::to_string(qlen) + " query tokens");
    if ((L + K - 1) / K > W)
      throw ack::Refusal("request " + std::to_string(b) +
                         " needs more blocks than block_table has");
    indptr[static_cast<size_t>(b) + 1] = indptr[static_cast<size_t>(b)] + L;
    max_len = std::max(max_len, L);
  }
  {  // every block id a request uses must be a block of the cache
    const int64_t extent = B ? (B - 1) * table.stride(0) + (W - 1) * table.stride(1) + 1 : 0;
    const auto tab = to_host(table, extent);
    for (int b = 0; b < B; ++b)
      for (int64_t j = 0; j < (seq[static_cast<size_t>(b)] + K - 1) / K; ++j) {
        const int64_t id = tab[static_cast<size_t>(b * table.stride(0) + j * table.stride(1))];
        if (id < 0 || id * K >= num_slots)
          throw ack::Refusal("block_table[" + std::to_string(b) + "][" + std::to_string(j) +
                             "] = " + std::to_string(id) + " is not a block of the cache");
      }
  }
  if (T == 0) return;
  const int total = indptr[static_cast<size_t>(B)];

  static mla::Workspace meta;  // page indices and row lists (the attention has its own)
  meta.reset();
  const size_t indptr_at = meta.add(4 * (static_cast<size_t>(B) + 1));
  const size_t pages_at = meta.add(4 * static_cast<size_t>(total));
  const size_t begin_at = meta.add(4 * static_cast<size_t>(T));
  const size_t len_at = meta.add(4 * static_cast<size_t>(T));
  meta.allocate();
  int32_t* d_indptr = meta.at<int32_t>(indptr_at);
  int32_t* d_pages = meta.at<int32_t>(pages_at);
  mla::check(hipMemcpy(d_indptr, indptr.data(), indptr.size() * 4, hipMemcpyHostToDevice),
             "copy indptr");
  hipLaunchKernelGGL(expand_page_indices, dim3(B), dim3(256), 0, 0, d_pages, table.ptr<int32_t>(),
                     table.stride(0), table.stride(1), lens.ptr<int32_t>(), d_indptr,
                     static_cast<int32_t>(K));
  mla::check(hipGetLastError(), "expand_page_indices launch");
  hipLaunchKernelGGL(causal_rows, dim3((T + 127) / 128), dim3(128), 0, 0,
                     meta.at<int32_t>(begin_at), meta.at<int32_t>(len_at), qsl_t.ptr<int32_t>(), B,
                     lens.ptr<int32_t>(), d_indptr, T);
  mla::check(hipGetLastError(), "causal_rows launch");

  a.kv_indices = d_pages;
  a.row_begin = meta.at<int32_t>(begin_at);
  a.row_len = meta.at<int32_t>(len_at);
  a.max_row_len = max_len;
  static mla::Workspace work;
  mla::run_attention(a, work);
}

// Bitwise: the split count is chosen from the token count and the longest row
// (mla_common.h run_attention), which a permutation keeps and a batch of one changes; each row
// reduces over its keys in order and block ids only form addresses.
const ack::KernelRegistrar kRegister("mla_decode", run_mla_decode,
                                     "batch-order-invariant,page-order-invariant");

}  // namespace
