// kv_gather (cp_mha_gather_cache, docs/ops/kv_gather.md): one workgroup per (output token, KV
// head), lanes copy the head's D elements in vectors of up to 16 bytes. Every cache offset goes
// through the view's real strides (block, slot, head, and the SHUFFLE tile strides): hybrid
// attention+Mamba caches have a block stride of 2H, and a padded cache has no contiguous dimension
// but the last. fp8 caches are dequantized with the per-tensor scale in fp32 and rounded once to
// the output dtype.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

enum CacheLayout : int { kNhd = 0, kShuffleK = 1, kShuffleV = 2 };

struct GatherCache {
  const uint8_t* base;  // element 0 of the view
  int64_t stride[5];    // in elements; NHD uses the first 4
  int layout;
  int64_t P, Hkv, D, x;
};

// Element offset of (block, slot, head, dim) in the cache view.
AC_DEVICE int64_t cache_offset(const GatherCache& c, int64_t blk, int64_t s, int64_t h, int64_t d) {
#ifdef AC_MUTANT_KV_GATHER_CONTIGUOUS_STRIDES
  // Seed bug (pre-#37228): offsets from the shape, as if the cache were contiguous.
  const int64_t H = c.P * c.Hkv * c.D;
  if (c.layout == kNhd) return blk * H + s * (c.Hkv * c.D) + h * c.D + d;
  if (c.layout == kShuffleK)
    return blk * H + h * (c.D * c.P) + (d / c.x) * (c.P * c.x) + s * c.x + d % c.x;
  return blk * H + h * (c.D * c.P) + (s / c.x) * (c.D * c.x) + d * c.x + s % c.x;
#else
  const int64_t* st = c.stride;
  int64_t off;
  if (c.layout == kNhd)
    off = blk * st[0] + s * st[1] + h * st[2] + d * st[3];
  else if (c.layout == kShuffleK)
    off = blk * st[0] + h * st[1] + (d / c.x) * st[2] + s * st[3] + (d % c.x) * st[4];
  else
    off = blk * st[0] + h * st[1] + (s / c.x) * st[2] + d * st[3] + (s % c.x) * st[4];
#if defined(AC_MUTANT_KV_GATHER_OFFSET_INT32)
  // Seed bug (issue 14): the element offset kept in int32, which wraps once a cache passes 2^31
  // elements (2^31 bytes of fp8, 2^32 of bf16).
  off = static_cast<int32_t>(static_cast<uint32_t>(off));
#endif
  return off;
#endif
}

// An fp8 cache code as a float, by the format's definition, special codes included.
AC_DEVICE float dequant_code(uint8_t b, AcFp8 fmt) {
#if defined(AC_MUTANT_KV_GATHER_FP8_ORDINARY_ONLY)
  // Seed bug (issue 14): a dequant exact on every ordinary code but wrong at the top of the
  // format: the saturation codes read as the next smaller value, fnuz's NaN 0x80 as -0.
  const uint8_t top = fmt == AcFp8::e4m3fn ? 0x7E : 0x7F;
  if ((b & 0x7F) >= top) b = static_cast<uint8_t>((b & 0x80) | (top - 1));
  if (fmt == AcFp8::e4m3fnuz && b == 0x80) return -0.0f;
#endif
  return ac_fp8_to_float(b, fmt);
}

// Native vector types, so aligned copies become single wide loads and stores.
template <int Bytes>
struct VecOf;
template <>
struct VecOf<1> {
  using type = uint8_t;
};
template <>
struct VecOf<2> {
  using type = uint16_t;
};
template <>
struct VecOf<4> {
  using type = uint32_t;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<16> {
  using type = uint4;
};

struct GatherMeta {
  const int32_t* block_tables;
  int64_t table_row_stride, table_col_stride;
  const int32_t* cu_seqlens_kv;
  const int32_t* token_to_batch;
  const int32_t* seq_starts;
};

// VEC elements per lane step; ES_IN bytes per cache element; DEQUANT: fp8 -> 16-bit output.
template <int VEC, int ES_IN, bool DEQUANT>
__global__ void gather_kv(GatherCache cache, uint8_t* out, int64_t out_token_stride,
                          int64_t out_head_stride, GatherMeta m, const float* scale, int fp8_format,
                          int out_is_bf16) {
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  // Steps 1-2 of the procedure: request, logical position, physical block and slot.
  const int32_t b = m.token_to_batch[t];
  const int64_t pos = t - m.cu_seqlens_kv[b] + m.seq_starts[b];
#if defined(AC_MUTANT_KV_GATHER_TABLE_UNIT_STRIDE)
  // Seed bug: the block table's innermost stride taken as 1 (row stride honoured).
  const int64_t blk = m.block_tables[b * m.table_row_stride + pos / cache.P];
#else
  const int64_t blk = m.block_tables[b * m.table_row_stride + (pos / cache.P) * m.table_col_stride];
#endif
  const int64_t s = pos % cache.P;
  const float sc = DEQUANT ? *scale : 1.0f;
  for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * VEC; d0 < cache.D;
       d0 += static_cast<int64_t>(blockDim.x) * VEC) {
    const uint8_t* src = cache.base + cache_offset(cache, blk, s, h, d0) * ES_IN;
#if defined(AC_MUTANT_KV_GATHER_OUT_OFFSET_INT32)
    // The output element offset in int32: wraps once key / value reach past element 2^31.
    uint8_t* dst = out + static_cast<int64_t>(static_cast<int32_t>(t * out_token_stride +
                                                                   h * out_head_stride + d0)) *
                             2;
#else
    uint8_t* dst = out + (t * out_token_stride + h * out_head_stride + d0) * 2;
#endif
    if constexpr (!DEQUANT) {
      using V = typename VecOf<VEC * ES_IN>::type;
      *reinterpret_cast<V*>(dst) = *reinterpret_cast<const V*>(src);
    } else {
      using VIn = typename VecOf<VEC>::type;
      using VOut = typename VecOf<VEC * 2>::type;
      const VIn packed = *reinterpret_cast<const VIn*>(src);
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(&packed);
      VOut result;
      uint16_t* halves = reinterpret_cast<uint16_t*>(&result);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float v = dequant_code(codes[i], static_cast<AcFp8>(fp8_format)) * sc;
        halves[i] = out_is_bf16 ? ac_float_to_bf16(v) : ac_float_to_f16(v);
      }
      *reinterpret_cast<VOut*>(dst) = result;
    }
  }
}

bool is16(const ack::KTensor& t) {
  return (t.dtype.code == kDLBfloat || t.dtype.code == kDLFloat) && t.dtype.bits == 16;
}
bool same_dtype(const ack::KTensor& a, const ack::KTensor& b) {
  return a.dtype.code == b.dtype.code && a.dtype.bits == b.dtype.bits;
}
std::string shape_text(const ack::KTensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "]";
}

GatherCache describe_cache(const ack::KTensor& t, int layout, int64_t P, int64_t Hkv, int64_t D,
                           int64_t x) {
  GatherCache c{};
  c.base = static_cast<const uint8_t*>(t.data);
  for (int i = 0; i < t.ndim; ++i) c.stride[i] = t.stride(i);
  c.layout = layout;
  c.P = P;
  c.Hkv = Hkv;
  c.D = D;
  c.x = x;
  return c;
}

// Widest vector (elements) whose every start offset is aligned: the run along d that is
// contiguous, every other stride, and both base pointers must be multiples of it.
int pick_vec(const GatherCache& c, int es_in, const ack::KTensor& out, int max_vec) {
  int64_t run;  // elements of d contiguous in memory, starting at a multiple of the vector
  int run_dim;  // the stride that steps along the run
  if (c.layout == kNhd) {
    run = c.stride[3] == 1 ? c.D : 1;
    run_dim = 3;
  } else if (c.layout == kShuffleK) {
    run = c.stride[4] == 1 ? c.x : 1;
    run_dim = 4;
  } else {
    run = 1;
    run_dim = -1;
  }
  const int ndim = c.layout == kNhd ? 4 : 5;
  for (int v = max_vec; v > 1; v /= 2) {
    bool ok = run % v == 0 && c.D % v == 0 && out.stride(0) % v == 0 && out.stride(1) % v == 0;
    for (int i = 0; i < ndim; ++i) ok = ok && (i == run_dim || c.stride[i] % v == 0);
    ok = ok && reinterpret_cast<uintptr_t>(c.base) % static_cast<uintptr_t>(v * es_in) == 0;
    ok = ok && reinterpret_cast<uintptr_t>(out.data) % static_cast<uintptr_t>(v * 2) == 0;
    if (ok) return v;
  }
  return 1;
}

template <int ES_IN, bool DEQUANT>
void launch_vec(int vec, dim3 grid, dim3 block, const GatherCache& c, const ack::KTensor& out,
                const GatherMeta& m, const float* scale, int fmt, int out_bf16) {
  uint8_t* o = static_cast<uint8_t*>(out.data);
  const int64_t os0 = out.stride(0), os1 = out.stride(1);
  switch (vec) {
    case 8:
      hipLaunchKernelGGL((gather_kv<8, ES_IN, DEQUANT>), grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), c, o, os0, os1, m, scale,
                         fmt, out_bf16);
      break;
    case 4:
      hipLaunchKernelGGL((gather_kv<4, ES_IN, DEQUANT>), grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), c, o, os0, os1, m, scale,
                         fmt, out_bf16);
      break;
    case 2:
      hipLaunchKernelGGL((gather_kv<2, ES_IN, DEQUANT>), grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), c, o, os0, os1, m, scale,
                         fmt, out_bf16);
      break;
    default:
      hipLaunchKernelGGL((gather_kv<1, ES_IN, DEQUANT>), grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), c, o, os0, os1, m, scale,
                         fmt, out_bf16);
  }
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess)
    throw std::runtime_error(std::string("gather_kv launch: ") + hipGetErrorString(e));
}

void run_kv_gather(const ack::KParams& p, const ack::KArgs& a) {
  const auto& kc = a.get("key_cache");
  const auto& vc = a.get("value_cache");
  const auto& table = a.get("block_tables");
  const auto& cu = a.get("cu_seqlens_kv");
  const auto& t2b = a.get("token_to_batch");
  const auto& starts = a.get("seq_starts");
  const auto& key = a.get("key");
  const auto& value = a.get("value");
  ack::expect_dtype(table, "block_tables", kDLInt, 32);
  ack::expect_dtype(cu, "cu_seqlens_kv", kDLInt, 32);
  ack::expect_dtype(t2b, "token_to_batch", kDLInt, 32);
  ack::expect_dtype(starts, "seq_starts", kDLInt, 32);
  ack::expect_ndim(table, "block_tables", 2);
  if (cu.stride(0) != 1 || t2b.stride(0) != 1 || starts.stride(0) != 1)
    throw ack::Refusal("cu_seqlens_kv, token_to_batch and seq_starts must be contiguous");

  const std::string layout = p.s("kv_cache_layout");
  const bool dequant = p.b("dequant");
#if defined(AC_MUTANT_KV_GATHER_REDERIVE_TOTAL_TOKENS)
  // total_tokens ignored and taken from the output's extent, as if key were always exactly
  // [total_tokens, Hkv, D].
  const int64_t T = key.size(0);
#else
  const int64_t T = p.i("total_tokens");
#endif
  if (!same_dtype(kc, vc)) throw ack::Refusal("key_cache and value_cache dtypes differ");
  if (!same_dtype(key, value) || !is16(key))
    throw ack::Refusal("key and value must both be bf16 or f16");
  const int out_bf16 = key.dtype.code == kDLBfloat ? 1 : 0;
  int fmt = 0;
  if (dequant) {
    ack::expect_dtype(kc, "key_cache", kDLUInt, 8);  // fp8 travels as uint8
    const std::string f = p.s("fp8_format");
    if (f != "e4m3fn" && f != "e4m3fnuz")
      throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
    fmt = static_cast<int>(f == "e4m3fn" ? AcFp8::e4m3fn : AcFp8::e4m3fnuz);
    ack::expect_dtype(a.get("k_scale"), "k_scale", kDLFloat, 32);
    ack::expect_dtype(a.get("v_scale"), "v_scale", kDLFloat, 32);
  } else if (!same_dtype(kc, key)) {
    throw ack::Refusal("without dequant the caches must have the output dtype");
  }
  const int es_in = dequant ? 1 : 2;
  const int64_t x = 16 / es_in;

  int64_t nb, P, Hkv, D;
  if (layout == "NHD") {
    ack::expect_ndim(kc, "key_cache", 4);
    ack::expect_ndim(vc, "value_cache", 4);
    nb = kc.size(0);
    P = kc.size(1);
    Hkv = kc.size(2);
    D = kc.size(3);
    for (int i = 0; i < 4; ++i)
      if (vc.size(i) != kc.size(i))
        throw ack::Refusal("NHD value_cache " + shape_text(vc) + " differs from key_cache " +
                           shape_text(kc));
  } else if (layout == "SHUFFLE") {
    ack::expect_ndim(kc, "key_cache", 5);
    ack::expect_ndim(vc, "value_cache", 5);
    if (kc.size(4) != x || vc.size(4) != x)
      throw ack::Refusal("SHUFFLE tiles must have x = 16 / element size = " + std::to_string(x) +
                         ", got key_cache " + shape_text(kc) + ", value_cache " + shape_text(vc));
    nb = kc.size(0);
    Hkv = kc.size(1);
    D = kc.size(2) * x;
    P = kc.size(3);
    if (vc.size(0) != nb || vc.size(1) != Hkv || vc.size(2) * x != P || vc.size(3) != D)
      throw ack::Refusal("SHUFFLE value_cache " + shape_text(vc) + " does not match key_cache " +
                         shape_text(kc) + " (K [nb,Hkv,D/x,P,x], V [nb,Hkv,P/x,D,x])");
  } else {
    throw ack::Refusal("kv_cache_layout must be NHD or SHUFFLE, got '" + layout + "'");
  }
  (void)nb;
  for (const auto* o : {&key, &value}) {
    ack::expect_ndim(*o, o == &key ? "key" : "value", 3);
    ack::expect_contiguous_last(*o, o == &key ? "key" : "value");
    if (o->size(0) < T || o->size(1) != Hkv || o->size(2) != D)
      throw ack::Refusal(std::string(o == &key ? "key" : "value") + " " + shape_text(*o) +
                         " cannot hold [total_tokens=" + std::to_string(T) + ", " +
                         std::to_string(Hkv) + ", " + std::to_string(D) + "]");
  }
  if (t2b.size(0) < T) throw ack::Refusal("token_to_batch is shorter than total_tokens");
  if (cu.size(0) != starts.size(0) + 1 || table.size(0) != starts.size(0))
    throw ack::Refusal("cu_seqlens_kv must have B+1 entries and block_tables B rows");
  if (T == 0) return;

  const GatherMeta meta{table.ptr<int32_t>(), table.stride(0),    table.stride(1),
                        cu.ptr<int32_t>(),    t2b.ptr<int32_t>(), starts.ptr<int32_t>()};
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(Hkv));
  const bool shuffle = layout == "SHUFFLE";
  for (int v = 0; v < 2; ++v) {
    const auto& cache = v ? vc : kc;
    const auto& out = v ? value : key;
    const GatherCache c = describe_cache(cache, shuffle ? (v ? kShuffleV : kShuffleK) : kNhd, P,
                                         Hkv, D, shuffle ? x : 1);
    const int vec = pick_vec(c, es_in, out, 8);
    const int lanes = static_cast<int>(std::min<int64_t>(256, (D + vec - 1) / vec));
    const float* scale = dequant ? a.get(v ? "v_scale" : "k_scale").ptr<float>() : nullptr;
    if (dequant)
      launch_vec<1, true>(vec, grid, dim3(lanes), c, out, meta, scale, fmt, out_bf16);
    else
      launch_vec<2, false>(vec, grid, dim3(lanes), c, out, meta, scale, fmt, out_bf16);
  }
}

const ack::KernelRegistrar kRegister("kv_gather", run_kv_gather, ack::kGraphSafe);

}  // namespace
