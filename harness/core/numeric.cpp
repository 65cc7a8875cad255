#include "numeric.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace attncheck {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::f64, "f64", 8},
    {DType::f32, "f32", 4},
    {DType::f16, "f16", 2},
    {DType::bf16, "bf16", 2},
    {DType::e4m3fn, "fp8_e4m3fn", 1},
    {DType::e4m3fnuz, "fp8_e4m3fnuz", 1},
    {DType::e5m2, "fp8_e5m2", 1},
    {DType::e5m2fnuz, "fp8_e5m2fnuz", 1},
    {DType::i8, "i8", 1},
    {DType::u8, "u8", 1},
    {DType::i32, "i32", 4},
    {DType::i64, "i64", 8},
};
const DTypeInfo& info(DType t) {
  return kInfo[static_cast<int>(t)];
}
}  // namespace

size_t dtype_size(DType t) {
  return info(t).size;
}
std::string_view dtype_name(DType t) {
  return info(t).name;
}
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.t;
  // Accepted aliases.
  if (name == "fp16" || name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "fp32" || name == "float32") return DType::f32;
  if (name == "e4m3fn") return DType::e4m3fn;
  if (name == "e4m3fnuz") return DType::e4m3fnuz;
  return std::nullopt;
}
bool is_fp8(DType t) {
  return t == DType::e4m3fn || t == DType::e4m3fnuz || t == DType::e5m2 || t == DType::e5m2fnuz;
}
bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16 || is_fp8(t);
}
bool is_integer(DType t) {
  return !is_floating(t);
}

MiniFloat minifloat_format(DType t) {
  switch (t) {
    case DType::f16:
      return {5, 10, 15, MiniFloat::ieee};
    case DType::bf16:
      return {8, 7, 127, MiniFloat::ieee};
    case DType::e4m3fn:
      return {4, 3, 7, MiniFloat::fn};
    case DType::e4m3fnuz:
      return {4, 3, 8, MiniFloat::fnuz};
    case DType::e5m2:
      return {5, 2, 15, MiniFloat::ieee};
    case DType::e5m2fnuz:
      return {5, 2, 16, MiniFloat::fnuz};
    default:
      throw std::invalid_argument("not a narrow float type: " + std::string(dtype_name(t)));
  }
}

namespace {
// Largest finite value: the top exponent is reserved for inf/NaN only in IEEE-style formats.
double max_finite_of(const MiniFloat& f) {
  const int top = (1 << f.exp_bits) - 1;
  const double m = std::ldexp(1.0, f.man_bits);
  switch (f.specials) {
    case MiniFloat::ieee:
      return (2.0 - 1.0 / m) * std::ldexp(1.0, top - 1 - f.bias);
    case MiniFloat::fn:
      return (2.0 - 2.0 / m) * std::ldexp(1.0, top - f.bias);
    case MiniFloat::fnuz:
      return (2.0 - 1.0 / m) * std::ldexp(1.0, top - f.bias);
  }
  return 0;
}
uint32_t nan_code(const MiniFloat& f) {
  const uint32_t total = 1u + f.exp_bits + f.man_bits;
  switch (f.specials) {
    case MiniFloat::ieee:  // quiet NaN: top exponent, mantissa MSB set
      return (((1u << f.exp_bits) - 1) << f.man_bits) | (1u << (f.man_bits - 1));
    case MiniFloat::fn:
      return (1u << (total - 1)) - 1;  // 0x7F
    case MiniFloat::fnuz:
      return 1u << (total - 1);  // 0x80
  }
  return 0;
}
}  // namespace

double max_finite(DType t) {
  if (t == DType::f32) return std::numeric_limits<float>::max();
  if (t == DType::f64) return std::numeric_limits<double>::max();
  return max_finite_of(minifloat_format(t));
}

uint64_t nan_bits(DType t) {
  if (t == DType::f32) return 0x7FC00000u;
  if (t == DType::f64) return 0x7FF8000000000000ull;
  return nan_code(minifloat_format(t));
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64:
      return std::ldexp(1.0, -53);
    case DType::f32:
      return std::ldexp(1.0, -24);
    default:
      break;
  }
  if (!is_floating(t)) return 0.0;
  return std::ldexp(1.0, -(minifloat_format(t).man_bits + 1));
}

uint32_t encode_minifloat(double x, DType t, Saturation sat) {
  const MiniFloat f = minifloat_format(t);
  const uint32_t sign_bit = 1u << (f.exp_bits + f.man_bits);
  if (std::isnan(x)) return nan_code(f);
  const bool neg = std::signbit(x);
  const double a = std::fabs(x);
  const double maxv = max_finite_of(f);
  const uint32_t max_code = [&] {
    const uint32_t top = (1u << f.exp_bits) - 1;
    const uint32_t all_man = (1u << f.man_bits) - 1;
    switch (f.specials) {
      case MiniFloat::ieee:
        return ((top - 1) << f.man_bits) | all_man;
      case MiniFloat::fn:
        return (top << f.man_bits) | (all_man - 1);
      case MiniFloat::fnuz:
        return (top << f.man_bits) | all_man;
    }
    return 0u;
  }();
  const uint32_t s = neg ? sign_bit : 0u;
  auto overflow = [&]() -> uint32_t {
    if (sat == Saturation::saturate) return s | max_code;
    if (f.specials == MiniFloat::ieee) return s | (((1u << f.exp_bits) - 1) << f.man_bits);
    return nan_code(f);
  };
  if (std::isinf(a)) {
    // Inf is not finite, so saturation does not apply (HIP: "propagate NAN/INF").
    if (f.specials == MiniFloat::ieee) return s | (((1u << f.exp_bits) - 1) << f.man_bits);
    return nan_code(f);
  }
  if (a == 0.0) return f.specials == MiniFloat::fnuz ? 0u : s;
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  int e2;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int e = std::max(e2 - 1, emin);
  // Scale so that one unit in the last place is 1, round to nearest even (default FP mode).
  double r = std::nearbyint(std::ldexp(a, f.man_bits - e));
  if (r >= std::ldexp(1.0, f.man_bits + 1)) {  // rounding carried into the next binade
    r = std::ldexp(r, -1);
    e += 1;
  }
  if (r == 0.0) return f.specials == MiniFloat::fnuz ? 0u : s;  // underflow to zero
  if (std::ldexp(r, e - f.man_bits) > maxv) return overflow();
  const auto ri = static_cast<uint32_t>(r);
  if (ri < (1u << f.man_bits)) return s | ri;  // subnormal (only possible at e == emin)
  const auto exp_field = static_cast<uint32_t>(e + f.bias);
  return s | (exp_field << f.man_bits) | (ri - (1u << f.man_bits));
}

double decode_minifloat(uint32_t bits, DType t) {
  const MiniFloat f = minifloat_format(t);
  const uint32_t sign_bit = 1u << (f.exp_bits + f.man_bits);
  const uint32_t exp_field = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  const bool neg = (bits & sign_bit) != 0;
  const uint32_t top = (1u << f.exp_bits) - 1;
  switch (f.specials) {
    case MiniFloat::ieee:
      if (exp_field == top)
        return man ? std::numeric_limits<double>::quiet_NaN()
                   : (neg ? -std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::infinity());
      break;
    case MiniFloat::fn:
      if (exp_field == top && man == (1u << f.man_bits) - 1)
        return std::numeric_limits<double>::quiet_NaN();
      break;
    case MiniFloat::fnuz:
      if (bits == sign_bit) return std::numeric_limits<double>::quiet_NaN();
      break;
  }
  double v = exp_field == 0 ? std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits)
                            : std::ldexp(static_cast<double>(man | (1u << f.man_bits)),
                                         static_cast<int>(exp_field) - f.bias - f.man_bits);
  return neg ? -v : v;
}

uint16_t bf16_from_float(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
uint16_t f16_from_float(float x) {
  return static_cast<uint16_t>(encode_minifloat(x, DType::f16, Saturation::nonsaturate));
}
float f16_to_float(uint16_t bits) {
  return static_cast<float>(decode_minifloat(bits, DType::f16));
}

}  // namespace attncheck
