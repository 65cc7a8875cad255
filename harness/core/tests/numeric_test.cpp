// The narrow-float codecs against tables built here from the format definitions (OCP OFP8 v1.0,
// the FNUZ RFC, IEEE 754), never from the decoder under test. docs/formats.md lists the sources.
#include "core/numeric.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_util.h"

#include "core/rng.h"
#include "core/tensor.h"

namespace attncheck {
namespace {

using testing_util::SameValue;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kFp8[] = {DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz};
constexpr Saturation kBothModes[] = {Saturation::saturate, Saturation::nonsaturate};

// --- Independent definition of every fp8 code ---------------------------------------------------
struct Fp8Def {
  int exp_bits, man_bits, bias;
  enum { ocp_e4m3, ieee_like, fnuz } nan_rule;
};
Fp8Def definition(DType t) {
  switch (t) {
    case DType::e4m3fn:
      return {4, 3, 7, Fp8Def::ocp_e4m3};  // OFP8: S.1111.111 is NaN, no inf
    case DType::e4m3fnuz:
      return {4, 3, 8, Fp8Def::fnuz};  // 0x80 is the only NaN; no inf, no -0
    case DType::e5m2:
      return {5, 2, 15, Fp8Def::ieee_like};  // exponent 11111: inf (man 0) or NaN
    default:
      return {5, 2, 16, Fp8Def::fnuz};
  }
}
// value = (-1)^s * 2^(E - bias) * (1 + M / 2^m) for E > 0, (-1)^s * 2^(1 - bias) * (M / 2^m)
// for E == 0, except the special codes of the format.
double defined_value(unsigned code, DType t) {
  const Fp8Def d = definition(t);
  const unsigned s = code >> 7;
  const unsigned e = (code >> d.man_bits) & ((1u << d.exp_bits) - 1);
  const unsigned m = code & ((1u << d.man_bits) - 1);
  const unsigned e_top = (1u << d.exp_bits) - 1, m_top = (1u << d.man_bits) - 1;
  if (d.nan_rule == Fp8Def::fnuz && code == 0x80) return kNaN;
  if (d.nan_rule == Fp8Def::ocp_e4m3 && e == e_top && m == m_top) return kNaN;
  if (d.nan_rule == Fp8Def::ieee_like && e == e_top) return m ? kNaN : (s ? -kInf : kInf);
  double mag = 1.0;
  for (int i = 0; i < d.man_bits; ++i) mag *= 2.0;  // 2^m
  const double frac = static_cast<double>(m) / mag;
  double v;
  if (e == 0) {
    v = frac;
    for (int i = 0; i < d.bias - 1; ++i) v /= 2.0;  // * 2^(1 - bias)
  } else {
    v = 1.0 + frac;
    const int p = static_cast<int>(e) - d.bias;
    for (int i = 0; i < p; ++i) v *= 2.0;
    for (int i = 0; i < -p; ++i) v /= 2.0;
  }
  return s ? -v : v;
}

TEST(Fp8Decode, AllCodesOfEveryFormatMatchTheDefinition) {
  for (DType t : kFp8) {
    for (unsigned c = 0; c < 256; ++c)
      EXPECT_TRUE(SameValue(defined_value(c, t), fp8_decode(static_cast<uint8_t>(c), t)))
          << dtype_name(t) << " code 0x" << std::hex << c;
  }
}

TEST(Fp8Decode, HandCheckedAnchors) {
  EXPECT_EQ(fp8_decode(0x7E, DType::e4m3fn), 448.0);
  EXPECT_EQ(fp8_decode(0x01, DType::e4m3fn), 0x1p-9);
  EXPECT_EQ(fp8_decode(0x08, DType::e4m3fn), 0x1p-6);  // min normal
  EXPECT_EQ(fp8_decode(0x38, DType::e4m3fn), 1.0);
  EXPECT_EQ(fp8_decode(0x7F, DType::e4m3fnuz), 240.0);
  EXPECT_EQ(fp8_decode(0x01, DType::e4m3fnuz), 0x1p-10);
  EXPECT_EQ(fp8_decode(0x40, DType::e4m3fnuz), 1.0);
  EXPECT_EQ(fp8_decode(0x7B, DType::e5m2), 57344.0);
  EXPECT_EQ(fp8_decode(0x7C, DType::e5m2), kInf);
  EXPECT_EQ(fp8_decode(0xFC, DType::e5m2), -kInf);
  EXPECT_EQ(fp8_decode(0x7F, DType::e5m2fnuz), 57344.0);
  EXPECT_EQ(fp8_decode(0x01, DType::e5m2fnuz), 0x1p-17);
  EXPECT_TRUE(std::signbit(fp8_decode(0x80, DType::e4m3fn)));  // -0 exists in OCP
}

TEST(Fp8Decode, NaNEncodings) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    EXPECT_EQ(std::isnan(fp8_decode(b, DType::e4m3fn)), c == 0x7F || c == 0xFF) << c;
    EXPECT_EQ(std::isnan(fp8_decode(b, DType::e4m3fnuz)), c == 0x80) << c;
    EXPECT_EQ(std::isnan(fp8_decode(b, DType::e5m2fnuz)), c == 0x80) << c;
    EXPECT_EQ(std::isnan(fp8_decode(b, DType::e5m2)), (c & 0x7F) > 0x7C) << c;
  }
  EXPECT_EQ(nan_bits(DType::e4m3fn), 0x7Fu);
  EXPECT_EQ(nan_bits(DType::e4m3fnuz), 0x80u);
  EXPECT_EQ(nan_bits(DType::e5m2fnuz), 0x80u);
  EXPECT_TRUE(std::isnan(fp8_decode(static_cast<uint8_t>(nan_bits(DType::e5m2)), DType::e5m2)));
  EXPECT_TRUE(std::isnan(bf16_to_float(static_cast<uint16_t>(nan_bits(DType::bf16)))));
  EXPECT_TRUE(std::isnan(f16_to_float(static_cast<uint16_t>(nan_bits(DType::f16)))));
}

TEST(Fp8Decode, FnuzIsHalfOfFnForEveryFiniteCode) {
  // The same bits mean half the value: why fn/fnuz mix-ups look "almost right" (sglang#36555).
  for (unsigned c = 0; c < 256; ++c) {
    if (c == 0x00 || c == 0x80 || c == 0x7F || c == 0xFF) continue;
    const auto b = static_cast<uint8_t>(c);
    EXPECT_EQ(fp8_decode(b, DType::e4m3fnuz), fp8_decode(b, DType::e4m3fn) / 2) << c;
    if ((c & 0x7F) < 0x7C) {  // e5m2's inf/NaN codes are finite in e5m2fnuz
      EXPECT_EQ(fp8_decode(b, DType::e5m2fnuz), fp8_decode(b, DType::e5m2) / 2) << c;
    }
  }
}

TEST(Numeric, MaxFiniteAndUnitRoundoff) {
  EXPECT_EQ(max_finite(DType::e4m3fn), 448.0);
  EXPECT_EQ(max_finite(DType::e4m3fnuz), 240.0);
  EXPECT_EQ(max_finite(DType::e5m2), 57344.0);
  EXPECT_EQ(max_finite(DType::e5m2fnuz), 57344.0);
  EXPECT_EQ(max_finite(DType::f16), 65504.0);
  EXPECT_EQ(max_finite(DType::bf16), 0x1.FEp127);
  EXPECT_EQ(unit_roundoff(DType::bf16), 0x1p-8);
  EXPECT_EQ(unit_roundoff(DType::f16), 0x1p-11);
  EXPECT_EQ(unit_roundoff(DType::f32), 0x1p-24);
  EXPECT_EQ(unit_roundoff(DType::f64), 0x1p-53);
  EXPECT_EQ(unit_roundoff(DType::e4m3fn), 0x1p-4);
  EXPECT_EQ(unit_roundoff(DType::e5m2), 0x1p-3);
  EXPECT_EQ(unit_roundoff(DType::i32), 0.0);
}

// --- Encoder -------------------------------------------------------------------------------------
uint32_t enc(double x, DType t, Saturation s) {
  return encode_minifloat(x, t, s);
}

TEST(Fp8Encode, E4m3fnOverflowBoundaries) {
  for (Saturation s : kBothModes) {
    EXPECT_EQ(enc(448, DType::e4m3fn, s), 0x7Eu);
    EXPECT_EQ(enc(449, DType::e4m3fn, s), 0x7Eu);
    // 464 is the midpoint of 448 (mantissa 110, even) and 480 (111, would be the NaN code):
    // round to nearest even first, then check the range (OCP rule) -> 448 in both modes.
    EXPECT_EQ(enc(464, DType::e4m3fn, s), 0x7Eu);
    EXPECT_EQ(enc(-464, DType::e4m3fn, s), 0xFEu);
    EXPECT_EQ(enc(240, DType::e4m3fn, s), 0x77u);
    // No inf in e4m3fn: inf is not finite, so saturation does not apply (HIP: propagate).
    EXPECT_EQ(enc(kInf, DType::e4m3fn, s) & 0x7Fu, 0x7Fu);
    EXPECT_EQ(enc(kNaN, DType::e4m3fn, s) & 0x7Fu, 0x7Fu);
  }
  EXPECT_EQ(enc(std::nextafter(464.0, 0.0), DType::e4m3fn, Saturation::nonsaturate), 0x7Eu);
  EXPECT_EQ(enc(465, DType::e4m3fn, Saturation::saturate), 0x7Eu);
  EXPECT_EQ(enc(-465, DType::e4m3fn, Saturation::saturate), 0xFEu);
  EXPECT_EQ(enc(465, DType::e4m3fn, Saturation::nonsaturate) & 0x7Fu, 0x7Fu);  // NaN
  EXPECT_EQ(enc(std::nextafter(464.0, kInf), DType::e4m3fn, Saturation::nonsaturate) & 0x7Fu,
            0x7Fu);
  EXPECT_EQ(enc(1e30, DType::e4m3fn, Saturation::saturate), 0x7Eu);
}

TEST(Fp8Encode, E4m3fnuzOverflowBoundariesAndNoNegativeZero) {
  for (Saturation s : kBothModes) {
    EXPECT_EQ(enc(240, DType::e4m3fnuz, s), 0x7Fu);
    EXPECT_EQ(enc(-240, DType::e4m3fnuz, s), 0xFFu);
    EXPECT_EQ(enc(247.9, DType::e4m3fnuz, s), 0x7Fu);
    EXPECT_EQ(enc(448, DType::e4m3fnuz, Saturation::saturate), 0x7Fu);
    EXPECT_EQ(enc(-0.0, DType::e4m3fnuz, s), 0x00u);  // no -0: 0x80 is NaN
    EXPECT_EQ(enc(-1e-30, DType::e4m3fnuz, s), 0x00u);
    EXPECT_EQ(enc(-0x1p-12, DType::e4m3fnuz, s), 0x00u);  // underflow keeps no sign
    EXPECT_EQ(enc(kInf, DType::e4m3fnuz, s), 0x80u);
    EXPECT_EQ(enc(-kInf, DType::e4m3fnuz, s), 0x80u);
    EXPECT_EQ(enc(kNaN, DType::e4m3fnuz, s), 0x80u);
  }
  // 248 is the midpoint of 240 (mantissa 111, odd) and 256 (out of range, even): RNE goes up.
  EXPECT_EQ(enc(248, DType::e4m3fnuz, Saturation::saturate), 0x7Fu);
  EXPECT_EQ(enc(248, DType::e4m3fnuz, Saturation::nonsaturate), 0x80u);
  EXPECT_EQ(enc(-248, DType::e4m3fnuz, Saturation::nonsaturate), 0x80u);
  EXPECT_EQ(enc(448, DType::e4m3fnuz, Saturation::nonsaturate), 0x80u);
}

TEST(Fp8Encode, E5m2OverflowBoundaries) {
  for (Saturation s : kBothModes) {
    EXPECT_EQ(enc(57344, DType::e5m2, s), 0x7Bu);
    EXPECT_EQ(enc(61439, DType::e5m2, s), 0x7Bu);
    EXPECT_EQ(enc(57344, DType::e5m2fnuz, s), 0x7Fu);
    EXPECT_EQ(enc(kInf, DType::e5m2, s), 0x7Cu);  // e5m2 has inf: passed through
    EXPECT_EQ(enc(-kInf, DType::e5m2, s), 0xFCu);
    EXPECT_EQ(enc(kInf, DType::e5m2fnuz, s), 0x80u);
    EXPECT_EQ(enc(-0.0, DType::e5m2, s), 0x80u);
    EXPECT_EQ(enc(-0.0, DType::e5m2fnuz, s), 0x00u);
  }
  // 61440: midpoint of 57344 (mantissa 11, odd) and 65536 (even, out of range): rounds up.
  EXPECT_EQ(enc(61440, DType::e5m2, Saturation::nonsaturate), 0x7Cu);  // inf
  EXPECT_EQ(enc(-61440, DType::e5m2, Saturation::nonsaturate), 0xFCu);
  EXPECT_EQ(enc(61440, DType::e5m2, Saturation::saturate), 0x7Bu);
  EXPECT_EQ(enc(61440, DType::e5m2fnuz, Saturation::nonsaturate), 0x80u);
  EXPECT_EQ(enc(61440, DType::e5m2fnuz, Saturation::saturate), 0x7Fu);
}

TEST(Fp8Encode, SubnormalEdgesTiesAndTinyValues) {
  for (Saturation s : kBothModes) {
    // e4m3fn: subnormal quantum 2^-9.
    EXPECT_EQ(enc(0x1p-10, DType::e4m3fn, s), 0x00u);         // tie 0 | 2^-9 -> even (0)
    EXPECT_EQ(enc(-0x1p-10, DType::e4m3fn, s), 0x80u);        // ... keeping the sign
    EXPECT_EQ(enc(0x1.000001p-10, DType::e4m3fn, s), 0x01u);  // just above the tie
    EXPECT_EQ(enc(3 * 0x1p-10, DType::e4m3fn, s), 0x02u);     // tie 1 | 2 -> 2
    EXPECT_EQ(enc(5 * 0x1p-10, DType::e4m3fn, s), 0x02u);     // tie 2 | 3 -> 2
    EXPECT_EQ(enc(7 * 0x1p-9, DType::e4m3fn, s), 0x07u);      // largest subnormal
    EXPECT_EQ(enc(7.5 * 0x1p-9, DType::e4m3fn, s), 0x08u);    // tie 7 | min normal -> 8
    EXPECT_EQ(enc(0x1p-6, DType::e4m3fn, s), 0x08u);
    // e4m3fnuz: quantum 2^-10; e5m2: 2^-16; e5m2fnuz: 2^-17.
    EXPECT_EQ(enc(0x1p-11, DType::e4m3fnuz, s), 0x00u);
    EXPECT_EQ(enc(0x1.8p-10, DType::e4m3fnuz, s), 0x02u);
    EXPECT_EQ(enc(0x1p-16, DType::e5m2, s), 0x01u);
    EXPECT_EQ(enc(0x1p-17, DType::e5m2, s), 0x00u);
    EXPECT_EQ(enc(0x1p-17, DType::e5m2fnuz, s), 0x01u);
    for (DType t : kFp8) {
      for (double tiny : {1e-30, 0x1p-1000, 5e-324}) {
        EXPECT_EQ(enc(tiny, t, s), 0x00u) << dtype_name(t);
        const uint32_t neg_zero = definition(t).nan_rule == Fp8Def::fnuz ? 0x00u : 0x80u;
        EXPECT_EQ(enc(-tiny, t, s), neg_zero) << dtype_name(t);
      }
    }
  }
}

TEST(Fp8Encode, EveryFiniteCodeRoundTrips) {
  for (DType t : kFp8)
    for (Saturation s : kBothModes)
      for (unsigned c = 0; c < 256; ++c) {
        const double v = defined_value(c, t);
        if (!std::isfinite(v)) continue;
        EXPECT_EQ(enc(v, t, s), c) << dtype_name(t) << " code " << c;
      }
}

TEST(Fp8Encode, MidpointsBetweenNeighboursRoundToEven) {
  // Exhaustive over adjacent positive finite codes: the midpoint goes to the even code, any
  // double on either side to the nearer one.
  for (DType t : kFp8)
    for (Saturation s : kBothModes)
      for (unsigned c = 0; c + 1 < 0x80; ++c) {
        const double lo = defined_value(c, t), hi = defined_value(c + 1, t);
        if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
        const double mid = (lo + hi) / 2;
        const unsigned even = (c % 2 == 0) ? c : c + 1;
        EXPECT_EQ(enc(mid, t, s), even) << dtype_name(t) << " between " << c << " and " << c + 1;
        EXPECT_EQ(enc(std::nextafter(mid, 0.0), t, s), c) << dtype_name(t);
        EXPECT_EQ(enc(std::nextafter(mid, kInf), t, s), c + 1) << dtype_name(t);
        // FNUZ has no -0: a negative value rounding to zero is +0 (0x80 is NaN).
        const bool fnuz = definition(t).nan_rule == Fp8Def::fnuz;
        EXPECT_EQ(enc(-mid, t, s), (fnuz && even == 0) ? 0u : (even | 0x80u)) << dtype_name(t);
      }
}

// --- bf16 and f16 against integer-only rounding written here ---------------------------------
// RNE of float bits to bf16: keep the top 16 bits, round on the 16 dropped ones.
uint16_t bf16_by_bits(uint32_t u) {
  const uint32_t kept = u >> 16, dropped = u & 0xFFFFu;
  const bool up = dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u));
  return static_cast<uint16_t>(kept + (up ? 1u : 0u));  // a carry into the exponent is correct
}

// RNE of a finite float to IEEE half with integers only: value = M * 2^E exactly, scaled to the
// half quantum of the result's binade and rounded on the dropped bits.
uint16_t f16_by_bits(uint32_t u) {
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const int exp = static_cast<int>((u >> 23) & 0xFFu);
  const uint32_t man = u & 0x7FFFFFu;
  if (exp == 0 && man == 0) return sign;
  uint64_t big = exp ? (man | 0x800000u) : man;  // value = big * 2^e2
  const int e2 = exp ? exp - 150 : -149;
  int top = 63 - std::countl_zero(big) + e2;    // floor(log2 value)
  if (top > 15) return sign | 0x7C00u;          // >= 65536: inf even before rounding
  const int quantum = std::max(top, -14) - 10;  // exponent of one unit in the last place
  const int shift = quantum - e2;
  uint64_t q;
  if (shift <= 0) {
    q = big << -shift;
  } else if (shift >= 64) {
    q = 0;
  } else {
    q = big >> shift;
    const uint64_t rem = big & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }
  // q counts quanta of 2^quantum; as bits: exponent field = quantum + 25 for normal numbers.
  if (quantum == -24) return static_cast<uint16_t>(sign | q);  // subnormal (or carry to 0x400)
  const uint64_t bits = (static_cast<uint64_t>(quantum + 24) << 10) + q;  // q has the hidden 1
  if (bits >= 0x7C00u) return sign | 0x7C00u;
  return static_cast<uint16_t>(sign | bits);
}

// Float bit patterns: every exponent, both signs, mantissas at and around every tie position,
// plus random ones.
std::vector<uint32_t> stratified_floats() {
  std::vector<uint32_t> out;
  Rng rng("numeric_test", "stratified_floats");
  for (uint32_t sign : {0u, 1u})
    for (uint32_t e = 0; e < 256; ++e) {
      std::vector<uint32_t> mans = {0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF};
      for (int k = 0; k < 23; ++k) {
        const uint32_t bit = 1u << k;
        for (uint32_t hi : {0u, bit << 1, 0x7FFFFFu & ~((bit << 1) - 1)}) {
          mans.push_back((hi | bit) & 0x7FFFFFu);              // exact tie at position k
          mans.push_back((hi | bit | (bit - 1)) & 0x7FFFFFu);  // tie + below bits
          mans.push_back((hi | (bit - 1)) & 0x7FFFFFu);        // just below the tie
          mans.push_back((hi | bit | 1u) & 0x7FFFFFu);
        }
      }
      for (int i = 0; i < 64; ++i) mans.push_back(rng.next_u32() & 0x7FFFFFu);
      for (uint32_t m : mans) out.push_back((sign << 31) | (e << 23) | m);
    }
  return out;
}

bool is_nan_bf16(uint32_t b) {
  return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0;
}
bool is_nan_f16(uint32_t b) {
  return (b & 0x7C00u) == 0x7C00u && (b & 0x3FFu) != 0;
}

TEST(Bf16, RoundToNearestEvenOverStratifiedFloats) {
  int64_t checked = 0;
  for (uint32_t u : stratified_floats()) {
    const float x = std::bit_cast<float>(u);
    const uint16_t fast = bf16_from_float(x);
    const auto generic =
        static_cast<uint16_t>(encode_minifloat(x, DType::bf16, Saturation::nonsaturate));
    if (std::isnan(x)) {  // NaN compared as a class: payloads differ between libraries
      EXPECT_TRUE(is_nan_bf16(fast)) << std::hex << u;
      EXPECT_TRUE(is_nan_bf16(generic)) << std::hex << u;
      continue;
    }
    const uint16_t want = bf16_by_bits(u);
    ASSERT_EQ(fast, want) << "float bits 0x" << std::hex << u;
    ASSERT_EQ(generic, want) << "float bits 0x" << std::hex << u;
    ASSERT_EQ(bf16_to_float(want), static_cast<float>(decode_minifloat(want, DType::bf16)));
    ++checked;
  }
  EXPECT_GT(checked, 100000);
}

TEST(F16, RoundToNearestEvenOverStratifiedFloats) {
  int64_t checked = 0;
  for (uint32_t u : stratified_floats()) {
    const float x = std::bit_cast<float>(u);
    const uint16_t fast = f16_from_float(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(is_nan_f16(fast)) << std::hex << u;
      continue;
    }
    const uint16_t want =
        std::isinf(x) ? static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7C00u) : f16_by_bits(u);
    ASSERT_EQ(fast, want) << "float bits 0x" << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
  EXPECT_EQ(f16_from_float(65504.0f), 0x7BFFu);
  EXPECT_EQ(f16_from_float(65519.99f), 0x7BFFu);
  EXPECT_EQ(f16_from_float(65520.0f), 0x7C00u);  // tie with 65536 rounds to even = inf
  EXPECT_EQ(f16_from_float(0x1p-24f), 0x0001u);
  EXPECT_EQ(f16_from_float(0x1p-25f), 0x0000u);  // tie with 0
  EXPECT_EQ(f16_to_float(0x3C00u), 1.0f);
}

TEST(DoublePath, NoDoubleRoundingThroughFloat) {
  // 1 + 2^-8 is the midpoint of bf16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81). A double just above it
  // must round up, although rounding it to float first lands exactly on the tie (-> even, down).
  const double above = 1.0 + 0x1p-8 + 0x1p-40;
  ASSERT_EQ(static_cast<float>(above), 1.0f + 0x1p-8f);
  EXPECT_EQ(bf16_from_float(static_cast<float>(above)), 0x3F80u);  // the trap
  EXPECT_EQ(encode_minifloat(above, DType::bf16), 0x3F81u);
  EXPECT_EQ(encode_value(above, DType::bf16), 0x3F81u);
  // Below the tie between 0x3F81 and 0x3F82 (1 + 3 * 2^-8): must round down.
  const double below = 1.0 + 3 * 0x1p-8 - 0x1p-40;
  EXPECT_EQ(bf16_from_float(static_cast<float>(below)), 0x3F82u);
  EXPECT_EQ(encode_minifloat(below, DType::bf16), 0x3F81u);
  Tensor t = Tensor::empty(DType::bf16, {2});
  t.set({0}, above);
  t.set({1}, below);
  EXPECT_EQ(t.get_bits({0}), 0x3F81u);
  EXPECT_EQ(t.get_bits({1}), 0x3F81u);
  // fp8: just above 464 overflows in non-saturating mode, exactly 464 does not.
  EXPECT_EQ(encode_minifloat(464.0 + 1e-9, DType::e4m3fn, Saturation::nonsaturate), 0x7Fu);
  // f16: just above the tie 1 + 2^-11.
  EXPECT_EQ(encode_minifloat(1.0 + 0x1p-11 + 0x1p-40, DType::f16), 0x3C01u);
}

TEST(Encode, IntegerPathMatchesScalingInEveryFormat) {
  // encode_minifloat rounds normal-range values by integers; the scaling path is the definition.
  // Every code's value, the midpoints to its neighbours and one ulp (of double) either side, and
  // random significands over every exponent the formats reach (and past them).
  const DType formats[] = {DType::f16,      DType::bf16, DType::e4m3fn,
                           DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz};
  for (DType t : formats) {
    const uint32_t codes = dtype_size(t) == 1 ? 256u : 65536u;
    for (Saturation s : kBothModes) {
      auto same = [&](double x) {
        ASSERT_EQ(encode_minifloat(x, t, s), encode_minifloat_by_scaling(x, t, s))
            << dtype_name(t) << " x=" << x;
      };
      for (uint32_t c = 0; c + 1 < codes; ++c) {
        const double a = decode_minifloat(c, t), b = decode_minifloat(c + 1, t);
        for (double x : {a, std::nextafter(a, 0.0), std::nextafter(a, 1e300)}) same(x);
        if (std::isfinite(a) && std::isfinite(b)) {
          const double mid = (a + b) / 2;
          for (double x : {mid, std::nextafter(mid, a), std::nextafter(mid, b)}) same(x);
        }
      }
      uint64_t state = 0x9E3779B97F4A7C15ull;
      for (int i = 0; i < 200000; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const int e = static_cast<int>(state >> 58) * 5 - 160;  // 2^-160 .. 2^155
        const double m = 1.0 + static_cast<double>(state & ((1ull << 52) - 1)) * 0x1p-52;
        same(std::ldexp((state >> 57) & 1 ? -m : m, e));
      }
    }
  }
}

TEST(Numeric, EncodeValueRulesPerDtype) {
  // Tensors store fp8 saturating (the kernels' quantizers do), f16/bf16 overflow to inf.
  EXPECT_EQ(encode_value(1000.0, DType::e4m3fn), 0x7Eu);
  EXPECT_EQ(encode_value(1000.0, DType::e4m3fnuz), 0x7Fu);
  EXPECT_EQ(encode_value(1e6, DType::f16), 0x7C00u);
  EXPECT_EQ(encode_value(1e39, DType::bf16), 0x7F80u);
  EXPECT_EQ(decode_value(0xFFFFFFFFu, DType::i32), -1.0);
  EXPECT_EQ(decode_value(0xFFu, DType::i8), -1.0);
  EXPECT_EQ(decode_value(0xFFu, DType::u8), 255.0);
  EXPECT_EQ(parse_dtype("fp8_e4m3fnuz"), DType::e4m3fnuz);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_FALSE(parse_dtype("fp4").has_value());
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
}

}  // namespace
}  // namespace attncheck
