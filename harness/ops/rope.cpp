// rope and indexer_qk_rope (docs/ops/rope.md).
// What they guard against: the wrong pairing (NeoX vs GPT-J: the DSv3.2 indexer is NeoX, GLM-5's
// is interleaved), a rotation applied to the wrong end of the head, strided q/k slices read as if
// contiguous (transposed-BMM outputs), an in-place contract that does not mutate its input and an
// out-of-place one that does (the indexer fast path discarded the result of an out-of-place RoPE:
// vLLM #27373, #43781), and dims outside the rotated slice being touched. Position 0 is the
// identity, so every group but one uses positions >= 1.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/policy.h"
#include "ops/op.h"
#include "reference/rope.h"

namespace attncheck {
namespace {

constexpr double kRopeBase = 10000.0;

DType parse_model_dtype(const Params& p) {
  return param_str(p, "dtype") == "f16" ? DType::f16 : DType::bf16;
}

// zero: every token at 0 (the one setting where a discarded rotation goes unnoticed);
// small: 0, 1, 7 then random below 16; large: 0, 1, 7, the last cache row, 4095, then random.
int64_t cache_rows(const std::string& positions) {
  return positions == "large" ? 8192 : 16;
}
Tensor make_positions(const Case& c, int64_t T, const std::string& kind) {
  Tensor pos = Tensor::zeros(DType::i64, {T});
  if (kind == "zero") return pos;
  const int64_t rows = cache_rows(kind);
  std::vector<int64_t> fixed = {0, 1, 7};
  if (kind == "large") fixed.insert(fixed.end(), {rows - 1, 4095});
  Rng rng(c.id, "positions", static_cast<uint64_t>(param_int(c.params, "seed")));
  for (int64_t t = 0; t < T; ++t)
    pos.at<int64_t>({t}) =
        t < static_cast<int64_t>(fixed.size()) ? fixed[t] : rng.uniform_int(0, rows - 1);
  return pos;
}
Tensor make_cache(const Params& p, int64_t rot) {
  const DType dt = param_str(p, "cache") == "f32" ? DType::f32 : parse_model_dtype(p);
  return ref::rope_cos_sin_cache(cache_rows(param_str(p, "positions")), rot, kRopeBase, dt);
}

// Derived from the kernel's arithmetic: a' = a c - b s in fp32 (possibly fused) is within
// 2 u32 (|a| + |b|) of the exact value; rounding that and rounding the exact value to the output
// dtype differ by at most one output ulp (<= 2 u_out |expected|) plus that fp32 error.
Budget rope_budget(DType dt, double max_abs_input) {
  const double u32 = unit_roundoff(DType::f32);
  BudgetBuilder b("rope");
  b.relative(2.0 * unit_roundoff(dt), "one " + std::string(dtype_name(dt)) + " ulp (2u)")
      .absolute(
          2.0 * u32 * 2.0 * max_abs_input,
          "fp32 evaluation error 2 u32 (|a|+|b|) with |a|,|b| <= " + format_number(max_abs_input) +
              "; reference in double from the same inputs and cache values");
  if (dt == DType::f16) b.absolute(std::ldexp(1.0, -24), "the f16 subnormal spacing");
  return b.build();
}
double max_abs(const Tensor& t) {
  double m = 0;
  t.for_each_index([&](const Index& i, int64_t) { m = std::max(m, std::fabs(t.get(i))); });
  return m;
}

class RopeOp final : public Op {
 public:
  std::string name() const override { return "rope"; }
  std::vector<Axis> axes() const override {
    return {
        {"style", "", "neox", {"neox", "gptj"}, "pairs (i, i+rot/2) or (2i, 2i+1)"},
        {"view",
         "",
         "front",
         {"contiguous", "front", "back", "transposed"},
         "rotated slice: own tensor; dims [0, rot) of the head (indexer); the last rot dims (MLA "
         "q_pe); the last rot dims of a head-major [H, T, hd] buffer (transposed BMM output)"},
        {"contract",
         "",
         "inplace",
         {"inplace", "out_of_place"},
         "mutate q/k views, or write q_out/k_out and leave q/k alone"},
        {"dtype", "", "bf16", {"bf16", "f16"}, "q/k dtype"},
        {"cache", "cs", "f32", {"f32", "model"}, "cos_sin_cache dtype"},
        {"positions", "pos", "small", {"zero", "small", "large"}, "token positions"},
        {"heads", "h", 4, {1, 4, 16, 128}, "q heads (k has one)"},
        {"head_dim", "hd", 128, {128, 192, 576}, "full head size the slice lives in"},
        {"rot", "rot", 64, {32, 64}, "rotary dims"},
        {"tokens", "t", 8, {}, "tokens"},
        {"seed", "s", 0, {}, "input seed"},
    };
  }

  std::vector<std::string> kernel_entries() const override {
    return {"rope_inplace", "rope_out_of_place"};
  }

  Problem make(const Case& c) const override {
    const auto& p = c.params;
    const DType dt = parse_model_dtype(p);
    const int64_t T = param_int(p, "tokens"), H = param_int(p, "heads");
    const int64_t hd = param_int(p, "head_dim"), rot = param_int(p, "rot");
    const std::string view = param_str(p, "view");
    const uint64_t seed = static_cast<uint64_t>(param_int(p, "seed"));
    if (T < 1) throw std::invalid_argument(c.id + ": tokens must be >= 1");

    // Full heads filled with data; the kernel sees the rotated slice.
    Tensor q_full, k_full, q, k;
    if (view == "contiguous") {
      q_full = q = Tensor::empty(dt, {T, H, rot});
      k_full = Tensor::empty(dt, {T, rot});
      k = k_full.unsqueeze(1);
    } else {
      q_full = view == "transposed" ? Tensor::empty(dt, {H, T, hd}).permute({1, 0, 2})
                                    : Tensor::empty(dt, {T, H, hd});
      k_full = Tensor::empty(dt, {T, hd});
      const int64_t lo = view == "front" ? 0 : hd - rot;
      q = q_full.slice(-1, lo, lo + rot);
      k = k_full.slice(-1, lo, lo + rot).unsqueeze(1);  // [T, 1, rot], as the fast path passes it
    }
    fill_normal(q_full, Rng(c.id, "q", seed));
    fill_normal(k_full, Rng(c.id, "k", seed));

    Problem prob;
    prob.args = {{"positions", make_positions(c, T, param_str(p, "positions")), Role::input},
                 {"cos_sin_cache", make_cache(p, rot), Role::input}};
    if (param_str(p, "contract") == "inplace") {
      prob.kernel = "rope_inplace";
      prob.args.push_back({"q", q, Role::inout});
      prob.args.push_back({"k", k, Role::inout});
    } else {
      prob.kernel = "rope_out_of_place";
      Tensor q_out = Tensor::empty(dt, {T, H, rot}), k_out = Tensor::empty(dt, {T, 1, rot});
      poison(q_out);
      poison(k_out);
      prob.args.push_back({"q", q, Role::input});
      prob.args.push_back({"k", k, Role::input});
      prob.args.push_back({"q_out", q_out, Role::output});
      prob.args.push_back({"k_out", k_out, Role::output});
    }
    prob.kernel_params = {{"is_neox", param_str(p, "style") == "neox"}};
    prob.flops = 6.0 * static_cast<double>(T * (H + 1) * rot / 2);
    prob.bytes = 2.0 * static_cast<double>(T * (H + 1) * rot) * static_cast<double>(dtype_size(dt));
    return prob;
  }

  TensorMap reference(const Problem& p) const override {
    const auto style =
        p.kernel_params.at("is_neox").get<bool>() ? ref::RopeStyle::neox : ref::RopeStyle::gptj;
    const Tensor& pos = p.arg("positions");
    const Tensor& cache = p.arg("cos_sin_cache");
    Tensor q = ref::rope(p.arg("q"), pos, cache, style);
    Tensor k = ref::rope(p.arg("k"), pos, cache, style);
    if (p.kernel == "rope_inplace") return {{"q", q}, {"k", k}};
    return {{"q_out", q}, {"k_out", k}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    const DType dt = p.arg("q").dtype();
    const double m = std::max(max_abs(p.arg("q")), max_abs(p.arg("k")));
    const Budget b = rope_budget(dt, m);
    if (p.kernel == "rope_inplace") return {{"q", b, {}, {}}, {"k", b, {}, {}}};
    return {{"q_out", b, {}, {}}, {"k_out", b, {}, {}}};
  }
};

// The indexer's RoPE step as one kernel contract: q [T, H, 128] and k [T, 128] (a strided slice
// of the fused wk+weights_proj GEMM output [T, 128 + H]) after RoPE on dims 0..63.
class IndexerQkRopeOp final : public Op {
 public:
  std::string name() const override { return "indexer_qk_rope"; }
  std::vector<Axis> axes() const override {
    return {
        {"style", "", "neox", {"neox", "gptj"}, "NeoX (DeepSeek-V3.2) or GPT-J (GLM-5)"},
        {"path",
         "",
         "fast",
         {"generic", "fast"},
         "generic: split, rotate out of place, concat; fast: rotate the q/k views in place"},
        {"dtype", "", "bf16", {"bf16", "f16"}, "q/k dtype"},
        {"cache", "cs", "f32", {"f32", "model"}, "cos_sin_cache dtype"},
        {"positions", "pos", "small", {"zero", "small", "large"}, "token positions"},
        {"heads", "h", 8, {8, 32, 64}, "indexer heads (GLM-5 32, DSv3.2 64)"},
        {"tokens", "t", 8, {}, "tokens"},
        {"seed", "s", 0, {}, "input seed"},
    };
  }

  Problem make(const Case& c) const override {
    const auto& p = c.params;
    const DType dt = parse_model_dtype(p);
    const int64_t T = param_int(p, "tokens"), H = param_int(p, "heads"), D = 128, rot = 64;
    const uint64_t seed = static_cast<uint64_t>(param_int(p, "seed"));
    if (T < 1) throw std::invalid_argument(c.id + ": tokens must be >= 1");
    Tensor q = Tensor::empty(dt, {T, H, D});
    Tensor kw = Tensor::empty(dt, {T, D + H});  // [k | weights_raw]: weights must stay untouched
    fill_normal(q, Rng(c.id, "q", seed));
    fill_normal(kw, Rng(c.id, "kw", seed));
    Problem prob;
    prob.kernel = "indexer_qk_rope";
    prob.args = {{"positions", make_positions(c, T, param_str(p, "positions")), Role::input},
                 {"cos_sin_cache", make_cache(p, rot), Role::input},
                 {"q", q, Role::inout},
                 {"k", kw.slice(1, 0, D), Role::inout}};
    prob.kernel_params = {{"is_neox", param_str(p, "style") == "neox"},
                          {"path", param_str(p, "path")}};
    prob.flops = 6.0 * static_cast<double>(T * (H + 1) * rot / 2);
    prob.bytes = 2.0 * static_cast<double>(T * (H + 1) * rot) * static_cast<double>(dtype_size(dt));
    return prob;
  }

  TensorMap reference(const Problem& p) const override {
    const auto style =
        p.kernel_params.at("is_neox").get<bool>() ? ref::RopeStyle::neox : ref::RopeStyle::gptj;
    auto r = ref::indexer_qk_rope(p.arg("q"), p.arg("k"), p.arg("positions"),
                                  p.arg("cos_sin_cache"), style);
    return {{"q", r.q}, {"k", r.k}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    const double m = std::max(max_abs(p.arg("q")), max_abs(p.arg("k")));
    Budget b = rope_budget(p.arg("q").dtype(), m);
    b.why += "; dims 64..127 are plain copies (expected bitwise equal to the input)";
    return {{"q", b, {}, {}}, {"k", b, {}, {}}};
  }
};

const OpRegistrar kRegisterRope(std::make_unique<RopeOp>());
const OpRegistrar kRegisterIndexerQkRope(std::make_unique<IndexerQkRopeOp>());

}  // namespace
}  // namespace attncheck
