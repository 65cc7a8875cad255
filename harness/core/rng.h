// Counter-based random numbers keyed by (case id, tensor name, seed), with our own distributions:
// std:: distributions differ between standard libraries, and goldens must not.
//
// Philox4x32-10 (Salmon et al., SC'11) gives 128 random bits per 64-bit counter. Element k of a
// tensor uses counter k, so a tensor's values do not depend on its strides or on what else the case
// generated. normal() is the Irwin-Hall sum of twelve 24-bit uniforms minus 6: exact in double,
// no libm, identical on every machine (its tails stop at +-6 sigma, which no test needs).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tensor.h"

namespace attncheck {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ull);

class Rng {
 public:
  Rng(std::string_view case_id, std::string_view tensor_name, uint64_t seed = 0);
  explicit Rng(uint64_t key) : key_(key) {}

  // Stateless access: the 128 bits at counter `k`.
  std::array<uint32_t, 4> block(uint64_t k) const;
  // Sequential stream (its own counter space, disjoint from block() use by element index).
  uint32_t next_u32();
  uint64_t next_u64();
  double uniform();                             // [0, 1), 53 bits
  double uniform(double lo, double hi);         // [lo, hi)
  int64_t uniform_int(int64_t lo, int64_t hi);  // [lo, hi], unbiased
  double normal();                              // mean 0, variance 1 (Irwin-Hall 12)

  // Per-element values (counter = element index).
  double uniform_at(uint64_t k) const;
  double normal_at(uint64_t k) const;
  // The same values for k = first, first + 1, ... into out, computed in batches (the kernels
  // below).
  void uniform_run(uint64_t first, std::span<double> out) const;
  void normal_run(uint64_t first, std::span<double> out) const;

  uint64_t key() const { return key_; }

 private:
  uint64_t key_;
  uint64_t stream_ = 0;
  std::array<uint32_t, 4> buf_{};
  int buf_left_ = 0;
};

// Generators write values directly in the tensor's dtype (rounded to nearest even), in logical
// row-major order, element k from counter k: the bytes do not depend on the tensor's layout.
void fill_normal(const Tensor& t, const Rng& rng, double mean = 0.0, double stddev = 1.0);
void fill_uniform(const Tensor& t, const Rng& rng, double lo, double hi);
void fill_uniform_int(const Tensor& t, const Rng& rng, int64_t lo, int64_t hi);  // [lo, hi]
// Uniform over the finite values of an fp8 tensor whose magnitude lies in [min_abs, max_abs].
void fill_fp8_codes(const Tensor& t, const Rng& rng, double max_abs);

// The generators above compute runs of consecutive elements at once, with Philox lanes side by
// side (structure of arrays), and encode them to bf16/f16/fp8 a run at a time; every kernel gives
// the bytes of the per-element definitions (Rng::block, Rng::normal_at, encode_value), which
// tests/rng_batch_test.cpp checks for each. The fastest one the CPU supports is used unless
// set_philox_kernel chose another (tests and benchmarks; not thread-safe against fills running at
// the same time).
enum class PhiloxKernel {
  portable,  // plain C++, any CPU
  avx2,      // x86-64 AVX2, 8 lanes per vector
};
bool philox_kernel_available(PhiloxKernel k);
PhiloxKernel philox_kernel();
void set_philox_kernel(PhiloxKernel k);  // std::invalid_argument if this CPU lacks it
void reset_philox_kernel();              // back to the fastest available

std::vector<int64_t> permutation(int64_t n, Rng& rng);
// Fills a NaN (or 0xFF bytes for integer/raw types) everywhere in the tensor's storage.
void poison(const Tensor& t);

}  // namespace attncheck
