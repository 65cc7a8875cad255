// Warp-cooperative 16x16x16 tile MMA with fp32 accumulation, bf16 or f16 inputs held as raw
// uint16_t bits. One source for both vendors:
//   NVIDIA: nvcuda::wmma (sm_80+ for bf16), operands loaded straight from memory by WMMA.
//   AMD CDNA (gfx90a, gfx940/941/942, gfx950; wave64): v_mfma_f32_16x16x16{bf16_1k,f16}.
//     Lane l holds A[l%16][4(l/16)+i] and B[4(l/16)+i][l%16] (i = 0..3) and accumulates
//     D[4(l/16)+i][l%16] (AMD matrix instruction calculator; CK's M16N16K16 warp GEMM attributes).
//
// Contract of every call: all lanes of one warp (wavefront) call it together with the same
// arguments, in a one-dimensional workgroup; a/b/out are 32-byte aligned (WMMA's rule; MFMA needs
// 8) and their leading dimensions are multiples of 8 elements. Operands may live in shared or
// global memory. The accumulator's element-to-lane mapping differs between vendors, so it is
// opaque: read it with ac_mma_store, and call ac_mma_sync() (a warp-level barrier with memory
// ordering) before lanes of the same warp read back what ac_mma_store wrote, and again before the
// warp overwrites it.
//
// Two levels:
//   ac_mma_16x16x16(c, a, lda, b, ldb, b_col_major, type): loads both operands and multiplies;
//   AcTileA<T> / AcTileB<T, BColMajor> with ac_mma_load_a / ac_mma_load_b / ac_mma: operands held
//   in registers, for register blocking (one A tile against several B tiles, as a GEMM does).
#pragma once
#include <type_traits>

#include "gpu_compat.h"

enum class AcMmaIn { bf16, f16 };

#if defined(AC_CUDA)
// CUDA's <mma.h> is a wrapper around crt/mma.h; this file shadows that name on the include path
// (-I kernels_under_test), so include the body the same way the wrapper does.
#if !defined(__CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__)
#define __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__
#define AC_MMA_UNDEF_INTERNAL_HEADERS
#endif
#include <crt/mma.h>
#if defined(AC_MMA_UNDEF_INTERNAL_HEADERS)
#undef __CUDA_INCLUDE_COMPILER_INTERNAL_HEADERS__
#undef AC_MMA_UNDEF_INTERNAL_HEADERS
#endif

template <AcMmaIn T>
struct AcMmaElem;
template <>
struct AcMmaElem<AcMmaIn::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct AcMmaElem<AcMmaIn::f16> {
  using type = __half;
};

struct AcTileAcc {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> frag;
};
template <AcMmaIn T>
struct AcTileA {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, typename AcMmaElem<T>::type,
                         nvcuda::wmma::row_major>
      frag;
};
template <AcMmaIn T, bool BColMajor>
struct AcTileB {
  nvcuda::wmma::fragment<
      nvcuda::wmma::matrix_b, 16, 16, 16, typename AcMmaElem<T>::type,
      typename std::conditional<BColMajor, nvcuda::wmma::col_major, nvcuda::wmma::row_major>::type>
      frag;
};

AC_DEVICE void ac_mma_zero(AcTileAcc& c) {
  nvcuda::wmma::fill_fragment(c.frag, 0.0f);
}
template <AcMmaIn T>
AC_DEVICE void ac_mma_load_a(AcTileA<T>& f, const uint16_t* a, int lda) {
  nvcuda::wmma::load_matrix_sync(f.frag, reinterpret_cast<const typename AcMmaElem<T>::type*>(a),
                                 static_cast<unsigned>(lda));
}
// B(k, n) at b[k * ldb + n], or at b[n * ldb + k] when BColMajor.
template <AcMmaIn T, bool BColMajor>
AC_DEVICE void ac_mma_load_b(AcTileB<T, BColMajor>& f, const uint16_t* b, int ldb) {
  nvcuda::wmma::load_matrix_sync(f.frag, reinterpret_cast<const typename AcMmaElem<T>::type*>(b),
                                 static_cast<unsigned>(ldb));
}
template <AcMmaIn T, bool BColMajor>
AC_DEVICE void ac_mma(AcTileAcc& c, const AcTileA<T>& a, const AcTileB<T, BColMajor>& b) {
  nvcuda::wmma::mma_sync(c.frag, a.frag, b.frag, c.frag);
}

AC_DEVICE void ac_mma_store(const AcTileAcc& c, float* out, int ldo) {
  nvcuda::wmma::store_matrix_sync(out, c.frag, static_cast<unsigned>(ldo),
                                  nvcuda::wmma::mem_row_major);
}

AC_DEVICE void ac_mma_sync() {
  __syncwarp();
}

#else  // AMD CDNA

#if defined(__HIP_DEVICE_COMPILE__)
#if !(defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
      defined(__gfx950__))
#error "mma.h: the MFMA tile needs a CDNA target with bf16_1k MFMA (gfx90a, gfx940-942, gfx950)"
#endif
#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 64
#error "mma.h: the MFMA lane layout below is for 64-lane wavefronts"
#endif
#endif

typedef short AcS16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 AcH16x4 __attribute__((ext_vector_type(4)));
typedef float AcF32x4 __attribute__((ext_vector_type(4)));
typedef uint32_t AcU32x2 __attribute__((ext_vector_type(2)));

struct AcTileAcc {
  AcF32x4 v;  // D[4 (lane / 16) + i][lane % 16], i = 0..3
};
template <AcMmaIn T>
struct AcTileA {
  AcU32x2 bits;  // A[lane % 16][4 (lane / 16) + i], i = 0..3, two per word
};
template <AcMmaIn T, bool BColMajor>
struct AcTileB {
  AcU32x2 bits;  // B[4 (lane / 16) + i][lane % 16]
};

AC_DEVICE void ac_mma_zero(AcTileAcc& c) {
  c.v = AcF32x4{0.0f, 0.0f, 0.0f, 0.0f};
}
template <AcMmaIn T>
AC_DEVICE void ac_mma_load_a(AcTileA<T>& f, const uint16_t* a, int lda) {
  const int lane = static_cast<int>(threadIdx.x) & 63;
  // Four consecutive k of one A row: one 8-byte load (k0 is a multiple of 4, lda of 8).
  f.bits = *reinterpret_cast<const AcU32x2*>(a + (lane & 15) * lda + (lane >> 4) * 4);
}
template <AcMmaIn T, bool BColMajor>
AC_DEVICE void ac_mma_load_b(AcTileB<T, BColMajor>& f, const uint16_t* b, int ldb) {
  const int lane = static_cast<int>(threadIdx.x) & 63;
  const int n = lane & 15, k0 = (lane >> 4) * 4;
  if constexpr (BColMajor) {
    f.bits = *reinterpret_cast<const AcU32x2*>(b + n * ldb + k0);
  } else {
    const uint16_t* col = b + k0 * ldb + n;
    f.bits.x = static_cast<uint32_t>(col[0]) | (static_cast<uint32_t>(col[ldb]) << 16);
    f.bits.y = static_cast<uint32_t>(col[2 * ldb]) | (static_cast<uint32_t>(col[3 * ldb]) << 16);
  }
}
template <AcMmaIn T, bool BColMajor>
AC_DEVICE void ac_mma(AcTileAcc& c, const AcTileA<T>& a, const AcTileB<T, BColMajor>& b) {
#if defined(__HIP_DEVICE_COMPILE__)
  if constexpr (T == AcMmaIn::bf16)
    c.v = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(
        __builtin_bit_cast(AcS16x4, a.bits), __builtin_bit_cast(AcS16x4, b.bits), c.v, 0, 0, 0);
  else
    c.v = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(AcH16x4, a.bits),
                                                __builtin_bit_cast(AcH16x4, b.bits), c.v, 0, 0, 0);
#else
  (void)c;
  (void)a;
  (void)b;
#endif
}

AC_DEVICE void ac_mma_store(const AcTileAcc& c, float* out, int ldo) {
  const int lane = static_cast<int>(threadIdx.x) & 63;
  const int col = lane & 15;
  const int row0 = (lane >> 4) * 4;
  for (int i = 0; i < 4; ++i) out[(row0 + i) * ldo + col] = c.v[i];
}

// A wavefront runs in lockstep and its LDS operations complete in order; the fences and the
// barrier keep the compiler from moving the reads above the stores.
AC_DEVICE void ac_mma_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}

#endif

template <AcMmaIn T, bool BColMajor>
AC_DEVICE void ac_mma_16x16x16(AcTileAcc& c, const uint16_t* a, int lda, const uint16_t* b,
                               int ldb) {
  AcTileA<T> fa;
  AcTileB<T, BColMajor> fb;
  ac_mma_load_a(fa, a, lda);
  ac_mma_load_b(fb, b, ldb);
  ac_mma(c, fa, fb);
}

// A (row-major, lda) times B (B(k, n) at b[k * ldb + n], or b[n * ldb + k] when b_col_major),
// accumulated into c.
AC_DEVICE void ac_mma_16x16x16(AcTileAcc& c, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                               bool b_col_major, AcMmaIn t) {
  if (t == AcMmaIn::bf16) {
    if (b_col_major)
      ac_mma_16x16x16<AcMmaIn::bf16, true>(c, a, lda, b, ldb);
    else
      ac_mma_16x16x16<AcMmaIn::bf16, false>(c, a, lda, b, ldb);
  } else {
    if (b_col_major)
      ac_mma_16x16x16<AcMmaIn::f16, true>(c, a, lda, b, ldb);
    else
      ac_mma_16x16x16<AcMmaIn::f16, false>(c, a, lda, b, ldb);
  }
}
