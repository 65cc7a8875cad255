// Indexer kernels of the prefill path without the paged cache (docs/ops/indexer.md): the
// per-(token, head) q quantizer with the head weights, and the fp8 MQA logits over ks/ke windows.
#include <cmath>
#include <string>

#include "indexer_common.h"

namespace {

using idx::kHeadDim;

// ---------------------------------------------------------------------------------------------
// q quantization: one warp per (token, head) group of 128; amax by warp max; ue8m0 scale with the
// 1e-10 floor; clamp to +-quant_max; w = ((raw * scale) * 128^-0.5) * H^-0.5 in fp32, that order.
__global__ void indexer_q_quant(const uint16_t* q, int64_t q_st, int64_t q_sh, const uint16_t* raw,
                                int64_t raw_st, int64_t raw_sh, int tokens, int heads,
                                uint8_t* q_fp8, int64_t o_st, int64_t o_sh, float* q_scale,
                                int64_t s_st, int64_t s_sh, float* weights, int64_t w_st,
                                int64_t w_sh, AcFp8 fmt, float quant_max, float softmax_scale,
                                float head_scale) {
  const int warps = static_cast<int>(blockDim.x) / ac_warp_size();
  const int group =
      static_cast<int>(blockIdx.x) * warps + static_cast<int>(threadIdx.x) / ac_warp_size();
  if (group >= tokens * heads) return;
  const int t = group / heads, h = group % heads, lane = ac_lane();
  const uint16_t* row = q + t * q_st + h * q_sh;
  float amax = 0.0f;
  for (int d = lane; d < kHeadDim; d += ac_warp_size())
    amax = fmaxf(amax, fabsf(ac_bf16_to_float(row[d])));
  amax = ac_warp_max(amax);
  const float scale = idx::ue8m0_scale(amax, 1e-10f, quant_max);
  uint8_t* out = q_fp8 + t * o_st + h * o_sh;
  for (int d = lane; d < kHeadDim; d += ac_warp_size()) {
    const float v = fminf(fmaxf(ac_bf16_to_float(row[d]) / scale, -quant_max), quant_max);
    out[d] = ac_float_to_fp8(v, fmt);
  }
  if (lane == 0) {
    q_scale[t * s_st + h * s_sh] = scale;
    float w = ac_bf16_to_float(raw[t * raw_st + h * raw_sh]) * scale;
    w = w * softmax_scale;
    w = w * head_scale;
    weights[t * w_st + h * w_sh] = w;
  }
}

void run_q_quant(const ack::KParams& p, const ack::KArgs& a) {
  const auto& q = a.get("q");
  const auto& raw = a.get("weights_raw");
  const auto& q_fp8 = a.get("q_fp8");
  const auto& q_scale = a.get("q_scale");
  const auto& weights = a.get("weights");
  ack::expect_dtype(q, "q", kDLBfloat, 16);
  ack::expect_ndim(q, "q", 3);
  ack::expect_contiguous_last(q, "q");
  ack::expect_dtype(raw, "weights_raw", kDLBfloat, 16);
  ack::expect_ndim(raw, "weights_raw", 2);
  ack::expect_dtype(q_fp8, "q_fp8", kDLUInt, 8);
  ack::expect_ndim(q_fp8, "q_fp8", 3);
  ack::expect_contiguous_last(q_fp8, "q_fp8");
  ack::expect_dtype(q_scale, "q_scale", kDLFloat, 32);
  ack::expect_dtype(weights, "weights", kDLFloat, 32);
  ack::expect_ndim(q_scale, "q_scale", 2);
  ack::expect_ndim(weights, "weights", 2);
  const int64_t T = q.size(0), H = q.size(1);
  if (q.size(2) != kHeadDim)
    throw ack::Refusal("q head dim must be 128, got " + std::to_string(q.size(2)));
  for (const auto* t : {&raw, &q_scale, &weights})
    if (t->size(0) != T || t->size(1) != H)
      throw ack::Refusal("weights_raw, q_scale and weights must be [T, H]");
  if (q_fp8.size(0) != T || q_fp8.size(1) != H || q_fp8.size(2) != kHeadDim)
    throw ack::Refusal("q_fp8 must be [T, H, 128]");
  const AcFp8 fmt = idx::fp8_format(p);
  const float qmax = idx::quant_max(p, fmt);
  if (T * H == 0) return;
  // Python scalars reach torch's fp32 multiply rounded to fp32.
  const auto softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  const auto head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  const int ws = idx::warp_size_of_device(), warps = 4;
  hipLaunchKernelGGL(indexer_q_quant, dim3(static_cast<unsigned>((T * H + warps - 1) / warps)),
                     dim3(warps * ws), 0, 0, q.ptr<uint16_t>(), q.stride(0), q.stride(1),
                     raw.ptr<uint16_t>(), raw.stride(0), raw.stride(1), static_cast<int>(T),
                     static_cast<int>(H), q_fp8.ptr<uint8_t>(), q_fp8.stride(0), q_fp8.stride(1),
                     q_scale.ptr<float>(), q_scale.stride(0), q_scale.stride(1),
                     weights.ptr<float>(), weights.stride(0), weights.stride(1), fmt, qmax,
                     softmax_scale, head_scale);
  idx::check_launch("indexer_q_quant");
}

// ---------------------------------------------------------------------------------------------
// Prefill logits: program (query i, key split of kSplit columns); every head of query i, 64 heads
// x 32 keys per matrix-unit tile. Columns of the split outside [ks, ke) get -inf; nothing past N.
struct PrefillArgs {
  const uint8_t* q;
  int64_t q_si, q_sh;
  const float* w;
  int64_t w_si, w_sh;
  const uint8_t* k;
  int64_t k_sj;
  const float* k_scale;
  int64_t ks_sj;
  const int32_t* ks;
  int64_t ks_s;
  const int32_t* ke;
  int64_t ke_s;
  int heads;
  int64_t n;
  float* out;
  int64_t out_rs;
  AcFp8 fmt;
};

__global__ void indexer_mqa_logits(PrefillArgs a) {
  __shared__ __align__(32) idx::ScoreSmem sm;
  const int64_t i = blockIdx.x;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * idx::kSplit;
  const int64_t c1 = c0 + idx::kSplit < a.n ? c0 + idx::kSplit : a.n;
  int64_t lo = a.ks[i * a.ks_s], hi = a.ke[i * a.ke_s];
  lo = lo < 0 ? 0 : (lo > a.n ? a.n : lo);  // clamped to [0, N] (AITER)
  hi = hi < 0 ? 0 : (hi > a.n ? a.n : hi);
  const int64_t t0 = lo > c0 ? lo : c0, t1 = hi < c1 ? hi : c1;  // this split's part of the window
  idx::load_lut(sm, a.fmt);
  for (int j = threadIdx.x; j < idx::kSplit; j += blockDim.x) sm.acc[j] = 0.0f;
  for (int hs = 0; hs < a.heads && t0 < t1; hs += idx::kTileHeads) {
    const int nh = a.heads - hs < idx::kTileHeads ? a.heads - hs : idx::kTileHeads;
    __syncthreads();
    idx::load_q(sm, a.q + i * a.q_si + hs * a.q_sh, a.q_sh, a.w + i * a.w_si + hs * a.w_sh, a.w_sh,
                nh);
    // Tiles start at multiples of 32 from c0 so acc indices stay aligned with columns.
    for (int64_t p0 = c0 + (t0 - c0) / idx::kTilePos * idx::kTilePos; p0 < t1;
         p0 += idx::kTilePos) {
      for (int j = threadIdx.x; j < idx::kTilePos * 32; j += blockDim.x) {
        const int pl = j / 32, d0 = 4 * (j % 32);
        const int64_t p = p0 + pl;
        const bool live = p >= t0 && p < t1;
#if defined(AC_MUTANT_INDEXER_PREFILL_K_OFFSET_INT32)
        // Seed bug: the key row offset in int32, which wraps once a key lies past byte 2^31.
        const uint8_t* key =
            a.k + static_cast<int32_t>(static_cast<uint32_t>(p) * static_cast<uint32_t>(a.k_sj));
#else
        const uint8_t* key = a.k + p * a.k_sj;  // 64-bit: a key row may lie past byte 2^32
#endif
        const uint32_t bits = live ? *reinterpret_cast<const uint32_t*>(key + d0) : 0u;
        idx::put_k(sm, pl, d0, bits);
        if (d0 == 0) sm.k_scale[pl] = live ? a.k_scale[p * a.ks_sj] : 0.0f;
      }
      idx::score_tile(sm, nh, static_cast<int>(p0 - c0));
    }
  }
  __syncthreads();
  float* out = a.out + i * a.out_rs;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
    out[c] = c >= lo && c < hi ? sm.acc[c - c0] : -__int_as_float(0x7f800000);
}

void run_mqa_logits(const ack::KParams& p, const ack::KArgs& args) {
  const auto& q = args.get("q");
  const auto& k = args.get("k_fp8");
  const auto& ks = args.get("k_scale");
  const auto& w = args.get("weights");
  const auto& lo = args.get("cu_seqlen_ks");
  const auto& hi = args.get("cu_seqlen_ke");
  const auto& out = args.get("logits");
  ack::expect_dtype(q, "q", kDLUInt, 8);
  ack::expect_ndim(q, "q", 3);
  ack::expect_contiguous_last(q, "q");
  ack::expect_dtype(k, "k_fp8", kDLUInt, 8);
  ack::expect_ndim(k, "k_fp8", 2);
  ack::expect_contiguous_last(k, "k_fp8");
  ack::expect_dtype(ks, "k_scale", kDLFloat, 32);
  ack::expect_ndim(ks, "k_scale", 1);
  ack::expect_dtype(w, "weights", kDLFloat, 32);
  ack::expect_ndim(w, "weights", 2);
  ack::expect_dtype(lo, "cu_seqlen_ks", kDLInt, 32);
  ack::expect_dtype(hi, "cu_seqlen_ke", kDLInt, 32);
  ack::expect_dtype(out, "logits", kDLFloat, 32);
  ack::expect_ndim(out, "logits", 2);
  ack::expect_contiguous_last(out, "logits");
  const int64_t M = q.size(0), H = q.size(1), N = k.size(0);
  if (q.size(2) != kHeadDim || k.size(1) != kHeadDim)
    throw ack::Refusal("q and k_fp8 head dim must be 128");
  if (H < 1 || H > idx::kMaxHeads)
    throw ack::Refusal("heads " + std::to_string(H) + " outside [1, " +
                       std::to_string(idx::kMaxHeads) + "]");
  if (k.stride(0) % 4 != 0 || reinterpret_cast<uintptr_t>(k.data) % 4 != 0)
    throw ack::Refusal("k_fp8 rows must be 4-byte aligned");
  if (ks.size(0) != N || w.size(0) != M || w.size(1) != H || lo.size(0) != M || hi.size(0) != M ||
      out.size(0) != M || out.size(1) != N)
    throw ack::Refusal("expected k_scale [N], weights [M, H], ks/ke [M], logits [M, N]");
  const AcFp8 fmt = idx::fp8_format(p);
  if (M == 0 || N == 0) return;
  PrefillArgs a{q.ptr<uint8_t>(),
                q.stride(0),
                q.stride(1),
                w.ptr<float>(),
                w.stride(0),
                w.stride(1),
                k.ptr<uint8_t>(),
                k.stride(0),
                ks.ptr<float>(),
                ks.stride(0),
                lo.ptr<int32_t>(),
                lo.stride(0),
                hi.ptr<int32_t>(),
                hi.stride(0),
                static_cast<int>(H),
                N,
                out.ptr<float>(),
                out.stride(0),
                fmt};
  const int ws = idx::warp_size_of_device();
  const dim3 grid(static_cast<unsigned>(M),
                  static_cast<unsigned>((N + idx::kSplit - 1) / idx::kSplit));
  hipLaunchKernelGGL(indexer_mqa_logits, grid, dim3(4 * ws), 0, 0, a);
  idx::check_launch("indexer_mqa_logits");
}

const ack::KernelRegistrar kRegisterQQuant("indexer_q_quant", run_q_quant);
const ack::KernelRegistrar kRegisterPrefill("indexer_logits_prefill", run_mqa_logits);

}  // namespace
