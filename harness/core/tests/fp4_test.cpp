// The FP4 codecs (core/fp4.h) against a second formulation built here from the bit fields of the
// definitions (OCP MX v1.0 for e2m1/e8m0/MXFP4, OCP OFP8 for NVFP4's e4m3 scale), never from the
// tables or frexp arithmetic of the code under test. Exhaustive over codes x scale bytes.
#include "core/fp4.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_util.h"

namespace attncheck::fp4 {
namespace {

using testing_util::SameValue;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr E2m1Rounding kRoundings[] = {E2m1Rounding::nearest_even,
                                       E2m1Rounding::nearest_ties_to_smaller};
constexpr NibbleOrder kOrders[] = {NibbleOrder::low_first, NibbleOrder::high_first};
constexpr MxScaleRule kRules[] = {MxScaleRule::ocp_floor, MxScaleRule::ceil, MxScaleRule::even};

// 2^p by repeated doubling or halving (exact for every p used here).
double power_of_two(int p) {
  double v = 1.0;
  for (int i = 0; i < p; ++i) v *= 2.0;
  for (int i = 0; i < -p; ++i) v /= 2.0;
  return v;
}

// e2m1 from its fields: S.EE.M, bias 1; E = 0 is subnormal: 2^(1-1) * M/2.
double defined_e2m1(unsigned code) {
  const unsigned s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double v = e == 0 ? 0.5 * m : power_of_two(static_cast<int>(e) - 1) * (1.0 + 0.5 * m);
  return s ? -v : v;
}
double defined_e8m0(unsigned byte) {
  return byte == 0xFF ? kNaN : power_of_two(static_cast<int>(byte) - 127);
}
// e4m3fn from its fields (OFP8): bias 7, S.1111.111 NaN, no inf.
double defined_e4m3fn(unsigned code) {
  const unsigned s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return kNaN;
  const double v = e == 0 ? power_of_two(-6) * (m / 8.0)
                          : power_of_two(static_cast<int>(e) - 7) * (1.0 + m / 8.0);
  return s ? -v : v;
}

TEST(E2m1, AllSixteenCodesMatchTheDefinition) {
  for (unsigned c = 0; c < 16; ++c)
    EXPECT_TRUE(SameValue(defined_e2m1(c), e2m1_decode(static_cast<uint8_t>(c)))) << "code " << c;
  EXPECT_THROW(e2m1_decode(16), std::invalid_argument);
}

TEST(E2m1, EveryCodeRoundTripsUnderBothRoundings) {
  for (E2m1Rounding r : kRoundings)
    for (unsigned c = 0; c < 16; ++c) {
      const unsigned expected = (c == 8 && r == E2m1Rounding::nearest_ties_to_smaller) ? 0 : c;
      EXPECT_EQ(expected, static_cast<unsigned>(e2m1_encode(defined_e2m1(c), r))) << "code " << c;
    }
}

// Brute force: the nearest of the 16 defined values; a tie goes to the even mantissa bit (OCP)
// or to the smaller magnitude; the sign of a zero follows the rule's definition.
uint8_t nearest_by_search(double x, E2m1Rounding r) {
  int best = -1;
  for (unsigned c = 0; c < 16; ++c) {
    if ((c >> 3) != (std::signbit(x) ? 1u : 0u)) continue;  // same sign side, -0 included
    const double d = std::fabs(x - defined_e2m1(c));
    if (best < 0) {
      best = static_cast<int>(c);
      continue;
    }
    const double db = std::fabs(x - defined_e2m1(static_cast<unsigned>(best)));
    const bool tie = d == db;
    const bool prefer = r == E2m1Rounding::nearest_even ? (c & 1) == 0 : false;
    if (d < db || (tie && prefer)) best = static_cast<int>(c);
  }
  if (r == E2m1Rounding::nearest_ties_to_smaller && (best & 7) == 0) return 0;
  return static_cast<uint8_t>(best);
}

TEST(E2m1, RoundingMatchesANearestSearchOnADenseSweepWithEveryTie) {
  // Multiples of 1/64 in [-8, 8]: every midpoint (multiples of 1/4) and points around each.
  for (E2m1Rounding r : kRoundings)
    for (int k = -8 * 64; k <= 8 * 64; ++k) {
      const double x = k / 64.0;
      EXPECT_EQ(nearest_by_search(x, r), e2m1_encode(x, r)) << "x = " << x;
    }
  EXPECT_EQ(2, e2m1_encode(0.75));  // tie 0.5|1 -> even code 2 (1.0)
  EXPECT_EQ(1, e2m1_encode(0.75, E2m1Rounding::nearest_ties_to_smaller));
  EXPECT_EQ(6, e2m1_encode(3.5));  // tie 3|4 -> 4
  EXPECT_EQ(7, e2m1_encode(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(15, e2m1_encode(-1e300));
  EXPECT_EQ(8, e2m1_encode(-0.1));  // -0 under OCP
  EXPECT_THROW(e2m1_encode(kNaN), std::domain_error);
}

TEST(E8m0, All256BytesMatchTheDefinition) {
  for (unsigned b = 0; b < 256; ++b)
    EXPECT_TRUE(SameValue(defined_e8m0(b), e8m0_decode(static_cast<uint8_t>(b)))) << "byte " << b;
  EXPECT_GT(e8m0_decode(0), 0.0);  // 2^-127, not zero (vLLM #46676)
  EXPECT_TRUE(std::isnan(e8m0_decode(0xFF)));
}

TEST(Nibbles, EveryByteUnpacksAndRepacksInBothOrders) {
  for (NibbleOrder o : kOrders)
    for (unsigned byte = 0; byte < 256; ++byte) {
      const uint8_t a = unpack_nibble(static_cast<uint8_t>(byte), 0, o);
      const uint8_t b = unpack_nibble(static_cast<uint8_t>(byte), 1, o);
      EXPECT_EQ(byte, pack_nibbles(a, b, o));
      EXPECT_EQ(o == NibbleOrder::low_first ? (byte & 15) : (byte >> 4), a);
    }
  EXPECT_EQ(0x21, pack_nibbles(1, 2));  // element 0 in the low nibble (OCP, AITER)
}

// Exhaustive over codes x scale bytes: a block holding `code` at every position (both halves of a
// byte), decoded through the block dequantizer, equals e2m1 x e8m0 by the definition.
TEST(Mxfp4, DequantizeAllCodesTimesAllScaleBytes) {
  for (NibbleOrder o : kOrders)
    for (unsigned s = 0; s < 256; ++s)
      for (unsigned c = 0; c < 16; ++c) {
        std::vector<uint8_t> packed(kMxfp4Block / 2);
        for (int i = 0; i < kMxfp4Block / 2; ++i)
          packed[i] = static_cast<uint8_t>(o == NibbleOrder::low_first ? (c | (i % 16) << 4)
                                                                       : ((i % 16) | c << 4));
        const uint8_t scale = static_cast<uint8_t>(s);
        std::vector<double> out(kMxfp4Block);
        mxfp4_dequantize(packed, std::span(&scale, 1), o, out);
        for (int i = 0; i < kMxfp4Block; ++i) {
          const unsigned code = i % 2 == 0 ? c : static_cast<unsigned>((i / 2) % 16);
          ASSERT_TRUE(SameValue(defined_e2m1(code) * defined_e8m0(s), out[i]))
              << "scale " << s << " code " << code << " element " << i;
        }
      }
}

// A block whose largest magnitude is 6 * 2^(s-127) gets scale byte s under every rule; every code
// placed beside it comes back: encode is exhaustive over codes x scale bytes too.
TEST(Mxfp4, QuantizeRecoversAllCodesTimesAllScaleBytes) {
  for (MxScaleRule rule : kRules)
    for (NibbleOrder o : kOrders)
      for (unsigned s = 0; s < 255; ++s)
        for (unsigned c = 0; c < 16; ++c) {
          std::vector<double> x(kMxfp4Block, 0.0);
          x[5] = 6 * defined_e8m0(s);
          x[10] = defined_e2m1(c) * defined_e8m0(s);
          x[11] = -x[10];
          std::vector<uint8_t> packed(kMxfp4Block / 2), scales(1);
          mxfp4_quantize(x, rule, E2m1Rounding::nearest_even, o, packed, scales);
          ASSERT_EQ(s, scales[0]) << scale_rule_name(rule) << " code " << c;
          ASSERT_EQ(c, unpack_nibble(packed[5], 0, o)) << scale_rule_name(rule) << " s " << s;
          ASSERT_EQ(c ^ 8, unpack_nibble(packed[5], 1, o)) << scale_rule_name(rule) << " s " << s;
          ASSERT_EQ(7, unpack_nibble(packed[2], 1, o));
        }
}

// Second formulations of the scale rules: a search over the 255 exponents for ocp_floor and
// ceil, torchao's float-bit expression for even.
int search_exponent(double amax, MxScaleRule rule) {
  if (rule == MxScaleRule::ocp_floor) {
    int e = -127;  // largest e with 4 * 2^e <= amax
    for (int t = -127; t <= 127; ++t)
      if (4 * power_of_two(t) <= amax) e = t;
    return e;
  }
  for (int t = -127; t <= 127; ++t)  // smallest e with amax <= 6 * 2^e
    if (amax <= 6 * power_of_two(t)) return t;
  return 127;
}
int torchao_even_exponent(float amax) {
  const uint32_t bits = (std::bit_cast<uint32_t>(amax) + (1u << 21)) & 0x7F800000u;
  const int e = static_cast<int>(bits >> 23) - 127 - 2;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

TEST(Mxfp4, ScaleRulesMatchSecondFormulationsOnEveryPositiveBf16) {
  for (uint32_t bits = 0x0080; bits < 0x7F80; ++bits) {  // every normal positive bf16
    const float amax = std::bit_cast<float>(bits << 16);
    for (MxScaleRule rule : {MxScaleRule::ocp_floor, MxScaleRule::ceil})
      ASSERT_EQ(search_exponent(amax, rule) + 127, mx_scale_byte(amax, rule))
          << scale_rule_name(rule) << " amax " << amax;
    ASSERT_EQ(torchao_even_exponent(amax) + 127, mx_scale_byte(amax, MxScaleRule::even))
        << "even amax " << amax;
  }
  for (MxScaleRule rule : kRules) {
    EXPECT_EQ(127, mx_scale_byte(0.0, rule));
    EXPECT_EQ(0xFF, mx_scale_byte(kNaN, rule));
    EXPECT_EQ(0, mx_scale_byte(1e-300, rule));  // clamped, never the NaN byte
    EXPECT_EQ(254, mx_scale_byte(1e300, rule));
  }
  // The three rules part where amax / 2^floor sits in (6, 8): 7 = 1.75 * 4.
  EXPECT_EQ(127, mx_scale_byte(7.0, MxScaleRule::ocp_floor));  // 7 saturates to 6
  EXPECT_EQ(128, mx_scale_byte(7.0, MxScaleRule::ceil));
  EXPECT_EQ(128, mx_scale_byte(7.0, MxScaleRule::even));
  EXPECT_EQ(127, mx_scale_byte(6.5, MxScaleRule::even));
  EXPECT_EQ(128, mx_scale_byte(6.5, MxScaleRule::ceil));
}

TEST(Mxfp4, RefusesBadSizesAndNaN) {
  std::vector<double> x(kMxfp4Block, 1.0);
  std::vector<uint8_t> packed(kMxfp4Block / 2), scales(1), short_packed(3);
  EXPECT_THROW(mxfp4_quantize(x, MxScaleRule::ceil, E2m1Rounding::nearest_even,
                              NibbleOrder::low_first, short_packed, scales),
               std::invalid_argument);
  x[3] = kNaN;
  EXPECT_THROW(mxfp4_quantize(x, MxScaleRule::ceil, E2m1Rounding::nearest_even,
                              NibbleOrder::low_first, packed, scales),
               std::domain_error);
}

TEST(Nvfp4, DecodeAllCodesTimesAllE4m3ScaleBytes) {
  for (float g : {1.0f, 0.0078125f, 3.3f})
    for (unsigned s = 0; s < 256; ++s)
      for (unsigned c = 0; c < 16; ++c)
        ASSERT_TRUE(SameValue(defined_e2m1(c) * defined_e4m3fn(s) * g,
                              nvfp4_decode(static_cast<uint8_t>(c), static_cast<uint8_t>(s), g)))
            << "g " << g << " scale " << s << " code " << c;
}

TEST(Nvfp4, QuantizeRecoversAllCodesTimesAllPositiveScales) {
  const float g = 0.25f;
  for (unsigned s = 1; s < 0x7F; ++s)  // every positive finite e4m3fn scale
    for (unsigned c = 0; c < 16; ++c) {
      std::vector<double> x(kNvfp4Block, 0.0);
      x[0] = 6 * defined_e4m3fn(s) * g;
      x[7] = defined_e2m1(c) * defined_e4m3fn(s) * g;
      std::vector<uint8_t> packed(kNvfp4Block / 2), scales(1);
      nvfp4_quantize(x, g, E2m1Rounding::nearest_even, NibbleOrder::low_first, packed, scales);
      ASSERT_EQ(s, scales[0]) << "code " << c;
      ASSERT_EQ(c, unpack_nibble(packed[3], 1)) << "scale " << s;
    }
  std::vector<double> zeros(kNvfp4Block, 0.0);
  std::vector<uint8_t> packed(kNvfp4Block / 2, 0xAA), scales(1, 0xAA);
  nvfp4_quantize(zeros, 1.0f, E2m1Rounding::nearest_even, NibbleOrder::low_first, packed, scales);
  EXPECT_EQ(0, scales[0]);
  for (uint8_t b : packed) EXPECT_EQ(0, b);
  EXPECT_THROW(nvfp4_quantize(zeros, 0.0f, E2m1Rounding::nearest_even, NibbleOrder::low_first,
                              packed, scales),
               std::invalid_argument);
}

}  // namespace
}  // namespace attncheck::fp4
