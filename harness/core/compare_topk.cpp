// Top-k outputs compared as sets: order is unspecified and ties are broken arbitrarily, so an index
// swap is accepted only between indices whose reference values tie within budget.tie_tol
// (V-TOPK: sorted value multisets equal within the bound). -1 padding must follow the valid
// indices.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "compare.h"

namespace attncheck {

CheckResult compare_topk(const std::string& name, const Tensor& expected, const Tensor& actual,
                         const Tensor& values, const std::vector<int64_t>& row_offsets,
                         const Budget& budget) {
  if (expected.shape() != actual.shape() || expected.ndim() != 2)
    throw std::invalid_argument("compare_topk '" + name +
                                "': expected [rows, k] tensors of equal shape, got " +
                                expected.describe() + " and " + actual.describe());
  if (values.ndim() != 2 || values.size(0) != expected.size(0))
    throw std::invalid_argument("compare_topk '" + name + "': values must be [rows, width]");
  CheckResult r{name, budget, {}, false, ""};
  Metrics& m = r.metrics;
  const int64_t rows = expected.size(0), k = expected.size(1), width = values.size(1);
  int64_t first_bad_row = -1;
  std::string first_reason;
  auto note = [&](int64_t row, const std::string& why) {
    if (first_bad_row < 0) {
      first_bad_row = row;
      first_reason = why;
    }
  };
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t off = row_offsets.empty() ? 0 : row_offsets.at(i);
    auto value_of = [&](int64_t idx) { return values.get({i, idx + off}); };
    auto valid_prefix = [&](const Tensor& t, bool is_actual) {
      std::vector<int64_t> v;
      bool ended = false;
      std::set<int64_t> seen;
      for (int64_t j = 0; j < k; ++j) {
        const auto x = static_cast<int64_t>(t.get({i, j}));
        if (x == -1) {
          ended = true;
          continue;
        }
        if (!is_actual) {
          v.push_back(x);
          continue;
        }
        if (ended) {
          ++m.topk_invalid;
          note(i, "valid index " + std::to_string(x) + " after -1 padding at column " +
                      std::to_string(j));
        } else if (x < 0 || x + off >= width) {
          ++m.topk_invalid;
          note(i, "index " + std::to_string(x) + " out of range at column " + std::to_string(j));
        } else if (!seen.insert(x).second) {
          ++m.topk_invalid;
          note(i, "duplicate index " + std::to_string(x));
        } else {
          v.push_back(x);
        }
      }
      return v;
    };
    const auto e = valid_prefix(expected, false);
    const auto a = valid_prefix(actual, true);
    m.count += static_cast<int64_t>(e.size());
    if (a.size() > e.size()) {
      m.topk_invalid += static_cast<int64_t>(a.size() - e.size());
      note(i, std::to_string(a.size()) + " valid indices, expected " + std::to_string(e.size()));
    }
    // The reference values of the chosen indices must match those of the expected ones within
    // tie_tol (a tie at the k-th value may pick either index). Greedy matching of the two
    // descending lists is a maximum matching for |x - y| <= tol, so each wrong index counts
    // once, however far it shifts the ranks. NaN sorts last and matches nothing.
    auto descending = [](double x, double y) { return std::isnan(y) ? !std::isnan(x) : x > y; };
    std::vector<double> ve, va;
    for (auto x : e) ve.push_back(value_of(x));
    for (auto x : a) va.push_back(value_of(x));
    std::sort(ve.begin(), ve.end(), descending);
    std::sort(va.begin(), va.end(), descending);
    size_t ie = 0, ia = 0;
    std::vector<double> missing, extra;
    while (ie < ve.size() && ia < va.size()) {
      if (ve[ie] == va[ia] || std::fabs(ve[ie] - va[ia]) <= budget.tie_tol) {
        ++ie;
        ++ia;
      } else if (descending(ve[ie], va[ia])) {
        missing.push_back(ve[ie++]);
      } else {
        extra.push_back(va[ia++]);
      }
    }
    missing.insert(missing.end(), ve.begin() + static_cast<std::ptrdiff_t>(ie), ve.end());
    extra.insert(extra.end(), va.begin() + static_cast<std::ptrdiff_t>(ia), va.end());
    if (!missing.empty()) {
      m.topk_missing += static_cast<int64_t>(missing.size());
      std::ostringstream os;
      os << missing.size() << " of " << ve.size() << " reference values not chosen (first "
         << missing.front() << ")";
      if (!extra.empty()) os << ", chosen instead e.g. value " << extra.front();
      if (a.size() < e.size()) os << "; " << a.size() << " valid indices, expected " << e.size();
      os << " (tie_tol " << budget.tie_tol << ")";
      note(i, os.str());
    }
  }
  m.mismatches = m.topk_missing + m.topk_invalid;
  m.mismatch_frac =
      m.count ? static_cast<double>(m.mismatches) / static_cast<double>(m.count) : 0.0;
  r.passed = m.mismatches == 0;
  std::ostringstream os;
  os << m.topk_missing << " missing, " << m.topk_invalid << " invalid of " << m.count << " indices";
  if (first_bad_row >= 0) {
    m.worst.index = {first_bad_row};
    os << "; first bad row " << first_bad_row << ": " << first_reason;
  }
  r.message = os.str();
  return r;
}

}  // namespace attncheck
