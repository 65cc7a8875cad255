// Indexer top-k (docs/ops/indexer.md): per row, the k largest logits of its window as request-local
// indices, valid first, -1 after. One workgroup per row: a 4-pass 8-bit radix select finds the
// k-th largest key, then an in-order compaction (block scans, no atomics on the output) writes the
// larger ones and the first ties by column, so the result is deterministic.
#include <string>

#include "indexer_common.h"

namespace {

constexpr int kThreads = 256;

// Monotone map of fp32 to uint32 (larger float, larger key). NaN never reaches it (no NaN logits).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = ac_float_bits(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive scan over the workgroup of a packed pair of counts (low and high 16 bits).
__device__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* scratch, uint32_t* total) {
  const int tid = static_cast<int>(threadIdx.x);
  scratch[tid] = v;
  __syncthreads();
  for (int off = 1; off < kThreads; off *= 2) {
    const uint32_t add = tid >= off ? scratch[tid - off] : 0u;
    __syncthreads();
    scratch[tid] += add;
    __syncthreads();
  }
  *total = scratch[kThreads - 1];
  const uint32_t incl = scratch[tid];
  __syncthreads();
  return incl - v;
}

struct TopkArgs {
  const float* logits;
  int64_t rs, cs;
  int64_t width;
  // prefill windows
  const int32_t* ks;
  int64_t ks_s;
  const int32_t* ke;
  int64_t ke_s;
  // decode windows
  const int32_t* seq_lens;
  int64_t sl_s;
  int next_n;
  int k;
  int32_t* out;
  int64_t out_rs, out_cs;
};

__global__ void __launch_bounds__(kThreads) indexer_topk(TopkArgs a) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t scratch[kThreads];
  __shared__ uint32_t sel_prefix, sel_mask, sel_remaining;
  const int64_t row = blockIdx.x;
  int64_t lo, hi;
  if (a.ks) {
    lo = a.ks[row * a.ks_s];
    hi = a.ke[row * a.ke_s];
  } else {
    lo = 0;
    hi =
        static_cast<int64_t>(a.seq_lens[(row / a.next_n) * a.sl_s]) - a.next_n + row % a.next_n + 1;
  }
  lo = lo < 0 ? 0 : (lo > a.width ? a.width : lo);
  hi = hi < lo ? lo : (hi > a.width ? a.width : hi);
  const int64_t n = hi - lo;
  const float* v = a.logits + row * a.rs + lo * a.cs;
  int32_t* out = a.out + row * a.out_rs;
  const int tid = static_cast<int>(threadIdx.x);
  if (n <= a.k) {  // the whole window
    for (int64_t j = tid; j < a.k; j += kThreads)
      out[j * a.out_cs] = j < n ? static_cast<int32_t>(j) : -1;
    return;
  }
  if (tid == 0) {
    sel_prefix = 0;
    sel_mask = 0;
    sel_remaining = static_cast<uint32_t>(a.k);
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0;  // kThreads == 256 bins
    __syncthreads();
    const uint32_t prefix = sel_prefix, mask = sel_mask;
    for (int64_t j = tid; j < n; j += kThreads) {
      const uint32_t key = order_key(v[j * a.cs]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (tid == 0) {  // the digit holding the remaining-th largest among the candidates
      uint32_t above = 0, rem = sel_remaining;
      int d = 255;
      for (; d > 0; --d) {
        if (above + hist[d] >= rem) break;
        above += hist[d];
      }
      sel_remaining = rem - above;
      sel_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      sel_mask = mask | (0xFFu << shift);
    }
    __syncthreads();
  }
  const uint32_t threshold = sel_prefix;
  const uint32_t ties_needed = sel_remaining;  // equal keys to take, lowest columns first
  const uint32_t greater_total = static_cast<uint32_t>(a.k) - ties_needed;
  uint32_t base_gt = 0, base_eq = 0;
  for (int64_t start = 0; start < n; start += kThreads) {
    const int64_t j = start + tid;
    uint32_t gt = 0, eq = 0;
    if (j < n) {
      const uint32_t key = order_key(v[j * a.cs]);
      gt = key > threshold;
      eq = key == threshold;
    }
    uint32_t total = 0;
    const uint32_t pos = block_exclusive_scan(gt | (eq << 16), scratch, &total);
    if (gt) out[(base_gt + (pos & 0xFFFFu)) * a.out_cs] = static_cast<int32_t>(j);
    const uint32_t e = base_eq + (pos >> 16);
    if (eq && e < ties_needed) out[(greater_total + e) * a.out_cs] = static_cast<int32_t>(j);
    base_gt += total & 0xFFFFu;
    base_eq += total >> 16;
  }
}

void launch_topk(TopkArgs a, int64_t rows) {
  if (rows == 0) return;
  hipLaunchKernelGGL(indexer_topk, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, 0, a);
  idx::check_launch("indexer_topk");
}

void check_common(const ack::KTensor& logits, const ack::KTensor& out, int64_t rows) {
  ack::expect_dtype(logits, "logits", kDLFloat, 32);
  ack::expect_ndim(logits, "logits", 2);
  ack::expect_dtype(out, "topk_indices", kDLInt, 32);
  ack::expect_ndim(out, "topk_indices", 2);
  if (logits.size(0) != rows || out.size(0) != rows)
    throw ack::Refusal("logits and topk_indices must have one row per query");
  if (out.size(1) < 1) throw ack::Refusal("top-k needs k >= 1");
}

void run_topk_prefill(const ack::KParams&, const ack::KArgs& args) {
  const auto& logits = args.get("logits");
  const auto& ks = args.get("cu_seqlen_ks");
  const auto& ke = args.get("cu_seqlen_ke");
  const auto& out = args.get("topk_indices");
  ack::expect_dtype(ks, "cu_seqlen_ks", kDLInt, 32);
  ack::expect_dtype(ke, "cu_seqlen_ke", kDLInt, 32);
  const int64_t rows = ks.size(0);
  check_common(logits, out, rows);
  if (ke.size(0) != rows)
    throw ack::Refusal("cu_seqlen_ks and cu_seqlen_ke must have the same length");
  TopkArgs a{};
  a.logits = logits.ptr<float>();
  a.rs = logits.stride(0);
  a.cs = logits.stride(1);
  a.width = logits.size(1);
  a.ks = ks.ptr<int32_t>();
  a.ks_s = ks.stride(0);
  a.ke = ke.ptr<int32_t>();
  a.ke_s = ke.stride(0);
  a.next_n = 1;
  a.k = static_cast<int>(out.size(1));
  a.out = out.ptr<int32_t>();
  a.out_rs = out.stride(0);
  a.out_cs = out.stride(1);
  launch_topk(a, rows);
}

void run_topk_decode(const ack::KParams& p, const ack::KArgs& args) {
  const auto& logits = args.get("logits");
  const auto& lens = args.get("seq_lens");
  const auto& out = args.get("topk_indices");
  ack::expect_dtype(lens, "seq_lens", kDLInt, 32);
  ack::expect_ndim(lens, "seq_lens", 1);
  const int64_t next_n = p.i("next_n");
  if (next_n < 1) throw ack::Refusal("next_n must be >= 1, got " + std::to_string(next_n));
  const int64_t rows = lens.size(0) * next_n;
  check_common(logits, out, rows);
  TopkArgs a{};
  a.logits = logits.ptr<float>();
  a.rs = logits.stride(0);
  a.cs = logits.stride(1);
  a.width = logits.size(1);
  a.seq_lens = lens.ptr<int32_t>();
  a.sl_s = lens.stride(0);
  a.next_n = static_cast<int>(next_n);
  a.k = static_cast<int>(out.size(1));
  a.out = out.ptr<int32_t>();
  a.out_rs = out.stride(0);
  a.out_cs = out.stride(1);
  launch_topk(a, rows);
}

const ack::KernelRegistrar kRegisterPrefill("indexer_topk_prefill", run_topk_prefill);
const ack::KernelRegistrar kRegisterDecode("indexer_topk_decode", run_topk_decode);

}  // namespace
