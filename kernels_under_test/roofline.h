// Ceilings measured with the library's own kernels in the same run as a benchmark, so a kernel's
// time can be set against the floor its bytes and FLOPs imply on this very device.
#pragma once

namespace ack {
double measure_copy_gbps();      // device-to-device copy, bytes read + written per second / 1e9
double measure_matrix_tflops();  // dense bf16 MMA (fp32 accumulate) through the portability
                                 // header's tile MMA
}  // namespace ack
