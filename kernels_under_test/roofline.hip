// Copy bandwidth and matrix rate on this device, measured with our own kernels.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_compat.h"
#include "mma.h"
#include "roofline.h"

namespace ack {

double measure_copy_gbps() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (hipMalloc(&a, bytes) != hipSuccess || hipMalloc(&b, bytes) != hipSuccess)
    throw std::runtime_error("roofline: cannot allocate 2 x 1 GiB");
  (void)hipMemset(a, 1, bytes);
  (void)hipMemcpy(b, a, bytes, hipMemcpyDeviceToDevice);  // warm-up
  hipEvent_t t0, t1;
  (void)hipEventCreate(&t0);
  (void)hipEventCreate(&t1);
  const int iters = 10;
  (void)hipEventRecord(t0, 0);
  for (int i = 0; i < iters; ++i) (void)hipMemcpy(b, a, bytes, hipMemcpyDeviceToDevice);
  (void)hipEventRecord(t1, 0);
  (void)hipEventSynchronize(t1);
  float ms = 0;
  (void)hipEventElapsedTime(&ms, t0, t1);
  (void)hipEventDestroy(t0);
  (void)hipEventDestroy(t1);
  (void)hipFree(a);
  (void)hipFree(b);
  return 2.0 * static_cast<double>(bytes) * iters / (static_cast<double>(ms) * 1e-3) / 1e9;
}

}  // namespace ack

// ---- matrix rate: a tiled GEMM C[M,N] = A[M,K] B[K,N] through mma.h ----
// 128x128 block tile, 32-deep K steps staged in shared memory (next step prefetched into
// registers while the current one is multiplied), eight warps of 32x64 each holding their operand
// tiles in registers (AcTileA/AcTileB). The rate is what our
// own tile MMA reaches, so it is the ceiling kernels built on mma.h can be held to.
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kWarps = 8;  // 4 along M x 2 along N
#if defined(AC_CUDA)
constexpr int kMaxThreads = kWarps * 32;
#else
constexpr int kMaxThreads = kWarps * 64;
#endif
constexpr int kLdA = kBK + 8;   // padded rows: multiple of 8 elements, 16-row steps 32B-aligned
constexpr int kLdB = kBN + 8;   // B row-major in shared: [kBK][kBN]
constexpr int kLdBt = kBK + 8;  // B column-major in shared: [kBN][kBK]
constexpr int kVecA = kBM * kBK / 8;  // 16-byte vectors per A tile
constexpr int kVecB = kBK * kBN / 8;

// b_col_major: B(k, n) at b[n * K + k] (an [N, K] row-major buffer), else at b[k * N + n].
template <AcMmaIn T, bool BColMajor>
__global__ void __launch_bounds__(kMaxThreads)
    tile_gemm(const uint16_t* a, const uint16_t* b, float* c, int M, int N, int K) {
  constexpr bool b_col_major = BColMajor;
  __shared__ __align__(32) uint16_t sa[kBM * kLdA];
  __shared__ __align__(32) uint16_t sb[kBK * kLdB > kBN * kLdBt ? kBK * kLdB : kBN * kLdBt];
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / warpSize;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 64;
  const int m0 = static_cast<int>(blockIdx.y) * kBM, n0 = static_cast<int>(blockIdx.x) * kBN;
  (void)M;

  AcTileAcc acc[2][4];
  for (auto& row : acc)
    for (auto& t : row) ac_mma_zero(t);

  // Each thread moves at most 4 vectors of A and 4 of B per step (256 threads on NVIDIA, 512 on
  // AMD: 512 vectors per tile).
  uint4 ra[4], rb[4];
  auto fetch = [&](int k0) {
    for (int j = 0; j < 4; ++j) {
      const int v = tid + j * nthreads;
      if (v >= kVecA) break;
      const int r = v / (kBK / 8), col = (v % (kBK / 8)) * 8;
      ra[j] = *reinterpret_cast<const uint4*>(a + static_cast<int64_t>(m0 + r) * K + k0 + col);
    }
    for (int j = 0; j < 4; ++j) {
      const int v = tid + j * nthreads;
      if (v >= kVecB) break;
      if constexpr (b_col_major) {
        const int n = v / (kBK / 8), kk = (v % (kBK / 8)) * 8;
        rb[j] = *reinterpret_cast<const uint4*>(b + static_cast<int64_t>(n0 + n) * K + k0 + kk);
      } else {
        const int kk = v / (kBN / 8), n = (v % (kBN / 8)) * 8;
        rb[j] = *reinterpret_cast<const uint4*>(b + static_cast<int64_t>(k0 + kk) * N + n0 + n);
      }
    }
  };
  auto stage = [&]() {
    for (int j = 0; j < 4; ++j) {
      const int v = tid + j * nthreads;
      if (v >= kVecA) break;
      const int r = v / (kBK / 8), col = (v % (kBK / 8)) * 8;
      *reinterpret_cast<uint4*>(sa + r * kLdA + col) = ra[j];
    }
    for (int j = 0; j < 4; ++j) {
      const int v = tid + j * nthreads;
      if (v >= kVecB) break;
      if constexpr (b_col_major) {
        const int n = v / (kBK / 8), kk = (v % (kBK / 8)) * 8;
        *reinterpret_cast<uint4*>(sb + n * kLdBt + kk) = rb[j];
      } else {
        const int kk = v / (kBN / 8), n = (v % (kBN / 8)) * 8;
        *reinterpret_cast<uint4*>(sb + kk * kLdB + n) = rb[j];
      }
    }
  };

  fetch(0);
  for (int k0 = 0; k0 < K; k0 += kBK) {
    __syncthreads();  // previous step's reads of shared memory are done
    stage();
    __syncthreads();
    if (k0 + kBK < K) fetch(k0 + kBK);
    // Register blocking: two A tiles and four B tiles per 16-deep step feed eight MMAs.
    for (int kk = 0; kk < kBK; kk += 16) {
      AcTileA<T> fa[2];
      AcTileB<T, BColMajor> fb[4];
      for (int i = 0; i < 2; ++i) ac_mma_load_a(fa[i], sa + (wm + 16 * i) * kLdA + kk, kLdA);
      for (int j = 0; j < 4; ++j) {
        const int n = wn + 16 * j;
        if constexpr (BColMajor)
          ac_mma_load_b(fb[j], sb + n * kLdBt + kk, kLdBt);
        else
          ac_mma_load_b(fb[j], sb + kk * kLdB + n, kLdB);
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) ac_mma(acc[i][j], fa[i], fb[j]);
    }
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      ac_mma_store(acc[i][j], c + static_cast<int64_t>(m0 + wm + 16 * i) * N + n0 + wn + 16 * j, N);
}

void check(hipError_t e, const char* what) {
  if (e != hipSuccess)
    throw std::runtime_error(std::string("roofline: ") + what + ": " + hipGetErrorString(e));
}

int device_warp_size() {
  int dev = 0;
  check(hipGetDevice(&dev), "hipGetDevice");
  hipDeviceProp_t prop;
  check(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
  return prop.warpSize;
}

void launch_gemm(const uint16_t* a, const uint16_t* b, float* c, int M, int N, int K,
                 bool b_col_major, AcMmaIn type, int warp_size) {
  const dim3 grid(N / kBN, M / kBM), block(kWarps * warp_size);
  if (type == AcMmaIn::bf16 && !b_col_major)
    hipLaunchKernelGGL((tile_gemm<AcMmaIn::bf16, false>), grid, block, 0, 0, a, b, c, M, N, K);
  else if (type == AcMmaIn::bf16)
    hipLaunchKernelGGL((tile_gemm<AcMmaIn::bf16, true>), grid, block, 0, 0, a, b, c, M, N, K);
  else if (!b_col_major)
    hipLaunchKernelGGL((tile_gemm<AcMmaIn::f16, false>), grid, block, 0, 0, a, b, c, M, N, K);
  else
    hipLaunchKernelGGL((tile_gemm<AcMmaIn::f16, true>), grid, block, 0, 0, a, b, c, M, N, K);
  check(hipGetLastError(), "tile_gemm launch");
}

// Small integers are exact in bf16 and f16, and so are their products and sums in fp32: the GEMM
// must match the host bit for bit, for both input types and both B layouts, before it is timed.
void verify_gemm(int warp_size) {
  const int M = 256, N = 128, K = 96;
  std::vector<uint16_t> ha(M * K), hb(K * N);
  std::vector<int> ia(M * K), ib(K * N);
  for (int i = 0; i < M * K; ++i) ia[i] = (i * 7 + i / 5) % 9 - 4;
  for (int i = 0; i < K * N; ++i) ib[i] = (i * 5 + i / 3) % 7 - 3;
  uint16_t *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  check(hipMalloc(&da, ha.size() * 2), "hipMalloc");
  check(hipMalloc(&db, hb.size() * 2), "hipMalloc");
  check(hipMalloc(&dc, size_t(M) * N * 4), "hipMalloc");
  std::string failure;
  for (AcMmaIn type : {AcMmaIn::bf16, AcMmaIn::f16})
    for (bool col_major : {false, true}) {
      for (int i = 0; i < M * K; ++i) {
        const float v = static_cast<float>(ia[i]);
        ha[i] = type == AcMmaIn::bf16 ? ac_float_to_bf16(v) : ac_float_to_f16(v);
      }
      for (int k = 0; k < K; ++k)
        for (int n = 0; n < N; ++n) {
          const float v = static_cast<float>(ib[k * N + n]);
          hb[col_major ? n * K + k : k * N + n] =
              type == AcMmaIn::bf16 ? ac_float_to_bf16(v) : ac_float_to_f16(v);
        }
      check(hipMemcpy(da, ha.data(), ha.size() * 2, hipMemcpyHostToDevice), "hipMemcpy");
      check(hipMemcpy(db, hb.data(), hb.size() * 2, hipMemcpyHostToDevice), "hipMemcpy");
      launch_gemm(da, db, dc, M, N, K, col_major, type, warp_size);
      std::vector<float> hc(size_t(M) * N);
      check(hipMemcpy(hc.data(), dc, hc.size() * 4, hipMemcpyDeviceToHost), "hipMemcpy");
      for (int m = 0; m < M && failure.empty(); ++m)
        for (int n = 0; n < N; ++n) {
          int ref = 0;
          for (int k = 0; k < K; ++k) ref += ia[m * K + k] * ib[k * N + n];
          if (hc[size_t(m) * N + n] != static_cast<float>(ref)) {
            failure = std::string("tile MMA GEMM wrong (") +
                      (type == AcMmaIn::bf16 ? "bf16" : "f16") +
                      (col_major ? ", B column-major" : ", B row-major") + ") at C[" +
                      std::to_string(m) + "," + std::to_string(n) +
                      "]: " + std::to_string(hc[size_t(m) * N + n]) + " != " + std::to_string(ref);
            break;
          }
        }
    }
  (void)hipFree(da);
  (void)hipFree(db);
  (void)hipFree(dc);
  if (!failure.empty()) throw std::runtime_error("roofline: " + failure);
}

}  // namespace

double ack::measure_matrix_tflops() {
  const int warp_size = device_warp_size();
  verify_gemm(warp_size);
  const int n = 8192;
  uint16_t *a = nullptr, *b = nullptr;
  float* c = nullptr;
  const size_t elems = size_t(n) * n;
  check(hipMalloc(&a, elems * 2), "cannot allocate A");
  check(hipMalloc(&b, elems * 2), "cannot allocate B");
  check(hipMalloc(&c, elems * 4), "cannot allocate C");
  // 0x3C3C is about 0.0115 in bf16: finite, non-zero operands (zeros could be fast-pathed).
  check(hipMemset(a, 0x3C, elems * 2), "hipMemset");
  check(hipMemset(b, 0x3C, elems * 2), "hipMemset");
  launch_gemm(a, b, c, n, n, n, false, AcMmaIn::bf16, warp_size);  // warm-up
  check(hipDeviceSynchronize(), "warm-up");
  hipEvent_t t0, t1;
  (void)hipEventCreate(&t0);
  (void)hipEventCreate(&t1);
  const int iters = 5;
  (void)hipEventRecord(t0, 0);
  for (int i = 0; i < iters; ++i) launch_gemm(a, b, c, n, n, n, false, AcMmaIn::bf16, warp_size);
  (void)hipEventRecord(t1, 0);
  (void)hipEventSynchronize(t1);
  float ms = 0;
  (void)hipEventElapsedTime(&ms, t0, t1);
  (void)hipEventDestroy(t0);
  (void)hipEventDestroy(t1);
  (void)hipFree(a);
  (void)hipFree(b);
  (void)hipFree(c);
  check(hipGetLastError(), "tile_gemm");
  return 2.0 * double(n) * n * n * iters / (static_cast<double>(ms) * 1e-3) / 1e12;
}
