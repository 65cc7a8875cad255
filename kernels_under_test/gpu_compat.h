// The one portability header: HIP sources compile with hipcc (AMD, wave64) and with nvcc (NVIDIA,
// warp32). Kernels include only this, use hip* names and the ac_* helpers below, and never assume a
// warp size. bf16/fp16/fp8 are handled as raw bits with our own conversions (attncheck's formats,
// fp8 e4m3fn and e4m3fnuz in software), so no vendor numeric header is involved.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define AC_HIP 1
#define AC_DEVICE_KIND "hip"
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define AC_CUDA 1
#define AC_DEVICE_KIND "cuda"
// Runtime API: hip* spelled onto cuda*.
using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipDeviceProp_t = cudaDeviceProp;
#define hipSuccess cudaSuccess
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(ptr, bytes, flags) cudaHostAlloc(ptr, bytes, flags)
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetDevice cudaGetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipEventCreate cudaEventCreate
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipEventDestroy cudaEventDestroy
// Streams and graphs (graph capture, runtime.hip).
using hipGraph_t = cudaGraph_t;
using hipGraphExec_t = cudaGraphExec_t;
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeRelaxed cudaStreamCaptureModeRelaxed
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipFuncSetAttribute(f, a, v) cudaFuncSetAttribute(f, a, v)
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#else
#error "gpu_compat.h needs hipcc or nvcc"
#endif

#include <cstdint>

#define AC_HOST_DEVICE __host__ __device__ __forceinline__
#define AC_DEVICE __device__ __forceinline__

// ---- warp-level primitives (width = the hardware's warpSize: 64 on CDNA, 32 on NVIDIA) ----
template <class T>
AC_DEVICE T ac_shfl_xor(T v, int lane_mask) {
#if defined(AC_CUDA)
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#else
  return __shfl_xor(v, lane_mask);
#endif
}
template <class T>
AC_DEVICE T ac_shfl(T v, int src_lane) {
#if defined(AC_CUDA)
  return __shfl_sync(0xffffffffu, v, src_lane);
#else
  return __shfl(v, src_lane);
#endif
}
AC_DEVICE int ac_warp_size() {
  return warpSize;
}
AC_DEVICE int ac_lane() {
  return static_cast<int>(threadIdx.x) % warpSize;
}
AC_DEVICE float ac_warp_sum(float v) {
  for (int m = warpSize / 2; m > 0; m /= 2) v += ac_shfl_xor(v, m);
  return v;
}
AC_DEVICE float ac_warp_max(float v) {
  for (int m = warpSize / 2; m > 0; m /= 2) v = fmaxf(v, ac_shfl_xor(v, m));
  return v;
}

// ---- bit casts usable on host and device ----
AC_HOST_DEVICE float ac_bits_to_float(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } x;
  x.u = u;
  return x.f;
}
AC_HOST_DEVICE uint32_t ac_float_bits(float f) {
  union {
    uint32_t u;
    float f;
  } x;
  x.f = f;
  return x.u;
}

// ---- 16-bit floats as raw bits ----
AC_HOST_DEVICE float ac_bf16_to_float(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } x;
  x.u = static_cast<uint32_t>(b) << 16;
  return x.f;
}
AC_HOST_DEVICE uint16_t ac_float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  union {
    uint32_t u;
    float f;
  } x;
  x.f = f;
  if ((x.u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x.u >> 16) | 0x40u);
  return static_cast<uint16_t>((x.u + 0x7FFFu + ((x.u >> 16) & 1u)) >> 16);
}
AC_HOST_DEVICE float ac_f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13);
    }
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  union {
    uint32_t u;
    float f;
  } x;
  x.u = bits;
  return x.f;
}
AC_HOST_DEVICE uint16_t ac_float_to_f16(float f) {  // round to nearest even, overflow to inf
  union {
    uint32_t u;
    float f;
  } x;
  x.f = f;
  const uint32_t sign = (x.u >> 16) & 0x8000u;
  const uint32_t a = x.u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                               // below f16 min normal
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);           // < half the min subnormal
    const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14 - (e - 112)
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

// ---- fp8 in software: the format is a runtime parameter ----
enum class AcFp8 : int { e4m3fn = 0, e4m3fnuz = 1 };

AC_HOST_DEVICE float ac_fp8_to_float(uint8_t b, AcFp8 fmt) {
  const int bias = fmt == AcFp8::e4m3fn ? 7 : 8;
  if (fmt == AcFp8::e4m3fnuz ? (b == 0x80) : ((b & 0x7F) == 0x7F))
    return ac_bits_to_float(0x7FC00000u);
  const uint32_t sign = (b & 0x80u) << 24;
  const int exp = (b >> 3) & 0xF;
  const int man = b & 0x7;
  float v;
  if (exp == 0)
    v = ldexpf(static_cast<float>(man), 1 - bias - 3);
  else
    v = ldexpf(static_cast<float>(man | 8), exp - bias - 3);
  return ac_bits_to_float(ac_float_bits(v) | sign);
}
AC_HOST_DEVICE float ac_fp8_max(AcFp8 fmt) {
  return fmt == AcFp8::e4m3fn ? 448.0f : 240.0f;
}
// Round to nearest even, saturating finite values to +-max (the quantizers clamp); NaN -> NaN code.
AC_HOST_DEVICE uint8_t ac_float_to_fp8(float f, AcFp8 fmt) {
  const int bias = fmt == AcFp8::e4m3fn ? 7 : 8;
  const uint8_t nan = fmt == AcFp8::e4m3fn ? 0x7F : 0x80;
  if (f != f) return nan;
  const uint8_t sign = (ac_float_bits(f) >> 31) ? 0x80 : 0x00;
  float a = fabsf(f);
  const float maxv = ac_fp8_max(fmt);
  const uint8_t max_code = fmt == AcFp8::e4m3fn ? 0x7E : 0x7F;
  if (a == 0.0f) return fmt == AcFp8::e4m3fnuz ? 0 : sign;
  int e;
  frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;
  const int emin = 1 - bias;
  if (exp < emin) exp = emin;
  float r = rintf(ldexpf(a, 3 - exp));  // rintf: round to nearest even
  if (r >= 16.0f) {
    r *= 0.5f;
    exp += 1;
  }
  if (r == 0.0f) return fmt == AcFp8::e4m3fnuz ? 0 : sign;
  if (ldexpf(r, exp - 3) > maxv) return sign | max_code;
  const int ri = static_cast<int>(r);
  if (ri < 8) return static_cast<uint8_t>(sign | ri);
  return static_cast<uint8_t>(sign | ((exp + bias) << 3) | (ri - 8));
}
