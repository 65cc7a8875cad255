// The `values` axis (issue 21 item 2): value distributions of the inputs, beside today's
// generators ("typical"), for the ops whose arithmetic depends on input magnitudes. Each kind is a
// deterministic transform of the inputs an op's make() generated, applied to the attention
// operands (queries, keys, values; the last dim is the head dim):
//
//   typical  the op's own generator, unchanged (the default; out of case ids, so existing ids and
//            goldens stay)
//   large    queries scaled by a power of two so the logits scale * q.k have a standard deviation
//            near 150 (measured on the generated inputs): logits of several hundred, exp overflows fp32 (past 88.7) without a max
//            subtraction, and the maxima of two splits differ by more than fp32's exp range
//   peaked   queries scaled so the logits' standard deviation is near 12 (measured): one key per row
//            dominates (weights of the others e^-5 .. 0), exp still in range without a max
//   ties     every key row equal on the dims the scores read (all of them; under MLA only the
//            rope dims past Lv, with the queries zero on V's dims): every logit of a row is the same
//            nonzero value, a uniform softmax, out = the mean of V
//   tiny     queries and caches scaled by a power of two to about twice the smallest normal of
//            their dtype (half of them subnormal there): logits underflow, out is tiny
//   cancel   key dims paired (k[2i+1] = k[2i]) and queries q[2i] = 16 q0[2i], q[2i+1] = q0[2i+1] -
//            16 q0[2i]: every pair of products cancels to the original size, so the sums of |q k|
//            behind each logit are about 16 times the logit (mixed signs that cancel)
//
// Elements that are not finite (the NaN of unreadable slots) are never touched. The budgets read
// the generated inputs (sum|q k|, norms, max|v|), so they stay derived for every kind
// (docs/verification.md); harness/ops/tests/values_test.cpp judges them against second
// formulations.
#pragma once
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "core/tensor.h"
#include "ops/typed_op.h"

namespace attncheck::values {

enum class Values { typical, large, peaked, ties, tiny, cancel };

inline const std::vector<std::pair<Values, std::string>>& names() {
  static const std::vector<std::pair<Values, std::string>> n = {
      {Values::typical, "typical"}, {Values::large, "large"}, {Values::peaked, "peaked"},
      {Values::ties, "ties"},       {Values::tiny, "tiny"},   {Values::cancel, "cancel"}};
  return n;
}

inline constexpr const char* kHelp =
    "input value distribution (harness/ops/values.h): typical = the generator above; large = "
    "logits of std ~150 (exp overflows fp32 without a max subtraction); peaked = logits of std "
    "~12 (one key dominates); ties = every logit of a row equal; tiny = inputs near the smallest "
    "normal of their dtype; cancel = paired products of mixed signs that cancel";

// The field: "values", id prefix "v" ("-vlarge"), out of ids at typical; `kinds` limits it to the
// kinds the op defines (all by default).
template <class P>
void add_field(Fields<P>& f, Values P::*member, const std::vector<Values>& kinds = {},
               const char* help = kHelp) {
  std::vector<std::pair<Values, std::string>> named;
  for (const auto& n : names())
    if (kinds.empty() || std::find(kinds.begin(), kinds.end(), n.first) != kinds.end())
      named.push_back(n);
  f.template choice<Values>("values", "v", member, named, help).out_of_id_at_default();
}

// A case file's error: the other kinds transform generated values, which special codes and the
// sparse storages of large offsets have already replaced or left out.
inline std::optional<std::string> unbuildable(Values v, bool special_codes, int64_t offset_log2) {
  if (v == Values::typical) return std::nullopt;
  if (special_codes) return "values other than typical need fp8_codes = ordinary";
  if (offset_log2 != 0) return "values other than typical need offset_log2 = 0";
  return std::nullopt;
}

// What an op tells the transforms about its typical inputs.
struct Magnitudes {
  double scale = 1;      // the logit of q and k is scale * q.k (softmax scale times k's scale)
  double q = 1;          // a typical |q| element
  double k = 1;          // a typical |k| element, in the cache's dtype
  int64_t tie_from = 0;  // ties: the first dim of the shared key suffix (under MLA: Lv)
};

inline double power_of_two_near(double x) {
  return std::ldexp(1.0, static_cast<int>(std::lround(std::log2(x))));
}

inline double smallest_normal(DType t) {
  return std::ldexp(1.0, 1 - minifloat_format(t).bias);
}

// Every finite element times `factor` (rounded to the tensor's dtype, as any generator writes).
inline void scale_finite(const Tensor& t, double factor) {
  t.for_each_index([&](const Index& i, int64_t) {
    const double x = t.get(i);
    if (std::isfinite(x)) t.set(i, x * factor);
  });
}

// The factor that brings elements of typical size `magnitude` to about twice the dtype's smallest
// normal (a power of two: only the subnormal range rounds).
inline double tiny_factor(DType t, double magnitude) {
  return power_of_two_near(2 * smallest_normal(t) / magnitude);
}

// The first `n` rows [D] of t (row-major over its leading dims) without a non-finite element.
inline std::vector<std::vector<double>> finite_rows(const Tensor& t, size_t n) {
  const int64_t D = t.size(-1);
  std::vector<std::vector<double>> rows;
  std::vector<double> row;
  bool finite = true;
  t.for_each_index([&](const Index& i, int64_t) {
    if (rows.size() >= n) return;
    const double x = t.get(i);
    finite = finite && std::isfinite(x);
    row.push_back(x);
    if (i.back() + 1 < D) return;
    if (finite) rows.push_back(row);
    row.clear();
    finite = true;
  });
  return rows;
}

// The standard deviation of the logits scale * q.k over the first 32 query rows and 64 key rows
// (measured, so every op's generator and cache dtype get the logits the kinds name).
inline double logit_std(const Tensor& q, const Tensor& k, double scale) {
  const auto qs = finite_rows(q, 32), ks = finite_rows(k, 64);
  double sum2 = 0;
  size_t n = 0;
  for (const auto& a : qs)
    for (const auto& b : ks) {
      double dot = 0;
      for (size_t d = 0; d < a.size(); ++d) dot += a[d] * b[d];
      sum2 += dot * dot * scale * scale;
      ++n;
    }
  const double std = n ? std::sqrt(sum2 / static_cast<double>(n)) : 0.0;
  return std > 0 ? std : 1.0;
}

// Queries [..., D] of an attention op whose key cache is k (not yet shaped).
inline void shape_queries(Values v, const Tensor& q, const Tensor& k, const Magnitudes& m) {
  switch (v) {
    case Values::typical:
      return;
    case Values::large:
      return scale_finite(q, power_of_two_near(150 / logit_std(q, k, m.scale)));
    case Values::peaked:
      return scale_finite(q, power_of_two_near(12 / logit_std(q, k, m.scale)));
    case Values::tiny:
      return scale_finite(q, tiny_factor(q.dtype(), m.q));
    case Values::ties:
      q.for_each_index([&](const Index& i, int64_t) {
        if (i.back() < m.tie_from) q.set(i, 0.0);
      });
      return;
    case Values::cancel:
      q.for_each_index([&](const Index& i, int64_t) {
        if (i.back() % 2 == 0) return;
        Index even = i;
        --even.back();
        const double big = 16 * q.get(even);
        q.set(i, q.get(i) - big);
        q.set(even, big);
      });
      return;
  }
}

// A key cache [..., D] (every leading index one row). Rows holding a non-finite element (slots
// nobody may read) are left alone.
inline void shape_keys(Values v, const Tensor& k, const Magnitudes& m) {
  const int64_t D = k.size(-1);
  auto finite_row = [&](const Index& first) {
    Index i = first;
    for (i.back() = 0; i.back() < D; ++i.back())
      if (!std::isfinite(k.get(i))) return false;
    return true;
  };
  switch (v) {
    case Values::typical:
    case Values::large:
    case Values::peaked:
      return;
    case Values::tiny:
      return scale_finite(k, tiny_factor(k.dtype(), m.k));
    case Values::ties: {
      std::optional<Index> shared;
      k.for_each_index([&](const Index& i, int64_t) {
        if (i.back() != 0 || shared || !finite_row(i)) return;
        shared = i;
      });
      if (!shared) return;
      std::vector<double> row(static_cast<size_t>(D));
      Index s = *shared;
      for (s.back() = 0; s.back() < D; ++s.back()) row[static_cast<size_t>(s.back())] = k.get(s);
      k.for_each_index([&](const Index& i, int64_t) {
        if (i.back() != 0 || !finite_row(i)) return;
        Index j = i;
        for (j.back() = m.tie_from; j.back() < D; ++j.back())
          k.set(j, row[static_cast<size_t>(j.back())]);
      });
      return;
    }
    case Values::cancel:
      k.for_each_index([&](const Index& i, int64_t) {
        if (i.back() % 2 == 0 || !std::isfinite(k.get(i))) return;
        Index even = i;
        --even.back();
        if (std::isfinite(k.get(even))) k.set(i, k.get(even));
      });
      return;
  }
}

// A separate V cache: only `tiny` changes it (the other kinds shape the logits).
inline void shape_values(Values v, const Tensor& vbuf, double magnitude) {
  if (v == Values::tiny) scale_finite(vbuf, tiny_factor(vbuf.dtype(), magnitude));
}

}  // namespace attncheck::values
