// Warp-cooperative 16x16x16 tile MMA with fp32 accumulation, bf16 or f16 inputs held as raw
// uint16_t bits. One source for both vendors:
//   NVIDIA: nvcuda::wmma (sm_80+ for bf16), operands loaded straight from memory by WMMA.
//   AMD CDNA (gfx90a, gfx940/941/942, gfx950; wave64): v_mfma_f32_16x16x16{bf16_1k,f16}.
//     Lane l holds A[l%16][4(l/16)+i] and B[4(l/16)+i][l%16] (i = 0..3) and accumulates
//     D[4(l/16)+i][l%16] (AMD matrix instruction calculator; CK's M16N16K16 warp GEMM attributes).
//
// Contract of every call: all lanes of one warp (wavefront) call it together with the same
// arguments; a/b/out are 32-byte aligned (WMMA's rule; MFMA needs 8) and their leading dimensions
// are multiples of 8 elements. Operands may live in shared or global memory. The accumulator's
// element-to-lane mapping differs between vendors, so it is opaque: read it with ac_mma_store, and
// call ac_mma_sync() (a warp-level barrier with memory ordering) before lanes of the same warp read
// back what ac_mma_store wrote, and again before the warp overwrites it.
#pragma once
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

struct AcTileAcc {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> frag;
};

AC_DEVICE void ac_mma_zero(AcTileAcc& c) {
  nvcuda::wmma::fill_fragment(c.frag, 0.0f);
}

template <class T>
AC_DEVICE void ac_wmma_16x16x16(AcTileAcc& c, const uint16_t* a, int lda, const uint16_t* b,
                                int ldb, bool b_col_major) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, reinterpret_cast<const T*>(a), static_cast<unsigned>(lda));
  if (b_col_major) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, reinterpret_cast<const T*>(b), static_cast<unsigned>(ldb));
    wmma::mma_sync(c.frag, fa, fb, c.frag);
  } else {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, reinterpret_cast<const T*>(b), static_cast<unsigned>(ldb));
    wmma::mma_sync(c.frag, fa, fb, c.frag);
  }
}

AC_DEVICE void ac_mma_16x16x16(AcTileAcc& c, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                               bool b_col_major, AcMmaIn t) {
  if (t == AcMmaIn::bf16)
    ac_wmma_16x16x16<__nv_bfloat16>(c, a, lda, b, ldb, b_col_major);
  else
    ac_wmma_16x16x16<__half>(c, a, lda, b, ldb, b_col_major);
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

AC_DEVICE void ac_mma_zero(AcTileAcc& c) {
  c.v = AcF32x4{0.0f, 0.0f, 0.0f, 0.0f};
}

AC_DEVICE void ac_mma_16x16x16(AcTileAcc& c, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                               bool b_col_major, AcMmaIn t) {
  const int lane = static_cast<int>(threadIdx.x) & 63;
  const int rc = lane & 15;        // A row, B column
  const int k0 = (lane >> 4) * 4;  // first of this lane's four k
  // Four consecutive k of one A row: one 8-byte load (k0 is a multiple of 4, lda of 8).
  const AcU32x2 a_bits = *reinterpret_cast<const AcU32x2*>(a + rc * lda + k0);
  AcU32x2 b_bits;
  if (b_col_major) {
    b_bits = *reinterpret_cast<const AcU32x2*>(b + rc * ldb + k0);
  } else {
    const uint16_t* col = b + k0 * ldb + rc;
    b_bits.x = static_cast<uint32_t>(col[0]) | (static_cast<uint32_t>(col[ldb]) << 16);
    b_bits.y = static_cast<uint32_t>(col[2 * ldb]) | (static_cast<uint32_t>(col[3 * ldb]) << 16);
  }
#if defined(__HIP_DEVICE_COMPILE__)
  if (t == AcMmaIn::bf16) {
    c.v = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(
        __builtin_bit_cast(AcS16x4, a_bits), __builtin_bit_cast(AcS16x4, b_bits), c.v, 0, 0, 0);
  } else {
    c.v = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(AcH16x4, a_bits),
                                                __builtin_bit_cast(AcH16x4, b_bits), c.v, 0, 0, 0);
  }
#else
  (void)a_bits;
  (void)b_bits;
  (void)t;
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
