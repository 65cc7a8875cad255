// kv_cache_write (reshape_and_cache_flash and its SHUFFLE / packed variants,
// docs/ops/kv_cache_write.md): one workgroup per (token, KV head), lanes over the head's D
// elements. Every cache offset goes through the view's real strides: hybrid attention+Mamba
// caches have a block stride of 2H, padded caches no contiguous dimension but the last, and in the
// packed (nb, Hkv, P, 2D) layout K and V of one slot are D elements apart with a head stride of
// P*2D. Padding tokens (slot < 0) write nothing. fp8 caches store RNE_fp8(fp32 x / scale),
// saturated to +-max finite.
// kv_cache_write_pertoken_quant (AITER reshape_and_cache_with_pertoken_quant): one workgroup per
// (token, KV head) reduces the row's amax, stores the dequant scale amax / M at the slot and the
// codes x * (1 / max(scale, 1e-12)) in the K SHUFFLE tile and the SHUFFLE or [nb, Hkv, D, P] V.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

enum CacheLayout : int { kNhd = 0, kShuffleK = 1, kShuffleV = 2, kPagedV = 3 };

struct WriteCache {
  uint8_t* base;      // element 0 of the view
  int64_t stride[5];  // in elements; NHD uses the first 4
  int layout;
  int64_t nb, P, Hkv, D, x;
};

AC_DEVICE int64_t cache_offset64(const WriteCache& c, int64_t blk, int64_t s, int64_t h, int64_t d);

// Element offset of (block, slot-in-block, head, dim) in the cache view: 64-bit, since a cache
// may pass 2^31 elements (issue 37).
AC_DEVICE int64_t cache_offset(const WriteCache& c, int64_t blk, int64_t s, int64_t h, int64_t d) {
#if defined(AC_MUTANT_KV_CACHE_WRITE_OFFSET_INT32)
  // Seed bug: the offset kept in int32, which wraps once the cache passes 2^31 elements.
  return static_cast<int32_t>(static_cast<uint32_t>(cache_offset64(c, blk, s, h, d)));
#else
  return cache_offset64(c, blk, s, h, d);
#endif
}

AC_DEVICE int64_t cache_offset64(const WriteCache& c, int64_t blk, int64_t s, int64_t h,
                                 int64_t d) {
  const int64_t* st = c.stride;
  if (c.layout == kNhd) return blk * st[0] + s * st[1] + h * st[2] + d * st[3];
  if (c.layout == kPagedV) return blk * st[0] + h * st[1] + d * st[2] + s * st[3];
#ifdef AC_MUTANT_KV_CACHE_WRITE_SHUFFLE_SHAPE_OFFSET
  // Seed bug (vLLM before #39192, AITER #3492): the SHUFFLE writer's block and head offsets from
  // the shape (blk * Hkv * D * P + h * D * P), as if every cache were contiguous.
  const int64_t tile = blk * (c.Hkv * c.D * c.P) + h * (c.D * c.P);
  if (c.layout == kShuffleK) return tile + (d / c.x) * (c.P * c.x) + s * c.x + d % c.x;
  return tile + (s / c.x) * (c.D * c.x) + d * c.x + s % c.x;
#else
  if (c.layout == kShuffleK)
    return blk * st[0] + h * st[1] + (d / c.x) * st[2] + s * st[3] + (d % c.x) * st[4];
  return blk * st[0] + h * st[1] + (s / c.x) * st[2] + d * st[3] + (s % c.x) * st[4];
#endif
}

// key / value's innermost stride. The mutant assumes it is 1 (a unit-innermost-stride shortcut:
// every case had one before issue 37's interleave cases).
#if defined(AC_MUTANT_KV_CACHE_WRITE_UNIT_INNER_STRIDE)
inline int64_t token_inner_stride(const ack::KTensor&) {
  return 1;
}
#else
inline int64_t token_inner_stride(const ack::KTensor& t) {
  return t.stride(2);
}
#endif

struct Tokens {
  const uint16_t* base;  // bf16/f16 bits
  int64_t stride[3];
};

// The bits of key / value element (t, h, d): 64-bit offsets, since a token row may lie past
// element 2^31 (issue 37).
AC_DEVICE uint16_t token_bits(const Tokens& src, int64_t t, int64_t h, int64_t d) {
#if defined(AC_MUTANT_KV_CACHE_WRITE_TOKEN_OFFSET_INT32)
  // Seed bug: the token's element offset in int32, which wraps once its row passes 2^31.
  const uint32_t at = static_cast<uint32_t>(t) * static_cast<uint32_t>(src.stride[0]) +
                      static_cast<uint32_t>(h * src.stride[1] + d * src.stride[2]);
  return src.base[static_cast<int32_t>(at)];
#else
  return src.base[t * src.stride[0] + h * src.stride[1] + d * src.stride[2]];
#endif
}

AC_DEVICE float token_value(const Tokens& src, int64_t t, int64_t h, int64_t d, int src_is_bf16) {
  const uint16_t bits = token_bits(src, t, h, d);
  return src_is_bf16 ? ac_bf16_to_float(bits) : ac_f16_to_float(bits);
}

// QUANT: fp8 cache (1-byte codes), else a 16-bit copy of the token's bits.
template <bool QUANT>
__global__ void write_kv(Tokens src, WriteCache cache, const int64_t* slot_mapping,
                         const float* scale, int fp8_format, int src_is_bf16) {
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= cache.nb * cache.P) return;  // padding token (or a slot past the cache)
  const int64_t blk = slot / cache.P, s = slot % cache.P;
  const float sc = QUANT ? *scale : 1.0f;
  for (int64_t d = threadIdx.x; d < cache.D; d += blockDim.x) {
    const uint16_t bits = token_bits(src, t, h, d);
    const int64_t off = cache_offset(cache, blk, s, h, d);
    if constexpr (QUANT) {
      const float x = src_is_bf16 ? ac_bf16_to_float(bits) : ac_f16_to_float(bits);
      cache.base[off] = ac_float_to_fp8(x / sc, static_cast<AcFp8>(fp8_format));
    } else {
      reinterpret_cast<uint16_t*>(cache.base)[off] = bits;
    }
  }
}

// ---- per-token quant ----

enum PertokenCodes : int { kCodesE4m3fn = 0, kCodesE4m3fnuz = 1, kCodesInt8 = 2 };

struct ScaleView {
  float* base;
  int64_t stride[3];
  int asm_layout;  // [nb, Hkv, P], else [Hkv, nb * P]
};

constexpr int kPertokenThreads = 64;  // a power of two: the amax tree below halves it

// One (token, head) row: amax over D (max is exact in any order), scale = amax / M, codes
// x * (1 / max(scale, 1e-12f)): the fp32 operations of the AITER kernel, each correctly rounded
// (no fast-math), so the codes and scales are the reference's bits.
__global__ void write_kv_pertoken(Tokens src, WriteCache cache, ScaleView scales,
                                  const int64_t* slot_mapping, int codes, int src_is_bf16) {
  __shared__ float partial[kPertokenThreads];
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t slot = slot_mapping[t];
  // The whole workgroup leaves together, so the barriers below stay uniform.
  if (slot < 0 || slot >= cache.nb * cache.P) return;  // padding token (or a slot past the cache)
  const int64_t blk = slot / cache.P, s = slot % cache.P;
  float amax = 0.0f;
  for (int64_t d = threadIdx.x; d < cache.D; d += blockDim.x)
    amax = fmaxf(amax, fabsf(token_value(src, t, h, d, src_is_bf16)));
  partial[threadIdx.x] = amax;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w)
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + w]);
    __syncthreads();
  }
  amax = partial[0];
  const float dtype_max = codes == kCodesInt8
                              ? 127.0f
                              : ac_fp8_max(codes == kCodesE4m3fn ? AcFp8::e4m3fn : AcFp8::e4m3fnuz);
  const float scale = amax / dtype_max;
  const float inv = 1.0f / fmaxf(scale, 1e-12f);
  if (threadIdx.x == 0) {
    int64_t at;
    if (scales.asm_layout) {
      at = blk * scales.stride[0] + h * scales.stride[1] + s * scales.stride[2];
    } else {
#ifdef AC_MUTANT_KV_CACHE_WRITE_PERTOKEN_SCALE_AT_TOKEN
      // Seed bug (AITER before #42): the [Hkv, max_kv_tokens] scale indexed by the token's position
      // in the batch instead of its slot, so a reader finds another token's scale (or an old one).
      at = h * scales.stride[0] + t * scales.stride[1];
#else
      at = h * scales.stride[0] + slot * scales.stride[1];
#endif
    }
    scales.base[at] = scale;
  }
  for (int64_t d = threadIdx.x; d < cache.D; d += blockDim.x) {
    const float q = token_value(src, t, h, d, src_is_bf16) * inv;
    uint8_t code;
    if (codes == kCodesInt8)
      code = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(q)));  // truncates
    else
      code = ac_float_to_fp8(q, codes == kCodesE4m3fn ? AcFp8::e4m3fn : AcFp8::e4m3fnuz);
    cache.base[cache_offset(cache, blk, s, h, d)] = code;
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

WriteCache describe_cache(const ack::KTensor& t, int layout, int64_t nb, int64_t P, int64_t Hkv,
                          int64_t D, int64_t x) {
  WriteCache c{};
  c.base = static_cast<uint8_t*>(t.data);
  for (int i = 0; i < t.ndim; ++i) c.stride[i] = t.stride(i);
  c.layout = layout;
  c.nb = nb;
  c.P = P;
  c.Hkv = Hkv;
  c.D = D;
  c.x = x;
  return c;
}

void run_kv_cache_write(const ack::KParams& p, const ack::KArgs& a) {
  const auto& key = a.get("key");
  const auto& value = a.get("value");
  const auto& kc = a.get("key_cache");
  const auto& vc = a.get("value_cache");
  const auto& slots = a.get("slot_mapping");
  ack::expect_dtype(slots, "slot_mapping", kDLInt, 64);
  ack::expect_ndim(slots, "slot_mapping", 1);
  if (slots.size(0) > 1 && slots.stride(0) != 1)
    throw ack::Refusal("slot_mapping must be contiguous");
  if (!same_dtype(key, value) || !is16(key))
    throw ack::Refusal("key and value must both be bf16 or f16");
  if (!same_dtype(kc, vc)) throw ack::Refusal("key_cache and value_cache dtypes differ");
  const std::string kv_dtype = p.s("kv_cache_dtype");
  const bool quant = kv_dtype == "fp8";
  int fmt = 0;
  if (quant) {
    ack::expect_dtype(kc, "key_cache", kDLUInt, 8);  // fp8 travels as uint8
    const std::string f = p.s("fp8_format");
    if (f != "e4m3fn" && f != "e4m3fnuz")
      throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
    fmt = static_cast<int>(f == "e4m3fn" ? AcFp8::e4m3fn : AcFp8::e4m3fnuz);
    ack::expect_dtype(a.get("k_scale"), "k_scale", kDLFloat, 32);
    ack::expect_dtype(a.get("v_scale"), "v_scale", kDLFloat, 32);
  } else if (kv_dtype != "auto") {
    throw ack::Refusal("kv_cache_dtype must be auto or fp8, got '" + kv_dtype + "'");
  } else if (!same_dtype(kc, key)) {
    throw ack::Refusal("with kv_cache_dtype auto the caches must have the key's dtype");
  }
  const int64_t x = quant ? 16 : 8;  // SHUFFLE tile: 16 bytes of the cache dtype

  const std::string layout = p.s("kv_cache_layout");
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
  for (const auto* t : {&key, &value}) {
    const char* name = t == &key ? "key" : "value";
    ack::expect_ndim(*t, name, 3);
    if (t->size(0) != slots.size(0) || t->size(1) != Hkv || t->size(2) != D)
      throw ack::Refusal(std::string(name) + " " + shape_text(*t) +
                         " is not [T=" + std::to_string(slots.size(0)) +
                         ", Hkv=" + std::to_string(Hkv) + ", D=" + std::to_string(D) + "]");
  }
  const int64_t T = slots.size(0);
  if (T == 0 || nb == 0) return;

  const bool shuffle = layout == "SHUFFLE";
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(Hkv));
  const dim3 block(static_cast<unsigned>(D < 256 ? D : 256));
  const int src_bf16 = key.dtype.code == kDLBfloat ? 1 : 0;
  for (int v = 0; v < 2; ++v) {
    const auto& src = v ? value : key;
    const Tokens tokens{src.ptr<uint16_t>(),
                        {src.stride(0), src.stride(1), token_inner_stride(src)}};
    const WriteCache c = describe_cache(v ? vc : kc, shuffle ? (v ? kShuffleV : kShuffleK) : kNhd,
                                        nb, P, Hkv, D, shuffle ? x : 1);
    const float* scale = quant ? a.get(v ? "v_scale" : "k_scale").ptr<float>() : nullptr;
    if (quant)
      hipLaunchKernelGGL(write_kv<true>, grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), tokens, c,
                         slots.ptr<int64_t>(), scale, fmt, src_bf16);
    else
      hipLaunchKernelGGL(write_kv<false>, grid, block, 0,
                         static_cast<hipStream_t>(ack::launch_stream()), tokens, c,
                         slots.ptr<int64_t>(), scale, fmt, src_bf16);
    const hipError_t e = hipGetLastError();
    if (e != hipSuccess)
      throw std::runtime_error(std::string("write_kv launch: ") + hipGetErrorString(e));
  }
}

void run_kv_cache_write_pertoken_quant(const ack::KParams& p, const ack::KArgs& a) {
  const auto& key = a.get("key");
  const auto& value = a.get("value");
  const auto& kc = a.get("key_cache");
  const auto& vc = a.get("value_cache");
  const auto& ks = a.get("k_dequant_scales");
  const auto& vs = a.get("v_dequant_scales");
  const auto& slots = a.get("slot_mapping");
  ack::expect_dtype(slots, "slot_mapping", kDLInt, 64);
  ack::expect_ndim(slots, "slot_mapping", 1);
  if (slots.size(0) > 1 && slots.stride(0) != 1)
    throw ack::Refusal("slot_mapping must be contiguous");
  if (!same_dtype(key, value) || !is16(key))
    throw ack::Refusal("key and value must both be bf16 or f16");
  if (!same_dtype(kc, vc)) throw ack::Refusal("key_cache and value_cache dtypes differ");
  const std::string kv_dtype = p.s("kv_cache_dtype");
  int codes;
  if (kv_dtype == "fp8") {
    ack::expect_dtype(kc, "key_cache", kDLUInt, 8);  // fp8 travels as uint8
    const std::string f = p.s("fp8_format");
    if (f != "e4m3fn" && f != "e4m3fnuz")
      throw ack::Refusal("fp8_format must be e4m3fn or e4m3fnuz, got '" + f + "'");
    codes = f == "e4m3fn" ? kCodesE4m3fn : kCodesE4m3fnuz;
  } else if (kv_dtype == "int8") {
    ack::expect_dtype(kc, "key_cache", kDLInt, 8);
    codes = kCodesInt8;
  } else {
    throw ack::Refusal("kv_cache_dtype must be fp8 or int8 for per-token quant, got '" + kv_dtype +
                       "'");
  }
  const std::string asm_text = p.s("asm_layout");
  if (asm_text != "true" && asm_text != "false")
    throw ack::Refusal("asm_layout must be true or false, got '" + asm_text + "'");
  const bool asm_layout = asm_text == "true";
  const int64_t x = 16;  // 16 bytes of a 1-byte cache
  ack::expect_ndim(kc, "key_cache", 5);
  if (kc.size(4) != x)
    throw ack::Refusal("key_cache " + shape_text(kc) + " is not [nb, Hkv, D/16, P, 16]");
  const int64_t nb = kc.size(0), Hkv = kc.size(1), D = kc.size(2) * x, P = kc.size(3);
  if (asm_layout) {
    ack::expect_ndim(vc, "value_cache", 5);
    if (vc.size(0) != nb || vc.size(1) != Hkv || vc.size(2) * x != P || vc.size(3) != D ||
        vc.size(4) != x)
      throw ack::Refusal("asm_layout value_cache " + shape_text(vc) +
                         " is not [nb, Hkv, P/16, D, " + "16] of key_cache " + shape_text(kc));
  } else {
    ack::expect_ndim(vc, "value_cache", 4);
    if (vc.size(0) != nb || vc.size(1) != Hkv || vc.size(2) != D || vc.size(3) != P)
      throw ack::Refusal("value_cache " + shape_text(vc) + " is not [nb, Hkv, D, P] of key_cache " +
                         shape_text(kc));
  }
  for (const auto* t : {&ks, &vs}) {
    const char* name = t == &ks ? "k_dequant_scales" : "v_dequant_scales";
    ack::expect_dtype(*t, name, kDLFloat, 32);
    ack::expect_ndim(*t, name, asm_layout ? 3 : 2);
    const bool ok = asm_layout ? t->size(0) == nb && t->size(1) == Hkv && t->size(2) == P
                               : t->size(0) == Hkv && t->size(1) == nb * P;
    if (!ok)
      throw ack::Refusal(std::string(name) + " " + shape_text(*t) + " is not " +
                         (asm_layout ? "[nb, Hkv, P]" : "[Hkv, nb * P]"));
  }
  for (const auto* t : {&key, &value}) {
    const char* name = t == &key ? "key" : "value";
    ack::expect_ndim(*t, name, 3);
    if (t->size(0) != slots.size(0) || t->size(1) != Hkv || t->size(2) != D)
      throw ack::Refusal(std::string(name) + " " + shape_text(*t) +
                         " is not [T=" + std::to_string(slots.size(0)) +
                         ", Hkv=" + std::to_string(Hkv) + ", D=" + std::to_string(D) + "]");
  }
  const int64_t T = slots.size(0);
  if (T == 0 || nb == 0) return;

  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(Hkv));
  const dim3 block(kPertokenThreads);
  const int src_bf16 = key.dtype.code == kDLBfloat ? 1 : 0;
  for (int v = 0; v < 2; ++v) {
    const auto& src = v ? value : key;
    const Tokens tokens{src.ptr<uint16_t>(),
                        {src.stride(0), src.stride(1), token_inner_stride(src)}};
    const int layout = v ? (asm_layout ? kShuffleV : kPagedV) : kShuffleK;
    const WriteCache c = describe_cache(v ? vc : kc, layout, nb, P, Hkv, D, x);
    const auto& sc = v ? vs : ks;
    ScaleView scales{sc.ptr<float>(),
                     {sc.stride(0), sc.stride(1), asm_layout ? sc.stride(2) : 0},
                     asm_layout ? 1 : 0};
    hipLaunchKernelGGL(write_kv_pertoken, grid, block, 0,
                       static_cast<hipStream_t>(ack::launch_stream()), tokens, c, scales,
                       slots.ptr<int64_t>(), codes, src_bf16);
    const hipError_t e = hipGetLastError();
    if (e != hipSuccess)
      throw std::runtime_error(std::string("write_kv_pertoken launch: ") + hipGetErrorString(e));
  }
}

const ack::KernelRegistrar kRegister("kv_cache_write", run_kv_cache_write, ack::kGraphSafe);
const ack::KernelRegistrar kRegisterPertoken("kv_cache_write_pertoken_quant",
                                             run_kv_cache_write_pertoken_quant, ack::kGraphSafe);

}  // namespace
