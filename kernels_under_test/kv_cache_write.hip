// kv_cache_write (reshape_and_cache_flash and its SHUFFLE / packed variants,
// docs/ops/kv_cache_write.md): one workgroup per (token, KV head), lanes over the head's D
// elements. Every cache offset goes through the view's real strides: hybrid attention+Mamba
// caches have a block stride of 2H, padded caches no contiguous dimension but the last, and in the
// packed (nb, Hkv, P, 2D) layout K and V of one slot are D elements apart with a head stride of
// P*2D. Padding tokens (slot < 0) write nothing. fp8 caches store RNE_fp8(fp32 x / scale),
// saturated to +-max finite.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

enum CacheLayout : int { kNhd = 0, kShuffleK = 1, kShuffleV = 2 };

struct WriteCache {
  uint8_t* base;      // element 0 of the view
  int64_t stride[5];  // in elements; NHD uses the first 4
  int layout;
  int64_t nb, P, Hkv, D, x;
};

// Element offset of (block, slot-in-block, head, dim) in the cache view.
AC_DEVICE int64_t cache_offset(const WriteCache& c, int64_t blk, int64_t s, int64_t h, int64_t d) {
  const int64_t* st = c.stride;
  if (c.layout == kNhd) return blk * st[0] + s * st[1] + h * st[2] + d * st[3];
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

struct Tokens {
  const uint16_t* base;  // bf16/f16 bits
  int64_t stride[3];
};

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
    const uint16_t bits = src.base[t * src.stride[0] + h * src.stride[1] + d * src.stride[2]];
    const int64_t off = cache_offset(cache, blk, s, h, d);
    if constexpr (QUANT) {
      const float x = src_is_bf16 ? ac_bf16_to_float(bits) : ac_f16_to_float(bits);
      cache.base[off] = ac_float_to_fp8(x / sc, static_cast<AcFp8>(fp8_format));
    } else {
      reinterpret_cast<uint16_t*>(cache.base)[off] = bits;
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
    const Tokens tokens{src.ptr<uint16_t>(), {src.stride(0), src.stride(1), src.stride(2)}};
    const WriteCache c = describe_cache(v ? vc : kc, shuffle ? (v ? kShuffleV : kShuffleK) : kNhd,
                                        nb, P, Hkv, D, shuffle ? x : 1);
    const float* scale = quant ? a.get(v ? "v_scale" : "k_scale").ptr<float>() : nullptr;
    if (quant)
      hipLaunchKernelGGL(write_kv<true>, grid, block, 0, 0, tokens, c, slots.ptr<int64_t>(), scale,
                         fmt, src_bf16);
    else
      hipLaunchKernelGGL(write_kv<false>, grid, block, 0, 0, tokens, c, slots.ptr<int64_t>(), scale,
                         fmt, src_bf16);
    const hipError_t e = hipGetLastError();
    if (e != hipSuccess)
      throw std::runtime_error(std::string("write_kv launch: ") + hipGetErrorString(e));
  }
}

const ack::KernelRegistrar kRegister("kv_cache_write", run_kv_cache_write);

}  // namespace
