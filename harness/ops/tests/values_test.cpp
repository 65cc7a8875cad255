// The values axis (harness/ops/values.h) against a second formulation of the reference: for every
// distribution, each op's outputs recomputed in long double straight from the problem's arguments,
// independent of the reference's code path (attention: a naive two-pass softmax, max first, then
// exp(s - max) and the sums; indexer logits: the weighted ReLU sum; rope: the pair rotation). The
// reference must agree inside the derived budget (far inside where it returns f64; within the one
// output rounding where it returns the output dtype), so the budgets stay valid for large, peaked,
// tied, tiny and cancelling inputs; and the budget must not be vacuous: an output with a bug-sized
// error (a fixed fraction of its largest |value|, on more elements than a mismatch fraction
// allows) fails the op's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ops/op.h"
#include "ops/values.h"
#include "ops/tests/registered_op.h"
#include "core/numeric.h"
#include "reference/indexer.h"
#include "reference/page_indices.h"
#include "reference/sparse_mla.h"
#include "run/evaluate.h"

namespace attncheck {
namespace {

using Real = long double;
const std::vector<std::string> kKinds = {"typical", "large", "peaked", "ties", "tiny", "cancel"};

// One row: q against key rows (the logit of key j is logit(q . k_j)); value row j is v(j, d).
struct RowResult {
  std::vector<Real> o;
  Real lse = -std::numeric_limits<Real>::infinity();
};
RowResult attend_two_pass(const std::vector<Real>& q, const std::vector<std::vector<Real>>& keys,
                          const std::function<Real(size_t, int64_t)>& v, int64_t lv,
                          const std::function<Real(Real)>& logit) {
  RowResult r;
  r.o.assign(static_cast<size_t>(lv), 0);
  if (keys.empty()) return r;
  std::vector<Real> s;
  Real m = -std::numeric_limits<Real>::infinity();
  for (const auto& k : keys) {
    Real dot = 0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * k[d];
    s.push_back(logit(dot));
    m = std::max(m, s.back());
  }
  Real l = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const Real w = std::exp(s[j] - m);
    l += w;
    for (int64_t d = 0; d < lv; ++d) r.o[static_cast<size_t>(d)] += w * v(j, d);
  }
  for (auto& x : r.o) x /= l;
  r.lse = m + std::log(l);
  return r;
}

std::vector<Real> row_of(const Tensor& t, Index at) {
  std::vector<Real> row(static_cast<size_t>(t.size(-1)));
  for (at.back() = 0; at.back() < t.size(-1); ++at.back())
    row[static_cast<size_t>(at.back())] = t.get(at);
  return row;
}

// decode_attention: request b, head h reads tokens [0, L_b) through the page table.
TensorMap decode_second(const Problem& p) {
  const Tensor &q = p.arg("q"), &k = p.arg("k_buffer"), &v = p.arg("v_buffer");
  const Tensor &table = p.arg("req_to_token"), &lens = p.arg("b_seq_len");
  const auto& kp = p.kernel_params;
  const Real sm = kp.at("sm_scale").get<double>(), ks = kp.at("k_scale").get<double>();
  const Real vs = kp.at("v_scale").get<double>(), cap = kp.at("logit_cap").get<double>();
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(-2), lv = v.size(-1);
  const int64_t P = k.ndim() == 4 ? k.size(1) : 1;
  auto at = [&](int64_t b, int64_t n, int64_t kvh) {
    const auto page = static_cast<int64_t>(table.get({b, n / P}));
    return P == 1 ? Index{page, kvh, 0} : Index{page, n % P, kvh, 0};
  };
  Tensor o = Tensor::empty(DType::f64, {B, Hq, lv}), lse = Tensor::empty(DType::f64, {B, Hq});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv), L = static_cast<int64_t>(lens.get({b}));
      std::vector<std::vector<Real>> keys;
      std::vector<Index> rows;
      for (int64_t n = 0; n < L; ++n) {
        rows.push_back(at(b, n, kvh));
        keys.push_back(row_of(k, rows.back()));
      }
      const auto r = attend_two_pass(
          row_of(q, {b, h, 0}), keys,
          [&](size_t j, int64_t d) {
            Index i = rows[j];
            i.back() = d;
            return vs * static_cast<Real>(v.get(i));
          },
          lv,
          [&](Real dot) {
            const Real s = dot * sm * ks;
            return cap > 0 ? cap * std::tanh(s / cap) : s;
          });
      for (int64_t d = 0; d < lv; ++d)
        o.set({b, h, d}, static_cast<double>(r.o[static_cast<size_t>(d)]));
      lse.set({b, h}, static_cast<double>(r.lse));
    }
  return {{"o", o}, {"lse", lse}};
}

// mla_decode / sparse_mla: token t reads the flat cache slots slots_of(t); V is the first lv dims.
TensorMap mla_second(const Problem& p, const std::function<std::vector<int64_t>(int64_t)>& slots_of) {
  const Tensor &q = p.arg("q"), &cache = p.arg("kv_cache");
  const auto& kp = p.kernel_params;
  const Real scale = kp.at("scale").get<double>(), kv = kp.at("kv_scale").get<double>();
  const int64_t T = q.size(0), N = q.size(1), lv = kp.at("lv").get<int64_t>(), P = cache.size(1);
  Tensor out = Tensor::empty(DType::f64, {T, N, lv}), lse = Tensor::empty(DType::f64, {T, N});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::vector<Real>> keys;
    for (int64_t s : slots_of(t)) {
      keys.push_back(row_of(cache, {s / P, s % P, 0}));
      for (auto& x : keys.back()) x *= kv;
    }
    for (int64_t h = 0; h < N; ++h) {
      const auto r = attend_two_pass(
          row_of(q, {t, h, 0}), keys, [&](size_t j, int64_t d) { return keys[j][d]; }, lv,
          [&](Real dot) { return dot * scale; });
      for (int64_t d = 0; d < lv; ++d)
        out.set({t, h, d}, static_cast<double>(r.o[static_cast<size_t>(d)]));
      lse.set({t, h}, static_cast<double>(r.lse));
    }
  }
  return {{"out", out}, {"lse", lse}};
}

TensorMap dense_mla_second(const Problem& p) {
  const Tensor &lens = p.arg("seq_lens"), &qsl = p.arg("query_start_loc");
  const int64_t kbs = p.kernel_params.at("kernel_block_size").get<int64_t>();
  const Tensor slots = ref::page_indices(p.arg("block_table"), lens, kbs);
  const Tensor cu = ref::cumulative_lengths(lens);
  return mla_second(p, [&](int64_t t) {
    int64_t b = 0;
    while (qsl.at<int32_t>({b + 1}) <= t) ++b;
    const int64_t qlen = qsl.at<int32_t>({b + 1}) - qsl.at<int32_t>({b});
    const int64_t i = t - qsl.at<int32_t>({b});
    std::vector<int64_t> keys;
    for (int64_t k = 0; k <= lens.at<int32_t>({b}) - qlen + i; ++k)
      keys.push_back(slots.at<int32_t>({cu.at<int32_t>({b}) + k}));
    return keys;
  });
}

TensorMap sparse_mla_second(const Problem& p) {
  const auto idx = ref::sparse_mla_pack(ref::sparse_mla_global_indices(
      p.arg("topk_indices"), p.arg("req_id_per_token"), p.arg("block_table"),
      p.kernel_params.at("kernel_block_size").get<int64_t>()));
  return mla_second(p, [&](int64_t t) {
    std::vector<int64_t> keys;
    for (int64_t i = idx.indptr.at<int32_t>({t}); i < idx.indptr.at<int32_t>({t + 1}); ++i)
      keys.push_back(idx.indices.at<int32_t>({i}));
    return keys;
  });
}

namespace ix = ref::indexer;

// indexer logits: logit(i, j) = sum_h w_ih max(0, q_ih . k_j) k_scale_j inside row i's window,
// -inf outside; k_of(i, j, codes, &scale) reads key j for row i or says it is outside.
Tensor logits_second(const Tensor& q, const Tensor& weights, int64_t width,
                     const std::function<bool(int64_t, int64_t, std::vector<Real>&, Real&)>& k_of) {
  const int64_t rows = weights.size(0), H = weights.size(1);
  const Tensor qr = q.reshape({rows, H, ix::kHeadDim});
  Tensor out = Tensor::empty(DType::f64, {rows, width});
  std::vector<Real> k(ix::kHeadDim);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < width; ++j) {
      Real scale = 0;
      if (!k_of(i, j, k, scale)) {
        out.set({i, j}, -std::numeric_limits<double>::infinity());
        continue;
      }
      Real sum = 0;
      for (int64_t h = 0; h < H; ++h) {
        Real dot = 0;
        for (int64_t d = 0; d < ix::kHeadDim; ++d)
          dot += static_cast<Real>(qr.get({i, h, d})) * k[static_cast<size_t>(d)];
        sum += static_cast<Real>(weights.get({i, h})) * std::max<Real>(dot, 0) * scale;
      }
      out.set({i, j}, static_cast<double>(sum));
    }
  return out;
}

TensorMap logits_prefill_second(const Problem& p) {
  const Tensor &k = p.arg("k_fp8"), &ks = p.arg("cu_seqlen_ks"), &ke = p.arg("cu_seqlen_ke");
  const Tensor& scales = p.arg("k_scale");
  return {{"logits", logits_second(p.arg("q"), p.arg("weights"), p.arg("logits").size(1),
                                   [&](int64_t i, int64_t j, std::vector<Real>& row, Real& s) {
                                     const auto jd = static_cast<double>(j);
                                     if (jd < ks.get({i}) || jd >= ke.get({i})) return false;
                                     for (int64_t d = 0; d < ix::kHeadDim; ++d)
                                       row[static_cast<size_t>(d)] = k.get({j, d});
                                     s = scales.get({j});
                                     return true;
                                   })}};
}

TensorMap logits_decode_second(const Problem& p) {
  const Tensor &q = p.arg("q"), &cache = p.arg("kv_cache"), &lens = p.arg("context_lens");
  const Tensor& table = p.arg("block_table");
  const int64_t NN = q.size(1), bs = cache.size(1), width = p.arg("logits").size(1);
  const ix::CacheView view{cache, bs, ix::layout_for_block_size(bs)};
  uint8_t bytes[ix::kHeadDim];
  return {{"logits",
           logits_second(q, p.arg("weights"), width,
                         [&](int64_t i, int64_t j, std::vector<Real>& row, Real& s) {
                           const int64_t b = i / NN, n = i % NN;
                           const int64_t len = static_cast<int64_t>(lens.get({b}));
                           if (j >= ix::decode_row_end(len, NN, n, width)) return false;
                           float scale = 0;
                           ix::read_token(view, static_cast<int64_t>(table.get({b, j / bs})),
                                          j % bs, bytes, &scale);
                           for (int64_t d = 0; d < ix::kHeadDim; ++d)
                             row[static_cast<size_t>(d)] = fp8_decode(bytes[d], q.dtype());
                           s = scale;
                           return true;
                         })}};
}

// rope: pair (a, b) of row t at position pos -> (a c - b s, b c + a s), c and s from the cache
// row [cos | sin]; NeoX pairs (i, i + rot/2), GPT-J (2i, 2i + 1).
TensorMap rope_second(const Problem& p) {
  const Tensor &pos = p.arg("positions"), &cache = p.arg("cos_sin_cache");
  const bool neox = p.kernel_params.at("is_neox").get<bool>();
  const bool inplace = !p.has_arg("q_out");
  TensorMap out;
  for (const char* name : {"q", "k"}) {
    const Tensor& x = p.arg(name);
    const int64_t T = x.size(0), H = x.size(1), rot = x.size(2), half = rot / 2;
    Tensor y = Tensor::empty(DType::f64, {T, H, rot});
    for (int64_t t = 0; t < T; ++t) {
      const auto at = static_cast<int64_t>(pos.get({t}));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const Real c = cache.get({at, i}), sn = cache.get({at, half + i});
          const int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
          const Real a = x.get({t, h, ia}), b = x.get({t, h, ib});
          y.set({t, h, ia}, static_cast<double>(a * c - b * sn));
          y.set({t, h, ib}, static_cast<double>(b * c + a * sn));
        }
    }
    out[inplace ? std::string(name) : std::string(name) + "_out"] = y;
  }
  return out;
}

// max over elements of |second - reference| / (atol + rtol |reference|), per output.
double worst_ratio(const Tensor& second, const Tensor& expected, const Budget& b) {
  double worst = 0;
  expected.for_each_index([&](const Index& i, int64_t) {
    const double e = expected.get(i), s = second.get(i);
    if (std::isinf(e) && e == s) return;  // -inf lse of a row without keys
    const double allowed = b.atol + b.rtol * std::fabs(e);
    worst = std::max(worst, std::fabs(s - e) / allowed);
  });
  return worst;
}

// Budgets are not vacuous: an output with a bug-sized error fails its check, whatever the budget's
// kind. The error does not scale with the budget (an element moved by a multiple of its own
// allowance fails every per-element budget, however loose): a fraction of the output's largest
// |value|, added to the elements of largest |value| (where a relative tolerance allows the most),
// one more of them than the check's max_mismatch_frac lets through. A budget that allows that
// error, or that lets every element through, fails this test. The fractions hold the derived
// allowances the test prints with room to spare: typical inputs allow at most 0.012 of the largest
// |value| (bf16/f16 outputs), the other kinds up to 0.17 (logits past exp's range with fp8 caches:
// the score error grows with sum |q k|).
double bug_error(const std::string& kind) { return kind == "typical" ? 0.05 : 0.25; }

struct Perturbation {
  bool failed = false;   // the check failed on the moved output
  double allowance = 0;  // numeric: the moved elements' largest atol + rtol |x| / largest |value|
  int64_t moved = 0;     // elements moved
  std::string why;       // why no bug-sized error could be made (the test then fails)
};

Perturbation bug_sized_error(const Op& o, const Problem& p, const TensorMap& expected,
                             const OutputCheck& chk, double fraction) {
  Perturbation out;
  if (chk.budget.kind == Budget::Kind::topk_set) {
    out.why = "no bug-sized error is defined for a top-k index set here";
    return out;
  }
  TensorMap actual;
  for (const auto& [name, t] : expected) actual[name] = t.clone();
  const Tensor& t = actual.at(chk.name);
  std::vector<std::pair<double, Index>> by_size;
  t.for_each_index([&](const Index& i, int64_t) {
    const double x = std::fabs(t.get(i));
    if (std::isfinite(x)) by_size.emplace_back(x, i);
  });
  const double allowed = chk.budget.kind == Budget::Kind::numeric
                             ? std::floor(chk.budget.max_mismatch_frac *
                                          static_cast<double>(t.numel()))
                             : 0;
  out.moved = static_cast<int64_t>(allowed) + 1;
  if (by_size.empty() || out.moved > static_cast<int64_t>(by_size.size())) {
    out.why = "the budget lets " + std::to_string(static_cast<int64_t>(allowed)) + " of " +
              std::to_string(by_size.size()) + " finite elements through";
    return out;
  }
  std::partial_sort(by_size.begin(), by_size.begin() + out.moved, by_size.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  const double largest = by_size.front().first, error = fraction * largest;
  if (largest == 0) {
    out.why = "every element is 0: no scale for a bug-sized error";
    return out;
  }
  for (int64_t k = 0; k < out.moved; ++k) {
    const auto& [size, index] = by_size[static_cast<size_t>(k)];
    if (chk.budget.kind == Budget::Kind::numeric)
      out.allowance = std::max(out.allowance, chk.budget.atol + chk.budget.rtol * size);
    t.set(index, t.get(index) + error);
  }
  out.allowance /= largest;
  for (const auto& r : check_outputs(o.checks(p, expected), expected, actual))
    if (r.name == chk.name) out.failed = !r.passed;
  return out;
}

struct OpShapes {
  const char* op;
  std::function<TensorMap(const Problem&)> second;
  std::vector<Params> shapes;
  // The reference's own output rounding: f64 outputs agree to ~1e-12 of the budget; the indexer's
  // logits (fp32) and rope's outputs (the q dtype) are rounded once, which the budget holds
  // (relative u + the subnormal spacing): at most about half of it.
  double far_inside = 1e-3;
};

bool allows(const Op& o, const std::string& kind) {
  for (const auto& a : o.axes())
    if (a.name == "values")
      return std::find(a.allowed.begin(), a.allowed.end(), nlohmann::json(kind)) != a.allowed.end();
  return false;
}

TEST(Values, ReferenceMatchesALongDoubleSecondFormulationInsideTheBudget) {
  const std::vector<OpShapes> ops = {
      {"decode_attention",
       decode_second,
       {{{"lk_lv", "576x512"}, {"splits", 8}, {"batch", 2}, {"max_ctx", 40}},
        {{"lk_lv", "128x128"}, {"is_mla", false}, {"kv_heads", 16}, {"batch", 2}},
        {{"lk_lv", "192x128"},
         {"is_mla", false},
         {"kv_heads", 2},
         {"kv_dtype", "e4m3fnuz"},
         {"dtype", "f16"},
         {"logit_cap", 30},
         {"batch", 2}}}},
      {"mla_decode",
       dense_mla_second,
       {{{"heads", 4}, {"qlen", 2}, {"dims", "96x64"}, {"block_size", 1}},
        {{"heads", 16}, {"kv_dtype", "e4m3fn"}, {"dtype", "f16"}, {"batch", 1}, {"ctx", 40}}}},
      {"sparse_mla",
       sparse_mla_second,
       {{{"heads", 8}, {"topk", 32}, {"dims", "96x64"}, {"scale", "yarn"}},
        {{"heads", 16}, {"pattern", "causal"}, {"kv_dtype", "e4m3fnuz"}, {"batch", 1}}}},
      {"indexer_logits_prefill",
       logits_prefill_second,
       {{{"heads", 16}}, {{"heads", 4}, {"fp8", "e4m3fnuz"}, {"mask", "random"}}},
       0.6},
      {"indexer_logits_decode",
       logits_decode_second,
       {{{"heads", 16}, {"block_size", 64}, {"batch", 3}, {"max_ctx", 100}},
        {{"heads", 8}, {"block_size", 1}, {"next_n", 2}, {"batch", 2}, {"fp8", "e4m3fnuz"}}},
       0.6},
      {"rope",
       rope_second,
       {{{"view", "transposed"}, {"contract", "out_of_place"}},
        {{"style", "gptj"}, {"dtype", "f16"}, {"positions", "large"}}},
       0.6},
  };
  for (const auto& family : ops) {
    const Op& o = registered_op(family.op);
    for (const auto& kind : kKinds) {
      if (!allows(o, kind)) continue;
      double worst = 0, worst_atol = 0, worst_allowance = 0;
      for (Params params : family.shapes) {
        params["values"] = kind;
        const Case c = o.make_case(params);
        const Problem p = o.make(c);
        ASSERT_FALSE(p.expect_refusal) << c.id;
        const TensorMap expected = o.reference(p);
        const TensorMap second = family.second(p);
        for (const auto& chk : o.checks(p, expected)) {
          const double r = worst_ratio(second.at(chk.name), expected.at(chk.name), chk.budget);
          EXPECT_LT(r, family.far_inside) << c.id << " " << chk.name << ": |second - reference| / budget";
          if (r >= worst) {
            worst = r;
            worst_atol = chk.budget.atol;
          }
          const Perturbation moved = bug_sized_error(o, p, expected, chk, bug_error(kind));
          EXPECT_TRUE(moved.why.empty()) << c.id << " " << chk.name << ": " << moved.why;
          EXPECT_TRUE(moved.failed) << c.id << " " << chk.name << ": " << moved.moved
                                    << " element(s) moved by " << bug_error(kind)
                                    << " x the largest |value| pass (allowance there "
                                    << moved.allowance << " of it)";
          worst_allowance = std::max(worst_allowance, moved.allowance);
        }
      }
      std::printf("%-17s %-8s max |long double second formulation - reference| / budget = %.3g (atol %.3g); allowance / max|out| %.3g\n",
                  family.op, kind.c_str(), worst, worst_atol, worst_allowance);
    }
  }
}

// What each kind does to the inputs, checked on the problem: large logits past exp's fp32 range,
// all-equal logits, tiny values near the dtype's smallest normal, and cancelling pairs.
TEST(Values, KindsShapeTheInputsAsDocumented) {
  const Op& o = registered_op("decode_attention");
  auto problem = [&](const char* kind, Params extra = Params::object()) {
    extra["values"] = kind;
    extra["lk_lv"] = "128x128";
    extra["is_mla"] = false;
    extra["kv_heads"] = 16;
    return o.make(o.make_case(extra));
  };
  EXPECT_EQ(o.make_case({{"values", "typical"}}).id, o.make_case(Params::object()).id);
  EXPECT_NE(o.make_case({{"values", "large"}}).id.find("-vlarge"), std::string::npos);
  // large: the reference's lse (a logit's scale) passes 88.7, where exp overflows fp32.
  const Problem large = problem("large");
  const TensorMap lr = o.reference(large);
  double lse_max = 0;
  lr.at("lse").for_each_index(
      [&](const Index& i, int64_t) { lse_max = std::max(lse_max, lr.at("lse").get(i)); });
  EXPECT_GT(lse_max, 88.8);
  // ties: every key row of every page equal, so lse = logit + log L with equal weights.
  const Problem ties = problem("ties");
  const Tensor& k = ties.arg("k_buffer");
  EXPECT_EQ(k.get({0, 0, 0, 5}), k.get({3, 7, 0, 5}));
  // tiny: q and the caches near bf16's smallest normal 2^-126.
  const Problem tiny = problem("tiny");
  EXPECT_LT(std::fabs(tiny.arg("q").get({0, 0, 0})), 1e-36);
  EXPECT_LT(std::fabs(tiny.arg("v_buffer").get({0, 0, 0, 0})), 1e-36);
  // cancel: k pairs equal, q pairs of opposite signs 16x the original size.
  const Problem cancel = problem("cancel");
  EXPECT_EQ(cancel.arg("k_buffer").get({1, 2, 3, 10}), cancel.arg("k_buffer").get({1, 2, 3, 11}));
  const Tensor& q = cancel.arg("q");
  int64_t opposite = 0, pairs = 0;
  for (int64_t d = 0; d < q.size(2); d += 2, ++pairs)
    opposite += q.get({0, 0, d}) * q.get({0, 0, d + 1}) < 0;
  EXPECT_GT(opposite, pairs * 9 / 10);
  // Special codes and sparse storages are case-file errors with another kind.
  EXPECT_THROW((void)o.make(o.make_case({{"values", "large"},
                                         {"kv_dtype", "e4m3fn"},
                                         {"fp8_codes", "special"}})),
               std::invalid_argument);
}

// The flush-to-zero head weights of AC_MUTANT_INDEXER_WEIGHTS_FTZ, on the CPU: the reference over
// weights with every fp32 subnormal set to 0 fails the op's checks for values = tiny and passes for
// every other kind (typical weights are normal: the mutant survived the tiers before this axis).
TEST(Values, FlushedSubnormalWeightsFailOnlyTiny) {
  for (const char* name : {"indexer_logits_prefill", "indexer_logits_decode"}) {
    const Op& o = registered_op(name);
    for (const char* kind : {"typical", "large", "tiny", "cancel"}) {
      const Problem p = o.make(o.make_case({{"heads", 16}, {"values", kind}}));
      const TensorMap expected = o.reference(p);
      Problem flushed = p;
      const Tensor w = p.arg("weights").contiguous();
      int64_t subnormal = 0;
      w.for_each_index([&](const Index& i, int64_t) {
        const double x = w.get(i);
        if (x == 0 || std::fabs(x) >= std::numeric_limits<float>::min()) return;
        w.set(i, 0.0);
        ++subnormal;
      });
      for (auto& a : flushed.args)
        if (a.name == "weights") a.tensor = w;
      bool passed = true;
      for (const auto& r : check_outputs(o.checks(p, expected), expected, o.reference(flushed)))
        passed = passed && r.passed;
      const bool tiny = std::string(kind) == "tiny";
      EXPECT_EQ(subnormal > 0, tiny) << name << " " << kind;
      EXPECT_EQ(passed, !tiny) << name << " " << kind << ": " << subnormal << " weights flushed";
      std::printf("%-23s %-8s %5lld subnormal weights; flushed to 0: %s\n", name, kind,
                  static_cast<long long>(subnormal), passed ? "passes" : "fails");
    }
  }
}

// The fp8 quantizers' `large` rows (issue 37 item 3): a large case's rows scaled back by 2^-112
// (exact: powers of two in bf16's range) quantize to the same codes, and every scale (and
// q_quant's weight) of a row above the amax floor is 2^-112 times the large case's: the kind moves
// only the scales, to near the top of fp32.
Problem scaled_back(Problem p, const char* arg) {
  Tensor t = p.arg(arg).clone();
  values::scale_finite(t, std::ldexp(1.0, -112));
  p.arg(arg) = t;
  return p;
}

TEST(Values, LargeQuantizerRowsMoveOnlyTheScales) {
  const double factor = std::ldexp(1.0, 112);
  {
    const Op& o = registered_op("indexer_q_quant");
    const Problem pl = o.make(o.make_case({{"tokens", 5}, {"heads", 8}, {"values", "large"}}));
    const TensorMap l = o.reference(pl), t = o.reference(scaled_back(pl, "q"));
    EXPECT_EQ(t.at("q_fp8").to_vector(), l.at("q_fp8").to_vector());
    const auto ts = t.at("q_scale").to_vector(), ls = l.at("q_scale").to_vector();
    const auto tw = t.at("weights").to_vector(), lw = l.at("weights").to_vector();
    int64_t moved = 0;
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i] > 1e-9) {  // rows above the amax floor (zero rows keep the floored scale)
        EXPECT_EQ(ls[i], ts[i] * factor) << i;
        EXPECT_EQ(lw[i], tw[i] * factor) << i;
        ++moved;
      }
    EXPECT_GT(moved, 30);
    EXPECT_GT(*std::max_element(ls.begin(), ls.end()), std::ldexp(1.0, 110));
  }
  const Op& o = registered_op("indexer_k_cache");
  const Problem pl = o.make(o.make_case({{"tokens", 20}, {"block_size", 1}, {"values", "large"}}));
  const Tensor cl = o.reference(pl).at("kv_cache"),
               ct = o.reference(scaled_back(pl, "k")).at("kv_cache");
  int64_t codes_equal = 0, scales_moved = 0;
  // Block size 1 (NORMAL): each page is one token's 128 codes, then its fp32 scale.
  for (int64_t page = 0; page < ct.size(0); ++page) {
    bool same = true;
    for (int64_t d = 0; d < 128; ++d)
      same = same && ct.get_bits({page, 0, d}) == cl.get_bits({page, 0, d});
    codes_equal += same;
    float st = 0, sl = 0;
    std::memcpy(&st, ct.element_ptr(Index{page, 0, 128}), 4);
    std::memcpy(&sl, cl.element_ptr(Index{page, 0, 128}), 4);
    scales_moved +=
        std::isfinite(st) && st > 1e-4f / 448 * 2 && sl == st * static_cast<float>(factor);
  }
  EXPECT_EQ(codes_equal, ct.size(0));
  EXPECT_GT(scales_moved, 8);
}

// indexer_mxfp4_logits_decode's weight kinds (each case id seeds its own N(0, 1) weights): large
// puts the largest |w| near 2^40, tiny makes every weight a nonzero fp32 subnormal.
TEST(Values, Mxfp4LogitsWeightKinds) {
  const Op& o = registered_op("indexer_mxfp4_logits_decode");
  const auto weights = [&](const char* kind) {
    return o.make(o.make_case({{"heads", 8}, {"batch", 2}, {"max_ctx", 30}, {"values", kind}}))
        .arg("weights")
        .to_vector();
  };
  const auto largest = [](const std::vector<double>& w) {
    double m = 0;
    for (const double x : w) m = std::max(m, std::fabs(x));
    return m;
  };
  EXPECT_LT(largest(weights("typical")), 8.0);
  EXPECT_GT(largest(weights("large")), std::ldexp(1.0, 39));
  EXPECT_LT(largest(weights("large")), std::ldexp(1.0, 43));
  for (const double w : weights("tiny")) {
    EXPECT_LT(std::fabs(w), std::numeric_limits<float>::min());
    EXPECT_NE(w, 0.0);
  }
}

}  // namespace
}  // namespace attncheck
