#include "sparse_mla_fp4.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/fp4.h"
#include "core/numeric.h"

namespace attncheck::ref::fp4_record {

std::string_view format_name(Format f) {
  return f == Format::nvfp4 ? "nvfp4" : "mxfp4";
}
int64_t block_elems(Format f) {
  return f == Format::nvfp4 ? fp4::kNvfp4Block : fp4::kMxfp4Block;
}
int64_t scale_bytes(Format f) {
  return kDims / block_elems(f);
}
int64_t record_bytes(Format f) {
  return kDataBytes + scale_bytes(f);
}

int64_t data_offset(int64_t t, int64_t c) {
  return t * kDataBytes + c;
}
int64_t scale_offset(Format f, int64_t page_size, int64_t t, int64_t s) {
  return page_size * kDataBytes + t * scale_bytes(f) + s;
}

void check_cache(const Tensor& cache, Format f) {
  const std::string want = "u8 [pages, page_size, " + std::to_string(record_bytes(f)) + "] (" +
                           std::string(format_name(f)) + " records)";
  if (cache.dtype() != DType::u8 || cache.ndim() != 3 || cache.size(2) != record_bytes(f))
    throw std::invalid_argument("kv_cache must be " + want + ", got " + cache.describe());
  if (cache.size(1) < 1) throw std::invalid_argument("kv_cache pages must hold >= 1 token");
  if (cache.stride(2) != 1 || cache.stride(1) != record_bytes(f) ||
      (cache.size(0) > 1 && cache.stride(0) < cache.size(1) * record_bytes(f)))
    throw std::invalid_argument("kv_cache pages must be contiguous and must not overlap, got " +
                                cache.describe());
}

namespace {

const uint8_t* page_bytes(const Tensor& cache, int64_t page) {
  return reinterpret_cast<const uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
}

double scale_value(Format f, uint8_t byte) {
  return f == Format::nvfp4 ? fp8_decode(byte, DType::e4m3fn) : fp4::e8m0_decode(byte);
}

}  // namespace

void read_record(const Tensor& cache, Format f, int64_t page, int64_t t, double* out) {
  const uint8_t* base = page_bytes(cache, page);
  const int64_t P = cache.size(1), block = block_elems(f);
  for (int64_t i = 0; i < kDims; ++i) {
    const uint8_t byte = base[data_offset(t, i / 2)];
    const uint8_t code = fp4::unpack_nibble(byte, static_cast<int>(i % 2));
    const uint8_t s = base[scale_offset(f, P, t, i / block)];
    out[i] = fp4::e2m1_decode(code) * scale_value(f, s);
  }
}

Tensor decode_cache(const Tensor& cache, Format f) {
  check_cache(cache, f);
  const int64_t pages = cache.size(0), P = cache.size(1);
  Tensor out = Tensor::empty(DType::f64, {pages, P, kDims});
  auto* dst = reinterpret_cast<double*>(out.data());
  for (int64_t g = 0; g < pages; ++g)
    for (int64_t t = 0; t < P; ++t) read_record(cache, f, g, t, dst + (g * P + t) * kDims);
  return out;
}

void write_record(const Tensor& cache, Format f, int64_t page, int64_t t, const double* values) {
  auto* base = reinterpret_cast<uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
  const int64_t P = cache.size(1), block = block_elems(f), blocks = scale_bytes(f);
  std::vector<uint8_t> codes(static_cast<size_t>(kDims));
  for (int64_t b = 0; b < blocks; ++b) {
    double amax = 0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i)
      amax = std::max(amax, std::fabs(values[i]));
    uint8_t byte = 0;
    if (f == Format::nvfp4) {
      // The V4.1 writer's floor keeps the e4m3 scale >= 2^-9 (its smallest subnormal).
      byte = fp8_encode(std::max(amax, 6.0 * std::ldexp(1.0, -9)) / 6.0, DType::e4m3fn);
    } else {
      // The V4.1 MXFP4 packers floor amax at 6 * 2^-126: byte >= 1, never the 2^-127 byte.
      byte =
          fp4::mx_scale_byte(std::max(amax, 6.0 * std::ldexp(1.0, -126)), fp4::MxScaleRule::ceil);
    }
    base[scale_offset(f, P, t, b)] = byte;
    const double scale = scale_value(f, byte);
    for (int64_t i = b * block; i < (b + 1) * block; ++i)
      codes[static_cast<size_t>(i)] = fp4::e2m1_encode(values[i] / scale);
  }
  for (int64_t c = 0; c < kDataBytes; ++c)
    base[data_offset(t, c)] =
        fp4::pack_nibbles(codes[static_cast<size_t>(2 * c)], codes[static_cast<size_t>(2 * c + 1)]);
}

MlaResult sparse_mla_fp4(const Tensor& q, const Tensor& cache, Format f,
                         const RaggedIndices& indices, double scale) {
  if (q.ndim() != 3 || q.size(2) != kDims)
    throw std::invalid_argument("q must be [T, N, 512] for an FP4 record cache, got " +
                                q.describe());
  return sparse_mla(q, {decode_cache(cache, f), 1.0}, indices, scale, kDims);
}

}  // namespace attncheck::ref::fp4_record
