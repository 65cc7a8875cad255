// The fill_* generators by their per-element definition: element k (logical row-major order) gets
// encode_value of its value from Rng::normal_at(k) / uniform_at(k) / block(k), written one element
// at a time. This is how core/rng.cpp generated inputs before its batched kernels; rng_batch_test
// checks every batched path against it bit for bit, and rng_bench times it as the baseline.
#pragma once
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace attncheck::rng_definition {

// set(element's bytes, k) for every element: a dense view by incremental offsets, anything else
// through Tensor::element_ptr (which throws outside a sparse storage's host window).
template <class SetFn>
void for_each_element(const Tensor& t, SetFn&& set) {
  if (t.numel() == 0) return;
  const auto es = static_cast<int64_t>(t.element_size());
  const Storage& s = *t.storage();
  const auto [lo, hi] = t.extent();
  if (s.sparse() || lo < 0 || hi * es > static_cast<int64_t>(s.bytes.size())) {
    t.for_each_index([&](const Index& idx, int64_t k) { set(t.element_ptr(idx), k); });
    return;
  }
  auto* base = const_cast<std::byte*>(s.bytes.data());
  t.for_each_offset([&](int64_t off, int64_t k) { set(base + off * es, k); });
}

inline void put(std::byte* p, double v, DType t, size_t es) {
  const uint64_t bits = encode_value(v, t);
  std::memcpy(p, &bits, es);
}

inline void fill_normal(const Tensor& t, const Rng& rng, double mean = 0.0, double stddev = 1.0) {
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    put(p, mean + stddev * rng.normal_at(static_cast<uint64_t>(k)), dt, es);
  });
}

inline void fill_uniform(const Tensor& t, const Rng& rng, double lo, double hi) {
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    put(p, lo + (hi - lo) * rng.uniform_at(static_cast<uint64_t>(k)), dt, es);
  });
}

inline void fill_uniform_int(const Tensor& t, const Rng& rng, int64_t lo, int64_t hi) {
  const auto range = static_cast<uint64_t>(hi - lo) + 1;
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    const auto r = rng.block(static_cast<uint64_t>(k));
    const uint64_t v = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    put(p, static_cast<double>(lo + static_cast<int64_t>(v % range)), dt, es);
  });
}

inline void fill_fp8_codes(const Tensor& t, const Rng& rng, double max_abs) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    const double v = fp8_decode(static_cast<uint8_t>(c), t.dtype());
    if (std::isfinite(v) && std::fabs(v) <= max_abs) codes.push_back(static_cast<uint8_t>(c));
  }
  for_each_element(t, [&](std::byte* p, int64_t k) {
    const auto r = rng.block(static_cast<uint64_t>(k));
    *p = static_cast<std::byte>(codes[r[0] % codes.size()]);
  });
}

}  // namespace attncheck::rng_definition
