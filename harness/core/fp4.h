// FP4 formats, written from their definitions (OCP Microscaling Formats (MX) v1.0; NVIDIA's
// NVFP4 description) so that the reference never depends on a vendor header: the e2m1 element,
// the e8m0 scale, MXFP4 (32 e2m1 elements + one e8m0 scale), NVFP4 (16 e2m1 elements + one e4m3
// scale + an fp32 tensor scale) and the order of two elements in a byte. docs/formats.md "FP4".
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

namespace attncheck::fp4 {

// --- e2m1: 1 sign, 2 exponent, 1 mantissa bit, bias 1; no inf, no NaN
// ------------------------------
inline constexpr int kE2m1Codes = 16;
inline constexpr double kE2m1Max = 6.0;
// Magnitudes of codes 0..7 (code | 8 is the negative; 8 is -0).
inline constexpr double kE2m1Magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e2m1_decode(uint8_t code);  // low 4 bits; the high ones must be zero (else invalid_argument)

// How a value between two e2m1 neighbours is rounded; both saturate at +-6 (inf included).
enum class E2m1Rounding : uint8_t {
  // OCP MX v1.0: round to nearest, ties to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
  // 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). Negative values that round to zero keep their sign.
  nearest_even,
  // The table quantizer of AITER's op test (argmin over the 16 values, first one on a tie): ties
  // go to the smaller magnitude (0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3), and values that round to
  // zero become +0.
  nearest_ties_to_smaller,
};
// NaN input throws std::domain_error (e2m1 has no NaN; OCP leaves it to the implementation).
uint8_t e2m1_encode(double x, E2m1Rounding rounding = E2m1Rounding::nearest_even);

// --- e8m0: an unsigned power of two 2^(byte - 127); byte 0 is 2^-127 (not zero), 0xFF is NaN
// ------
inline constexpr int kE8m0Bias = 127;
inline constexpr uint8_t kE8m0NaN = 0xFF;
double e8m0_decode(uint8_t byte);

// --- MXFP4: blocks of 32 elements sharing one e8m0 scale
// -------------------------------------------
inline constexpr int kMxfp4Block = 32;

// How a block's scale byte follows from its largest magnitude amax (> 0, finite). Every rule
// clamps the exponent to [-127, 127] (bytes 0..254, never the NaN byte); amax == 0 gives byte 127
// (scale 1) under every rule, as AITER's quantizer does. A NaN or infinite amax gives 0xFF.
enum class MxScaleRule : uint8_t {
  // OCP MX v1.0 section 6.3: 2^(floor(log2 amax) - 2), 2 being e2m1's largest exponent. amax/scale
  // lands in [4, 8): elements above 6 saturate.
  ocp_floor,
  // ceil(log2(amax / 6)): the smallest power of two with amax / scale <= 6, nothing saturates.
  // AITER's quantizer (test_pa_mqa_logits_mxfp4.py `quantize`), NVIDIA's cvt.rp ue8m0 ("RCEIL").
  ceil,
  // torchao's EVEN mode: amax rounded to e2m1's one mantissa bit (half up) first, then the OCP
  // floor: a mantissa of amax >= 1.75 moves the exponent up by one.
  even,
};
std::string_view scale_rule_name(MxScaleRule rule);  // "ocp_floor", "ceil", "even"
uint8_t mx_scale_byte(double amax, MxScaleRule rule);

// --- Two elements per byte
// -------------------------------------------------------------------------
enum class NibbleOrder : uint8_t {
  low_first,   // element 2i in bits 0..3, 2i+1 in bits 4..7 (OCP, torch float4_e2m1fn_x2, AITER)
  high_first,  // element 2i in bits 4..7
};
uint8_t pack_nibbles(uint8_t even_code, uint8_t odd_code,
                     NibbleOrder order = NibbleOrder::low_first);
uint8_t unpack_nibble(uint8_t byte, int index_in_byte, NibbleOrder order = NibbleOrder::low_first);

// Quantizes x (a multiple of 32 elements) to packed codes (x.size() / 2 bytes) and scale bytes
// (x.size() / 32). Elements are divided by the exact power of two of their block's scale.
void mxfp4_quantize(std::span<const double> x, MxScaleRule rule, E2m1Rounding rounding,
                    NibbleOrder order, std::span<uint8_t> packed, std::span<uint8_t> scales);
// e2m1(code) * 2^(scale - 127) for every element (exact in double); a 0xFF scale gives NaN.
void mxfp4_dequantize(std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                      NibbleOrder order, std::span<double> out);

// --- NVFP4: blocks of 16 elements, an e4m3fn block scale and an fp32 tensor scale
// ------------------
inline constexpr int kNvfp4Block = 16;
// value = e2m1(code) * e4m3fn(block_scale) * tensor_scale. A NaN block scale (0x7F/0xFF) gives
// NaN for its block.
double nvfp4_decode(uint8_t code, uint8_t block_scale_e4m3, float tensor_scale);
// The block scale is amax / (6 * tensor_scale) rounded to e4m3fn (nearest even, saturating at
// 448); each element is then x / (e4m3(scale) * tensor_scale) rounded by `rounding`. A block whose
// scale rounds to zero encodes all zeros. tensor_scale must be finite and > 0.
void nvfp4_quantize(std::span<const double> x, float tensor_scale, E2m1Rounding rounding,
                    NibbleOrder order, std::span<uint8_t> packed, std::span<uint8_t> scales);

}  // namespace attncheck::fp4
