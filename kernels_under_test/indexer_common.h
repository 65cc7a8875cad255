// Shared pieces of the indexer kernels (indexer.hip, indexer_prefill.hip, indexer_topk.hip): the
// cache layout formulas, the ue8m0 scale, host-side validation, and the fp8 MQA scoring tile on
// the matrix instructions (mma.h) that both logits kernels run.
#pragma once
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"
#include "mma.h"

namespace idx {

constexpr int kHeadDim = 128;
constexpr int kTokenBytes = 132;  // 128 fp8 values + one fp32 scale per token
constexpr int kTile = 16;         // SHUFFLE: 16 tokens x 16 dims per 256-byte sub-tile
constexpr int kMaxHeads = 128;

// ---- cache layout (block-flat pages: BS*128 value bytes, then BS fp32 scales) ----
AC_HOST_DEVICE int64_t value_offset(bool shuffle, int64_t t, int d) {
  if (!shuffle) return t * kHeadDim + d;
  return (t / kTile) * (kTile * kHeadDim) + (d / kTile) * (kTile * kTile) + (t % kTile) * kTile +
         d % kTile;
}
AC_HOST_DEVICE int64_t scale_offset(int64_t block_size, int64_t t) {
  return block_size * kHeadDim + 4 * t;
}

// fp32 (max(amax, floor) / quant_max) rounded up to a power of two, exactly (frexp, not log2).
AC_DEVICE float ue8m0_scale(float amax, float floor, float quant_max) {
  const float s = fmaxf(amax, floor) / quant_max;  // IEEE division (no fast-math)
  int e = 0;
  const float m = frexpf(s, &e);
  return m == 0.5f ? s : ldexpf(1.0f, e);
}

// ---- host-side validation ----
inline AcFp8 fp8_format(const ack::KParams& p) {
  const std::string& f = p.s("fp8_format");
  if (f == "e4m3fn") return AcFp8::e4m3fn;
  if (f == "e4m3fnuz") return AcFp8::e4m3fnuz;
  throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
}

inline float quant_max(const ack::KParams& p, AcFp8 fmt) {
  const double m = p.f("quant_max");
  if (!(m > 0.0) || m > static_cast<double>(ac_fp8_max(fmt)))
    throw ack::Refusal("quant_max " + std::to_string(m) + " outside (0, " +
                       std::to_string(ac_fp8_max(fmt)) + "] for this fp8 format");
  return static_cast<float>(m);
}

struct CacheGeometry {
  int64_t num_blocks;
  int block_size;
  int64_t block_stride;  // bytes
};

// kv_cache: u8 [num_blocks, BS, 132], blocks contiguous inside, page stride a multiple of 4 (the
// fp32 scales), BS 1 (NORMAL) or a multiple of 16 (SHUFFLE).
inline CacheGeometry cache_geometry(const ack::KTensor& c) {
  ack::expect_dtype(c, "kv_cache", kDLUInt, 8);
  ack::expect_ndim(c, "kv_cache", 3);
  if (c.size(2) != kTokenBytes)
    throw ack::Refusal("kv_cache last dimension must be 132 (128 fp8 + fp32 scale), got " +
                       std::to_string(c.size(2)));
  const int64_t bs = c.size(1);
  if (bs != 1 && (bs < 1 || bs % kTile != 0))
    throw ack::Refusal("kv_cache block size " + std::to_string(bs) +
                       " is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)");
  if (c.stride(2) != 1 || c.stride(1) != kTokenBytes || c.stride(0) < bs * kTokenBytes)
    throw ack::Refusal("kv_cache pages must be contiguous [BS, 132] with stride(0) >= BS*132");
  if (c.stride(0) % 4 != 0 || reinterpret_cast<uintptr_t>(c.data) % 4 != 0)
    throw ack::Refusal("kv_cache page stride " + std::to_string(c.stride(0)) +
                       " is not a multiple of 4 (fp32 scales would be misaligned)");
  return {c.size(0), static_cast<int>(bs), c.stride(0)};
}

inline int warp_size_of_device() {
  static const int size = [] {
    int dev = 0;
    hipDeviceProp_t prop;
    if (hipGetDevice(&dev) != hipSuccess || hipGetDeviceProperties(&prop, dev) != hipSuccess)
      return 0;
    return static_cast<int>(prop.warpSize);
  }();
  if (size <= 0) throw std::runtime_error("cannot query the device's warp size");
  return size;
}

inline void check_launch(const char* what) {
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

// ---- scoring tile: S[h, p] = q[h] . k[p] over up to 64 heads x 32 positions ----
// fp8 widens exactly to bf16, so the bf16 MMA with fp32 accumulation forms exact products; only
// the fp32 summation order differs from the reference.
constexpr int kTileHeads = 64;
constexpr int kTilePos = 32;
constexpr int kSplit = 256;         // key positions per program
constexpr int kLdQ = kHeadDim + 8;  // bf16 rows, padded (multiple of 8, 16-row steps 32B)
constexpr int kLdK = kHeadDim + 8;
constexpr int kLdS = kTilePos + 8;  // fp32 scores

struct ScoreSmem {
  uint16_t q[kTileHeads * kLdQ];
  uint16_t k[kTilePos * kLdK];
  float s[kTileHeads * kLdS];
  float w[kTileHeads];
  float k_scale[kTilePos];
  float acc[kSplit];
  uint16_t lut[256];  // fp8 code -> bf16 bits
};

AC_DEVICE void load_lut(ScoreSmem& sm, AcFp8 fmt) {
  for (int c = threadIdx.x; c < 256; c += blockDim.x)
    sm.lut[c] = ac_float_to_bf16(ac_fp8_to_float(static_cast<uint8_t>(c), fmt));
}

// Rows [0, nh) of the q tile from fp8 rows (head stride in bytes), the rest zero; w likewise.
AC_DEVICE void load_q(ScoreSmem& sm, const uint8_t* q, int64_t head_stride, const float* w,
                      int64_t w_stride, int nh) {
  for (int i = threadIdx.x; i < kTileHeads * kHeadDim; i += blockDim.x) {
    const int h = i / kHeadDim, d = i % kHeadDim;
    sm.q[h * kLdQ + d] = h < nh ? sm.lut[q[h * head_stride + d]] : uint16_t{0};
  }
  for (int h = threadIdx.x; h < kTileHeads; h += blockDim.x) {
    sm.w[h] = h < nh ? w[h * w_stride] : 0.0f;
#if defined(AC_MUTANT_INDEXER_WEIGHTS_FTZ)
    // Denormals flushed (what a fast-math / flush-to-zero build does to fp32): subnormal head
    // weights read as 0.
    if (fabsf(sm.w[h]) < 1.17549435e-38f) sm.w[h] = 0.0f;
#endif
  }
}

// Stores 4 fp8 bytes (little-endian in `bits`) of key row pl, dims d0..d0+3, as bf16.
AC_DEVICE void put_k(ScoreSmem& sm, int pl, int d0, uint32_t bits) {
  for (int i = 0; i < 4; ++i) sm.k[pl * kLdK + d0 + i] = sm.lut[(bits >> (8 * i)) & 0xFFu];
}

// S = Q K^T on the matrix units, then acc[p0 + p] += sum_{h < nh} w[h] relu(S[h, p] k_scale[p])
// for p < 32, heads in order (deterministic). Call with the q and k tiles loaded; all threads.
AC_DEVICE void score_tile(ScoreSmem& sm, int nh, int p0) {
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / ac_warp_size();
  const int warps = static_cast<int>(blockDim.x) / ac_warp_size();
  const int head_tiles = (nh + 15) / 16;
  for (int tile = warp; tile < head_tiles * (kTilePos / 16); tile += warps) {
    const int ht = tile / (kTilePos / 16), ct = tile % (kTilePos / 16);
    AcTileAcc c;
    ac_mma_zero(c);
    for (int kk = 0; kk < kHeadDim; kk += 16)
      ac_mma_16x16x16(c, sm.q + ht * 16 * kLdQ + kk, kLdQ, sm.k + ct * 16 * kLdK + kk, kLdK,
                      /*b_col_major=*/true, AcMmaIn::bf16);
    ac_mma_store(c, sm.s + ht * 16 * kLdS + ct * 16, kLdS);
  }
  __syncthreads();
  if (threadIdx.x < kTilePos) {
    const int p = static_cast<int>(threadIdx.x);
    float a = sm.acc[p0 + p];
    const float ks = sm.k_scale[p];
    for (int h = 0; h < nh; ++h) a += sm.w[h] * fmaxf(sm.s[h * kLdS + p] * ks, 0.0f);
    sm.acc[p0 + p] = a;
  }
  __syncthreads();
}

}  // namespace idx
