// The coverage audit: each flag raised where it must be and not elsewhere (a probe op whose
// scalars are, by construction, constant, derived from one or two tensor extents, or free),
// refused configurations left out, large offsets read from sparse storages without touching them,
// acceptances matched, stale and unknown ones reported, and the case-file section's errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "ops/typed_op.h"
#include "run/cases.h"
#include "run/coverage.h"
#include "core/tests/test_util.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

// Not registered: audited directly. t is [x, y] f32; scalars: "fixed" constant, "twice" = 2x (a
// function of t.shape[0]), "sum" = x + y (of the pair of extents), "free" from the mode axis,
// which no tensor shows; x = 3 is an invalid configuration.
struct ProbeParams {
  int64_t x = 1;
  int64_t y = 1;
  std::string mode = "a";
};

class ProbeOp final : public TypedOp<ProbeParams> {
 public:
  using P = ProbeParams;
  std::string name() const override { return "coverage_probe"; }
  Fields<P> fields() const override {
    return Fields<P>()
        .add("x", "x", &P::x, "rows")
        .only({1, 2, 3, 4, 5})
        .add("y", "y", &P::y, "columns")
        .add("mode", "", &P::mode, "picks the free scalar")
        .only({"a", "b"});
  }
  std::optional<std::string> invalid(const P& p) const override {
    if (p.x == 3) return "x = 3 is refused";
    return std::nullopt;
  }
  CaseSize size(const P& p) const override {
    CaseSize s;
    s.input_bytes = 4 * static_cast<double>(p.x) * static_cast<double>(p.y);
    return s;
  }

  Problem make(const Case&, const P& p) const override {
    Problem prob;
    prob.args = {{"t", Tensor::zeros(DType::f32, {p.x, p.y}), Role::input}};
    return prob;
  }
  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {
        {"fixed", 7}, {"twice", 2 * p.x}, {"sum", p.x + p.y}, {"free", p.mode == "a" ? 0.25 : 0.5}};
  }
  TensorMap reference(const Problem&, const P&) const override { return {}; }
  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    return {};
  }
};

std::vector<Case> probe_cases(const Op& op, std::vector<int> xs, std::vector<int> ys,
                              std::vector<std::string> modes) {
  std::vector<Case> out;
  for (int x : xs)
    for (int y : ys)
      for (const auto& m : modes) out.push_back(op.make_case({{"x", x}, {"y", y}, {"mode", m}}));
  return out;
}

const CoverageArgument& arg(const OpCoverage& oc, const std::string& name) {
  for (const auto& a : oc.arguments)
    if (a.name == name) return a;
  throw std::runtime_error("no argument " + name);
}
std::vector<std::string> flags_of(const OpCoverage& oc, const std::string& name) {
  std::vector<std::string> v;
  for (const auto& f : arg(oc, name).flags) v.push_back(f.flag);
  return v;
}
using Flags = std::vector<std::string>;

TEST(Coverage, FlagsEachKindWhereItMustAndOnlyThere) {
  const ProbeOp op;
  const auto oc = audit_op(op, probe_cases(op, {1, 2, 3, 4}, {8, 9}, {"a", "b"}), {}, "quick");
  EXPECT_EQ(oc.cases, 12);  // x = 3 refused: not audited
  EXPECT_EQ(oc.refused, 4);
  EXPECT_EQ(flags_of(oc, "params.fixed"), Flags{"never-varied"});
  EXPECT_EQ(flags_of(oc, "t.dtype"), Flags{"never-varied"});
  EXPECT_EQ(flags_of(oc, "params.twice"), Flags{"derived"});
  EXPECT_NE(arg(oc, "params.twice").flags[0].detail.find("a function of t.shape[0]"),
            std::string::npos)
      << arg(oc, "params.twice").flags[0].detail;
  EXPECT_EQ(flags_of(oc, "params.sum"), Flags{"derived"});
  EXPECT_NE(arg(oc, "params.sum").flags[0].detail.find("a function of ("), std::string::npos)
      << arg(oc, "params.sum").flags[0].detail;
  // Cases that share every other argument differ in it: not derived.
  EXPECT_EQ(flags_of(oc, "params.free"), Flags{});
  EXPECT_EQ(flags_of(oc, "t.shape[0]"), Flags{});
  // Tiny tensors: neither offset limit reached.
  EXPECT_EQ(flags_of(oc, "t.last_element"), Flags{"never-extreme"});
  EXPECT_EQ(flags_of(oc, "t.last_byte"), Flags{"never-extreme"});
  // x = 5 is allowed but never audited.
  ASSERT_EQ(flags_of(oc, "axis.x"), Flags{"never-extreme"});
  EXPECT_NE(arg(oc, "axis.x").flags[0].detail.find("largest allowed 5"), std::string::npos);
  EXPECT_EQ(flags_of(oc, "axis.y"), Flags{});  // no documented extremes
  EXPECT_EQ(arg(oc, "params.twice").distinct, 3);
}

TEST(Coverage, FreeScalarIsDerivedWhenTheTierTiesItToAnExtent) {
  // mode "b" only with y = 9: the tier lets a kernel read "free" off t.shape[1].
  const ProbeOp op;
  auto cases = probe_cases(op, {1, 2}, {8}, {"a"});
  for (const auto& c : probe_cases(op, {1, 2}, {9}, {"b"})) cases.push_back(c);
  const auto oc = audit_op(op, cases, {}, "quick");
  ASSERT_EQ(flags_of(oc, "params.free"), Flags{"derived"});
  EXPECT_NE(arg(oc, "params.free").flags[0].detail.find("t.shape[1]"), std::string::npos);
}

TEST(Coverage, LargeOffsetsAreReadFromSparseStoragesWithoutTouchingThem) {
  const Op* op = find_op("mla_decode");
  ASSERT_TRUE(op);
  std::vector<Case> cases;
  for (int log2 : {31, 32})
    cases.push_back(op->make_case(
        {{"heads", 16}, {"dims", "96x64"}, {"kv_dtype", "e4m3fn"}, {"offset_log2", log2}}));
  const auto start = std::chrono::steady_clock::now();
  const auto oc = audit_op(*op, cases, {}, "quick");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_EQ(flags_of(oc, "kv_cache.last_element"), Flags{});
  EXPECT_EQ(flags_of(oc, "kv_cache.last_byte"), Flags{});
  EXPECT_GE(*arg(oc, "kv_cache.last_byte").max, 4294967296.0);
  EXPECT_EQ(flags_of(oc, "out.last_element"), Flags{"never-extreme"});
}

CoverageReport audit_file(const CaseFile& f) {
  CoverageReport r;
  r.tier = "smoke";
  r.ops.push_back(audit_op(*find_op(f.op), f.tiers.at("smoke"), f.coverage_accepts, "smoke"));
  return r;
}

class CoverageFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_util::fresh_test_dir("coverage"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& text) {
    const auto p = (dir_ / "selftest_axpy.toml").string();
    std::ofstream(p) << text;
    return p;
  }
  std::string error_of(const std::string& coverage) {
    try {
      (void)load_case_file(write(std::string(kHead) + coverage));
    } catch (const CaseFileError& e) {
      return e.what();
    }
    return "";
  }
  static constexpr const char* kHead = R"(
op = "selftest_axpy"
[[group]]
name = "g"
tiers = { smoke = "cartesian" }
axes = { heads = [1, 2, 4], n = [8, 16] }
)";
  fs::path dir_;
};

TEST_F(CoverageFiles, AcceptancesMatchFlagsAndStaleOrUnknownOnesAreReported) {
  const auto f = load_case_file(write(std::string(kHead) + R"(
[[coverage.accept]]
arguments = ["params.alpha", "x.dtype"]
flag = "never-varied"
reason = "fixed by the test op"

[[coverage.accept]]
argument = "params.heads"
flag = "never-varied"
reason = "stale: heads varies"

[[coverage.accept]]
argument = "nothing.shape[0]"
flag = "derived"
reason = "names no argument"
)"));
  ASSERT_EQ(f.coverage_accepts.size(), 3u);
  EXPECT_EQ(f.coverage_accepts[0].arguments.size(), 2u);
  const auto r = audit_file(f);
  const auto& oc = r.ops[0];
  const auto& alpha = arg(oc, "params.alpha").flags;
  ASSERT_EQ(alpha.size(), 1u);
  EXPECT_TRUE(alpha[0].accepted());
  EXPECT_EQ(alpha[0].reason, "fixed by the test op");
  EXPECT_NE(alpha[0].accepted_at.find("selftest_axpy.toml:"), std::string::npos);
  ASSERT_EQ(oc.stale.size(), 1u);
  EXPECT_NE(oc.stale[0].find("'params.heads' is accepted as never-varied"), std::string::npos);
  ASSERT_EQ(oc.errors.size(), 1u);
  EXPECT_NE(oc.errors[0].find("'nothing.shape[0]'"), std::string::npos);
  // params.heads is derived from x.shape[0] and not accepted: the audit fails.
  EXPECT_EQ(flags_of(oc, "params.heads"), Flags{"derived"});
  EXPECT_GT(r.unaccepted(), 0);
  EXPECT_EQ(r.exit_status(), 1);
  const auto j = coverage_json(r);
  EXPECT_EQ(j["stale"], 1);
  EXPECT_EQ(j["errors"], 1);
}

TEST_F(CoverageFiles, EveryFlagAcceptedIsClean) {
  auto f = load_case_file(write(kHead));
  auto r = audit_file(f);
  ASSERT_GT(r.unaccepted(), 0);
  for (const auto& a : r.ops[0].arguments)
    for (const auto& fl : a.flags)
      f.coverage_accepts.push_back({{a.name}, fl.flag, "accepted in the test", "t:1"});
  r = audit_file(f);
  EXPECT_EQ(r.unaccepted(), 0);
  EXPECT_EQ(r.exit_status(), 0);
}

TEST_F(CoverageFiles, MalformedAcceptancesAreErrorsNamingTheLine) {
  EXPECT_NE(error_of("[[coverage.accept]]\nargument = \"x.dtype\"\nflag = \"never-varied\"\n")
                .find("missing 'reason'"),
            std::string::npos);
  EXPECT_NE(error_of("[[coverage.accept]]\nargument = \"x.dtype\"\nflag = \"never-varied\"\n"
                     "reason = \"  \"\n")
                .find("reason: empty"),
            std::string::npos);
  EXPECT_NE(error_of("[[coverage.accept]]\nargument = \"x.dtype\"\nflag = \"boring\"\n"
                     "reason = \"r\"\n")
                .find("unknown flag 'boring'"),
            std::string::npos);
  EXPECT_NE(error_of("[[coverage.accept]]\nargument = \"axis.nope\"\nflag = \"never-extreme\"\n"
                     "reason = \"r\"\n")
                .find("'axis.nope' names no axis"),
            std::string::npos);
  EXPECT_NE(error_of("[[coverage.accept]]\nargument = \"x.dtype\"\narguments = [\"x.dtype\"]\n"
                     "flag = \"never-varied\"\nreason = \"r\"\n")
                .find("exactly one of 'argument' or 'arguments'"),
            std::string::npos);
  EXPECT_NE(error_of("[[coverage.accept]]\narguments = [\"x.dtype\", \"x.dtype\"]\n"
                     "flag = \"never-varied\"\nreason = \"r\"\n")
                .find("accepted twice"),
            std::string::npos);
  EXPECT_NE(error_of("[coverage]\nreject = 1\n").find("unknown field 'reject'"), std::string::npos);
  const std::string e =
      error_of("[[coverage.accept]]\nargument = \"x.dtype\"\nflag = \"never-varied\"\n");
  EXPECT_NE(e.find("selftest_axpy.toml:7:"), std::string::npos) << e;
}

}  // namespace
}  // namespace attncheck
