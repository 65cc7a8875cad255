#include "policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <stdexcept>

#include "numeric.h"

namespace attncheck {

double gamma_n(int64_t n, double u) {
  if (n < 0 || u < 0) throw std::invalid_argument("gamma_n: negative length or unit roundoff");
  const double nu = static_cast<double>(n) * u;
  if (nu >= 1.0)
    throw std::invalid_argument("gamma_n: n u = " + format_number(nu) +
                                " >= 1, no worst-case bound exists for n = " + std::to_string(n));
  return nu / (1.0 - nu);
}

double gamma_n_probabilistic(int64_t n, double u, double lambda) {
  if (n < 0 || u < 0 || lambda <= 0)
    throw std::invalid_argument("gamma_n_probabilistic: negative length, u or lambda");
  const double nd = static_cast<double>(n);
  return std::expm1(lambda * std::sqrt(nd) * u + nd * u * u / (1.0 - u));
}

double subnormal_half_spacing(DType t) {
  switch (t) {
    case DType::f64:
      return std::numeric_limits<double>::denorm_min() / 2;
    case DType::f32:
      return static_cast<double>(std::numeric_limits<float>::denorm_min()) / 2;
    default:
      break;
  }
  if (!is_floating(t)) return 0.0;
  const MiniFloat f = minifloat_format(t);
  return std::ldexp(1.0, 1 - f.bias - f.man_bits - 1);  // smallest subnormal = 2^(1-bias-m)
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

BudgetBuilder& BudgetBuilder::output_rounding(DType out) {
  const double u = unit_roundoff(out);
  const double sub = subnormal_half_spacing(out);
  budget_.rtol += u;
  budget_.atol += sub;
  clauses_.push_back(
      "rtol " + format_number(u) + " = u(" + std::string(dtype_name(out)) +
      "): one rounding of the result to " + std::string(dtype_name(out)) +
      (sub >= 1e-300 ? " (+ atol " + format_number(sub) + " below its normal range)" : ""));
  return *this;
}

BudgetBuilder& BudgetBuilder::accumulation(int64_t n, DType acc, double abs_sum, Bound bound,
                                           const std::string& what) {
  const double u = unit_roundoff(acc);
  const double g = bound == Bound::worst_case ? gamma_n(n, u) : gamma_n_probabilistic(n, u);
  const double term = g * abs_sum;
  budget_.atol += term;
  clauses_.push_back("atol " + format_number(term) + " = " +
                     (bound == Bound::worst_case ? "gamma_" + std::to_string(n)
                                                 : "gamma~_" + std::to_string(n) + "(lambda " +
                                                       format_number(kLambda) + ")") +
                     "(" + std::string(dtype_name(acc)) + ") " + format_number(g) +
                     " * sum|terms| " + format_number(abs_sum) + ": " + what);
  return *this;
}

BudgetBuilder& BudgetBuilder::absolute(double atol, const std::string& why) {
  if (!(atol >= 0)) throw std::invalid_argument("BudgetBuilder::absolute: negative or NaN atol");
  budget_.atol += atol;
  clauses_.push_back("atol " + format_number(atol) + ": " + why);
  return *this;
}

BudgetBuilder& BudgetBuilder::relative(double rtol, const std::string& why) {
  if (!(rtol >= 0)) throw std::invalid_argument("BudgetBuilder::relative: negative or NaN rtol");
  budget_.rtol += rtol;
  clauses_.push_back("rtol " + format_number(rtol) + ": " + why);
  return *this;
}

BudgetBuilder& BudgetBuilder::max_calc_diff(double limit, const std::string& why) {
  budget_.max_calc_diff = limit;
  clauses_.push_back("calc_diff <= " + format_number(limit) + ": " + why);
  return *this;
}

BudgetBuilder& BudgetBuilder::max_mismatch_frac(double frac, const std::string& why) {
  budget_.max_mismatch_frac = frac;
  clauses_.push_back("mismatch fraction <= " + format_number(frac) + ": " + why);
  return *this;
}

Budget BudgetBuilder::build() const {
  Budget b = budget_;
  b.kind = Budget::Kind::numeric;
  b.why = output_ + ": |actual - expected| <= atol + rtol |expected| with atol " +
          format_number(b.atol) + ", rtol " + format_number(b.rtol);
  for (const auto& c : clauses_) b.why += "; " + c;
  return b;
}

Budget output_rounding_budget(DType out, double scale, std::string why) {
  if (!(scale >= 0)) throw std::invalid_argument("output_rounding_budget: negative or NaN scale");
  const double u = unit_roundoff(out);
  Budget b;
  b.rtol = u;
  b.atol = u * scale + subnormal_half_spacing(out);
  b.why = "rtol u(" + std::string(dtype_name(out)) + ") " + format_number(u) + ", atol u * scale " +
          format_number(scale) + " = " + format_number(b.atol) + ": " + why;
  return b;
}

namespace {

// The parts a contract combines, in canonical order (attncheck_bridge.CONTRACT_PARTS).
struct ContractPart {
  std::string_view name;
  bool Contract::*flag;
};
constexpr ContractPart kContractParts[] = {
    {"qk-products-in-input-type", &Contract::qk_products_in_input_type},
    {"p-in-input-type", &Contract::p_in_input_type},
};

}  // namespace

std::string Contract::name() const {
  std::string s;
  for (const auto& part : kContractParts)
    if (this->*part.flag) s += (s.empty() ? "" : "+") + std::string(part.name);
  return s.empty() ? std::string(kDefaultContractName) : s;
}

std::optional<Contract> parse_contract(std::string_view name) {
  if (name == kDefaultContractName) return Contract{};
  if (name.empty()) return std::nullopt;
  Contract c;
  size_t start = 0;
  while (true) {
    const size_t plus = name.find('+', start);
    const std::string_view part =
        name.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start);
    const auto* found = std::find_if(std::begin(kContractParts), std::end(kContractParts),
                                     [&](const ContractPart& p) { return p.name == part; });
    if (found == std::end(kContractParts) || c.*found->flag) return std::nullopt;
    c.*found->flag = true;
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  return c;
}

std::vector<Contract> known_contracts() {
  // Bit i of the mask sets part i: 0 (the default), 1, 2, 3, ... lists single parts before their
  // combinations, as attncheck_bridge.CONTRACTS does.
  constexpr size_t n = std::size(kContractParts);
  std::vector<Contract> out;
  for (size_t mask = 0; mask < (size_t{1} << n); ++mask) {
    Contract c;
    for (size_t i = 0; i < n; ++i)
      if (mask >> i & 1) c.*kContractParts[i].flag = true;
    out.push_back(c);
  }
  return out;
}

std::string known_contract_names() {
  std::string s;
  for (const auto& c : known_contracts()) s += (s.empty() ? "" : ", ") + c.name();
  return s;
}

double qk_product_rounding_error(const Contract& c, DType in, double abs_products_sum) {
  if (!(abs_products_sum >= 0))
    throw std::invalid_argument("qk_product_rounding_error: negative or NaN sum of |products|");
  return c.qk_products_in_input_type ? unit_roundoff(in) * abs_products_sum : 0.0;
}

double qk_rounded_products_growth(const Contract& c, DType in) {
  return c.qk_products_in_input_type ? 1.0 + unit_roundoff(in) : 1.0;
}

double probability_rounding(const Contract& c, DType in) {
  return c.p_in_input_type ? unit_roundoff(in) : 0.0;
}

double softmax_weight_remainder(double score_error) {
  if (!(score_error >= 0))
    throw std::invalid_argument("softmax_weight_remainder: negative or NaN score error");
  return std::max(0.0, std::expm1(2 * score_error) - 2 * score_error);
}

Budget exact_budget(std::string why) {
  Budget b;
  b.kind = Budget::Kind::exact;
  b.why = std::move(why);
  return b;
}

Budget topk_budget(double tie_tol, std::string why) {
  if (!(tie_tol >= 0)) throw std::invalid_argument("topk_budget: negative or NaN tie_tol");
  Budget b;
  b.kind = Budget::Kind::topk_set;
  b.tie_tol = tie_tol;
  b.why = std::move(why);
  return b;
}

}  // namespace attncheck
