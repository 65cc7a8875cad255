// The sparse indexer with MXFP4 keys and queries (docs/ops/indexer_mxfp4.md), in AITER's paged
// MXFP4 cache layout: a page of S entries is S * D/2 bytes of packed e2m1 values (element 2i in the
// low nibble), then S * D/32 e8m0 scales, each region in token order or preshuffled into tiles of
// n_per_tile tokens (AITER pa_mqa_logits_mxfp4.py preshuffle_values / preshuffle_scales mode 1).
//
// indexer_mxfp4_k_cache: one thread per 32-element block quantizes a bf16 K row (scale rule a
// parameter, elements nearest-even) into its slot. indexer_mxfp4_logits_decode: one thread per
// key position; each 32-element block's e2m1 products sum exactly in fp32 (multiples of 1/4, at
// most 32 * 36) and are scaled by 2^(sq + sk - 254) with ldexpf, so no scale is ever formed alone.
//
// Parameter format = "nvfp4" (with global_scale, the cache's fp32 tensor scale): NVFP4 keys, the
// page holding S * D/2 value bytes then S * D/16 e4m3fn scales in token order. The writer computes
// in double (as the reference does): scale byte = e4m3(amax / (6 * global)) nearest even,
// saturating at 448; element = e2m1(x / (e4m3 * global)) nearest even (0 when the byte is 0). The
// reader sums each 16-element block's e2m1 products exactly, multiplies by the e4m3 scale (exact)
// and 2^(sq - 127), and applies the global scale once to the dot product.
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

constexpr int kBlock = 32;  // MXFP4 elements per scale
constexpr int kShuffleWidth = 16;
constexpr int kWarpOrder = 64;  // the scale shuffle spreads a tile over 64 lanes (AITER)
constexpr int kMaxHeadDim = 512;
constexpr int kMaxHeads = 128;

struct Geometry {
  int head_dim, page_size, n_per_tile;  // n_per_tile 0: natural order
  int block;                            // elements per scale: 32 (MXFP4) or 16 (NVFP4)
};

AC_HOST_DEVICE int64_t value_offset(const Geometry& g, int64_t t, int64_t c) {
  if (g.n_per_tile == 0) return t * (g.head_dim / 2) + c;
  const int64_t npt = g.n_per_tile, groups = g.head_dim / 2 / kShuffleWidth;
  return (((t / npt) * groups + c / kShuffleWidth) * npt + t % npt) * kShuffleWidth +
         c % kShuffleWidth;
}

AC_HOST_DEVICE int64_t scale_offset(const Geometry& g, int64_t t, int64_t s) {
  const int64_t base = static_cast<int64_t>(g.page_size) * (g.head_dim / 2);
  const int64_t ns = g.head_dim / g.block;
#if defined(AC_MUTANT_MXFP4_SCALE_WRONG_BLOCK)
  s = (s + 1) % ns;  // seed: the scale slice of the neighbouring block
#endif
  if (g.n_per_tile == 0) return base + t * ns + s;
  const int64_t npt = g.n_per_tile, s_lo = kWarpOrder / npt, s_hi = ns / s_lo;
  return base + (((t / npt) * s_lo + s % s_lo) * npt + t % npt) * s_hi + s / s_lo;
}

AC_DEVICE float e2m1_value(uint32_t code) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = magnitude[code & 7u];
  return (code & 8u) ? -v : v;
}

// Nearest, ties to the even code; saturates at 6; the sign of a zero is kept.
AC_DEVICE uint8_t e2m1_code(float v) {
  const float a = fabsf(v);
  uint32_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return static_cast<uint8_t>(c | (signbit(v) ? 8u : 0u));
}

enum class ScaleRule : int { ceil, ocp_floor, even };

// The unbiased scale exponent of a block with largest magnitude amax (finite, > 0).
AC_DEVICE int scale_exponent(float amax, ScaleRule rule) {
  int k = 0;
  const float m2 = 2.0f * frexpf(amax, &k);  // amax = m2 * 2^(k-1), m2 in [1, 2)
  int e = k - 3;                             // floor(log2 amax) - 2
#if defined(AC_MUTANT_MXFP4_SCALE_FLOOR)
  // Seed (vLLM #43557): floor(log2(amax / 6)) instead of ceil: one power of two too small
  // unless amax / 6 is a power of two, so the block's largest elements saturate at 6.
  (void)rule;
  if (m2 < 1.5f) e -= 1;
#else
  if (rule == ScaleRule::ceil && m2 > 1.5f) e += 1;
  if (rule == ScaleRule::even && m2 >= 1.75f) e += 1;
#endif
  return e;
}

// The first byte of page `page`: 64-bit, since a cache may pass 2^32 bytes (issue 37).
AC_DEVICE uint8_t* page_at(const uint8_t* cache, int64_t page, int64_t page_stride) {
#if defined(AC_MUTANT_INDEXER_MXFP4_PAGE_OFFSET_INT32)
  // Seed bug: page * page_stride in int32, which wraps once the cache passes 2^31 bytes.
  return const_cast<uint8_t*>(cache) +
         static_cast<int32_t>(static_cast<uint32_t>(page) * static_cast<uint32_t>(page_stride));
#else
  return const_cast<uint8_t*>(cache) + page * page_stride;
#endif
}

// Token i's k row: 64-bit, since a row may lie past element 2^31 (issue 37).
AC_DEVICE const uint16_t* k_row(const uint16_t* k, int64_t i, int64_t k_row_stride) {
#if defined(AC_MUTANT_INDEXER_MXFP4_K_OFFSET_INT32)
  // Seed bug: the row offset in int32, which wraps once a row passes element 2^31.
  return k + static_cast<int32_t>(static_cast<uint32_t>(i) * static_cast<uint32_t>(k_row_stride));
#else
  return k + i * k_row_stride;
#endif
}

__global__ void mxfp4_quant_and_cache(const uint16_t* k, int64_t k_row_stride, const int64_t* slots,
                                      int64_t slot_stride, int tokens, uint8_t* cache,
                                      int64_t page_stride, int64_t capacity, Geometry g,
                                      ScaleRule rule) {
  const int i = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(threadIdx.x);
  if (i >= tokens || b >= g.head_dim / kBlock) return;
  const int64_t slot = slots[i * slot_stride];
  if (slot < 0 || slot >= capacity) return;  // padding token (the host checked the upper bound)
  const uint16_t* row = k_row(k, i, k_row_stride) + b * kBlock;
  float amax = 0.0f;
  for (int d = 0; d < kBlock; ++d) amax = fmaxf(amax, fabsf(ac_bf16_to_float(row[d])));
  int e = amax > 0.0f ? scale_exponent(amax, rule) : 0;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  uint8_t* page = page_at(cache, slot / g.page_size, page_stride);
  const int64_t t = slot % g.page_size;
  page[scale_offset(g, t, b)] = static_cast<uint8_t>(e + 127);
  for (int d = 0; d < kBlock; d += 2) {
    const uint8_t lo = e2m1_code(ldexpf(ac_bf16_to_float(row[d]), -e));
    const uint8_t hi = e2m1_code(ldexpf(ac_bf16_to_float(row[d + 1]), -e));
    page[value_offset(g, t, (b * kBlock + d) / 2)] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// ---- NVFP4 ----

constexpr int kNvBlock = 16;  // NVFP4 elements per e4m3 scale

// e4m3fn (bias 7, max 448, 0x7F NaN) of a finite v >= 0: nearest, ties to even, saturating at 448.
AC_DEVICE uint8_t e4m3_byte(double v) {
  if (v >= 448.0) return 0x7E;
#if defined(AC_MUTANT_NVFP4_E4M3_SCALE_TRUNCATED)
  // Seed: the scale rounded toward zero (a truncating conversion), not to nearest even.
  const auto to_step = [](double x) { return floor(x); };
#else
  const auto to_step = [](double x) { return rint(x); };  // default mode: nearest even
#endif
  if (v < 0.015625) return static_cast<uint8_t>(to_step(v * 512.0));  // subnormals: m * 2^-9
  int k = 0;
  (void)frexp(v, &k);  // v in [2^(k-1), 2^k)
  const int e = k - 1;
  const int m = static_cast<int>(to_step(ldexp(v, 3 - e)));  // in [8, 16]
  return static_cast<uint8_t>(m == 16 ? ((e + 8) << 3) : (((e + 7) << 3) | (m - 8)));
}

AC_DEVICE float e4m3_value(uint32_t byte) {
  const uint32_t e = (byte >> 3) & 15u, m = byte & 7u;
  if (e == 15u && m == 7u) return __int_as_float(0x7fc00000);
  const float v = e == 0 ? ldexpf(static_cast<float>(m), -9)
                         : ldexpf(static_cast<float>(8u + m), static_cast<int>(e) - 10);
  return (byte & 0x80u) ? -v : v;
}

// Nearest, ties to the even code, in double (the reference's rounding of x / step).
AC_DEVICE uint8_t e2m1_code_double(double v) {
  const double a = fabs(v);
  uint32_t c = a <= 0.25   ? 0
               : a < 0.75  ? 1
               : a <= 1.25 ? 2
               : a < 1.75  ? 3
               : a <= 2.5  ? 4
               : a < 3.5   ? 5
               : a <= 5.0  ? 6
                           : 7;
  return static_cast<uint8_t>(c | (signbit(v) ? 8u : 0u));
}

__global__ void nvfp4_quant_and_cache(const uint16_t* k, int64_t k_row_stride, const int64_t* slots,
                                      int64_t slot_stride, int tokens, uint8_t* cache,
                                      int64_t page_stride, int64_t capacity, Geometry g,
                                      float global) {
  const int i = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(threadIdx.x);
  if (i >= tokens || b >= g.head_dim / kNvBlock) return;
  const int64_t slot = slots[i * slot_stride];
  if (slot < 0 || slot >= capacity) return;
  const uint16_t* row = k_row(k, i, k_row_stride) + b * kNvBlock;
  double amax = 0.0;
  for (int d = 0; d < kNvBlock; ++d) amax = fmax(amax, fabs(double(ac_bf16_to_float(row[d]))));
#if defined(AC_MUTANT_NVFP4_GLOBAL_SCALE_MISSING)
  // Seed: the writer ignores the global scale (scales and elements as if it were 1).
  const double gs = 1.0;
  (void)global;
#else
  const double gs = global;
#endif
  const uint8_t byte = e4m3_byte(amax / (6.0 * gs));
  const double step = static_cast<double>(e4m3_value(byte)) * gs;  // exact: 4 + 24 bits
  uint8_t* page = page_at(cache, slot / g.page_size, page_stride);
  const int64_t t = slot % g.page_size;
  page[scale_offset(g, t, b)] = byte;
  for (int d = 0; d < kNvBlock; d += 2) {
    const uint8_t lo = step == 0 ? 0 : e2m1_code_double(ac_bf16_to_float(row[d]) / step);
    const uint8_t hi = step == 0 ? 0 : e2m1_code_double(ac_bf16_to_float(row[d + 1]) / step);
    page[value_offset(g, t, (b * kNvBlock + d) / 2)] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

int64_t positive(int64_t v, const char* what) {
  if (v < 1) throw ack::Refusal(std::string(what) + " must be >= 1, got " + std::to_string(v));
  return v;
}

bool is_nvfp4(const ack::KParams& p) {
  if (!p.has("format") || p.s("format") == "mxfp4") return false;
  if (p.s("format") == "nvfp4") return true;
  throw ack::Refusal("unknown format '" + p.s("format") + "'");
}

float global_scale_of(const ack::KParams& p) {
  const double g = p.f("global_scale");
  if (!(g > 0 && g < 3.4e38)) throw ack::Refusal("global_scale must be finite and > 0");
  return static_cast<float>(g);
}

Geometry geometry_of(const ack::KParams& p, const ack::KTensor& cache, int64_t head_dim) {
  ack::expect_dtype(cache, "kv_cache", kDLUInt, 8);
  ack::expect_ndim(cache, "kv_cache", 3);
  if (head_dim < kBlock || head_dim % kBlock != 0 || head_dim > kMaxHeadDim)
    throw ack::Refusal("head_dim must be a multiple of 32 in [32, 512], got " +
                       std::to_string(head_dim));
  const int block = is_nvfp4(p) ? kNvBlock : kBlock;
  const Geometry g{static_cast<int>(head_dim), static_cast<int>(positive(cache.size(1), "page")),
                   static_cast<int>(p.i("n_per_tile")), block};
  const int64_t entry = head_dim / 2 + head_dim / block, ns = head_dim / block;
  if (cache.size(2) != entry || cache.stride(2) != 1 || cache.stride(1) != entry ||
      cache.stride(0) < g.page_size * entry)
    throw ack::Refusal("kv_cache must be [pages, page_size, D/2 + D/block] with contiguous pages");
  if (block == kNvBlock && g.n_per_tile != 0)
    throw ack::Refusal("nvfp4 pages are in natural order (n_per_tile 0)");
  if (g.n_per_tile != 0 && ((g.n_per_tile != 16 && g.n_per_tile != 32) ||
                            g.page_size % g.n_per_tile != 0 || ns < kWarpOrder / g.n_per_tile))
    throw ack::Refusal("n_per_tile " + std::to_string(g.n_per_tile) + " does not fit page " +
                       std::to_string(g.page_size) + " and head_dim " + std::to_string(head_dim));
  return g;
}

void finish(const char* what) {
  hipError_t e = hipGetLastError();
  if (e == hipSuccess) e = hipDeviceSynchronize();
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

ScaleRule scale_rule_of(const ack::KParams& p) {
  const std::string& r = p.s("scale_rule");
  if (r == "ceil") return ScaleRule::ceil;
  if (r == "ocp_floor") return ScaleRule::ocp_floor;
  if (r == "even") return ScaleRule::even;
  throw ack::Refusal("unknown scale_rule '" + r + "'");
}

void run_k_cache(const ack::KParams& p, const ack::KArgs& a) {
  const auto& k = a.get("k");
  const auto& slots = a.get("slot_mapping");
  const auto& cache = a.get("kv_cache");
  ack::expect_dtype(k, "k", kDLBfloat, 16);
  ack::expect_ndim(k, "k", 2);
  ack::expect_contiguous_last(k, "k");
  ack::expect_dtype(slots, "slot_mapping", kDLInt, 64);
  ack::expect_ndim(slots, "slot_mapping", 1);
  if (k.size(0) < slots.size(0)) throw ack::Refusal("k has fewer rows than slot_mapping");
  const Geometry g = geometry_of(p, cache, k.size(1));
  const int tokens = static_cast<int>(slots.size(0));
  if (g.block == kNvBlock) {
    const float global = global_scale_of(p);
    if (tokens == 0) return;
    hipLaunchKernelGGL(nvfp4_quant_and_cache, dim3(tokens), dim3(g.head_dim / kNvBlock), 0, 0,
                       k.ptr<uint16_t>(), k.stride(0), slots.ptr<int64_t>(), slots.stride(0),
                       tokens, cache.ptr<uint8_t>(), cache.stride(0), cache.size(0) * g.page_size,
                       g, global);
    finish("nvfp4_quant_and_cache");
    return;
  }
  const ScaleRule rule = scale_rule_of(p);
  if (tokens == 0) return;
  hipLaunchKernelGGL(mxfp4_quant_and_cache, dim3(tokens), dim3(g.head_dim / kBlock), 0, 0,
                     k.ptr<uint16_t>(), k.stride(0), slots.ptr<int64_t>(), slots.stride(0), tokens,
                     cache.ptr<uint8_t>(), cache.stride(0), cache.size(0) * g.page_size, g, rule);
  finish("mxfp4_quant_and_cache");
}

// ---- paged logits ----

struct LogitsArgs {
  const uint8_t* q;
  const uint8_t* q_scale;
  int64_t q_sb, q_sn, q_sh, qs_sb, qs_sn, qs_sh;  // strides in bytes (innermost dim contiguous)
  const uint8_t* cache;
  int64_t page_stride, num_pages;
  Geometry g;
  const float* w;
  int64_t w_rs;
  const int32_t* lens;
  int64_t lens_s;
  const int32_t* table;
  int64_t table_rs, table_cs, table_w;
  float* out;
  int64_t out_rs, width;
  int heads, next_n;
  float global;  // NVFP4 keys (g.block 16) only
};

AC_DEVICE uint32_t nibble(uint8_t byte, int index) {
  return index == 0 ? (byte & 15u) : (byte >> 4);
}

// A cache byte's element 2i + index. Its own function: swapping the nibbles of q and K alike
// leaves every dot product unchanged, so the bug that matters is a reader whose cache order
// differs from the query's (and the writer's).
AC_DEVICE uint32_t cache_nibble(uint8_t byte, int index) {
#if defined(AC_MUTANT_MXFP4_NIBBLE_SWAP)
  index ^= 1;  // seed: cache element 2i read from the high nibble, the query's from the low one
#endif
  return nibble(byte, index);
}

// sum * 2^(sq - 127) * 2^(sk - 127), exact while the result is an fp32 number; NaN for 0xFF.
AC_DEVICE float scaled(float sum, uint32_t sq, uint32_t sk) {
  if (sq == 0xFFu || sk == 0xFFu) return __int_as_float(0x7fc00000);
#if defined(AC_MUTANT_MXFP4_E8M0_ZERO_BYTE)
  // Seed (vLLM #46676 review): each scale built as a float from `byte << 23`, so byte 0 (2^-127,
  // an fp32 subnormal) becomes 0.
  return sum * __int_as_float(static_cast<int>(sq << 23)) *
         __int_as_float(static_cast<int>(sk << 23));
#else
  return ldexpf(sum, static_cast<int>(sq) + static_cast<int>(sk) - 254);
#endif
}

// q (MXFP4) . k (NVFP4) of one head: each 16-element block's e2m1 products sum exactly (multiples
// of 1/4 up to 16 * 36), times the block's e4m3 scale (exact in fp32) and q's 2^(sq - 127); the
// global scale multiplies the sum once.
AC_DEVICE float nvfp4_dot(const LogitsArgs& a, const uint8_t* qh, const uint8_t* qsh,
                          const uint8_t* base, int64_t t) {
  const int nb = a.g.head_dim / kNvBlock;
  float dot = 0.0f;
  for (int s = 0; s < nb; ++s) {
    float block = 0.0f;
    for (int c = s * kNvBlock / 2; c < (s + 1) * kNvBlock / 2; ++c) {
      const uint8_t qb = qh[c], kb = base[value_offset(a.g, t, c)];
      block += e2m1_value(nibble(qb, 0)) * e2m1_value(cache_nibble(kb, 0));
      block += e2m1_value(nibble(qb, 1)) * e2m1_value(cache_nibble(kb, 1));
    }
#if defined(AC_MUTANT_NVFP4_SCALE_WRONG_BLOCK)
    const int ks = (s * kNvBlock) / kBlock;  // seed: the scale index of a 32-element block
#else
    const int ks = s;
#endif
    const uint32_t sq = qsh[(s * kNvBlock) / kBlock];
    const float kscale = e4m3_value(base[scale_offset(a.g, t, ks)]);
    dot += sq == 0xFFu ? __int_as_float(0x7fc00000)
                       : ldexpf(block * kscale, static_cast<int>(sq) - 127);
  }
  dot *= a.global;
#if defined(AC_MUTANT_NVFP4_GLOBAL_SCALE_TWICE)
  dot *= a.global;  // seed: the global scale applied again (once folded into the scales, once here)
#endif
  return dot;
}

__global__ void mxfp4_paged_logits(LogitsArgs a) {
  const int r = static_cast<int>(blockIdx.x);
  const int b = r / a.next_n, n = r % a.next_n;
  const int64_t p = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (p >= a.width) return;
  const int64_t L = a.lens[b * a.lens_s];
  int64_t end = L - a.next_n + n + 1;
  end = end < 0 ? 0 : (end > a.width ? a.width : end);
  float* out = a.out + r * a.out_rs;
  if (p >= end) {
    out[p] = -__int_as_float(0x7f800000);
    return;
  }
  const int64_t col = p / a.g.page_size;
  const int64_t page = col < a.table_w ? a.table[b * a.table_rs + col * a.table_cs] : -1;
  if (page < 0 || page >= a.num_pages) {  // a bad table entry is the caller's; never read past
    out[p] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* base = page_at(a.cache, page, a.page_stride);
  const int64_t t = p % a.g.page_size;
  const int D = a.g.head_dim, ns = D / kBlock;
  float acc = 0.0f;
  for (int h = 0; h < a.heads; ++h) {
    const uint8_t* qh = a.q + b * a.q_sb + n * a.q_sn + h * a.q_sh;
    const uint8_t* qsh = a.q_scale + b * a.qs_sb + n * a.qs_sn + h * a.qs_sh;
    float dot = 0.0f;
    if (a.g.block == kNvBlock) {
      dot = nvfp4_dot(a, qh, qsh, base, t);
    } else {
      for (int s = 0; s < ns; ++s) {
        float block = 0.0f;  // exact: multiples of 1/4 up to 32 * 36
        for (int c = s * kBlock / 2; c < (s + 1) * kBlock / 2; ++c) {
          const uint8_t qb = qh[c], kb = base[value_offset(a.g, t, c)];
          block += e2m1_value(nibble(qb, 0)) * e2m1_value(cache_nibble(kb, 0));
          block += e2m1_value(nibble(qb, 1)) * e2m1_value(cache_nibble(kb, 1));
        }
        dot += scaled(block, qsh[s], base[scale_offset(a.g, t, s)]);
      }
    }
    acc += a.w[r * a.w_rs + h] * fmaxf(dot, 0.0f);
  }
  out[p] = acc;
}

void run_logits(const ack::KParams& p, const ack::KArgs& args) {
  const auto& q = args.get("q");
  const auto& qs = args.get("q_scale");
  const auto& cache = args.get("kv_cache");
  const auto& w = args.get("weights");
  const auto& lens = args.get("context_lens");
  const auto& table = args.get("block_table");
  const auto& out = args.get("logits");
  ack::expect_dtype(q, "q", kDLUInt, 8);
  ack::expect_ndim(q, "q", 4);
  ack::expect_contiguous_last(q, "q");
  ack::expect_dtype(qs, "q_scale", kDLUInt, 8);
  ack::expect_ndim(qs, "q_scale", 4);
  ack::expect_contiguous_last(qs, "q_scale");
  ack::expect_dtype(w, "weights", kDLFloat, 32);
  ack::expect_ndim(w, "weights", 2);
  ack::expect_contiguous_last(w, "weights");
  ack::expect_dtype(lens, "context_lens", kDLInt, 32);
  ack::expect_ndim(lens, "context_lens", 1);
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  ack::expect_dtype(out, "logits", kDLFloat, 32);
  ack::expect_ndim(out, "logits", 2);
  ack::expect_contiguous_last(out, "logits");
  const int64_t B = q.size(0), NN = q.size(1), H = q.size(2), D = 2 * q.size(3);
  const Geometry g = geometry_of(p, cache, D);
  if (H < 1 || H > kMaxHeads)
    throw ack::Refusal("heads " + std::to_string(H) + " outside [1, 128]");
  positive(NN, "next_n");
  if (qs.size(0) != B || qs.size(1) != NN || qs.size(2) != H || qs.size(3) != D / kBlock)
    throw ack::Refusal("q_scale must be [B, next_n, H, D/32]");
  if (w.size(0) != B * NN || w.size(1) != H) throw ack::Refusal("weights must be [B*next_n, H]");
  if (lens.size(0) != B || table.size(0) != B)
    throw ack::Refusal("context_lens and block_table need B rows");
  if (out.size(0) != B * NN) throw ack::Refusal("logits must have B*next_n rows");
  const int64_t rows = B * NN, width = out.size(1);
  if (rows == 0 || width == 0) return;
  LogitsArgs a{};
  a.q = q.ptr<uint8_t>();
  a.q_sb = q.stride(0), a.q_sn = q.stride(1), a.q_sh = q.stride(2);
  a.q_scale = qs.ptr<uint8_t>();
  a.qs_sb = qs.stride(0), a.qs_sn = qs.stride(1), a.qs_sh = qs.stride(2);
  a.cache = cache.ptr<uint8_t>();
  a.page_stride = cache.stride(0), a.num_pages = cache.size(0), a.g = g;
  a.w = w.ptr<float>(), a.w_rs = w.stride(0);
  a.lens = lens.ptr<int32_t>(), a.lens_s = lens.stride(0);
  a.table = table.ptr<int32_t>();
  a.table_rs = table.stride(0), a.table_cs = table.stride(1), a.table_w = table.size(1);
  a.out = out.ptr<float>(), a.out_rs = out.stride(0), a.width = width;
  a.heads = static_cast<int>(H), a.next_n = static_cast<int>(NN);
  a.global = g.block == kNvBlock ? global_scale_of(p) : 1.0f;
  const int threads = 128;
  hipLaunchKernelGGL(
      mxfp4_paged_logits,
      dim3(static_cast<unsigned>(rows), static_cast<unsigned>((width + threads - 1) / threads)),
      dim3(threads), 0, 0, a);
  finish("mxfp4_paged_logits");
}

const ack::KernelRegistrar kRegisterKCache("indexer_mxfp4_k_cache", run_k_cache);
const ack::KernelRegistrar kRegisterLogits("indexer_mxfp4_logits_decode", run_logits);

}  // namespace
