// FP4 codecs (fp4.h). Every value here is exact in double: e2m1 values have one mantissa bit and
// e8m0 scales are powers of two, so decode never rounds and quantize rounds only in e2m1_encode.
#include "core/fp4.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/numeric.h"

namespace attncheck::fp4 {

double e2m1_decode(uint8_t code) {
  if (code >= kE2m1Codes)
    throw std::invalid_argument("e2m1_decode: code " + std::to_string(code) +
                                " has bits above the low four");
  const double magnitude = kE2m1Magnitudes[code & 7];
  return (code & 8) ? -magnitude : magnitude;
}

uint8_t e2m1_encode(double x, E2m1Rounding rounding) {
  if (std::isnan(x)) throw std::domain_error("e2m1_encode: NaN has no e2m1 code");
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const double a = std::fabs(x);
  uint8_t magnitude_code = 7;  // saturate: 6 and above, inf included
  if (a < kE2m1Max) {
    int lower = 0;
    while (kE2m1Magnitudes[lower + 1] <= a) ++lower;
    const double midpoint = (kE2m1Magnitudes[lower] + kE2m1Magnitudes[lower + 1]) / 2;
    if (a < midpoint) {
      magnitude_code = static_cast<uint8_t>(lower);
    } else if (a > midpoint) {
      magnitude_code = static_cast<uint8_t>(lower + 1);
    } else if (rounding == E2m1Rounding::nearest_even) {
      magnitude_code = static_cast<uint8_t>(lower % 2 == 0 ? lower : lower + 1);
    } else {
      magnitude_code = static_cast<uint8_t>(lower);
    }
  }
  if (magnitude_code == 0 && rounding == E2m1Rounding::nearest_ties_to_smaller) return 0;
  return static_cast<uint8_t>(sign | magnitude_code);
}

double e8m0_decode(uint8_t byte) {
  if (byte == kE8m0NaN) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, static_cast<int>(byte) - kE8m0Bias);
}

std::string_view scale_rule_name(MxScaleRule rule) {
  switch (rule) {
    case MxScaleRule::ocp_floor:
      return "ocp_floor";
    case MxScaleRule::ceil:
      return "ceil";
    case MxScaleRule::even:
      return "even";
  }
  return "?";
}

uint8_t mx_scale_byte(double amax, MxScaleRule rule) {
  if (!std::isfinite(amax)) return kE8m0NaN;
  amax = std::fabs(amax);
  if (amax == 0) return kE8m0Bias;
  int k = 0;
  const double m = std::frexp(amax, &k);  // amax = m * 2^k, m in [0.5, 1)
  const int floor_log2 = k - 1;
  int e = floor_log2 - 2;  // e2m1's largest power of two is 2^2
  switch (rule) {
    case MxScaleRule::ocp_floor:
      break;
    case MxScaleRule::ceil:
      while (std::ldexp(kE2m1Max, e) < amax) ++e;
      while (std::ldexp(kE2m1Max, e - 1) >= amax) --e;
      break;
    case MxScaleRule::even:
      if (2 * m >= 1.75) ++e;
      break;
  }
  if (e < -kE8m0Bias) e = -kE8m0Bias;
  if (e > kE8m0Bias) e = kE8m0Bias;
  return static_cast<uint8_t>(e + kE8m0Bias);
}

uint8_t pack_nibbles(uint8_t even_code, uint8_t odd_code, NibbleOrder order) {
  const uint8_t lo = order == NibbleOrder::low_first ? even_code : odd_code;
  const uint8_t hi = order == NibbleOrder::low_first ? odd_code : even_code;
  return static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
}

uint8_t unpack_nibble(uint8_t byte, int index_in_byte, NibbleOrder order) {
  const bool low = (index_in_byte == 0) == (order == NibbleOrder::low_first);
  return static_cast<uint8_t>(low ? (byte & 0xF) : (byte >> 4));
}

namespace {

void check_sizes(const char* what, size_t elements, size_t block, size_t packed, size_t scales) {
  if (elements % block != 0 || packed != elements / 2 || scales != elements / block)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(elements) +
                                " elements need a multiple of " + std::to_string(block) + ", " +
                                std::to_string(elements / 2) + " packed bytes and " +
                                std::to_string(elements / block) + " scales (got " +
                                std::to_string(packed) + ", " + std::to_string(scales) + ")");
}

double block_amax(std::span<const double> x, size_t begin, size_t n, const char* what) {
  double amax = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    if (std::isnan(x[i]))
      throw std::domain_error(std::string(what) + ": NaN at element " + std::to_string(i));
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  return amax;
}

}  // namespace

void mxfp4_quantize(std::span<const double> x, MxScaleRule rule, E2m1Rounding rounding,
                    NibbleOrder order, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  check_sizes("mxfp4_quantize", x.size(), kMxfp4Block, packed.size(), scales.size());
  for (size_t b = 0; b < scales.size(); ++b) {
    const size_t begin = b * kMxfp4Block;
    const uint8_t byte = mx_scale_byte(block_amax(x, begin, kMxfp4Block, "mxfp4_quantize"), rule);
    if (byte == kE8m0NaN)
      throw std::domain_error("mxfp4_quantize: infinite element in block " + std::to_string(b));
    scales[b] = byte;
    const double scale = e8m0_decode(byte);
    for (size_t i = begin; i < begin + kMxfp4Block; i += 2)
      packed[i / 2] = pack_nibbles(e2m1_encode(x[i] / scale, rounding),
                                   e2m1_encode(x[i + 1] / scale, rounding), order);
  }
}

void mxfp4_dequantize(std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                      NibbleOrder order, std::span<double> out) {
  check_sizes("mxfp4_dequantize", out.size(), kMxfp4Block, packed.size(), scales.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = e2m1_decode(unpack_nibble(packed[i / 2], static_cast<int>(i % 2), order)) *
             e8m0_decode(scales[i / kMxfp4Block]);
}

double nvfp4_decode(uint8_t code, uint8_t block_scale_e4m3, float tensor_scale) {
  return e2m1_decode(code) * fp8_decode(block_scale_e4m3, DType::e4m3fn) *
         static_cast<double>(tensor_scale);
}

void nvfp4_quantize(std::span<const double> x, float tensor_scale, E2m1Rounding rounding,
                    NibbleOrder order, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  check_sizes("nvfp4_quantize", x.size(), kNvfp4Block, packed.size(), scales.size());
  if (!(std::isfinite(tensor_scale) && tensor_scale > 0))
    throw std::invalid_argument("nvfp4_quantize: tensor scale must be finite and > 0, got " +
                                std::to_string(tensor_scale));
  const double g = tensor_scale;
  for (size_t b = 0; b < scales.size(); ++b) {
    const size_t begin = b * kNvfp4Block;
    const double amax = block_amax(x, begin, kNvfp4Block, "nvfp4_quantize");
    scales[b] = fp8_encode(amax / (kE2m1Max * g), DType::e4m3fn, Saturation::saturate);
    const double step = fp8_decode(scales[b], DType::e4m3fn) * g;  // exact: 4 + 24 bits
    for (size_t i = begin; i < begin + kNvfp4Block; i += 2) {
      const uint8_t even = step == 0 ? 0 : e2m1_encode(x[i] / step, rounding);
      const uint8_t odd = step == 0 ? 0 : e2m1_encode(x[i + 1] / step, rounding);
      packed[i / 2] = pack_nibbles(even, odd, order);
    }
  }
}

}  // namespace attncheck::fp4
