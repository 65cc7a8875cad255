// A test-only op ("selftest_axpy"): out = alpha * x + 1 per row, in f32 or bf16, with a head count
// that must be a power of two (3 is an invalid configuration the kernel must refuse). Linked into
// run_tests and the fake kernel library only, never into attncheck: it gives the runner a float op
// with an invalid configuration, independent of the real ops that other slices are writing.
#include <cmath>

#include "core/numeric.h"
#include "core/rng.h"
#include "ops/typed_op.h"

namespace attncheck {
namespace {

enum class Layout { contiguous, strided, sparse };

struct AxpyParams {
  int64_t heads = 2;
  int64_t n = 64;
  DType dtype = DType::f32;
  Layout layout = Layout::contiguous;
  int64_t seed = 0;
};

class SelftestAxpyOp final : public TypedOp<AxpyParams> {
 public:
  using P = AxpyParams;
  std::string name() const override { return "selftest_axpy"; }
  Fields<P> fields() const override {
    return Fields<P>()
        .add("heads", "h", &P::heads, "rows; 3 is invalid (not a power of two)")
        .only({1, 2, 3, 4})
        .add("n", "n", &P::n, "row length")
        .add("dtype", "", &P::dtype, "x and out dtype")
        .only({"f32", "bf16"})
        .choice("layout", "", &P::layout,
                {{Layout::contiguous, "contiguous"},
                 {Layout::strided, "strided"},
                 {Layout::sparse, "sparse"}},
                "strided: rows 7 elements apart; sparse: x is rows [64, 64 + heads) of a sparse "
                "storage of 64 + heads + 8 rows whose host window holds only those rows")
        .add("seed", "s", &P::seed, "input seed");
  }

  std::optional<std::string> invalid(const P& p) const override {
    if (p.heads & (p.heads - 1)) return "heads must be a power of two";
    return std::nullopt;
  }

  // x and out, each [heads, n + 7] at most.
  CaseSize size(const P& p) const override {
    const double row = static_cast<double>(p.n + 7) * static_cast<double>(dtype_size(p.dtype));
    CaseSize s;
    s.input_bytes = static_cast<double>(p.heads + 8) * row;
    s.output_bytes = static_cast<double>(p.heads) * row;
    s.work = static_cast<double>(p.heads) * static_cast<double>(p.n);
    return s;
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t pitch = p.layout == Layout::strided ? p.n + 7 : p.n;
    Tensor x = p.layout == Layout::sparse
                   ? Tensor::sparse(p.dtype, {64 + p.heads + 8, p.n}, 64 * p.n, p.heads * p.n)
                         .slice(0, 64, 64 + p.heads)
                   : Tensor::empty(p.dtype, {p.heads, pitch}).slice(1, 0, p.n);
    fill_normal(x, Rng(c.id, "x", static_cast<uint64_t>(p.seed)));
    Tensor out = Tensor::empty(p.dtype, {p.heads, pitch});
    poison(out);
    Problem prob;
    prob.args = {{"x", x, Role::input}, {"out", out.slice(1, 0, p.n), Role::output}};
    prob.flops = 2.0 * static_cast<double>(p.heads * p.n);
    prob.bytes =
        2.0 * static_cast<double>(p.heads * p.n) * static_cast<double>(dtype_size(p.dtype));
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"alpha", kAlpha}, {"heads", p.heads}};
  }

  TensorMap reference(const Problem& prob, const P&) const override {
    const Tensor& x = prob.arg("x");
    Tensor out = Tensor::empty(DType::f64, x.shape());
    x.for_each_index([&](const Index& idx, int64_t) { out.set(idx, kAlpha * x.get(idx) + 1.0); });
    return {{"out", out}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P&, const TensorMap&) const override {
    Budget b;
    const double u = unit_roundoff(prob.arg("out").dtype());
    b.rtol = u;
    b.atol = 1e-30;
    b.why = "one rounding of an exact f64 value to the output dtype: |err| <= u |e|";
    return {{"out", b, {}, {}}};
  }

 private:
  static constexpr double kAlpha = 0.5;
};

const OpRegistrar kRegister(std::make_unique<SelftestAxpyOp>());

}  // namespace
}  // namespace attncheck
