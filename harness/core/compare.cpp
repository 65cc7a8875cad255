#include "compare.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "numeric.h"

namespace attncheck {

std::string format_index(const Index& idx) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < idx.size(); ++i) os << (i ? "," : "") << idx[i];
  os << "]";
  return os.str();
}

namespace {
void require_same_shape(const std::string& name, const Tensor& e, const Tensor& a) {
  if (e.shape() != a.shape())
    throw std::invalid_argument("compare '" + name + "': shape mismatch, expected " + e.describe() +
                                ", actual " + a.describe());
}

// Distance in representable values of `t` between two finite values (0 for f64).
int64_t ulp_distance(double x, double y, DType t) {
  if (t == DType::f64 || !is_floating(t) || x == y) return 0;
  auto ordinal = [&](double v) -> int64_t {
    uint64_t bits = encode_value(v, t);
    const int total = static_cast<int>(dtype_size(t) * 8);
    const uint64_t sign = 1ull << (total - 1);
    const auto mag = static_cast<int64_t>(bits & (sign - 1));
    return (bits & sign) ? -mag : mag;
  };
  const int64_t d = ordinal(x) - ordinal(y);
  return d < 0 ? -d : d;
}

std::string summarize(const CheckResult& r) {
  std::ostringstream os;
  const auto& m = r.metrics;
  os.precision(3);
  if (r.budget.kind == Budget::Kind::exact) {
    os << m.bit_mismatches << " of " << m.count << " elements differ bitwise";
  } else if (r.budget.kind == Budget::Kind::topk_set) {
    os << m.topk_missing << " missing, " << m.topk_invalid << " invalid of " << m.count
       << " indices";
  } else {
    os << "max_abs " << m.max_abs << " max_rel " << m.max_rel << " mismatches " << m.mismatches
       << "/" << m.count << " (budget atol " << r.budget.atol << " rtol " << r.budget.rtol;
    if (r.budget.max_mismatch_frac > 0) os << " frac " << r.budget.max_mismatch_frac;
    os << ") calc_diff " << m.calc_diff;
    if (r.budget.max_calc_diff >= 0) os << " (budget " << r.budget.max_calc_diff << ")";
    if (m.nan_actual) os << " NaN " << m.nan_actual;
    if (m.neginf_mask_mismatch) os << " -inf mask mismatches " << m.neginf_mask_mismatch;
  }
  if (!m.worst.index.empty())
    os << "; worst at " << format_index(m.worst.index) << " expected " << m.worst.expected
       << " actual " << m.worst.actual;
  return os.str();
}
}  // namespace

CheckResult compare_numeric(const std::string& name, const Tensor& expected, const Tensor& actual,
                            const Budget& budget) {
  require_same_shape(name, expected, actual);
  CheckResult r{name, budget, {}, false, ""};
  Metrics& m = r.metrics;
  m.count = expected.numel();
  double sxy = 0, sxx = 0, syy = 0, se2 = 0, sd2 = 0;
  const double rel_floor = std::max(budget.atol, 1e-30);
  double worst_ratio = -1;
  const DType at = actual.dtype(), et = expected.dtype();
  expected.for_each_bits_with(actual, [&](const Index& idx, int64_t, uint64_t eb, uint64_t ab) {
    const double e = decode_value(eb, et);
    const double a = decode_value(ab, at);
    const bool e_nan = std::isnan(e), a_nan = std::isnan(a);
    m.nan_expected += e_nan;
    m.nan_actual += a_nan;
    m.inf_actual += std::isinf(a);
    const bool e_ninf = std::isinf(e) && e < 0, a_ninf = std::isinf(a) && a < 0;
    if (e_ninf != a_ninf) ++m.neginf_mask_mismatch;
    double err, ratio;
    if (e_nan || a_nan) {  // NaN never passes, even against a NaN reference
      err = std::numeric_limits<double>::infinity();
      ratio = err;
    } else if (std::isinf(e) || std::isinf(a)) {
      err = (e == a) ? 0.0 : std::numeric_limits<double>::infinity();
      ratio = err;
    } else {
      err = std::fabs(a - e);
      const double allow = budget.atol + budget.rtol * std::fabs(e);
      ratio = allow > 0 ? err / allow : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      m.max_abs = std::max(m.max_abs, err);
      m.max_rel = std::max(m.max_rel, err / std::max(std::fabs(e), rel_floor));
      m.max_ulp = std::max(m.max_ulp, ulp_distance(a, e, at));
      sxy += a * e;
      sxx += e * e;
      syy += a * a;
      se2 += e * e;
      sd2 += err * err;
    }
    if (ratio > 1.0) ++m.mismatches;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      m.worst = {idx, e, a, err, ratio};
    }
  });
  m.mismatch_frac =
      m.count ? static_cast<double>(m.mismatches) / static_cast<double>(m.count) : 0.0;
  m.rel_l2 = se2 > 0 ? std::sqrt(sd2 / se2) : std::sqrt(sd2);
  m.calc_diff = (sxx + syy) > 0 ? 1.0 - 2.0 * sxy / (sxx + syy) : 0.0;
  m.cosine = (sxx > 0 && syy > 0) ? sxy / std::sqrt(sxx * syy) : (sxx == syy ? 1.0 : 0.0);
  bool ok = m.nan_actual == 0 && m.nan_expected == 0 && m.neginf_mask_mismatch == 0;
  ok = ok && m.mismatch_frac <= budget.max_mismatch_frac;
  if (budget.max_calc_diff >= 0) ok = ok && m.calc_diff <= budget.max_calc_diff;
  r.passed = ok;
  r.message = summarize(r);
  return r;
}

CheckResult compare_exact(const std::string& name, const Tensor& expected, const Tensor& actual) {
  require_same_shape(name, expected, actual);
  if (expected.dtype() != actual.dtype())
    throw std::invalid_argument("compare '" + name + "': exact compare of different dtypes");
  Budget b;
  b.kind = Budget::Kind::exact;
  b.why = "exact op: bitwise equality";
  CheckResult r{name, b, {}, false, ""};
  Metrics& m = r.metrics;
  m.count = expected.numel();
  expected.for_each_bits_with(actual, [&](const Index& idx, int64_t, uint64_t e, uint64_t a) {
    if (e != a) {
      if (m.bit_mismatches == 0)
        m.worst = {idx, expected.get(idx), actual.get(idx),
                   std::fabs(expected.get(idx) - actual.get(idx)),
                   std::numeric_limits<double>::infinity()};
      ++m.bit_mismatches;
    }
  });
  m.mismatches = m.bit_mismatches;
  m.mismatch_frac =
      m.count ? static_cast<double>(m.mismatches) / static_cast<double>(m.count) : 0.0;
  r.passed = m.bit_mismatches == 0;
  r.message = summarize(r);
  return r;
}

CheckResult compare(const std::string& name, const Tensor& expected, const Tensor& actual,
                    const Budget& budget) {
  switch (budget.kind) {
    case Budget::Kind::exact: {
      auto r = compare_exact(name, expected, actual);
      r.budget.why = budget.why.empty() ? r.budget.why : budget.why;
      return r;
    }
    case Budget::Kind::numeric:
      return compare_numeric(name, expected, actual, budget);
    case Budget::Kind::topk_set:
      throw std::invalid_argument("compare '" + name + "': top-k needs compare_topk (values)");
  }
  return {};
}

double check_margin(const CheckResult& c) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const Metrics& m = c.metrics;
  const Budget& b = c.budget;
  double margin = 0;
  if (b.kind == Budget::Kind::exact) {
    margin = m.bit_mismatches > 0 || m.mismatches > 0 ? inf : 0.0;
  } else if (b.kind == Budget::Kind::topk_set) {
    const double bad = static_cast<double>(m.topk_missing + m.topk_invalid);
    const double allowed = b.max_mismatch_frac * static_cast<double>(m.count);
    margin = allowed > 0 ? bad / allowed : (bad > 0 ? inf : 0.0);
  } else if (m.nan_actual > 0 || m.nan_expected > 0 || m.neginf_mask_mismatch > 0) {
    margin = inf;
  } else {
    if (b.max_mismatch_frac > 0)
      margin = m.mismatch_frac / b.max_mismatch_frac;
    else if (!m.worst.index.empty())
      margin = m.worst.ratio;
    else
      margin = m.mismatches > 0 ? inf : 0.0;
    if (b.max_calc_diff >= 0) {
      const double calc = std::max(m.calc_diff, 0.0);
      margin = std::max(margin, b.max_calc_diff > 0 ? calc / b.max_calc_diff
                                : calc > 0          ? inf
                                                    : 0.0);
    }
  }
  if (std::isnan(margin)) margin = inf;
  if (!c.passed && margin <= 1.0) margin = inf;  // failed for a reason the metrics do not scale
  return std::max(margin, 0.0);
}

}  // namespace attncheck
