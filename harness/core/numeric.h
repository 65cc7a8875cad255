// Encoders and decoders for the low-precision float formats, written from the format definitions
// (OCP OFP8 spec, FNUZ RFC, IEEE 754) so that the reference never depends on a vendor header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "dtype.h"

namespace attncheck {

// What happens to a finite value whose rounded magnitude exceeds the format's largest finite value.
enum class Saturation {
  saturate,     // clamp to +-max finite (HIP __HIP_SATFINITE, torch's fp8 cast of finite values)
  nonsaturate,  // become inf where the format has it, else NaN (OCP "round first, then overflow")
};

// Parameters of a binary floating-point format narrower than 32 bits.
struct MiniFloat {
  int exp_bits;
  int man_bits;
  int bias;
  enum Specials {
    ieee,
    fn,
    fnuz
  } specials;  // ieee: inf + NaN at max exponent; fn: only S.1..1.1..1 is
               // NaN; fnuz: 0x80 is the only NaN, no -0, no inf
};

MiniFloat minifloat_format(DType t);  // f16, bf16 and the four fp8 types
double max_finite(DType t);

// Round-to-nearest-even from double straight to the format (no double rounding through float).
uint32_t encode_minifloat(double x, DType t, Saturation sat = Saturation::saturate);
// The same result by scaling (frexp / ldexp / nearbyint), the definition the fast integer path of
// encode_minifloat is tested against; encode_minifloat uses it outside the normal range.
uint32_t encode_minifloat_by_scaling(double x, DType t, Saturation sat = Saturation::saturate);
double decode_minifloat(uint32_t bits, DType t);
// encode_minifloat over a run of values, bit for bit, code i written at out + i * width as a
// uint8_t (fp8) or uint16_t (f16, bf16): the input generators' chunked encoder, with the format's
// parameters fixed at compile time instead of looked up per value.
void encode_minifloats(std::span<const double> x, DType t, Saturation sat, std::byte* out);

// Fast paths with identical results.
uint16_t bf16_from_float(float x);
float bf16_to_float(uint16_t bits);
uint16_t f16_from_float(float x);
float f16_to_float(uint16_t bits);

inline uint8_t fp8_encode(double x, DType t, Saturation sat = Saturation::saturate) {
  return static_cast<uint8_t>(encode_minifloat(x, t, sat));
}
inline double fp8_decode(uint8_t bits, DType t) {
  return decode_minifloat(bits, t);
}

// The canonical NaN bit pattern of a format (used to poison outputs).
uint64_t nan_bits(DType t);

// Unit roundoff u = 2^-(mantissa bits + 1) of a floating type (0 for integers).
double unit_roundoff(DType t);

}  // namespace attncheck
