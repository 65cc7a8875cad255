// Element types the harness knows. No HIP, no Eigen: kernels-side code may include this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace attncheck {

enum class DType : uint8_t {
  f64,
  f32,
  f16,
  bf16,
  e4m3fn,    // OCP fp8 E4M3 (gfx950, NVIDIA): bias 7, max 448, NaN 0x7F/0xFF, no inf
  e4m3fnuz,  // fp8 E4M3 FNUZ (gfx942): bias 8, max 240, NaN 0x80 only, no -0, no inf
  e5m2,      // OCP fp8 E5M2: bias 15, max 57344, IEEE-like inf/NaN
  e5m2fnuz,  // fp8 E5M2 FNUZ: bias 16, max 57344, NaN 0x80 only
  i8,
  u8,
  i32,
  i64,
};

inline constexpr DType kAllDTypes[] = {DType::f64,    DType::f32,      DType::f16,  DType::bf16,
                                       DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz,
                                       DType::i8,     DType::u8,       DType::i32,  DType::i64};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "bf16", "fp8_e4m3fn", ...
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);
bool is_fp8(DType t);
bool is_integer(DType t);

}  // namespace attncheck
