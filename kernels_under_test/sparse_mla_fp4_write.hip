// sparse_mla_fp4_k_cache: writes DeepSeek-V4.1's FP4 compressed-KV records
// (docs/ops/sparse_mla_fp4.md). One thread per (token, scale block): the block's amax, its scale
// byte (nvfp4: e4m3(max(amax, 6 x 2^-9) / 6), nearest even, saturating at 448; mxfp4:
// ceil(log2(max(amax, 6 x 2^-126) / 6)) + 127), then the elements x / scale rounded to the nearest
// e2m1, ties to even (the quotient is exact or far from a tie in fp32: bf16 over a 4-bit scale),
// element 2i in the low nibble; data rows first in a page, scale rows after them.
#include <cmath>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

constexpr int kDims = 512;
constexpr int kDataBytes = kDims / 2;

// Nearest, ties to the even code; saturates at 6; the sign of a zero is kept.
AC_DEVICE uint32_t e2m1_code(float v) {
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
  return c | ((ac_float_bits(v) >> 31) ? 8u : 0u);
}

AC_DEVICE uint8_t e4m3_scale_byte(float amax) {
  const float s = fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f;
#if defined(AC_MUTANT_FP4W_SCALE_TRUNCATED)
  // seed: the e4m3 scale rounded toward zero (the largest e4m3 number <= s)
  uint8_t b = ac_float_to_fp8(s, AcFp8::e4m3fn);
  if (ac_fp8_to_float(b, AcFp8::e4m3fn) > s) --b;
  return b;
#elif defined(AC_MUTANT_FP4W_NO_SCALE_FLOOR)
  return ac_float_to_fp8(amax / 6.0f, AcFp8::e4m3fn);  // seed: a zero block gets scale 0
#else
  return ac_float_to_fp8(s, AcFp8::e4m3fn);
#endif
}

AC_DEVICE uint8_t e8m0_scale_byte(float amax) {
  const float y = fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) / 6.0f;
  int e = 0;
  const float m = frexpf(y, &e);  // y = m 2^e, m in [0.5, 1)
  int exponent = m == 0.5f ? e - 1 : e;
  exponent = exponent < -127 ? -127 : (exponent > 127 ? 127 : exponent);
  return static_cast<uint8_t>(exponent + 127);
}

AC_DEVICE float e8m0_value(uint32_t byte) {
  return ac_bits_to_float(byte == 0 ? 0x00400000u : byte << 23);
}

__global__ void write_records(const uint16_t* kv, int64_t kv_row_stride, const int64_t* slots,
                              int tokens, uint8_t* cache, int64_t page_stride, int64_t P,
                              int64_t num_slots, bool mxfp4, int32_t* bad) {
  const int block = mxfp4 ? 32 : 16, blocks = kDims / block, scale_bytes = blocks;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(tokens) * blocks) return;
  const int64_t row = i / blocks;
  const int b = static_cast<int>(i % blocks);
  const int64_t slot = slots[row];
  if (slot < 0) return;
  if (slot >= num_slots) {
    atomicExch(bad, 1);
    return;
  }
  const int64_t t = slot % P;
  // 64-bit offsets: a cache may pass 2^32 bytes and a row lie past element 2^31 (issue 37).
#if defined(AC_MUTANT_FP4W_PAGE_OFFSET_INT32)
  // Seed bug: page * page_stride in int32, which wraps once the cache passes 2^31 bytes.
  uint8_t* page = cache + static_cast<int32_t>(static_cast<uint32_t>(slot / P) *
                                               static_cast<uint32_t>(page_stride));
#else
  uint8_t* page = cache + (slot / P) * page_stride;
#endif
#if defined(AC_MUTANT_FP4W_KV_OFFSET_INT32)
  // Seed bug: the row offset in int32, which wraps once kv's row passes element 2^31.
  const uint16_t* x =
      kv + static_cast<int32_t>(static_cast<uint32_t>(row) * static_cast<uint32_t>(kv_row_stride)) +
      b * block;
#else
  const uint16_t* x = kv + row * kv_row_stride + b * block;
#endif
  float amax = 0.0f;
  for (int d = 0; d < block; ++d) amax = fmaxf(amax, fabsf(ac_bf16_to_float(x[d])));
  const uint8_t s = mxfp4 ? e8m0_scale_byte(amax) : e4m3_scale_byte(amax);
  const float scale = mxfp4 ? e8m0_value(s) : ac_fp8_to_float(s, AcFp8::e4m3fn);
#if defined(AC_MUTANT_FP4W_INTERLEAVED_RECORD)
  const int64_t data = t * (kDataBytes + scale_bytes), scales = data + kDataBytes;  // seed
#else
  const int64_t data = t * kDataBytes, scales = P * kDataBytes + t * scale_bytes;
#endif
#if defined(AC_MUTANT_FP4W_SCALE_WRONG_BLOCK)
  page[scales + (b + 1) % blocks] = s;  // seed: the scale slot of the next block
#else
  page[scales + b] = s;
#endif
  for (int d = 0; d < block; d += 2) {
    const uint32_t lo = e2m1_code(ac_bf16_to_float(x[d]) / scale);
    const uint32_t hi = e2m1_code(ac_bf16_to_float(x[d + 1]) / scale);
#if defined(AC_MUTANT_FP4W_NIBBLE_SWAP)
    page[data + (b * block + d) / 2] = static_cast<uint8_t>(hi | (lo << 4));  // seed: high first
#else
    page[data + (b * block + d) / 2] = static_cast<uint8_t>(lo | (hi << 4));
#endif
  }
}

void check(hipError_t e, const char* what) {
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

void run_write(const ack::KParams& p, const ack::KArgs& args) {
  const auto& kv = args.get("kv");
  const auto& slots = args.get("slot_mapping");
  const auto& cache = args.get("kv_cache");
  ack::expect_ndim(kv, "kv", 2);
  ack::expect_ndim(slots, "slot_mapping", 1);
  ack::expect_ndim(cache, "kv_cache", 3);
  ack::expect_dtype(kv, "kv", kDLBfloat, 16);
  ack::expect_dtype(slots, "slot_mapping", kDLInt, 64);
  ack::expect_dtype(cache, "kv_cache", kDLUInt, 8);
  ack::expect_contiguous_last(kv, "kv");
  if (slots.stride(0) != 1 && slots.size(0) > 1)
    throw ack::Refusal("slot_mapping must be contiguous");
  const std::string& format = p.s("kv_format");
  if (format != "nvfp4" && format != "mxfp4")
    throw ack::Refusal("kv_format must be nvfp4 or mxfp4, got '" + format + "'");
  const bool mxfp4 = format == "mxfp4";
  const int64_t rb = kDataBytes + (mxfp4 ? 16 : 32), P = cache.size(1);
  if (kv.size(1) != kDims) throw ack::Refusal("kv rows must have 512 elements");
  if (cache.size(2) != rb)
    throw ack::Refusal("kv_cache rows must be " + std::to_string(rb) + "-byte " + format +
                       " records");
  if (cache.stride(2) != 1 || cache.stride(1) != rb ||
      (cache.size(0) > 1 && cache.stride(0) < P * rb))
    throw ack::Refusal("kv_cache pages must be contiguous runs of P records");
  const int tokens = static_cast<int>(slots.size(0));
  if (kv.size(0) < tokens) throw ack::Refusal("kv must have a row per slot_mapping entry");
  if (tokens == 0) return;
  int32_t* bad = nullptr;
  check(hipMalloc(&bad, 4), "alloc flag");
  check(hipMemset(bad, 0, 4), "clear flag");
  const int blocks = kDims / (mxfp4 ? 32 : 16);
  const int64_t threads = static_cast<int64_t>(tokens) * blocks;
  hipLaunchKernelGGL(write_records, dim3(static_cast<unsigned>((threads + 255) / 256)), dim3(256),
                     0, 0, kv.ptr<uint16_t>(), kv.stride(0), slots.ptr<int64_t>(), tokens,
                     cache.ptr<uint8_t>(), cache.stride(0), P, cache.size(0) * P, mxfp4, bad);
  check(hipGetLastError(), "write_records launch");
  int32_t bad_h = 0;
  check(hipMemcpy(&bad_h, bad, 4, hipMemcpyDeviceToHost), "copy flag");
  check(hipFree(bad), "free flag");
  if (bad_h)
    throw std::runtime_error("sparse_mla_fp4_k_cache: a slot_mapping entry is past the cache");
}

const ack::KernelRegistrar kRegister("sparse_mla_fp4_k_cache", run_write);

}  // namespace
