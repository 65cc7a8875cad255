// Copy bandwidth and matrix rate on this device, measured with our own kernels.
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
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

// Replaced by the tile-MMA GEMM once the MMA helpers exist (issue 4).
double ack::measure_matrix_tflops() {
  throw std::runtime_error("matrix-rate kernel not built yet");
}
