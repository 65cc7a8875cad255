// Deriving comparison budgets from the arithmetic a kernel does (docs/verification.md, "How
// tolerances are derived"). An op states its error terms: the fp32 accumulations it performs
// (length, magnitude of the summed terms) and the rounding of its result to the output dtype;
// these helpers turn them into a Budget whose `why` shows every term and its number.
//
//   Budget b = BudgetBuilder("o")
//                  .accumulation(576, DType::f32, sum_abs_qk, Bound::worst_case, "q.k dot")
//                  .output_rounding(DType::bf16)
//                  .build();
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compare.h"
#include "dtype.h"

namespace attncheck {

// Higham's gamma_n = n u / (1 - n u): |computed - exact| <= gamma_n * sum |terms| for a sum (or
// dot product) of n terms accumulated in any order in a format of unit roundoff u (Higham,
// Accuracy and Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and Section 3.1: a dot
// product of length n needs gamma_n, each product counting as one rounding). Throws if n u >= 1.
double gamma_n(int64_t n, double u);

// Higham & Mary, "A new approach to probabilistic rounding error analysis" (SIAM J. Sci. Comput.
// 41(5), 2019): if rounding errors are
// independent and mean-zero, |computed - exact| <= gamma~_n(lambda) * sum |terms| with probability
// >= 1 - 2 exp(-lambda^2 (1-u)^2 / 2), where gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 /
// (1-u)) - 1 ~ lambda sqrt(n) u. kLambda = 6: failure probability about 3e-8 per sum.
inline constexpr double kLambda = 6.0;
double gamma_n_probabilistic(int64_t n, double u, double lambda = kLambda);

// Half the spacing of the smallest subnormals of `t`: the absolute rounding error of a value in
// the subnormal range (where the relative bound u does not hold). 0 for integer types.
double subnormal_half_spacing(DType t);

enum class Bound {
  worst_case,     // gamma_n: holds for every input and every summation order
  probabilistic,  // gamma~_n(kLambda): for long fp32 sums of non-adversarial data
};

// Accumulating named error terms into a Budget. Each call adds to atol or rtol and records a
// clause for Budget::why; build() joins them.
class BudgetBuilder {
 public:
  explicit BudgetBuilder(std::string output) : output_(std::move(output)) {}

  // A result stored in `out` by one round-to-nearest: rtol += u(out); atol += half the subnormal
  // spacing of `out` (values below the normal range have absolute, not relative, error).
  BudgetBuilder& output_rounding(DType out);
  // A sum or dot product of n terms accumulated in `acc`, whose |terms| sum to at most
  // `abs_sum`: atol += gamma * abs_sum (gamma_n or gamma~_n by `bound`).
  BudgetBuilder& accumulation(int64_t n, DType acc, double abs_sum, Bound bound,
                              const std::string& what);
  // Any other derived term, with its derivation in words.
  BudgetBuilder& absolute(double atol, const std::string& why);
  BudgetBuilder& relative(double rtol, const std::string& why);
  // Optional aggregate checks (the elementwise bound above stays the primary one).
  BudgetBuilder& max_calc_diff(double limit, const std::string& why);
  BudgetBuilder& max_mismatch_frac(double frac, const std::string& why);

  double atol() const { return budget_.atol; }
  double rtol() const { return budget_.rtol; }
  Budget build() const;

 private:
  std::string output_;
  Budget budget_;
  std::vector<std::string> clauses_;
};

// A budget for a value computed to working precision and stored once in `out`: rtol = u(out),
// atol = u(out) * scale + the subnormal half spacing. `scale` is the magnitude of the quantities
// the result is built from (e.g. max |V| for an attention output): an output near zero is a
// cancellation of terms of that size, and their rounding is relative to them, not to the result.
Budget output_rounding_budget(DType out, double scale, std::string why);

// Exact ops (gathers, index arithmetic, cache bytes): bitwise equality.
Budget exact_budget(std::string why);
// Top-k as sets; swaps allowed only between indices whose reference values differ <= tie_tol.
Budget topk_budget(double tie_tol, std::string why);

// "%.3g" of a number, for why strings.
std::string format_number(double v);

// Arithmetic contracts (docs/verification.md "Arithmetic contracts"): how a kernel entry declares
// it rounds where the default model of every budget does not. The default, "fp32-accumulate":
// products formed exactly and accumulated in fp32, softmax probabilities kept in fp32 unless the
// op's own model rounds them. Each flag is one extra rounding to the 16-bit input type (bf16 or
// f16) that an op with that arithmetic derives its budget terms from; names are those of
// attncheck_bridge.CONTRACTS (bridge/python/attncheck_bridge/__init__.py).
struct Contract {
  bool qk_products_in_input_type = false;  // each q.k product rounded to the input type, fp32 sum
  bool p_in_input_type = false;  // softmax probabilities rounded to the input type before P.V

  bool is_default() const { return !qk_products_in_input_type && !p_in_input_type; }
  // The canonical name: "fp32-accumulate", or the flags' names joined by '+' in declaration order.
  std::string name() const;
  bool operator==(const Contract&) const = default;
};

inline constexpr std::string_view kDefaultContractName = "fp32-accumulate";

// The contract a name denotes ('+' parts in any order), nullopt for anything else (an unknown or
// repeated part, "fp32-accumulate" inside a combination, "").
std::optional<Contract> parse_contract(std::string_view name);
// Every contract, the default first, then the combinations in the order of
// attncheck_bridge.CONTRACTS (the smallest deviation first).
std::vector<Contract> known_contracts();
// Their names, ", "-joined, for messages.
std::string known_contract_names();

// Derivation helpers for contract terms (docs/verification.md "Arithmetic contracts").
//
// Rounding each of a dot product's products to `in` moves each by at most u(in) times its
// magnitude: the dot product gains an absolute error of at most u(in) * sum|products|, and the
// accumulation that follows sums terms up to (1 + u(in)) times larger.
// The extra error: u(in) * abs_products_sum; 0 unless the contract rounds products.
double qk_product_rounding_error(const Contract& c, DType in, double abs_products_sum);
// The factor the accumulation's bound over the rounded products grows by: 1 + u(in) (1 when the
// contract does not round products).
double qk_rounded_products_growth(const Contract& c, DType in);
// The relative error each softmax probability gains before P.V: u(in) under p-in-input-type,
// else 0.
double probability_rounding(const Contract& c, DType in);
// Softmax weights w_n = exp(s_n) / sum exp(s) move by a factor in [exp(-2 d), exp(2 d)] when
// every score moves by at most d, i.e. by a relative error of at most expm1(2 d). Budgets model it
// to first order (2 d); this is the rest, expm1(2 d) - 2 d >= 0, which stops being negligible once
// a contract makes score errors of order u(bf16).
double softmax_weight_remainder(double score_error);

}  // namespace attncheck
