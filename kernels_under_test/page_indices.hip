// page_indices: one workgroup per request, lanes stride over the request's tokens (the Triton
// original loops over chunks of 1024 lanes with a t < seq_len mask). Reads the block table through
// its real row stride and never past the request's last block. A slot past 2^31 - 1 has no int32
// value: the host checks the block ids in use first and refuses (docs/abi.md), where the Triton
// original wraps.
#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

__global__ void expand_page_indices(int32_t* out, const int32_t* block_table,
                                    int64_t table_row_stride, int64_t table_col_stride,
                                    const int32_t* seq_lens, const int32_t* cu, int32_t K) {
  const int r = blockIdx.x;
  const int32_t len = seq_lens[r];
  const int32_t base = cu[r];
  for (int32_t t = threadIdx.x; t < len; t += blockDim.x) {
    const int32_t blk = block_table[r * table_row_stride + (t / K) * table_col_stride];
    out[base + t] = blk * K + t % K;
  }
}

std::vector<int32_t> copy_to_host(const int32_t* src, int64_t count, const char* what) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  if (count > 0 && hipMemcpy(v.data(), src, v.size() * 4, hipMemcpyDeviceToHost) != hipSuccess)
    throw std::runtime_error(std::string("copying ") + what + " to the host failed");
  return v;
}

// Refuses when a block id a request uses, times K, plus its last slot is past int32.
void check_slots_fit_int32(const ack::KTensor& table, const ack::KTensor& lens, int64_t K) {
  const int64_t B = lens.size(0), W = table.size(1);
  if (B == 0 || W == 0) return;
  const auto seq = copy_to_host(lens.ptr<int32_t>(), B, "seq_lens");
  const int64_t extent = (B - 1) * table.stride(0) + (W - 1) * table.stride(1) + 1;
  const auto tab = copy_to_host(table.ptr<int32_t>(), extent, "block_table");
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = seq[static_cast<size_t>(r)], blocks = (len + K - 1) / K;
    for (int64_t j = 0; j < blocks && j < W; ++j) {
      const int64_t blk = tab[static_cast<size_t>(r * table.stride(0) + j * table.stride(1))];
      const int64_t last = blk * K + (j + 1 < blocks ? K - 1 : (len - 1) % K);
#if !defined(AC_MUTANT_PAGE_INDICES_UNCHECKED_INT32)
      if (last > INT32_MAX)
        throw ack::Refusal("request " + std::to_string(r) + ": block id " + std::to_string(blk) +
                           " * " + std::to_string(K) + " is past the int32 slot range");
#else
      (void)last;  // seed bug: slots computed in int32 and wrapped, as the Triton original does
#endif
    }
  }
}

void run_page_indices(const ack::KParams& p, const ack::KArgs& a) {
  const auto& table = a.get("block_table");
  const auto& lens = a.get("seq_lens");
  const auto& cu = a.get("cu_seq_lens");
  const auto& out = a.get("page_indices");
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_dtype(lens, "seq_lens", kDLInt, 32);
  ack::expect_dtype(cu, "cu_seq_lens", kDLInt, 32);
  ack::expect_dtype(out, "page_indices", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  const int64_t K = p.i("kernel_block_size");
  if (K < 1) throw ack::Refusal("kernel_block_size must be >= 1, got " + std::to_string(K));
  if (lens.stride(0) != 1 || cu.stride(0) != 1 || out.stride(0) != 1)
    throw ack::Refusal("seq_lens, cu_seq_lens and page_indices must be contiguous");
  const int B = static_cast<int>(lens.size(0));
  if (B == 0) return;
  check_slots_fit_int32(table, lens, K);
  hipLaunchKernelGGL(expand_page_indices, dim3(B), dim3(256), 0, 0, out.ptr<int32_t>(),
                     table.ptr<int32_t>(), table.stride(0), table.stride(1), lens.ptr<int32_t>(),
                     cu.ptr<int32_t>(), static_cast<int32_t>(K));
}

const ack::KernelRegistrar kRegister("page_indices", run_page_indices);

}  // namespace
