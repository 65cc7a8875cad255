// Private helpers of the indexer reference: fast raw access to contiguous tensors and fp8 lookup
// tables (the generic Tensor::get goes through double per element, too slow for long contexts).
#pragma once
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/numeric.h"
#include "core/tensor.h"

namespace attncheck::ref::indexer::detail {

inline Tensor dense(const Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

template <class T>
const T* raw(const Tensor& dense_tensor) {
  return reinterpret_cast<const T*>(dense_tensor.data());
}

[[noreturn]] inline void fail(const std::string& what) {
  throw std::invalid_argument("indexer reference: " + what);
}
// For checks outside loops; inside loops write `if (!ok) fail(...)` so the message is built only
// on failure.
inline void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

inline void expect_dtype(const Tensor& t, DType d, const char* name) {
  expect(t.dtype() == d,
         std::string(name) + " must be " + std::string(dtype_name(d)) + ", got " + t.describe());
}

inline void expect_fp8(const Tensor& t, const char* name) {
  expect(t.dtype() == DType::e4m3fn || t.dtype() == DType::e4m3fnuz,
         std::string(name) + " must be fp8 e4m3fn or e4m3fnuz, got " + t.describe());
}

// Decoded value of every fp8 byte (NaN codes decode to NaN).
inline std::array<double, 256> fp8_table(DType fp8) {
  std::array<double, 256> lut{};
  for (int b = 0; b < 256; ++b)
    lut[static_cast<size_t>(b)] = fp8_decode(static_cast<uint8_t>(b), fp8);
  return lut;
}

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

}  // namespace attncheck::ref::indexer::detail
