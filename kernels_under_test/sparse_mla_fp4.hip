// sparse_mla_fp4: sparse MLA decode reading DeepSeek-V4.1's FP4 compressed-KV records directly
// (docs/ops/sparse_mla_fp4.md): 512 e2m1 values per token, element 2i in the low nibble of byte i,
// with 32 e4m3fn scales of 16 elements (nvfp4, 288 bytes) or 16 e8m0 scales of 32 (mxfp4, 272
// bytes); a page of P tokens holds the P data rows, then the P scale rows.
//
// One workgroup per (token, head). Top-k entries become cache slots as in sparse_mla.hip
// (triton_convert_req_index_to_global_index); each warp scores one key at a time (every lane
// decodes a contiguous slice of the record, products summed in fp32); softmax over the scores in
// shared memory; then each thread decodes its output dims of every key and accumulates p * v in
// fp32. A token with no valid entry gets out = 0 and lse = -inf. No denormal flushing: the e8m0
// byte 0 is 2^-127, an fp32 subnormal.
#include <cmath>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "mla_common.h"

namespace {

constexpr int kDims = 512;
constexpr int kDataBytes = kDims / 2;
constexpr int kThreads = 256;
constexpr int kMaxTopk = 2048;

struct Record {
  int block;  // elements per scale: 16 (nvfp4) or 32 (mxfp4)
  bool mxfp4;
  int scale_bytes;  // per token: 32 or 16
  AC_HOST_DEVICE int bytes() const { return kDataBytes + scale_bytes; }
};

AC_DEVICE float e2m1_value(uint32_t code) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = magnitude[code & 7u];
  return (code & 8u) ? -v : v;
}

// e8m0: 2^(byte - 127), byte 0 the fp32 subnormal 2^-127, 0xFF NaN.
AC_DEVICE float e8m0_value(uint32_t byte) {
  if (byte == 0xFFu) return ac_bits_to_float(0x7FC00000u);
#if defined(AC_MUTANT_FP4REC_E8M0_ZERO_BYTE)
  return ac_bits_to_float(byte << 23);  // seed: byte 0 becomes 0
#else
  return ac_bits_to_float(byte == 0 ? 0x00400000u : byte << 23);
#endif
}

AC_DEVICE float e4m3fn_value(uint32_t byte) {
#if defined(AC_MUTANT_FP4REC_E4M3_SUBNORMAL)
  if ((byte & 0x78u) == 0 && (byte & 0x7Fu) != 0)  // seed: exponent field 0 read as normal
    return ((byte & 0x80u) ? -1.0f : 1.0f) * ldexpf(static_cast<float>((byte & 7u) | 8u), -9);
#endif
  return ac_fp8_to_float(static_cast<uint8_t>(byte), AcFp8::e4m3fn);
}

// Byte offsets in a page of P tokens.
AC_DEVICE int64_t data_at(int64_t P, int64_t t, int64_t c, const Record& r) {
#if defined(AC_MUTANT_FP4REC_INTERLEAVED_RECORD)
  (void)P;
  return t * r.bytes() + c;  // seed: each token's record read as one contiguous run
#else
  (void)r;
  (void)P;
  return t * kDataBytes + c;
#endif
}
AC_DEVICE int64_t scale_at(int64_t P, int64_t t, int64_t b, const Record& r) {
#if defined(AC_MUTANT_FP4REC_SCALE_WRONG_BLOCK)
  b = (b + 1) % r.scale_bytes;  // seed: the neighbouring block's scale
#endif
#if defined(AC_MUTANT_FP4REC_INTERLEAVED_RECORD)
  (void)P;
  return t * r.bytes() + kDataBytes + b;
#else
  return P * kDataBytes + t * r.scale_bytes + b;
#endif
}

// Element d of token t's record in `page`.
AC_DEVICE float element(const uint8_t* page, int64_t P, int64_t t, int d, const Record& r) {
  const uint32_t byte = page[data_at(P, t, d / 2, r)];
#if defined(AC_MUTANT_FP4REC_NIBBLE_SWAP)
  const uint32_t code = (d % 2) ? byte & 0xFu : byte >> 4;  // seed: element 2i from the high nibble
#else
  const uint32_t code = (d % 2) ? byte >> 4 : byte & 0xFu;
#endif
  const uint32_t s = page[scale_at(P, t, d / r.block, r)];
  return e2m1_value(code) * (r.mxfp4 ? e8m0_value(s) : e4m3fn_value(s));
}

struct Args {
  const uint16_t* q;
  int64_t q_ts, q_hs;
  bool bf16;
  const uint8_t* kv;
  int64_t page_stride, P, num_slots;
  Record rec;
  const int32_t* table;
  int64_t table_rs, table_cs, table_cols;
  const int32_t* req;
  const int32_t* topk;
  int64_t topk_rs, topk_cs;
  int k, heads;
  float scale;
  uint16_t* out;
  int64_t out_ts, out_hs;
  float* lse;
  int64_t lse_ts, lse_hs;
  int32_t* bad;  // a slot outside the cache, or 0
};

AC_DEVICE float load_half(const uint16_t* p, bool bf16) {
  return bf16 ? ac_bf16_to_float(*p) : ac_f16_to_float(*p);
}

// The first byte of the page holding `slot`: 64-bit, since a record cache may pass 2^32 bytes.
AC_DEVICE const uint8_t* page_of(const Args& a, int64_t slot) {
#if defined(AC_MUTANT_FP4REC_PAGE_OFFSET_INT32)
  // Seed bug: page * page_stride in int32, which wraps once the cache passes 2^31 bytes.
  return a.kv + static_cast<int32_t>(static_cast<uint32_t>(slot / a.P) *
                                     static_cast<uint32_t>(a.page_stride));
#else
  return a.kv + (slot / a.P) * a.page_stride;
#endif
}

__global__ void sparse_mla_fp4_kernel(Args a) {
  __shared__ int64_t slots[kMaxTopk];
  __shared__ float scores[kMaxTopk];
  __shared__ float q[kDims];
  __shared__ float reduce[kThreads];
  __shared__ int count;
  const int t = static_cast<int>(blockIdx.x) / a.heads, h = static_cast<int>(blockIdx.x) % a.heads;
  const int tid = static_cast<int>(threadIdx.x);
  for (int d = tid; d < kDims; d += kThreads) {
#if defined(AC_MUTANT_FP4REC_Q_OFFSET_INT32)
    // Seed bug: q's row offset in int32, which wraps once q's token stride passes 2^31.
    const uint32_t at = static_cast<uint32_t>(t) * static_cast<uint32_t>(a.q_ts) +
                        static_cast<uint32_t>(h * a.q_hs + d);
    q[d] = load_half(a.q + static_cast<int32_t>(at), a.bf16);
#else
    q[d] = load_half(a.q + t * a.q_ts + h * a.q_hs + d, a.bf16);
#endif
  }
  if (tid == 0) {  // converted slots of the row, valid ones kept in row order
    int n = 0;
    const int32_t r = a.req[t];
    for (int j = 0; j < a.k; ++j) {
      const int32_t tok = a.topk[t * a.topk_rs + j * a.topk_cs];
      if (tok < 0 || tok / a.P >= a.table_cols) continue;
      const int64_t slot =
          static_cast<int64_t>(a.table[r * a.table_rs + (tok / a.P) * a.table_cs]) * a.P +
          tok % a.P;
      if (slot < 0 || slot >= a.num_slots) {
        atomicExch(a.bad, static_cast<int32_t>(slot == 0 ? -1 : slot));
        continue;
      }
      slots[n++] = slot;
    }
    count = n;
  }
  __syncthreads();
  const int n = count;
  // Scores: one key per warp, each lane a contiguous slice of the 512 dims.
  const int ws = ac_warp_size(), lane = ac_lane(), warp = tid / ws, warps = kThreads / ws;
  const int per_lane = kDims / ws;
  for (int j = warp; j < n; j += warps) {
    const int64_t slot = slots[j];
    const uint8_t* page = page_of(a, slot);
    float dot = 0.0f;
    for (int d = lane * per_lane; d < (lane + 1) * per_lane; ++d)
      dot += q[d] * element(page, a.P, slot % a.P, d, a.rec);
    dot = ac_warp_sum(dot);
    if (lane == 0) scores[j] = dot * a.scale;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = tid; j < n; j += kThreads) m = fmaxf(m, scores[j]);
  reduce[tid] = m;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (tid < s) reduce[tid] = fmaxf(reduce[tid], reduce[tid + s]);
    __syncthreads();
  }
  m = reduce[0];
  __syncthreads();
  float sum = 0.0f;
  for (int j = tid; j < n; j += kThreads) sum += expf(scores[j] - m);
  reduce[tid] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (tid < s) reduce[tid] += reduce[tid + s];
    __syncthreads();
  }
  sum = reduce[0];
  uint16_t* o = a.out + t * a.out_ts + h * a.out_hs;
  for (int d = tid; d < kDims; d += kThreads) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const int64_t slot = slots[j];
      const uint8_t* page = page_of(a, slot);
      acc += expf(scores[j] - m) * element(page, a.P, slot % a.P, d, a.rec);
    }
    const float v = n > 0 ? acc / sum : 0.0f;
    o[d] = a.bf16 ? ac_float_to_bf16(v) : ac_float_to_f16(v);
  }
  if (tid == 0) a.lse[t * a.lse_ts + h * a.lse_hs] = n > 0 ? m + logf(sum) : -INFINITY;
}

void run_sparse_mla_fp4(const ack::KParams& p, const ack::KArgs& args) {
  const auto& q = args.get("q");
  const auto& kv = args.get("kv_cache");
  const auto& table = args.get("block_table");
  const auto& req = args.get("req_id_per_token");
  const auto& topk = args.get("topk_indices");
  const auto& out = args.get("out");
  const auto& lse = args.get("lse");
  ack::expect_ndim(q, "q", 3);
  ack::expect_ndim(kv, "kv_cache", 3);
  ack::expect_ndim(table, "block_table", 2);
  ack::expect_ndim(req, "req_id_per_token", 1);
  ack::expect_ndim(topk, "topk_indices", 2);
  ack::expect_ndim(out, "out", 3);
  ack::expect_ndim(lse, "lse", 2);
  ack::expect_dtype(kv, "kv_cache", kDLUInt, 8);
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_dtype(req, "req_id_per_token", kDLInt, 32);
  ack::expect_dtype(topk, "topk_indices", kDLInt, 32);
  ack::expect_dtype(lse, "lse", kDLFloat, 32);
  ack::expect_contiguous_last(q, "q");
  ack::expect_contiguous_last(out, "out");
  const bool bf16 = mla::mma_type(q, "q") == AcMmaIn::bf16;
  if (out.dtype.code != q.dtype.code || out.dtype.bits != 16)
    throw ack::Refusal("tensor 'out' must have q's dtype");
  const int64_t T = q.size(0), N = q.size(1);
  if (!mla::valid_num_heads(N)) throw ack::Refusal(mla::num_heads_message(N));
  if (q.size(2) != kDims || out.size(0) != T || out.size(1) != N || out.size(2) != kDims ||
      lse.size(0) != T || lse.size(1) != N)
    throw ack::Refusal("q and out must be [T, N, 512] and lse [T, N]");
  Record rec{};
  const std::string& format = p.s("kv_format");
  if (format == "nvfp4")
    rec = {16, false, 32};
  else if (format == "mxfp4")
    rec = {32, true, 16};
  else
    throw ack::Refusal("kv_format must be nvfp4 or mxfp4, got '" + format + "'");
  if (kv.size(2) != rec.bytes())
    throw ack::Refusal("kv_cache rows must be " + std::to_string(rec.bytes()) + "-byte " + format +
                       " records, got " + std::to_string(kv.size(2)));
  const int64_t P = kv.size(1);
  if (p.i("kernel_block_size") != P)
    throw ack::Refusal("kernel_block_size differs from the cache block size");
  if (kv.stride(2) != 1 || kv.stride(1) != rec.bytes() ||
      (kv.size(0) > 1 && kv.stride(0) < P * rec.bytes()))
    throw ack::Refusal("kv_cache pages must be contiguous runs of P records");
  const int k = static_cast<int>(topk.size(1));
  if (req.size(0) != T || topk.size(0) != T)
    throw ack::Refusal("req_id_per_token must be [T] and topk_indices [T, topk]");
  if (req.stride(0) != 1) throw ack::Refusal("req_id_per_token must be contiguous");
  if (k < 1 || k > kMaxTopk) throw ack::Refusal("topk must be in [1, 2048]");
  std::vector<int32_t> req_h(static_cast<size_t>(T));
  if (T)
    mla::check(hipMemcpy(req_h.data(), req.data, static_cast<size_t>(T) * 4, hipMemcpyDeviceToHost),
               "copy req_id_per_token");
  for (int64_t t = 0; t < T; ++t)
    if (req_h[static_cast<size_t>(t)] < 0 || req_h[static_cast<size_t>(t)] >= table.size(0))
      throw ack::Refusal("req_id_per_token[" + std::to_string(t) + "] is not a row of block_table");
  if (T == 0) return;

  static mla::Workspace flag;
  flag.reset();
  const size_t bad_at = flag.add(4);
  flag.allocate();
  int32_t* bad = flag.at<int32_t>(bad_at);
  mla::check(hipMemset(bad, 0, 4), "clear flag");
  Args a{};
  a.q = q.ptr<uint16_t>();
  a.q_ts = q.stride(0);
  a.q_hs = q.stride(1);
  a.bf16 = bf16;
  a.kv = kv.ptr<uint8_t>();
  a.page_stride = kv.stride(0);
  a.P = P;
  a.num_slots = kv.size(0) * P;
  a.rec = rec;
  a.table = table.ptr<int32_t>();
  a.table_rs = table.stride(0);
  a.table_cs = table.stride(1);
  a.table_cols = table.size(1);
  a.req = req.ptr<int32_t>();
  a.topk = topk.ptr<int32_t>();
  a.topk_rs = topk.stride(0);
  a.topk_cs = topk.stride(1);
  a.k = k;
  a.heads = static_cast<int>(N);
  a.scale = static_cast<float>(p.f("scale"));
  a.out = out.ptr<uint16_t>();
  a.out_ts = out.stride(0);
  a.out_hs = out.stride(1);
  a.lse = lse.ptr<float>();
  a.lse_ts = lse.stride(0);
  a.lse_hs = lse.stride(1);
  a.bad = bad;
  hipLaunchKernelGGL(sparse_mla_fp4_kernel, dim3(static_cast<unsigned>(T * N)), dim3(kThreads), 0,
                     0, a);
  mla::check(hipGetLastError(), "sparse_mla_fp4 launch");
  int32_t bad_h = 0;
  mla::check(hipMemcpy(&bad_h, bad, 4, hipMemcpyDeviceToHost), "copy flag");
  if (bad_h)
    throw std::runtime_error("sparse_mla_fp4: a top-k entry maps to cache slot " +
                             std::to_string(bad_h) + ", outside the cache");
}

const ack::KernelRegistrar kRegister("sparse_mla_fp4", run_sparse_mla_fp4);

}  // namespace
