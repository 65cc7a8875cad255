// decode_attention: vLLM's Triton split-KV decode attention (docs/ops/decode_attention.md) as
// two kernels. Stage 1 follows vLLM's grouped stage-1 kernel: grid (B, head groups, splits), up to
// BLOCK_H query heads of one KV head per program, BLOCK_N tokens per step found through the page
// table with the cache's real page/token/head strides, fp32 online softmax, p rounded to the q
// dtype before P.V, and for MLA the K tile reused as V. Stage 2 merges the split partials by their
// log-sum-exp. The tile comes from (Lk, Lv) by the rule of vLLM PR #41119; the mutant
// AC_MUTANT_DECODE_TILE_FROM_LK re-creates the pre-fix rule (vLLM #40966).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

constexpr int kThreads = 256;  // per program: 4 wavefronts of 64 or 8 warps of 32
constexpr int kMaxCols = 4;    // accumulator columns per thread: Lv <= 1024

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

struct Tiles {
  bool grouped;
  int64_t dmodel, dpe, dv, block_n, block_h;
};

// The tile rule (reference/decode_tiles.cpp holds the spec'd version for both vendors and both
// rules, tested against docs/ops/decode_attention.md's tile table). kv_group_num == 1 is vLLM's
// normal kernel: one head per program, no tl.dot (so no p rounding), BLOCK_N 64 (8 on HIP).
Tiles choose_tiles(int64_t lk, int64_t lv, bool is_mla, int64_t group) {
#if defined(AC_HIP)
  const bool hip = true;
#else
  const bool hip = false;
#endif
  if (group == 1) return {false, next_pow2(lk), 0, next_pow2(lv), hip ? 8 : 64, 1};
  Tiles t{true, 0, 0, next_pow2(lv), 0, 16};
#if defined(AC_MUTANT_DECODE_TILE_FROM_LK)
  // Seed bug: the pre-fix rule sizes the Q/K tile from Lk for MLA too (320 -> 512/0).
  (void)is_mla;
  t.dmodel = lk == 576 ? 512 : lk == 288 ? 256 : next_pow2(lk);
  t.dpe = lk == 576 ? 64 : lk == 288 ? 32 : 0;
  t.block_n = hip && lk >= 576 ? 16 : 32;
#else
  if (!is_mla) {
    t.dmodel = next_pow2(lk);
    t.dpe = 0;
  } else if (!hip && lk == 576) {
    t.dmodel = 512;
    t.dpe = 64;
  } else if (!hip && lk == 288) {
    t.dmodel = 256;
    t.dpe = 32;
  } else {
    t.dmodel = next_pow2(lv);
    t.dpe = lk > lv ? next_pow2(lk - lv) : 0;
  }
  t.block_n = hip ? 16 : 32;
#endif
  return t;
}

struct Stage1Args {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* table;
  const int32_t* lens;
  float* partials;  // [B, Hq, S, Lv + 1]
  int64_t q_sb, q_sh;
  int64_t k_sp, k_st, k_sh;  // page, token in page, head
  int64_t v_sp, v_st, v_sh;
  int64_t t_sb, t_sc, lens_s;
  int hq, group, lk, lv, page_size, splits;
  int block_n, block_h, valid_block_h, progs_per_kv;
  int k_main, k_pitch, rope_cols, dmodel, v_pitch;  // staged widths (see the launcher)
  int off_k, off_rope, off_v, off_p, off_stat, off_rows;
  float qk_scale, acc_scale, cap;
  int host_max_len;  // AC_MUTANT_DECODE_BAKED_SEQ_LENS only: the lengths' maximum read on the host
  int fp8_format;    // -1: the cache has the q dtype; else AcFp8
  bool q_bf16, k_as_v, round_p, vec8;
};

AC_DEVICE float bits_to_float(uint16_t b, bool bf16) {
  return bf16 ? ac_bf16_to_float(b) : ac_f16_to_float(b);
}
AC_DEVICE uint16_t float_to_bits(float f, bool bf16) {
  return bf16 ? ac_float_to_bf16(f) : ac_float_to_f16(f);
}

// fp8 -> float. The mutant decodes like a table that stops one code short of the top: the
// saturation codes (e4m3fn 0x7E = 448 and its NaN 0x7F, e4m3fnuz 0x7F = 240) read as the next
// smaller value, and fnuz's NaN code 0x80 as -0 — exact on every ordinary code.
AC_DEVICE float fp8_value(uint8_t b, AcFp8 fmt) {
#if defined(AC_MUTANT_DECODE_FP8_ORDINARY_ONLY)
  const uint8_t top = fmt == AcFp8::e4m3fn ? 0x7E : 0x7F;
  if ((b & 0x7F) >= top) b = static_cast<uint8_t>((b & 0x80) | (top - 1));
  if (fmt == AcFp8::e4m3fnuz && b == 0x80) return -0.0f;
#endif
  return ac_fp8_to_float(b, fmt);
}

// A cache element as q-dtype bits: 16-bit caches are copied, fp8 widens exactly (e4m3 fits bf16
// and f16); the per-tensor scales are applied to the scores and the output instead.
AC_DEVICE uint16_t cache_bits(const void* base, int64_t i, const Stage1Args& a) {
  if (a.fp8_format < 0) return static_cast<const uint16_t*>(base)[i];
  const uint8_t b = static_cast<const uint8_t*>(base)[i];
  return float_to_bits(fp8_value(b, static_cast<AcFp8>(a.fp8_format)), a.q_bf16);
}

// Eight cache elements at element offset i (8-aligned) as q-dtype bits: one 16-byte load for a
// 16-bit cache, one 8-byte load for fp8.
AC_DEVICE uint4 cache_bits8(const void* base, int64_t i, const Stage1Args& a) {
  if (a.fp8_format < 0)
    return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
  const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + i);
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) {
    const uint32_t src = k < 2 ? raw.x : raw.y;
    const int shift = (k % 2) * 16;
    const auto lo = static_cast<uint8_t>(src >> shift),
               hi = static_cast<uint8_t>(src >> (shift + 8));
    const auto fmt = static_cast<AcFp8>(a.fp8_format);
    w[k] = float_to_bits(fp8_value(lo, fmt), a.q_bf16) |
           static_cast<uint32_t>(float_to_bits(fp8_value(hi, fmt), a.q_bf16)) << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// rows x width tile: column c holds source dim col0 + c of each token row (masked < limit and to
// valid rows; zero elsewhere, like Triton's masked loads). a.vec8 (checked by the launcher: cache
// pointers and strides, widths, pitches, col0 and limit all multiples of 8) moves 8 elements per
// access; otherwise one element at a time.
AC_DEVICE void load_tile(uint16_t* dst, const void* src, const int64_t* rows, int nrows, int width,
                         int pitch, int col0, int limit, const Stage1Args& a) {
  if (a.vec8) {
    const int chunks = pitch / 8;
#pragma unroll 4
    for (int i = threadIdx.x; i < nrows * chunks; i += blockDim.x) {
      const int j = i / chunks, c = (i % chunks) * 8, d = col0 + c;
      const bool in = rows[j] >= 0 && c < width && d < limit;
#if defined(AC_MUTANT_DECODE_STALE_SMEM_ROWS)
      if (rows[j] < 0) continue;  // rows past the split are left as they are
#endif
      *reinterpret_cast<uint4*>(dst + j * pitch + c) =
          in ? cache_bits8(src, rows[j] + d, a) : make_uint4(0, 0, 0, 0);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < nrows * pitch; i += blockDim.x) {
    const int j = i / pitch, c = i % pitch, d = col0 + c;
#if defined(AC_MUTANT_DECODE_STALE_SMEM_ROWS)
    if (rows[j] < 0) continue;
#endif
    dst[i] = rows[j] >= 0 && c < width && d < limit ? cache_bits(src, rows[j] + d, a) : 0;
  }
}

// Orders the lanes' shared-memory accesses around a single lane's update (NVIDIA schedules lanes
// independently; AMD wavefronts run in lockstep).
AC_DEVICE void warp_barrier() {
#if defined(AC_CUDA)
  __syncwarp();
#endif
}

AC_DEVICE float soft_cap(float s, float cap) {
  const float x = s / cap;
  return cap * (2.0f / (1.0f + expf(-2.0f * x)) - 1.0f);  // tanh(x) = 2 sigmoid(2x) - 1
}

template <int MAX_H, int COLS>
__global__ void __launch_bounds__(kThreads) decode_stage1(Stage1Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* q_s = reinterpret_cast<uint16_t*>(smem);  // [block_h][lk]
  auto* k_s = reinterpret_cast<uint16_t*>(smem + a.off_k);
  auto* rope_s = reinterpret_cast<uint16_t*>(smem + a.off_rope);
  auto* v_s = reinterpret_cast<uint16_t*>(smem + a.off_v);
  auto* p_s = reinterpret_cast<float*>(smem + a.off_p);  // [block_h][block_n]
  auto* m_s = reinterpret_cast<float*>(smem + a.off_stat);
  float* l_s = m_s + a.block_h;
  float* alpha_s = l_s + a.block_h;
  auto* krow_s = reinterpret_cast<int64_t*>(smem + a.off_rows);  // element offset of each token
  int64_t* vrow_s = krow_s + a.block_n;

  const int b = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  // Heads of this program: never straddle two KV heads (when kv_group_num > BLOCK_H is not a
  // multiple of BLOCK_H, a flat g * VALID_BLOCK_H numbering would).
  const int kvh = g / a.progs_per_kv;
  const int h0 = kvh * a.group + (g % a.progs_per_kv) * a.valid_block_h;
  const int nh = min(a.valid_block_h, (kvh + 1) * a.group - h0);
#if defined(AC_MUTANT_DECODE_BAKED_SEQ_LENS)
  const int len = min(a.lens[b * a.lens_s], a.host_max_len);
#else
  const int len = a.lens[b * a.lens_s];
#endif
  const int per = (len + a.splits - 1) / a.splits;
  const int start = per * split, end = min(start + per, len);
  if (end <= start) return;  // empty split: stage 2 skips it by the same bounds

  const int tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid % warpSize, warp = tid / warpSize, nwarps = nt / warpSize;
  const auto* q = static_cast<const uint16_t*>(a.q);
  for (int i = tid; i < a.block_h * a.lk; i += nt) {
    const int h = i / a.lk, d = i % a.lk;
#if defined(AC_MUTANT_DECODE_Q_OFFSET_INT32)
    // Seed bug: q's row offset in int32, which wraps once q's batch stride reaches past 2^31.
    const uint32_t at = static_cast<uint32_t>(b) * static_cast<uint32_t>(a.q_sb) +
                        static_cast<uint32_t>((h0 + h) * a.q_sh + d);
    q_s[i] = h < nh ? q[static_cast<int32_t>(at)] : 0;
#else
    q_s[i] = h < nh ? q[b * a.q_sb + (h0 + h) * a.q_sh + d] : 0;
#endif
  }
  for (int h = tid; h < a.block_h; h += nt) {
    m_s[h] = -INFINITY;
    l_s[h] = 0.0f;
  }
  float acc[MAX_H][COLS];
  for (int h = 0; h < MAX_H; ++h)
    for (int c = 0; c < COLS; ++c) acc[h][c] = 0.0f;

  const uint16_t* v_tile = a.k_as_v ? k_s : v_s;  // IS_MLA: v = trans(k), the K main tile
  for (int n0 = start; n0 < end; n0 += a.block_n) {
    for (int j = tid; j < a.block_n; j += nt) {
      const int n = n0 + j;
      int64_t kr = -1, vr = -1;
#if defined(AC_MUTANT_DECODE_LEN_OFF_BY_ONE)
      if (n <= end) {  // "end is inclusive": one token past each split
#else
      if (n < end) {
#endif
#if defined(AC_MUTANT_DECODE_TABLE_UNIT_STRIDE)
        // Seed bug (vLLM's Triton decode reads Req_to_tokens + b * stride(0) + column): the
        // table's innermost stride taken as 1.
        const int64_t page = a.table[b * a.t_sb + n / a.page_size];
#else
        const int64_t page = a.table[b * a.t_sb + (n / a.page_size) * a.t_sc];
#endif
        const int64_t slot = n % a.page_size;
#if defined(AC_MUTANT_DECODE_PAGE_OFFSET_INT32)
        // Element offsets in 32-bit arithmetic: wraps once page * page_stride passes 2^31.
        kr = static_cast<int32_t>(page) * static_cast<int32_t>(a.k_sp) +
             static_cast<int32_t>(slot * a.k_st + kvh * a.k_sh);
        vr = static_cast<int32_t>(page) * static_cast<int32_t>(a.v_sp) +
             static_cast<int32_t>(slot * a.v_st + kvh * a.v_sh);
#else
        kr = page * a.k_sp + slot * a.k_st + kvh * a.k_sh;
        vr = page * a.v_sp + slot * a.v_st + kvh * a.v_sh;
#endif
      }
      krow_s[j] = kr;
      vrow_s[j] = vr;
    }
#if !defined(AC_MUTANT_DECODE_MISSING_BARRIER)
    __syncthreads();  // every thread's tile loads read all row offsets
#endif
    load_tile(k_s, a.k, krow_s, a.block_n, a.k_main, a.k_pitch, 0, a.lk, a);
    if (a.rope_cols > 0)
      load_tile(rope_s, a.k, krow_s, a.block_n, a.rope_cols, a.rope_cols, a.dmodel, a.lk, a);
    if (!a.k_as_v) load_tile(v_s, a.v, vrow_s, a.block_n, a.lv, a.v_pitch, 0, a.lv, a);
    __syncthreads();

    // Scores: one warp per token, lanes over the head dims, all heads at once.
    for (int j = warp; j < a.block_n; j += nwarps) {
      if (krow_s[j] < 0) {
        for (int h = lane; h < a.block_h; h += warpSize) p_s[h * a.block_n + j] = -INFINITY;
        continue;
      }
      float part[MAX_H];
      for (int h = 0; h < MAX_H; ++h) part[h] = 0.0f;
      for (int d = lane; d < a.k_main; d += warpSize) {
        const float kd = bits_to_float(k_s[j * a.k_pitch + d], a.q_bf16);
        for (int h = 0; h < MAX_H; ++h)
          if (h < nh) part[h] += bits_to_float(q_s[h * a.lk + d], a.q_bf16) * kd;
      }
      for (int d = lane; d < a.rope_cols; d += warpSize) {
        const float kd = bits_to_float(rope_s[j * a.rope_cols + d], a.q_bf16);
        for (int h = 0; h < MAX_H; ++h)
          if (h < nh) part[h] += bits_to_float(q_s[h * a.lk + a.dmodel + d], a.q_bf16) * kd;
      }
      for (int h = 0; h < MAX_H; ++h) {
        if (h >= nh) break;  // nh is the same for the whole warp
        float s = ac_warp_sum(part[h]) * a.qk_scale;
        if (a.cap > 0.0f) s = soft_cap(s, a.cap);
        if (lane == 0) p_s[h * a.block_n + j] = s;
      }
    }
    __syncthreads();

    // Online softmax: one warp per head. l sums the fp32 p; P.V uses p rounded to the q dtype
    // (tl.dot(p.to(v.dtype), v)) in the grouped kernel.
    for (int h = warp; h < nh; h += nwarps) {
      float* row = p_s + h * a.block_n;
      float mx = -INFINITY;
      for (int j = lane; j < a.block_n; j += warpSize) mx = fmaxf(mx, row[j]);
      mx = ac_warp_max(mx);
#if defined(AC_MUTANT_DECODE_SOFTMAX_NO_MAX)
      // The MHA kernel (fp32 p, MAX_H 1) takes exp(s) with no max subtraction ("logits are
      // small"): 0 stands in for the running max, so p overflows fp32 once a logit passes 88.7.
      const float m_old = m_s[h], m_new = MAX_H == 1 ? 0.0f : fmaxf(m_old, mx);
#else
      const float m_old = m_s[h], m_new = fmaxf(m_old, mx);
#endif
      float sum = 0.0f;
      for (int j = lane; j < a.block_n; j += warpSize) {
        const float e = expf(row[j] - m_new);
        sum += e;
        row[j] = a.round_p ? bits_to_float(float_to_bits(e, a.q_bf16), a.q_bf16) : e;
      }
      sum = ac_warp_sum(sum);
      warp_barrier();  // every lane has read m_s[h] before lane 0 updates it
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();

#if defined(AC_MUTANT_DECODE_STALE_SMEM_ROWS)
    // P.V over the whole tile: rows past the split have p = 0, "so their V does not matter" —
    // unless the unwritten V row holds NaN (0 * NaN = NaN).
    const int valid_n = a.block_n;
#else
    const int valid_n = min(a.block_n, end - n0);
#endif
    for (int h = 0; h < MAX_H; ++h)
      if (h < nh)
        for (int c = 0; c < COLS; ++c) acc[h][c] *= alpha_s[h];
    for (int j = 0; j < valid_n; ++j)
      for (int c = 0; c < COLS; ++c) {
        const int d = tid + c * nt;
        if (d >= a.lv) break;
        // The V tile's own pitch: with k_as_v this is only the K tile when BLOCK_DMODEL ==
        // BLOCK_DV, which the launcher enforces.
        const float vd = bits_to_float(v_tile[j * a.v_pitch + d], a.q_bf16);
        for (int h = 0; h < MAX_H; ++h)
          if (h < nh) acc[h][c] += p_s[h * a.block_n + j] * vd;
      }
    __syncthreads();  // the next step overwrites the tiles
  }

  const int64_t slot_w = a.lv + 1;
  for (int h = 0; h < MAX_H; ++h) {
    if (h >= nh) break;
#if defined(AC_MUTANT_DECODE_PARTIALS_OFFSET_INT32)
    // Seed bug (vLLM's Triton decode, issue 37): the partials row offset in int32 arithmetic,
    // which wraps once batch x heads x splits x (Lv + 1) passes 2^31.
    const uint32_t row = (static_cast<uint32_t>(b) * a.hq + h0 + h) * a.splits + split;
    float* out = a.partials + static_cast<int32_t>(row * static_cast<uint32_t>(slot_w));
#else
    float* out =
        a.partials + ((static_cast<int64_t>(b) * a.hq + h0 + h) * a.splits + split) * slot_w;
#endif
    const float scale = a.acc_scale / l_s[h];
    for (int c = 0; c < COLS; ++c) {
      const int d = tid + c * nt;
      if (d < a.lv) out[d] = acc[h][c] * scale;
    }
    if (tid == 0) out[a.lv] = m_s[h] + logf(l_s[h]);
  }
}

struct Stage2Args {
  const float* partials;
  const int32_t* lens;
  void* o;
  float* lse;
  int64_t lens_s, o_sb, o_sh, lse_sb, lse_sh;
  int hq, lv, splits;
  int host_max_len;  // as in Stage1Args
  bool o_bf16;
};

__global__ void decode_stage2(Stage2Args a) {
  const int b = blockIdx.x, h = blockIdx.y;
#if defined(AC_MUTANT_DECODE_BAKED_SEQ_LENS)
  const int len = min(a.lens[b * a.lens_s], a.host_max_len);
#else
  const int len = a.lens[b * a.lens_s];
#endif
  const int per = (len + a.splits - 1) / a.splits;
  const int64_t slot_w = a.lv + 1;
#if defined(AC_MUTANT_DECODE_PARTIALS_OFFSET_INT32)
  const uint32_t row = (static_cast<uint32_t>(b) * a.hq + h) * a.splits;
  const float* base = a.partials + static_cast<int32_t>(row * static_cast<uint32_t>(slot_w));
#else
  const float* base = a.partials + (static_cast<int64_t>(b) * a.hq + h) * a.splits * slot_w;
#endif
#if defined(AC_MUTANT_DECODE_OUT_OFFSET_INT32)
  // The output row offset in int32: wraps once o's batch stride reaches past element 2^31.
  auto* o = static_cast<uint16_t*>(a.o) + static_cast<int32_t>(b * a.o_sb + h * a.o_sh);
#else
  auto* o = static_cast<uint16_t*>(a.o) + b * a.o_sb + h * a.o_sh;
#endif
  // Every thread merges the same split scalars (identical results) for its own columns;
  // d == lv is the log-sum-exp itself.
#if defined(AC_MUTANT_DECODE_DROP_LAST_SPLIT)
  // Splits counted by floor(len / per): the last, partial split is dropped.
  const int used_splits = per > 0 ? min(a.splits, len / per) : 0;
#else
  const int used_splits = a.splits;
#endif
  for (int d = threadIdx.x; d <= a.lv; d += blockDim.x) {
    float acc = 0.0f, e_sum = 0.0f, e_max = -INFINITY;
    for (int s = 0; s < used_splits; ++s) {
      const int start = per * s, end = min(start + per, len);
      if (end <= start) continue;
      const float lse_s = base[s * slot_w + a.lv];
      const float n = fmaxf(lse_s, e_max);
      const float alpha = expf(e_max - n), beta = expf(lse_s - n);
      if (d < a.lv) acc = acc * alpha + beta * base[s * slot_w + d];
      e_sum = e_sum * alpha + beta;
      e_max = n;
    }
    if (d < a.lv)
      o[d] = float_to_bits(acc / e_sum, a.o_bf16);
    else
      a.lse[b * a.lse_sb + h * a.lse_sh] = e_max + logf(e_sum);
  }
}

using Stage1Fn = void (*)(Stage1Args);
Stage1Fn pick_stage1(int64_t block_h, int cols) {  // cols 3 runs the 4-column kernel
  if (block_h == 1)
    return cols == 1 ? decode_stage1<1, 1> : cols == 2 ? decode_stage1<1, 2> : decode_stage1<1, 4>;
  return cols == 1 ? decode_stage1<16, 1> : cols == 2 ? decode_stage1<16, 2> : decode_stage1<16, 4>;
}

void check(hipError_t e, const char* what) {
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

// Per device, queried once: reading the properties costs about a millisecond per call.
size_t shared_memory_limit() {
  static int cached_dev = -1;
  static size_t cached = 0;
  int dev = 0;
  check(hipGetDevice(&dev), "hipGetDevice");
  if (dev != cached_dev) {
    hipDeviceProp_t prop;
    check(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
#if defined(AC_CUDA)
    cached = prop.sharedMemPerBlockOptin;
#else
    cached = prop.sharedMemPerBlock;
#endif
    cached_dev = dev;
  }
  return cached;
}

// Split partials: grown on demand, kept between calls, NaN-filled before every launch so a split
// that stage 1 skips and stage 2 reads shows up. The fill is queued on the launch stream, so a
// graph capture records it; growing is not allowed while capturing (the runtime's warm-up run
// allocates first).
float* partials_workspace(size_t floats, hipStream_t stream) {
  static float* buf = nullptr;
  static size_t cap = 0;
  if (floats > cap && ack::capturing())
    throw std::runtime_error(
        "decode_attention: the partials workspace would grow during a capture");
  if (floats > cap) {
    if (buf) check(hipFree(buf), "hipFree");
    buf = nullptr;
    check(hipMalloc(reinterpret_cast<void**>(&buf), floats * sizeof(float)), "hipMalloc");
    cap = floats;
  }
  check(hipMemsetAsync(buf, 0xFF, floats * sizeof(float), stream), "hipMemsetAsync");
  return buf;
}

#if defined(AC_MUTANT_DECODE_BAKED_SEQ_LENS)
int host_max_seq_len(const ack::KTensor& lens) {
  std::vector<int32_t> h(static_cast<size_t>(lens.size(0)));
  int m = 0;
  for (size_t b = 0; b < h.size(); ++b) {
    check(hipMemcpy(&h[b], lens.ptr<int32_t>() + static_cast<int64_t>(b) * lens.stride(0), 4,
                    hipMemcpyDeviceToHost),
          "read b_seq_len");
    m = std::max(m, static_cast<int>(h[b]));
  }
  return m;
}
#endif

bool is_16bit_float(const ack::KTensor& t, bool* bf16) {
  *bf16 = t.dtype.code == kDLBfloat;
  return t.dtype.bits == 16 && t.dtype.lanes == 1 &&
         (t.dtype.code == kDLBfloat || t.dtype.code == kDLFloat);
}

std::string str(int64_t v) {
  return std::to_string(v);
}

int align16(int64_t x) {
  return static_cast<int>((x + 15) / 16 * 16);
}

void run_decode_attention(const ack::KParams& p, const ack::KArgs& args) {
  const auto &q = args.get("q"), &k = args.get("k_buffer"), &v = args.get("v_buffer");
  const auto &table = args.get("req_to_token"), &lens = args.get("b_seq_len");
  const auto &o = args.get("o"), &lse = args.get("lse");
  bool q_bf16 = false;
  if (!is_16bit_float(q, &q_bf16)) throw ack::Refusal("tensor 'q' must be bfloat16 or float16");
  ack::expect_dtype(o, "o", q_bf16 ? kDLBfloat : kDLFloat, 16);
  ack::expect_dtype(lse, "lse", kDLFloat, 32);
  ack::expect_dtype(table, "req_to_token", kDLInt, 32);
  ack::expect_dtype(lens, "b_seq_len", kDLInt, 32);
  int fp8_format = -1;
  if (k.dtype.code == kDLUInt && k.dtype.bits == 8) {
    const std::string f = p.s("fp8_format");
    if (f != "e4m3fn" && f != "e4m3fnuz")
      throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
    fp8_format = static_cast<int>(f == "e4m3fn" ? AcFp8::e4m3fn : AcFp8::e4m3fnuz);
  } else {
    ack::expect_dtype(k, "k_buffer", q_bf16 ? kDLBfloat : kDLFloat, 16);
  }
  ack::expect_dtype(v, "v_buffer", static_cast<DLDataTypeCode>(k.dtype.code), k.dtype.bits);
  ack::expect_ndim(q, "q", 3);
  ack::expect_ndim(o, "o", 3);
  ack::expect_ndim(lse, "lse", 2);
  ack::expect_ndim(table, "req_to_token", 2);
  ack::expect_ndim(lens, "b_seq_len", 1);
  if (k.ndim != 3 && k.ndim != 4)
    throw ack::Refusal("k_buffer must be [num_pages, P, Hkv, Lk] or [num_tokens, Hkv, Lk]");
  ack::expect_ndim(v, "v_buffer", k.ndim);
  ack::expect_contiguous_last(q, "q");
  ack::expect_contiguous_last(k, "k_buffer");
  ack::expect_contiguous_last(v, "v_buffer");
  ack::expect_contiguous_last(o, "o");

  const int64_t B = q.size(0), hq = q.size(1), lk = q.size(2);
  const int64_t hkv = k.size(-2), lv = v.size(-1), P = k.ndim == 4 ? k.size(1) : 1;
#if defined(AC_MUTANT_DECODE_SPLIT_BY_BATCH)
  // Seed bug (a launch heuristic like vLLM's): the split count comes from the batch size, fewer
  // splits for a fuller batch, instead of num_kv_splits. Each result stays within budget; a
  // request's bits change with the batch it shares.
  const int64_t S = std::max<int64_t>(1, p.i("num_kv_splits") / std::max<int64_t>(1, q.size(0)));
#else
  const int64_t S = p.i("num_kv_splits");
#endif
  const bool is_mla = p.b("is_mla");
  if (p.i("page_size") != P)
    throw ack::Refusal("page_size " + str(p.i("page_size")) + " does not match k_buffer's " +
                       str(P));
  if (k.size(-1) != lk) throw ack::Refusal("q has Lk " + str(lk) + ", k_buffer " + str(k.size(-1)));
  for (int d = 0; d + 1 < k.ndim; ++d)
    if (k.size(d) != v.size(d)) throw ack::Refusal("k_buffer and v_buffer differ in dim " + str(d));
  if (hkv < 1 || hq % hkv != 0)
    throw ack::Refusal("Hq " + str(hq) + " is not a multiple of Hkv " + str(hkv));
  if (o.size(0) != B || o.size(1) != hq || o.size(2) != lv)
    throw ack::Refusal("o must be [B, Hq, Lv] = [" + str(B) + ", " + str(hq) + ", " + str(lv) +
                       "]");
  if (lse.size(0) != B || lse.size(1) != hq) throw ack::Refusal("lse must be [B, Hq]");
  if (table.size(0) != B || lens.size(0) != B)
    throw ack::Refusal("req_to_token and b_seq_len need one row per request");
  if (S < 1 || S > 65535) throw ack::Refusal("num_kv_splits must be in [1, 65535], got " + str(S));
  const double k_scale = p.f("k_scale"), v_scale = p.f("v_scale");
  if (fp8_format < 0 && (k_scale != 1.0 || v_scale != 1.0))
    throw ack::Refusal("k_scale and v_scale apply to fp8 caches only; this cache is 16-bit");
  if (is_mla) {
    if (lv >= lk)
      throw ack::Refusal("is_mla needs Lv < Lk (V is the latent prefix of K), got " + str(lk) +
                         "/" + str(lv));
    bool same = v.data == k.data;
    for (int d = 0; d + 1 < k.ndim; ++d) same = same && v.stride(d) == k.stride(d);
    if (!same) throw ack::Refusal("is_mla needs v_buffer to be k_buffer[..., :Lv] (same storage)");
    if (v_scale != k_scale) throw ack::Refusal("is_mla: V is K's storage, so v_scale == k_scale");
  }

  const int64_t group = hq / hkv;
  const Tiles t = choose_tiles(lk, lv, is_mla, group);
  const bool k_as_v = t.grouped && is_mla;
#if !defined(AC_MUTANT_DECODE_TILE_FROM_LK)
  if (k_as_v && t.dmodel != t.dv)
    throw ack::Refusal(
        "inconsistent tile: IS_MLA reuses the K tile as V, which needs "
        "BLOCK_DMODEL == BLOCK_DV, got " +
        str(t.dmodel) + " vs " + str(t.dv));
#endif
  if (t.dmodel + t.dpe < lk || t.dv < lv)
    throw ack::Refusal("tile " + str(t.dmodel) + "+" + str(t.dpe) + "/" + str(t.dv) +
                       " does not cover Lk " + str(lk) + " / Lv " + str(lv));
  const int64_t cols = (lv + kThreads - 1) / kThreads;
  if (cols > kMaxCols) throw ack::Refusal("Lv " + str(lv) + " > " + str(kMaxCols * kThreads));
  if (B == 0) return;

  // Staged widths: Q rows hold dims [0, Lk); the K main tile dims [0, min(BLOCK_DMODEL, Lk)) with
  // row pitch BLOCK_DMODEL when V aliases it; the rope tile dims [BLOCK_DMODEL, Lk).
  const int64_t k_main = std::min(t.dmodel, lk);
  const int64_t k_pitch = k_as_v ? t.dmodel : k_main;
  const int64_t rope = std::max<int64_t>(0, std::min(t.dmodel + t.dpe, lk) - t.dmodel);
  const int64_t v_pitch = k_as_v ? t.dv : lv;
  const int64_t valid_block_h = std::min(t.block_h, group);
  // 8-element tile loads: every cache row offset, width and pitch a multiple of 8 elements.
  const int64_t elem = fp8_format >= 0 ? 1 : 2;
  auto rows_aligned = [&](const ack::KTensor& c) {
    bool ok = reinterpret_cast<uintptr_t>(c.data) % static_cast<uintptr_t>(8 * elem) == 0;
    for (int d = 0; d + 1 < c.ndim; ++d) ok = ok && c.stride(d) % 8 == 0;
    return ok;
  };
  const bool vec8 = rows_aligned(k) && rows_aligned(v) && lk % 8 == 0 && lv % 8 == 0 &&
                    t.dmodel % 8 == 0 && k_main % 8 == 0 && k_pitch % 8 == 0 && rope % 8 == 0 &&
                    v_pitch % 8 == 0;
  const int64_t off_k = align16(t.block_h * lk * 2);
  const int64_t off_rope = off_k + align16(t.block_n * k_pitch * 2);
  const int64_t off_v = off_rope + align16(t.block_n * rope * 2);
  const int64_t off_p = off_v + (k_as_v ? 0 : align16(t.block_n * v_pitch * 2));
  const int64_t off_stat = off_p + align16(t.block_h * t.block_n * 4);
  const int64_t off_rows = off_stat + align16(3 * t.block_h * 4);
  const int64_t smem = off_rows + 2 * t.block_n * 8;
  const size_t limit = shared_memory_limit();
  if (static_cast<size_t>(smem) > limit)
    throw ack::Refusal("tile BLOCK_DMODEL " + str(t.dmodel) + " BLOCK_DPE " + str(t.dpe) +
                       " BLOCK_DV " + str(t.dv) + " BLOCK_N " + str(t.block_n) + " needs " +
                       str(smem) + " bytes of shared memory per block, the device allows " +
                       str(static_cast<int64_t>(limit)));

  const int64_t progs_per_kv = (group + valid_block_h - 1) / valid_block_h;
  if (hkv * progs_per_kv > 65535) throw ack::Refusal("too many head groups for grid dim y");
  const auto stream = static_cast<hipStream_t>(ack::launch_stream());
  float* partials = partials_workspace(static_cast<size_t>(B * hq * S * (lv + 1)), stream);

  Stage1Args a{};
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.table = table.ptr<int32_t>();
  a.lens = lens.ptr<int32_t>();
  a.partials = partials;
  a.q_sb = q.stride(0);
  a.q_sh = q.stride(1);
  // 3-D caches are token tables: page = token, page stride = token stride.
  a.k_sp = k.stride(0);
  a.k_st = k.ndim == 4 ? k.stride(1) : k.stride(0);
  a.k_sh = k.stride(-2);
  a.v_sp = v.stride(0);
  a.v_st = v.ndim == 4 ? v.stride(1) : v.stride(0);
  a.v_sh = v.stride(-2);
  a.t_sb = table.stride(0);
  a.t_sc = table.stride(1);
  a.lens_s = lens.stride(0);
  a.hq = static_cast<int>(hq);
  a.group = static_cast<int>(group);
  a.lk = static_cast<int>(lk);
  a.lv = static_cast<int>(lv);
  a.page_size = static_cast<int>(P);
  a.splits = static_cast<int>(S);
  a.block_n = static_cast<int>(t.block_n);
  a.block_h = static_cast<int>(t.block_h);
  a.valid_block_h = static_cast<int>(valid_block_h);
  a.progs_per_kv = static_cast<int>(progs_per_kv);
  a.k_main = static_cast<int>(k_main);
  a.k_pitch = static_cast<int>(k_pitch);
  a.rope_cols = static_cast<int>(rope);
  a.dmodel = static_cast<int>(t.dmodel);
  a.v_pitch = static_cast<int>(v_pitch);
  a.off_k = static_cast<int>(off_k);
  a.off_rope = static_cast<int>(off_rope);
  a.off_v = static_cast<int>(off_v);
  a.off_p = static_cast<int>(off_p);
  a.off_stat = static_cast<int>(off_stat);
  a.off_rows = static_cast<int>(off_rows);
  const bool fp8 = fp8_format >= 0;
#if defined(AC_MUTANT_DECODE_REDERIVE_SM_SCALE)
  // sm_scale ignored and re-derived from the head dim, as if every model used 1/sqrt(Lk).
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(lk));
#else
  const double sm_scale = p.f("sm_scale");
#endif
  a.qk_scale = static_cast<float>(sm_scale) * (fp8 ? static_cast<float>(k_scale) : 1.0f);
  a.acc_scale = fp8 ? static_cast<float>(is_mla && t.grouped ? k_scale : v_scale) : 1.0f;
  a.cap = static_cast<float>(p.f("logit_cap"));
  a.fp8_format = fp8_format;
  a.q_bf16 = q_bf16;
  a.k_as_v = k_as_v;
  a.round_p = t.grouped;
  a.vec8 = vec8;

#if defined(AC_MUTANT_DECODE_BAKED_SEQ_LENS)
  // Seed bug (vLLM #46329, SGLang #27664 class): the wrapper reads b_seq_len to the host at
  // launch and bounds the work by its maximum, a host scalar; a graph captured at shorter
  // lengths replays that bound after the lengths grew.
  a.host_max_len = host_max_seq_len(lens);
#endif
  Stage1Fn stage1 = pick_stage1(t.block_h, static_cast<int>(cols));
#if defined(AC_CUDA)
  // Above 48 KiB NVIDIA needs the opt-in; HIP's limit is the LDS size, no attribute.
  check(hipFuncSetAttribute(reinterpret_cast<const void*>(stage1),
                            hipFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "hipFuncSetAttribute");
#endif
  const dim3 grid1(static_cast<unsigned>(B), static_cast<unsigned>(hkv * progs_per_kv),
                   static_cast<unsigned>(S));
  hipLaunchKernelGGL(stage1, grid1, dim3(kThreads), static_cast<size_t>(smem), stream, a);
  check(hipGetLastError(), "decode_attention stage 1 launch");

  Stage2Args a2{};
  a2.partials = partials;
  a2.lens = lens.ptr<int32_t>();
  a2.o = o.data;
  a2.lse = lse.ptr<float>();
  a2.lens_s = lens.stride(0);
  a2.o_sb = o.stride(0);
  a2.o_sh = o.stride(1);
  a2.lse_sb = lse.stride(0);
  a2.lse_sh = lse.stride(1);
  a2.hq = static_cast<int>(hq);
  a2.lv = static_cast<int>(lv);
  a2.splits = static_cast<int>(S);
  a2.o_bf16 = q_bf16;
  a2.host_max_len = a.host_max_len;
  hipLaunchKernelGGL(decode_stage2, dim3(static_cast<unsigned>(B), static_cast<unsigned>(hq)),
                     dim3(128), 0, stream, a2);
  check(hipGetLastError(), "decode_attention stage 2 launch");
}

// Bitwise: a request's programs (grid x = its index) read only its own row, length and pages,
// with split bounds from its own length and num_kv_splits, and reduce over its tokens in order;
// page ids only form addresses. The split count changes the reduction (not split-invariant).
const ack::KernelRegistrar kRegister("decode_attention", run_decode_attention, ack::kGraphSafe,
                                     "batch-invariant,page-order-invariant");

}  // namespace
