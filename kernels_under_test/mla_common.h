// The AITER-style MLA attention core shared by mla_decode.hip and sparse_mla.hip:
//   heads in groups of 16 (the MMA's M dimension); fewer than 16 heads are padded by
//   repeat-interleave into a workspace and the output is un-padded with head stride 16/N;
//   every query token is one row group over its own list of flat cache slots (the page-size-1
//   view: dense decode = the expanded page indices of its request up to its causal limit, sparse =
//   its packed top-k slots);
//   split-KV stage 1: QK^T and P.V through mma.h over 16-key chunks, online softmax in fp32,
//   P rounded to the input dtype before P.V, fp8 rows decoded in software (format a parameter);
//   stage 2: LSE merge of the splits (natural log), output through its real strides.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "mma.h"

// Everything here has internal linkage: each .hip file that includes it gets its own kernels.
namespace mla {
namespace {

constexpr int kHeadTile = 16;  // MMA M: heads per row group
constexpr int kKeyChunk = 16;  // MMA N of QK^T / K of P.V: keys per online-softmax step
constexpr int kWarps = 4;      // per workgroup
constexpr int kMaxLk = 576, kMaxLv = 512;
constexpr int kMaxSplits = 64;
constexpr int kMaxTilesPerWarp = kMaxLv / 16 / kWarps;  // output column tiles one warp owns

inline void check(hipError_t e, const char* what) {
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

// One growing device allocation per op, reused across launches (timing runs call repeatedly).
// Usage: reset(); offsets = add(bytes)...; allocate(); at<T>(offset).
class Workspace {
 public:
  void reset() { used_ = 0; }
  size_t add(size_t bytes) {
    const size_t offset = used_;
    used_ += (bytes + 255) / 256 * 256;
    return offset;
  }
  void allocate() {
    if (used_ <= capacity_) return;
    if (base_) {
      check(hipDeviceSynchronize(), "workspace");  // earlier launches may still use it
      check(hipFree(base_), "hipFree workspace");
      base_ = nullptr;
    }
    check(hipMalloc(&base_, used_), "hipMalloc workspace");
    capacity_ = used_;
  }
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }

 private:
  void* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
};

// What the attention core needs, all device pointers.
struct Attention {
  // Queries [T, N, lk] (16-bit, unit stride in the last dim), strides in elements.
  const uint16_t* q = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;
  int num_tokens = 0, num_heads = 0;
  // The cache as page-size-1 rows [num_slots, lk]: 16-bit (same type as q) or fp8 codes.
  const void* kv = nullptr;
  bool kv_fp8 = false;
  AcFp8 fp8_format = AcFp8::e4m3fn;
  float kv_scale = 1.0f;
  // Token t attends slots kv_indices[row_begin[t] .. row_begin[t] + row_len[t]).
  const int32_t* kv_indices = nullptr;
  const int32_t* row_begin = nullptr;
  const int32_t* row_len = nullptr;
  int max_row_len = 0;
  int lk = 0, lv = 0;
  float scale = 0;
  AcMmaIn type = AcMmaIn::bf16;
  // Outputs [T, N, lv] (16-bit, q's type) and lse [T, N] (fp32), strides in elements.
  uint16_t* out = nullptr;
  int64_t out_token_stride = 0, out_head_stride = 0;
  float* lse = nullptr;
  int64_t lse_token_stride = 0, lse_head_stride = 0;
  int num_splits = 0;  // 0: chosen from max_row_len
};

// ---- device code ----

AC_DEVICE uint16_t to_bits(float x, AcMmaIn t) {
  return t == AcMmaIn::bf16 ? ac_float_to_bf16(x) : ac_float_to_f16(x);
}

// Element offset of a cache row: 64-bit, since a cache may pass 2^31 elements (issue 14).
AC_DEVICE int64_t row_offset(int64_t slot, int lk) {
#if defined(AC_MUTANT_MLA_SLOT_OFFSET_INT32)
  // Seed bug: slot * Lk in int32, which wraps once the row offset passes 2^31 elements.
  return static_cast<int32_t>(static_cast<uint32_t>(slot) * static_cast<uint32_t>(lk));
#else
  return slot * lk;
#endif
}

// An fp8 cache code as a float, by the format's definition, special codes included.
AC_DEVICE float decode_fp8(uint8_t b, AcFp8 fmt) {
#if defined(AC_MUTANT_MLA_FP8_ORDINARY_ONLY)
  // Seed bug: a dequant exact on every ordinary code but wrong at the top of the format: the
  // saturation codes (and e4m3fn's NaN) read as the next smaller value, fnuz's NaN 0x80 as -0.
  const uint8_t top = fmt == AcFp8::e4m3fn ? 0x7E : 0x7F;
  if ((b & 0x7F) >= top) b = static_cast<uint8_t>((b & 0x80) | (top - 1));
  if (fmt == AcFp8::e4m3fnuz && b == 0x80) return -0.0f;
#endif
  return ac_fp8_to_float(b, fmt);
}

// Repeat-interleave (16-head rule): padded head j of token t is real head j / r, [T, 16, lk].
// q's row of token t, head h: 64-bit, since a token's row may lie past element 2^31 (issue 37).
AC_DEVICE const uint16_t* q_row(const uint16_t* q, int t, int64_t ts, int h, int64_t hs) {
#if defined(AC_MUTANT_MLA_Q_OFFSET_INT32)
  // Seed bug: the row offset in int32, which wraps once q's token stride passes 2^31.
  return q + static_cast<int32_t>(static_cast<uint32_t>(t) * static_cast<uint32_t>(ts) +
                                  static_cast<uint32_t>(h * hs));
#else
  return q + t * ts + h * hs;
#endif
}

__global__ void pad_heads(uint16_t* dst, const uint16_t* q, int64_t ts, int64_t hs, int lk, int r) {
  const int t = static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y);
  const uint16_t* src = q_row(q, t, ts, j / r, hs);
  uint16_t* d = dst + (static_cast<int64_t>(t) * kHeadTile + j) * lk;
  for (int i = static_cast<int>(threadIdx.x); i < lk; i += static_cast<int>(blockDim.x))
    d[i] = src[i];
}

// Stage 1: grid (splits, tokens, heads / 16), kWarps warps. Shared memory (dynamic):
//   qs, ks: [16][ldk] 16-bit (queries of the head group, keys of the chunk), ldk = lk + 8;
//   part:   [kWarps][256] fp32 (per-warp partial S tiles, then per-warp P.V tile scratch);
//   ps:     [16][16] 16-bit P; row statistics; the chunk's slots.
struct Stage1Smem {
  static size_t bytes(int lk) {
    const size_t ldk = static_cast<size_t>(lk) + 8;
    return 2 * kHeadTile * ldk * 2 + kWarps * 256 * 4 + 256 * 2 + 5 * kHeadTile * 4 + kKeyChunk * 4;
  }
};

// At most kWarps 64-lane waves: lets the AMD compiler give each lane the registers the output
// accumulators need.
__global__ void __launch_bounds__(kWarps * 64)
    split_kv_stage1(Attention a, const uint16_t* q, int64_t q_ts, int64_t q_hs, int heads,
                    int splits, float* part_o, float* part_lse) {
  extern __shared__ __align__(32) unsigned char smem[];
  const int lk = a.lk, lv = a.lv, ldk = lk + 8;
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* ks = qs + kHeadTile * ldk;
  float* part = reinterpret_cast<float*>(ks + kHeadTile * ldk);
  uint16_t* ps = reinterpret_cast<uint16_t*>(part + kWarps * 256);
  float* m_s = reinterpret_cast<float*>(ps + 256);  // [2][16]: read one, write the other
  float* l_s = m_s + 2 * kHeadTile;                 // [2][16]
  float* alpha_s = l_s + 2 * kHeadTile;             // [16] rescale of this chunk
  int32_t* slot_s = reinterpret_cast<int32_t*>(alpha_s + kHeadTile);

  const int split = static_cast<int>(blockIdx.x), t = static_cast<int>(blockIdx.y);
  const int h0 = static_cast<int>(blockIdx.z) * kHeadTile;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / warpSize, lane = tid % warpSize;
  const int len = a.row_len[t], begin = a.row_begin[t];
  const int per = ((len + splits - 1) / splits + kKeyChunk - 1) / kKeyChunk * kKeyChunk;
  const int k0 = split * per, k1 = min(len, k0 + per);
  const int64_t part_row = (static_cast<int64_t>(t) * splits + split) * heads + h0;
  if (k0 >= k1) {  // nothing to attend in this split: lse -inf marks it empty for stage 2
    if (tid < kHeadTile) part_lse[part_row + tid] = -INFINITY;
    return;
  }
  for (int i = tid; i < kHeadTile * lk; i += nthreads) {
    const int r = i / lk, d = i % lk;
    qs[r * ldk + d] = q_row(q, t, q_ts, h0 + r, q_hs)[d];
  }
  if (tid < kHeadTile) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  // This lane's share of the output: column tiles warp + kWarps * i, elements lane + warpSize * e.
  const int col_tiles = lv / 16, per_lane = 256 / warpSize;
  float o[kMaxTilesPerWarp][8];
#pragma unroll
  for (int i = 0; i < kMaxTilesPerWarp; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[i][e] = 0.0f;

  const float score_scale = a.scale * a.kv_scale;
  const uint8_t* kv8 = static_cast<const uint8_t*>(a.kv);
  const uint16_t* kv16 = static_cast<const uint16_t*>(a.kv);
  const int vecs = lk / 8;  // 8-element vectors per row
  int cur = 0;
  for (int kc = k0; kc < k1; kc += kKeyChunk) {
    const int n = min(kKeyChunk, k1 - kc);
    __syncthreads();  // the previous chunk is done with ks, ps and slot_s
    if (tid < kKeyChunk) slot_s[tid] = tid < n ? a.kv_indices[begin + kc + tid] : -1;
    __syncthreads();
    for (int i = tid; i < kKeyChunk * vecs; i += nthreads) {
      const int r = i / vecs, v = i % vecs;
      const int64_t slot = slot_s[r];
      uint4 bits = make_uint4(0, 0, 0, 0);  // keys past the chunk's end are zero, never NaN
      if (slot >= 0) {
        const int64_t row = row_offset(slot, lk);
        if (!a.kv_fp8) {
          bits = *reinterpret_cast<const uint4*>(kv16 + row + v * 8);
        } else {
          const uint2 codes = *reinterpret_cast<const uint2*>(kv8 + row + v * 8);
          uint32_t w[4];
          for (int k = 0; k < 4; ++k) {
            const uint32_t word = k < 2 ? codes.x : codes.y;
            const int sh = (k % 2) * 16;
            const uint16_t lo =
                to_bits(decode_fp8(static_cast<uint8_t>(word >> sh), a.fp8_format), a.type);
            const uint16_t hi =
                to_bits(decode_fp8(static_cast<uint8_t>(word >> (sh + 8)), a.fp8_format), a.type);
            w[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
          }
          bits = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      *reinterpret_cast<uint4*>(ks + r * ldk + v * 8) = bits;
    }
    __syncthreads();
    // S = Q K^T, the Lk/16 k-steps dealt round-robin to the warps; partial tiles summed below.
    {
      AcTileAcc acc;
      ac_mma_zero(acc);
      for (int kk = warp; kk < lk / 16; kk += kWarps)
        ac_mma_16x16x16(acc, qs + kk * 16, ldk, ks + kk * 16, ldk, true, a.type);
      ac_mma_store(acc, part + warp * 256, 16);
    }
    __syncthreads();
    // Online softmax over the chunk: element e = (row e / 16, key e % 16); a row's 16 keys are 16
    // consecutive lanes of one warp.
    const int nxt = cur ^ 1;
    for (int e = tid; e < 256; e += nthreads) {
      const int r = e / 16, j = e % 16;
      float s = 0.0f;
      for (int w = 0; w < kWarps; ++w) s += part[w * 256 + e];
      s = j < n ? s * score_scale : -INFINITY;
      float mx = s;
      for (int m = 8; m > 0; m /= 2) mx = fmaxf(mx, ac_shfl_xor(mx, m));
      const float m_old = m_s[cur * kHeadTile + r];
      const float m_new = fmaxf(m_old, mx);  // finite: key 0 of the chunk is always valid
      const float p = j < n ? expf(s - m_new) : 0.0f;
      float sum = p;
      for (int m = 8; m > 0; m /= 2) sum += ac_shfl_xor(sum, m);
      ps[e] = to_bits(p, a.type);  // P in the input dtype, as the MMA consumes it
      if (j == 0) {
        const float alpha = expf(m_old - m_new);  // 0 on the first chunk (m_old = -inf)
        alpha_s[r] = alpha;
        m_s[nxt * kHeadTile + r] = m_new;
        l_s[nxt * kHeadTile + r] = l_s[cur * kHeadTile + r] * alpha + sum;
      }
    }
    cur = nxt;
    __syncthreads();
    // O = O * alpha + P V over this warp's column tiles.
    float* scratch = part + warp * 256;
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      const int tile = warp + kWarps * i;
      if (tile >= col_tiles) break;  // uniform within the warp
      AcTileAcc acc;
      ac_mma_zero(acc);
      ac_mma_16x16x16(acc, ps, 16, ks + tile * 16, ldk, false, a.type);
      ac_mma_store(acc, scratch, 16);
      ac_mma_sync();
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e >= per_lane) break;
        const int idx = lane + warpSize * e;
        o[i][e] = o[i][e] * alpha_s[idx / 16] + scratch[idx];
      }
      ac_mma_sync();
    }
  }
  // Normalize within the split; V rows carry kv_scale (fp8) as well.
  const float* l_fin = l_s + cur * kHeadTile;
  const float* m_fin = m_s + cur * kHeadTile;
#pragma unroll
  for (int i = 0; i < kMaxTilesPerWarp; ++i) {
    const int tile = warp + kWarps * i;
    if (tile >= col_tiles) break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e >= per_lane) break;
      const int idx = lane + warpSize * e, r = idx / 16, c = idx % 16;
      part_o[(part_row + r) * lv + tile * 16 + c] = o[i][e] * a.kv_scale / l_fin[r];
    }
  }
  if (tid < kHeadTile) part_lse[part_row + tid] = m_fin[tid] + logf(l_fin[tid]);
}

// The element offset of out[t, h, 0] through out's strides.
__device__ inline int64_t out_row_offset(int64_t t, int64_t h, int64_t o_ts, int64_t o_hs) {
#if defined(AC_MUTANT_MLA_OUT_OFFSET_INT32)
  return static_cast<int32_t>(t * o_ts + h * o_hs);  // seed bug: wraps past element 2^31
#else
  return t * o_ts + h * o_hs;
#endif
}

// Stage 2: grid (tokens, heads), merges the splits by their LSE and writes out/lse through the
// given strides. A row with no key (every split empty) gets out = 0 and lse = -inf.
__global__ void merge_stage2(const float* part_o, const float* part_lse, int heads, int splits,
                             int lv, AcMmaIn type, uint16_t* out, int64_t o_ts, int64_t o_hs,
                             float* lse, int64_t l_ts, int64_t l_hs) {
  const int t = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
#if defined(AC_MUTANT_MLA_MERGE_TRUSTS_FIRST)
  // The first split's LSE as the merge's reference instead of the max over splits: exp(l - mx)
  // overflows once a later split's LSE exceeds the first's by more than 88.7.
  const float mx = part_lse[static_cast<int64_t>(t) * splits * heads + h];
#else
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s)
    mx = fmaxf(mx, part_lse[(static_cast<int64_t>(t) * splits + s) * heads + h]);
#endif
  float total = 0.0f;
  if (mx != -INFINITY)
    for (int s = 0; s < splits; ++s) {
      const float l = part_lse[(static_cast<int64_t>(t) * splits + s) * heads + h];
      if (l != -INFINITY) total += expf(l - mx);
    }
  uint16_t* o = out + out_row_offset(t, h, o_ts, o_hs);
  for (int d = static_cast<int>(threadIdx.x); d < lv; d += static_cast<int>(blockDim.x)) {
    float acc = 0.0f;
    if (mx != -INFINITY)
      for (int s = 0; s < splits; ++s) {
        const int64_t row = (static_cast<int64_t>(t) * splits + s) * heads + h;
        const float l = part_lse[row];
        if (l != -INFINITY) acc += expf(l - mx) * part_o[row * lv + d];
      }
    o[d] = to_bits(mx != -INFINITY ? acc / total : 0.0f, type);
  }
  if (threadIdx.x == 0) lse[t * l_ts + h * l_hs] = mx != -INFINITY ? mx + logf(total) : -INFINITY;
}

// Un-pad (16-head rule): real head h is padded head h * r, i.e. the strided view o_pad[:, ::r].
__global__ void unpad_heads(uint16_t* out, int64_t o_ts, int64_t o_hs, float* lse, int64_t l_ts,
                            int64_t l_hs, const uint16_t* o_pad, const float* lse_pad, int lv,
                            int r) {
  const int t = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
#if defined(AC_MUTANT_MLA_UNPADDED_HEADS)
  const int src = h;  // seed bug: a contiguous view o_pad[:, :N] (padded head h = real head h / r)
#else
  const int src = h * r;
#endif
  const uint16_t* o = o_pad + (static_cast<int64_t>(t) * kHeadTile + src) * lv;
  for (int d = static_cast<int>(threadIdx.x); d < lv; d += static_cast<int>(blockDim.x))
    out[out_row_offset(t, h, o_ts, o_hs) + d] = o[d];
  if (threadIdx.x == 0) lse[t * l_ts + h * l_hs] = lse_pad[t * kHeadTile + src];
}

// ---- host side ----

inline AcMmaIn mma_type(const ack::KTensor& t, const char* name) {
  if (t.dtype.code == kDLBfloat && t.dtype.bits == 16) return AcMmaIn::bf16;
  if (t.dtype.code == kDLFloat && t.dtype.bits == 16) return AcMmaIn::f16;
  throw ack::Refusal(std::string("tensor '") + name + "' must be bfloat16 or float16");
}

inline bool valid_num_heads(int64_t n) {
  return n >= 1 && (n >= kHeadTile ? n % kHeadTile == 0 : kHeadTile % n == 0);
}
inline std::string num_heads_message(int64_t n) {
  return "Aiter MLA requires that num_heads be multiples or divisors of 16, but provided " +
         std::to_string(n) + " number of heads.\nTry adjusting tensor_parallel_size value.";
}

// Checks shared by both ops: q/out/lse/kv shapes, dtypes, strides and parameters. Fills `a`
// except the row lists. Returns the number of flat cache slots.
inline int64_t validate_common(const ack::KParams& p, const ack::KArgs& args, Attention& a) {
  const auto& q = args.get("q");
  const auto& kv = args.get("kv_cache");
  const auto& out = args.get("out");
  const auto& lse = args.get("lse");
  ack::expect_ndim(q, "q", 3);
  ack::expect_ndim(kv, "kv_cache", 3);
  ack::expect_ndim(out, "out", 3);
  ack::expect_ndim(lse, "lse", 2);
  ack::expect_dtype(lse, "lse", kDLFloat, 32);
  ack::expect_contiguous_last(q, "q");
  ack::expect_contiguous_last(out, "out");
  a.type = mma_type(q, "q");
  if (out.dtype.code != q.dtype.code || out.dtype.bits != 16)
    throw ack::Refusal("tensor 'out' must have q's dtype");
  const int64_t T = q.size(0), N = q.size(1), lk = q.size(2);
  if (!valid_num_heads(N)) throw ack::Refusal(num_heads_message(N));
  const int64_t lv = p.i("lv");
  if (lk % 16 != 0 || lk > kMaxLk || lv % 16 != 0 || lv < 16 || lv > lk || lv > kMaxLv)
    throw ack::Refusal("unsupported head dims Lk=" + std::to_string(lk) + ", Lv=" +
                       std::to_string(lv) + " (need multiples of 16, Lv <= Lk <= 576, Lv <= 512)");
  if (out.size(0) != T || out.size(1) != N || out.size(2) != lv || lse.size(0) != T ||
      lse.size(1) != N)
    throw ack::Refusal("out must be [T, N, Lv] and lse [T, N] for q [T, N, Lk]");
  if (kv.size(2) != lk)
    throw ack::Refusal("kv_cache rows must have Lk = " + std::to_string(lk) + " elements");
  // As in AITER, the kernel sees the cache as page-size-1 rows [num_blocks * P, Lk].
  if (kv.stride(2) != 1 || kv.stride(1) != lk || kv.stride(0) != kv.size(1) * lk)
    throw ack::Refusal(
        "kv_cache must be contiguous in its last three dims (flattened to "
        "[num_blocks * block_size, Lk] page-size-1 rows)");
  if (reinterpret_cast<uintptr_t>(kv.data) % 16 != 0)
    throw ack::Refusal("kv_cache must be 16-byte aligned (vector loads)");
  if (p.i("kernel_block_size") != kv.size(1))
    throw ack::Refusal("kernel_block_size " + std::to_string(p.i("kernel_block_size")) +
                       " differs from the cache block size " + std::to_string(kv.size(1)));
  if (kv.dtype.code == kDLUInt && kv.dtype.bits == 8) {
    const std::string& f = p.s("fp8_format");
    if (f != "e4m3fn" && f != "e4m3fnuz")
      throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
    a.kv_fp8 = true;
    a.fp8_format = f == "e4m3fn" ? AcFp8::e4m3fn : AcFp8::e4m3fnuz;
  } else if (kv.dtype.code != q.dtype.code || kv.dtype.bits != 16) {
    throw ack::Refusal("kv_cache must have q's dtype or be fp8 (uint8 with fp8_format)");
  }
  a.kv_scale = static_cast<float>(p.f("kv_scale"));
  if (!a.kv_fp8 && a.kv_scale != 1.0f) throw ack::Refusal("kv_scale applies to fp8 caches only");
  a.scale = static_cast<float>(p.f("scale"));
  a.q = q.ptr<uint16_t>();
  a.q_token_stride = q.stride(0);
  a.q_head_stride = q.stride(1);
  a.num_tokens = static_cast<int>(T);
  a.num_heads = static_cast<int>(N);
  a.kv = kv.data;
  a.lk = static_cast<int>(lk);
  a.lv = static_cast<int>(lv);
  a.out = out.ptr<uint16_t>();
  a.out_token_stride = out.stride(0);
  a.out_head_stride = out.stride(1);
  a.lse = lse.ptr<float>();
  a.lse_token_stride = lse.stride(0);
  a.lse_head_stride = lse.stride(1);
  if (p.has("num_kv_splits")) a.num_splits = static_cast<int>(p.i("num_kv_splits"));
  return kv.size(0) * kv.size(1);
}

inline int device_sm_count() {
  static int n = [] {
    int dev = 0;
    check(hipGetDevice(&dev), "hipGetDevice");
    hipDeviceProp_t prop;
    check(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
    return prop.multiProcessorCount;
  }();
  return n;
}

inline int device_warp_size() {
  static int ws = [] {
    int dev = 0;
    check(hipGetDevice(&dev), "hipGetDevice");
    hipDeviceProp_t prop;
    check(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
    return prop.warpSize;
  }();
  return ws;
}

// Pads, runs both stages and un-pads. `ws` must have no carvings pending; row lists set in `a`.
inline void run_attention(const Attention& a, Workspace& ws) {
  const int T = a.num_tokens, N = a.num_heads;
  if (T == 0) return;
  const bool padded = N < kHeadTile;
  const int H = padded ? kHeadTile : N, r = padded ? kHeadTile / N : 1;
  int splits = a.num_splits;
  if (splits <= 0) {  // enough workgroups to fill the device, at least four key chunks per split
    const int groups = T * (H / kHeadTile);
    splits = (4 * device_sm_count() + groups - 1) / groups;
    splits = std::min(splits, (a.max_row_len + 4 * kKeyChunk - 1) / (4 * kKeyChunk));
  }
  splits = splits < 1 ? 1 : splits > kMaxSplits ? kMaxSplits : splits;
  ws.reset();
  const size_t q_pad_at = ws.add(padded ? sizeof(uint16_t) * T * kHeadTile * a.lk : 0);
  const size_t part_o_at = ws.add(sizeof(float) * T * splits * H * a.lv);
  const size_t part_lse_at = ws.add(sizeof(float) * T * splits * H);
  const size_t o_pad_at = ws.add(padded ? sizeof(uint16_t) * T * kHeadTile * a.lv : 0);
  const size_t lse_pad_at = ws.add(padded ? sizeof(float) * T * kHeadTile : 0);
  ws.allocate();
  uint16_t* q_pad = ws.at<uint16_t>(q_pad_at);
  float* part_o = ws.at<float>(part_o_at);
  float* part_lse = ws.at<float>(part_lse_at);
  uint16_t* o_pad = ws.at<uint16_t>(o_pad_at);
  float* lse_pad = ws.at<float>(lse_pad_at);

  const uint16_t* q = a.q;
  int64_t q_ts = a.q_token_stride, q_hs = a.q_head_stride;
  if (padded) {
    hipLaunchKernelGGL(pad_heads, dim3(T, kHeadTile), dim3(128), 0, 0, q_pad, a.q, q_ts, q_hs, a.lk,
                       r);
    check(hipGetLastError(), "pad_heads launch");
    q = q_pad;
    q_ts = static_cast<int64_t>(kHeadTile) * a.lk;
    q_hs = a.lk;
  }
  const size_t smem = Stage1Smem::bytes(a.lk);
  const int threads = kWarps * device_warp_size();
  hipLaunchKernelGGL(split_kv_stage1, dim3(splits, T, H / kHeadTile), dim3(threads), smem, 0, a, q,
                     q_ts, q_hs, H, splits, part_o, part_lse);
  check(hipGetLastError(), "split_kv_stage1 launch");
  if (padded) {
    hipLaunchKernelGGL(merge_stage2, dim3(T, H), dim3(128), 0, 0, part_o, part_lse, H, splits, a.lv,
                       a.type, o_pad, static_cast<int64_t>(kHeadTile) * a.lv,
                       static_cast<int64_t>(a.lv), lse_pad, static_cast<int64_t>(kHeadTile),
                       static_cast<int64_t>(1));
    check(hipGetLastError(), "merge_stage2 launch");
    hipLaunchKernelGGL(unpad_heads, dim3(T, N), dim3(128), 0, 0, a.out, a.out_token_stride,
                       a.out_head_stride, a.lse, a.lse_token_stride, a.lse_head_stride, o_pad,
                       lse_pad, a.lv, r);
    check(hipGetLastError(), "unpad_heads launch");
  } else {
    hipLaunchKernelGGL(merge_stage2, dim3(T, H), dim3(128), 0, 0, part_o, part_lse, H, splits, a.lv,
                       a.type, a.out, a.out_token_stride, a.out_head_stride, a.lse,
                       a.lse_token_stride, a.lse_head_stride);
    check(hipGetLastError(), "merge_stage2 launch");
  }
}

}  // namespace
}  // namespace mla
