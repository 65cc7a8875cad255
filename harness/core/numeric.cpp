#include "numeric.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

namespace {
constexpr MiniFloat kF16{5, 10, 15, MiniFloat::ieee};
constexpr MiniFloat kBF16{8, 7, 127, MiniFloat::ieee};
constexpr MiniFloat kE4M3FN{4, 3, 7, MiniFloat::fn};
constexpr MiniFloat kE4M3FNUZ{4, 3, 8, MiniFloat::fnuz};
constexpr MiniFloat kE5M2{5, 2, 15, MiniFloat::ieee};
constexpr MiniFloat kE5M2FNUZ{5, 2, 16, MiniFloat::fnuz};
}  // namespace

MiniFloat minifloat_format(DType t) {
  switch (t) {
    case DType::f16:
      return kF16;
    case DType::bf16:
      return kBF16;
    case DType::e4m3fn:
      return kE4M3FN;
    case DType::e4m3fnuz:
      return kE4M3FNUZ;
    case DType::e5m2:
      return kE5M2;
    case DType::e5m2fnuz:
      return kE5M2FNUZ;
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

namespace {
// Values whose exponent lies in the format's normal range below its top binade (nearly all test
// data) round by integers alone: the double's 53-bit significand to man_bits + 1 bits, nearest
// even, a carry moving to the next binade, which is still finite in every format. This is what the
// general path below computes with frexp / ldexp / nearbyint, at a fraction of the cost (input
// generation is most of a case's CPU time, docs/results.md); numeric_test compares both paths.
inline std::optional<uint32_t> encode_normal_fast(double x, const MiniFloat& f) {
  const auto bits = std::bit_cast<uint64_t>(x);
  const int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  const int emin = 1 - f.bias;
  // Exponent fields up to top - 2 (top = all ones): a carry reaches top - 1 at most, finite in
  // every format.
  const int top_normal = (1 << f.exp_bits) - 3 - f.bias;
  if (e < emin || e > top_normal) return std::nullopt;  // also zero, subnormal, inf, NaN
  const uint64_t sig = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  const int shift = 52 - f.man_bits;
  uint64_t r = sig >> shift;
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) ++r;
  // A carry gives r == 2^(man_bits+1): mantissa 0 of the next exponent, which the addition of the
  // fields below produces by itself.
  const uint64_t exp_field = static_cast<uint64_t>(e + f.bias);
  const uint32_t sign = (bits >> 63) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  return sign |
         static_cast<uint32_t>((exp_field << f.man_bits) + (r - (uint64_t{1} << f.man_bits)));
}
}  // namespace

uint32_t encode_minifloat(double x, DType t, Saturation sat) {
  if (const auto fast = encode_normal_fast(x, minifloat_format(t))) return *fast;
  return encode_minifloat_by_scaling(x, t, sat);
}

namespace {
// One format's run: F is a constant, so encode_normal_fast's shifts and bounds fold away.
template <MiniFloat F, class Code>
void encode_run(std::span<const double> x, DType t, Saturation sat, std::byte* out) {
  for (size_t i = 0; i < x.size(); ++i) {
    const auto fast = encode_normal_fast(x[i], F);
    const auto code = static_cast<Code>(fast ? *fast : encode_minifloat_by_scaling(x[i], t, sat));
    std::memcpy(out + i * sizeof(Code), &code, sizeof(Code));
  }
}
}  // namespace

void encode_minifloats(std::span<const double> x, DType t, Saturation sat, std::byte* out) {
  switch (t) {
    case DType::f16:
      return encode_run<kF16, uint16_t>(x, t, sat, out);
    case DType::bf16:
      return encode_run<kBF16, uint16_t>(x, t, sat, out);
    case DType::e4m3fn:
      return encode_run<kE4M3FN, uint8_t>(x, t, sat, out);
    case DType::e4m3fnuz:
      return encode_run<kE4M3FNUZ, uint8_t>(x, t, sat, out);
    case DType::e5m2:
      return encode_run<kE5M2, uint8_t>(x, t, sat, out);
    case DType::e5m2fnuz:
      return encode_run<kE5M2FNUZ, uint8_t>(x, t, sat, out);
    default:
      minifloat_format(t);  // throws: not a narrow float type
  }
}

uint32_t encode_minifloat_by_scaling(double x, DType t, Saturation sat) {
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

namespace {
double decode_by_definition(uint32_t bits, DType t);

// Every code of the narrow formats decoded once: decoding is on the references' and the
// generators' hot paths.
const std::vector<double>& decode_table(DType t) {
  static const auto tables = [] {
    std::array<std::vector<double>, 16> out;
    for (DType f :
         {DType::f16, DType::bf16, DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz}) {
      auto& v = out[static_cast<size_t>(f)];
      v.resize(dtype_size(f) == 1 ? 256 : 65536);
      for (uint32_t c = 0; c < v.size(); ++c) v[c] = decode_by_definition(c, f);
    }
    return out;
  }();
  return tables[static_cast<size_t>(t)];
}
}  // namespace

double decode_minifloat(uint32_t bits, DType t) {
  const auto& table = decode_table(t);
  // Not a narrow float (the definition throws) or bits past the format's width: as defined.
  return bits < table.size() ? table[bits] : decode_by_definition(bits, t);
}

namespace {
double decode_by_definition(uint32_t bits, DType t) {
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
}  // namespace

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
