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
#include "ops/typed_op.h"
#include "ops/values.h"
#include "reference/rope.h"

namespace attncheck {
namespace {

constexpr double kRopeBase = 10000.0;

enum class CosSinDtype { f32, model };
enum class Positions { zero, small, large };

// The axes rope and indexer_qk_rope share; each op adds its own around them (add_style, then its
// own, add_inputs, its own, add_tokens_seed: the case-id order).
struct RopeCommonParams {
  ref::RopeStyle style = ref::RopeStyle::neox;
  DType dtype = DType::bf16;
  CosSinDtype cache = CosSinDtype::f32;
  Positions positions = Positions::small;
  int64_t tokens = 8;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  bool pad_strides = false;     // ops/storage_offset.h
  bool compact = false;         // ops/storage_offset.h
  bool far_rows = false;        // ops/storage_offset.h
};

// The members named here live in the base RopeCommonParams: the explicit template arguments let
// them convert to members of P.
template <class P>
void add_style(Fields<P>& f, std::string help) {
  f.template choice<ref::RopeStyle>(
      "style", "", &P::style, {{ref::RopeStyle::neox, "neox"}, {ref::RopeStyle::gptj, "gptj"}},
      std::move(help));
}
template <class P>
void add_inputs(Fields<P>& f) {
  f.template add<DType>("dtype", "", &P::dtype, "q/k dtype")
      .only({"bf16", "f16"})
      .template choice<CosSinDtype>("cache", "cs", &P::cache,
                                    {{CosSinDtype::f32, "f32"}, {CosSinDtype::model, "model"}},
                                    "cos_sin_cache dtype")
      .template choice<Positions>(
          "positions", "pos", &P::positions,
          {{Positions::zero, "zero"}, {Positions::small, "small"}, {Positions::large, "large"}},
          "token positions");
}
template <class P>
void add_tokens_seed(Fields<P>& f) {
  f.template add<int64_t>("tokens", "t", &P::tokens, "tokens")
      .template add<int64_t>("seed", "s", &P::seed, "input seed")
      .template add<bool>("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
      .out_of_id_at_default()
      .template add<bool>("pad_strides", "pstr", &P::pad_strides, kPadStridesHelp)
      .out_of_id_at_default()
      .template add<bool>("compact", "cmp", &P::compact, kCompactHelp)
      .out_of_id_at_default()
      .template add<bool>("far_rows", "far", &P::far_rows, kFarRowsHelp)
      .out_of_id_at_default();
}

std::optional<std::string> rope_unbuildable(const RopeCommonParams& p) {
  if (p.tokens < 1) return "tokens must be >= 1";
  return std::nullopt;
}

// zero: every token at 0 (the one setting where a discarded rotation goes unnoticed);
// small: 0, 1, 7 then random below 16; large: 0, 1, 7, the last cache row, 4095, then random.
int64_t cache_rows(Positions positions) {
  return positions == Positions::large ? 8192 : 16;
}
Tensor make_positions(const Case& c, const RopeCommonParams& p) {
  Tensor pos = Tensor::zeros(DType::i64, {p.tokens});
  if (p.positions == Positions::zero) return pos;
  const int64_t rows = cache_rows(p.positions);
  std::vector<int64_t> fixed = {0, 1, 7};
  if (p.positions == Positions::large) fixed.insert(fixed.end(), {rows - 1, 4095});
  Rng rng(c.id, "positions", static_cast<uint64_t>(p.seed));
  for (int64_t t = 0; t < p.tokens; ++t)
    pos.at<int64_t>({t}) =
        t < static_cast<int64_t>(fixed.size()) ? fixed[t] : rng.uniform_int(0, rows - 1);
  return pos;
}
Tensor make_cache(const RopeCommonParams& p, int64_t rot) {
  const DType dt = p.cache == CosSinDtype::f32 ? DType::f32 : p.dtype;
  return ref::rope_cos_sin_cache(cache_rows(p.positions), rot, kRopeBase, dt);
}

// The shared make() preamble: positions and cos_sin_cache args, the kernel entry, and the cost
// of rotating `rot` dims of H q heads and one k head per token.
Problem rope_problem(const Case& c, const RopeCommonParams& p, std::string entry, int64_t H,
                     int64_t rot) {
  Problem prob;
  prob.kernel = std::move(entry);
  prob.args = {{"positions", make_positions(c, p), Role::input},
               {"cos_sin_cache", make_cache(p, rot), Role::input}};
  const int64_t T = p.tokens;
  prob.flops = 6.0 * static_cast<double>(T * (H + 1) * rot / 2);
  prob.bytes =
      2.0 * static_cast<double>(T * (H + 1) * rot) * static_cast<double>(dtype_size(p.dtype));
  return prob;
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
  // Where the outputs are subnormal, one ulp is the subnormal spacing, not 2u|e| (bf16's matters
  // only for tiny inputs: values = tiny).
  b.absolute(2 * subnormal_half_spacing(dt),
             "the " + std::string(dtype_name(dt)) + " subnormal spacing");
  return b.build();
}
double max_abs(const Tensor& t) {
  double m = 0;
  t.for_each_index([&](const Index& i, int64_t) { m = std::max(m, std::fabs(t.get(i))); });
  return m;
}

enum class View { contiguous, front, back, transposed };
enum class Contract { inplace, out_of_place };

struct RopeParams : RopeCommonParams {
  View view = View::front;
  Contract contract = Contract::inplace;
  int64_t heads = 4;
  int64_t head_dim = 128;
  int64_t rot = 64;
  values::Values values = values::Values::typical;
};

// values (harness/ops/values.h) of rope's N(0, 1) inputs: large = x 2^k so |x| reaches about an
// eighth of the dtype's largest finite value (f16 2^13, bf16 2^124: a rotation computed in the
// input dtype or a product that leaves fp32 overflows); tiny = about twice the smallest normal
// (outputs in the subnormal range: a flush-to-zero kernel returns 0).
void shape_rope_inputs(values::Values v, const Tensor& t) {
  if (v == values::Values::tiny) values::scale_finite(t, values::tiny_factor(t.dtype(), 1.0));
  if (v == values::Values::large)
    values::scale_finite(t, values::power_of_two_near(max_finite(t.dtype()) / 8 / 6));
}

class RopeOp final : public TypedOp<RopeParams> {
 public:
  using P = RopeParams;
  std::string name() const override { return "rope"; }
  // far_rows: every token's rows are independent; positions is contiguous by the ABI.
  FarRows far_rows_args(const P& p) const override {
    // In place q and k are far; out of place the outputs (inputs dense: 8 GB, not 16, per case).
    if (p.contract == Contract::inplace) return {{"q", "k"}, {}, {"positions"}};
    return {{"q_out", "k_out"}, {}, {"q", "k", "positions"}};
  }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P& p) const override {
    if (p.contract == Contract::inplace) return {"cos_sin_cache"};
    return {"cos_sin_cache", "q_out", "k_out"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    add_style(f, "pairs (i, i+rot/2) or (2i, 2i+1)");
    f.choice("view", "", &P::view,
             {{View::contiguous, "contiguous"},
              {View::front, "front"},
              {View::back, "back"},
              {View::transposed, "transposed"}},
             "rotated slice: own tensor; dims [0, rot) of the head (indexer); the last rot dims "
             "(MLA q_pe); the last rot dims of a head-major [H, T, hd] buffer (transposed BMM "
             "output)")
        .choice("contract", "", &P::contract,
                {{Contract::inplace, "inplace"}, {Contract::out_of_place, "out_of_place"}},
                "mutate q/k views, or write q_out/k_out and leave q/k alone");
    add_inputs(f);
    f.add("heads", "h", &P::heads, "q heads (k has one)")
        .only({1, 4, 16, 128})
        .add("head_dim", "hd", &P::head_dim, "full head size the slice lives in")
        .only({128, 192, 576})
        .add("rot", "rot", &P::rot, "rotary dims")
        .only({32, 64});
    add_tokens_seed(f);
    values::add_field(f, &P::values,
                      {values::Values::typical, values::Values::large, values::Values::tiny},
                      "input value distribution (harness/ops/rope.cpp): typical N(0, 1); large "
                      "= |x| up to an eighth of the dtype's largest finite value; tiny = about "
                      "twice the dtype's smallest normal (subnormal outputs)");
    return f;
  }

  std::vector<std::string> kernel_entries() const override {
    return {"rope_inplace", "rope_out_of_place"};
  }

  std::optional<std::string> unbuildable(const P& p) const override { return rope_unbuildable(p); }

  // q (H heads, in a transposed view too) and k, their outputs, positions and the cos/sin cache.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), H = static_cast<double>(p.heads);
    const double hd = static_cast<double>(std::max(p.head_dim, p.rot));
    const double es = static_cast<double>(dtype_size(p.dtype));
    CaseSize s;
    s.input_bytes = T * (H + 1) * hd * es + 8 * T + 4.0 * 8192 * static_cast<double>(p.rot);
    s.output_bytes = T * (H + 1) * static_cast<double>(p.rot) * es;
    s.work = T * (H + 1) * static_cast<double>(p.rot);
    return s.count("tokens", p.tokens).count("heads", p.heads);
  }

  Problem make(const Case& c, const P& p) const override {
    const DType dt = p.dtype;
    const int64_t T = p.tokens, H = p.heads, hd = p.head_dim, rot = p.rot;
    const auto seed = static_cast<uint64_t>(p.seed);

    // Full heads filled with data; the kernel sees the rotated slice.
    Tensor q_full, k_full, q, k;
    if (p.view == View::contiguous) {
      q_full = q = Tensor::empty(dt, {T, H, rot});
      k_full = Tensor::empty(dt, {T, rot});
      k = k_full.unsqueeze(1);
    } else {
      q_full = p.view == View::transposed ? Tensor::empty(dt, {H, T, hd}).permute({1, 0, 2})
                                          : Tensor::empty(dt, {T, H, hd});
      k_full = Tensor::empty(dt, {T, hd});
      const int64_t lo = p.view == View::front ? 0 : hd - rot;
      q = q_full.slice(-1, lo, lo + rot);
      k = k_full.slice(-1, lo, lo + rot).unsqueeze(1);  // [T, 1, rot], as the fast path passes it
    }
    fill_normal(q_full, Rng(c.id, "q", seed));
    fill_normal(k_full, Rng(c.id, "k", seed));
    shape_rope_inputs(p.values, q_full);
    shape_rope_inputs(p.values, k_full);

    const bool inplace = p.contract == Contract::inplace;
    Problem prob = rope_problem(c, p, inplace ? "rope_inplace" : "rope_out_of_place", H, rot);
    if (inplace) {
      prob.args.push_back({"q", q, Role::inout});
      prob.args.push_back({"k", k, Role::inout});
    } else {
      Tensor q_out = Tensor::empty(dt, {T, H, rot}), k_out = Tensor::empty(dt, {T, 1, rot});
      poison(q_out);
      poison(k_out);
      prob.args.push_back({"q", q, Role::input});
      prob.args.push_back({"k", k, Role::input});
      prob.args.push_back({"q_out", q_out, Role::output});
      prob.args.push_back({"k_out", k_out, Role::output});
    }
    return prob;
  }

  // Graph replay: captured with the positions reversed (each token rotated by another's angle).
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(prob, {reversed("positions")});
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"is_neox", p.style == ref::RopeStyle::neox}};
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    const Tensor& pos = prob.arg("positions");
    const Tensor& cache = prob.arg("cos_sin_cache");
    Tensor q = ref::rope(prob.arg("q"), pos, cache, p.style);
    Tensor k = ref::rope(prob.arg("k"), pos, cache, p.style);
    if (p.contract == Contract::inplace) return {{"q", q}, {"k", k}};
    return {{"q_out", q}, {"k_out", k}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                  const TensorMap&) const override {
    const double m = std::max(max_abs(prob.arg("q")), max_abs(prob.arg("k")));
    const Budget b = rope_budget(p.dtype, m);
    if (p.contract == Contract::inplace) return {{"q", b, {}, {}}, {"k", b, {}, {}}};
    return {{"q_out", b, {}, {}}, {"k_out", b, {}, {}}};
  }
};

// The indexer's RoPE step as one kernel contract: q [T, H, 128] and k [T, 128] (a strided slice
// of the fused wk+weights_proj GEMM output [T, 128 + H]) after RoPE on dims 0..63.
enum class IndexerPath { generic, fast };

struct IndexerQkRopeParams : RopeCommonParams {
  IndexerPath path = IndexerPath::fast;
  int64_t heads = 8;
};

class IndexerQkRopeOp final : public TypedOp<IndexerQkRopeParams> {
 public:
  using P = IndexerQkRopeParams;
  std::string name() const override { return "indexer_qk_rope"; }
  // far_rows: every token's rows are independent; positions is contiguous by the ABI.
  FarRows far_rows_args(const P&) const override { return {{"q", "k"}, {}, {"positions"}}; }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override { return {"k"}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"cos_sin_cache", "q"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    add_style(f, "NeoX (DeepSeek-V3.2) or GPT-J (GLM-5)");
    f.choice("path", "", &P::path, {{IndexerPath::generic, "generic"}, {IndexerPath::fast, "fast"}},
             "generic: split, rotate out of place, concat; fast: rotate the q/k views in place");
    add_inputs(f);
    f.add("heads", "h", &P::heads, "indexer heads (GLM-5 32, DSv3.2 64)").only({8, 32, 64});
    add_tokens_seed(f);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override { return rope_unbuildable(p); }

  // q [T, H, 128], the k|weights rows, positions and the cos/sin cache (64 wide).
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), H = static_cast<double>(p.heads);
    const double es = static_cast<double>(dtype_size(p.dtype));
    CaseSize s;
    s.input_bytes = T * (H * 128 + 128 + H) * es + 8 * T + 4.0 * 8192 * 64;
    s.work = T * (H + 1) * 64;
    return s.count("tokens", p.tokens).count("heads", p.heads);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t T = p.tokens, H = p.heads, D = 128, rot = 64;
    const auto seed = static_cast<uint64_t>(p.seed);
    Tensor q = Tensor::empty(p.dtype, {T, H, D});
    Tensor kw = Tensor::empty(p.dtype, {T, D + H});  // [k | weights_raw]: weights stay untouched
    fill_normal(q, Rng(c.id, "q", seed));
    fill_normal(kw, Rng(c.id, "kw", seed));
    Problem prob = rope_problem(c, p, "indexer_qk_rope", H, rot);
    prob.args.push_back({"q", q, Role::inout});
    prob.args.push_back({"k", kw.slice(1, 0, D), Role::inout});
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"is_neox", p.style == ref::RopeStyle::neox},
            {"path", p.path == IndexerPath::fast ? "fast" : "generic"}};
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    auto r = ref::indexer_qk_rope(prob.arg("q"), prob.arg("k"), prob.arg("positions"),
                                  prob.arg("cos_sin_cache"), p.style);
    return {{"q", r.q}, {"k", r.k}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                  const TensorMap&) const override {
    const double m = std::max(max_abs(prob.arg("q")), max_abs(prob.arg("k")));
    Budget b = rope_budget(p.dtype, m);
    b.why += "; dims 64..127 are plain copies (expected bitwise equal to the input)";
    return {{"q", b, {}, {}}, {"k", b, {}, {}}};
  }
};

const OpRegistrar kRegisterRope(std::make_unique<RopeOp>());
const OpRegistrar kRegisterIndexerQkRope(std::make_unique<IndexerQkRopeOp>());

}  // namespace
}  // namespace attncheck
