// Comparing an actual tensor against an expected one: metrics, a budget, a verdict.
// Written-down rules (docs/verification.md): NaN never passes; -inf masks must match
// exactly; exact ops compare bits; every result names its worst element.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor.h"

namespace attncheck {

// What a check allows. Elementwise: |a - e| <= atol + rtol * |e|.
struct Budget {
  enum class Kind { numeric, exact, topk_set } kind = Kind::numeric;
  double atol = 0;
  double rtol = 0;
  double max_mismatch_frac = 0;  // fraction of elements allowed outside atol/rtol (default none)
  double max_calc_diff = -1;     // DeepGEMM 1 - 2<x,y>/(|x|^2+|y|^2); < 0: not checked
  double tie_tol = 0;            // topk_set: swaps allowed between values within this bound
  std::string why;               // how the numbers were derived, printed beside the result
};

struct WorstElement {
  Index index;
  double expected = 0;
  double actual = 0;
  double abs_err = 0;
  double ratio = 0;  // abs_err / (atol + rtol*|expected|); inf when the budget is zero
};

struct Metrics {
  int64_t count = 0;
  int64_t mismatches = 0;  // elements outside atol + rtol*|e|, NaN or inf mismatch included
  double mismatch_frac = 0;
  double max_abs = 0;
  double max_rel = 0;    // |a-e| / max(|e|, rel_floor)
  double rel_l2 = 0;     // ||a-e|| / ||e||
  double calc_diff = 0;  // 1 - 2 sum(x y) / sum(x^2 + y^2), -inf positions zeroed
  double cosine = 1;
  int64_t nan_expected = 0;
  int64_t nan_actual = 0;
  int64_t inf_actual = 0;
  int64_t neginf_mask_mismatch = 0;  // positions where exactly one side is -inf
  int64_t max_ulp = 0;               // in the actual tensor's dtype (floats narrower than f64)
  int64_t bit_mismatches = 0;        // exact compares
  WorstElement worst;
  // top-k
  int64_t topk_missing = 0;  // reference indices not found and not excused by a tie
  int64_t topk_invalid = 0;  // duplicates, out-of-range, -1 in the wrong place
};

struct CheckResult {
  std::string name;  // output tensor name
  Budget budget;
  Metrics metrics;
  bool passed = false;
  std::string message;  // human summary: metric vs budget, worst element
};

// How far a check is from its budget (the report's margin, written beside each check): 1 is the
// edge, above 1 fails, inf for NaN or bit errors. numeric: the worst element's |a - e| / (atol +
// rtol |e|) when no element may exceed the budget, else the used fraction of the allowed
// mismatches; max_calc_diff adds calc_diff / max_calc_diff. exact: 0 or inf. topk_set: missing +
// invalid indices over the allowance. A failed check is never below 1.
double check_margin(const CheckResult& c);

// Numeric comparison of two tensors of the same shape (any dtype, any strides).
CheckResult compare_numeric(const std::string& name, const Tensor& expected, const Tensor& actual,
                            const Budget& budget);
// Bitwise comparison (raw element bits). NaN payloads count as different bits on purpose.
CheckResult compare_exact(const std::string& name, const Tensor& expected, const Tensor& actual);
// Top-k rows compared as sets. expected/actual: [rows, k] int32 indices with -1 padding (valid
// first); values: [rows, width] the reference values the indices point into (column = index +
// col_offset of that row, from `row_offsets`, may be empty).
CheckResult compare_topk(const std::string& name, const Tensor& expected, const Tensor& actual,
                         const Tensor& values, const std::vector<int64_t>& row_offsets,
                         const Budget& budget);

CheckResult compare(const std::string& name, const Tensor& expected, const Tensor& actual,
                    const Budget& budget);

std::string format_index(const Index& idx);

}  // namespace attncheck
