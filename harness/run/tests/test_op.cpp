// A test-only op ("selftest_axpy"): out = alpha * x + 1 per row, in f32 or bf16, with a head count
// that must be a power of two (3 is an invalid configuration the kernel must refuse). Linked into
// run_tests and the fake kernel library only, never into attncheck: it gives the runner a float op
// with an invalid configuration, independent of the real ops that other slices are writing.
#include <cmath>

#include "core/numeric.h"
#include "core/rng.h"
#include "ops/op.h"

namespace attncheck {
namespace {

class SelftestAxpyOp final : public Op {
 public:
  std::string name() const override { return "selftest_axpy"; }
  std::vector<Axis> axes() const override {
    return {
        {"heads", "h", 2, {1, 2, 3, 4}, "rows; 3 is invalid (not a power of two)"},
        {"n", "n", 64, {}, "row length"},
        {"dtype", "", "f32", {"f32", "bf16"}, "x and out dtype"},
        {"layout",
         "",
         "contiguous",
         {"contiguous", "strided", "sparse"},
         "strided: rows 7 elements apart; sparse: x is rows [64, 64 + heads) of a sparse storage "
         "of 64 + heads + 8 rows whose host window holds only those rows"},
        {"seed", "s", 0, {}, "input seed"},
    };
  }

  Problem make(const Case& c) const override {
    const int64_t heads = param_int(c.params, "heads");
    const int64_t n = param_int(c.params, "n");
    const DType dt = param_dtype(c.params, "dtype");
    const std::string layout = param_str(c.params, "layout");
    const int64_t pitch = layout == "strided" ? n + 7 : n;
    Tensor x =
        layout == "sparse"
            ? Tensor::sparse(dt, {64 + heads + 8, n}, 64 * n, heads * n).slice(0, 64, 64 + heads)
            : Tensor::empty(dt, {heads, pitch}).slice(1, 0, n);
    fill_normal(x, Rng(c.id, "x", static_cast<uint64_t>(param_int(c.params, "seed"))));
    Tensor out = Tensor::empty(dt, {heads, pitch});
    poison(out);
    Problem p;
    p.args = {{"x", x, Role::input}, {"out", out.slice(1, 0, n), Role::output}};
    p.kernel_params = {{"alpha", 0.5}, {"heads", heads}};
    if (heads & (heads - 1)) p.expect_refusal = "heads must be a power of two";
    p.flops = 2.0 * static_cast<double>(heads * n);
    p.bytes = 2.0 * static_cast<double>(heads * n) * static_cast<double>(dtype_size(dt));
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    const int64_t heads = p.kernel_params.at("heads").get<int64_t>();
    if (heads & (heads - 1)) throw InvalidConfig("heads must be a power of two");
    const double alpha = p.kernel_params.at("alpha").get<double>();
    const Tensor& x = p.arg("x");
    Tensor out = Tensor::empty(DType::f64, x.shape());
    x.for_each_index([&](const Index& idx, int64_t) { out.set(idx, alpha * x.get(idx) + 1.0); });
    return {{"out", out}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    Budget b;
    const double u = unit_roundoff(p.arg("out").dtype());
    b.rtol = u;
    b.atol = 1e-30;
    b.why = "one rounding of an exact f64 value to the output dtype: |err| <= u |e|";
    return {{"out", b, {}, {}}};
  }
};

const OpRegistrar kRegister(std::make_unique<SelftestAxpyOp>());

}  // namespace
}  // namespace attncheck
