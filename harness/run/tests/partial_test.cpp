// Partial contracts (run/partial.h, docs/verification.md "Partial contracts") and libraries that
// implement a subset of the ops, proven on the CPU with the fake kernel library: it declares
// $ATTNCHECK_FAKE_PARTIAL for every entry and keeps it (or, with $ATTNCHECK_FAKE_PARTIAL_WRITES=1,
// breaks it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "run/device.h"
#include "run/evaluate.h"
#include "run/partial.h"
#include "run/results.h"

#ifndef ATTNCHECK_FAKE_KERNELS
#error "ATTNCHECK_FAKE_KERNELS (path of the fake kernel library) must be defined by the build"
#endif

namespace attncheck {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class Partial : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"ATTNCHECK_FAKE_PARTIAL", "ATTNCHECK_FAKE_PARTIAL_WRITES",
                          "ATTNCHECK_FAKE_FAULT", "ATTNCHECK_FAKE_OMIT", "ATTNCHECK_FAKE_EXT_SIZE"})
      ::unsetenv(v);
  }
  // A library of its own per case: declarations are asked once per entry and kept.
  static Result run(const std::string& op_name, const Params& given, const char* partial) {
    if (partial)
      ::setenv("ATTNCHECK_FAKE_PARTIAL", partial, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_PARTIAL");
    const auto lib = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS);
    DeviceRunner runner(*lib, "fake-cpu");
    EvalContext ctx;
    ctx.device = &runner;
    ctx.options.arch = "fake-cpu";
    return evaluate(find_op(op_name)->make_case(given), ctx);
  }
};

constexpr const char* kNoLse = R"({"not_produced": ["lse"]})";
constexpr const char* kPastContext = R"({"unspecified": {"logits": "past_context"}})";

// An entry that leaves lse alone, as declared: judged on `out` alone, and says so.
TEST_F(Partial, NotProducedOutputLeftUntouchedIsJudgedWithoutIt) {
  const Result r = run("sparse_mla", Params::object(), kNoLse);
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_EQ(r.partial, nlohmann::json::parse(R"({"not_produced": ["lse"], "unspecified": {}})"));
  EXPECT_TRUE(contains(r.message, "judged under the entry's partial contract: 'lse' not produced"))
      << r.message;
  ASSERT_FALSE(r.checks.empty());
  for (const auto& c : r.checks) EXPECT_NE(c.name, "lse");
  // The same kernel in a library whose table ends before `partial` (built against an older
  // header): nothing declared, so the lse it leaves unwritten fails the case.
  ::setenv("ATTNCHECK_FAKE_EXT_SIZE", "before_copy_within", 1);
  const Result undeclared = run("sparse_mla", Params::object(), kNoLse);
  EXPECT_EQ(undeclared.verdict, Verdict::failed) << undeclared.message;
  EXPECT_TRUE(contains(undeclared.message, "elements of 'lse' were never written"))
      << undeclared.message;
  EXPECT_TRUE(undeclared.partial.is_null());
}

TEST_F(Partial, NotProducedOutputWrittenFailsSayingSo) {
  ::setenv("ATTNCHECK_FAKE_PARTIAL_WRITES", "1", 1);
  const Result r = run("sparse_mla", Params::object(), kNoLse);
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
  EXPECT_TRUE(contains(r.message, "elements of 'lse'")) << r.message;
  EXPECT_TRUE(contains(r.message, "which entry 'sparse_mla' declares not produced")) << r.message;
}

// Positions past each request's context left unwritten, as declared: not compared; the rest is.
TEST_F(Partial, UnspecifiedRegionLeftUnwrittenIsNotCompared) {
  const Result r = run("indexer_logits_decode", Params::object(), kPastContext);
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_EQ(r.partial["unspecified"], nlohmann::json::parse(R"({"logits": "past_context"})"));
  EXPECT_TRUE(contains(r.message, "'logits' past_context unspecified")) << r.message;
  ::setenv("ATTNCHECK_FAKE_EXT_SIZE", "before_copy_within", 1);  // the declaration unseen
  const Result undeclared = run("indexer_logits_decode", Params::object(), kPastContext);
  EXPECT_EQ(undeclared.verdict, Verdict::failed) << undeclared.message;
  EXPECT_TRUE(contains(undeclared.message, "elements of 'logits' were never written"))
      << undeclared.message;
}

TEST_F(Partial, ElementsOutsideTheRegionAreStillJudged) {
  // One request of the longest context: element [0, 0] lies inside it.
  ::setenv("ATTNCHECK_FAKE_FAULT", "nan", 1);
  const Result r = run("indexer_logits_decode", {{"batch", 1}}, kPastContext);
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
  EXPECT_TRUE(contains(r.message, "logits")) << r.message;
}

TEST_F(Partial, WritesOutsideTheViewStillFail) {
  ::setenv("ATTNCHECK_FAKE_FAULT", "past_view", 1);
  const Result r = run("indexer_logits_decode", Params::object(), kPastContext);
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
  EXPECT_TRUE(contains(r.message, "outside every argument's view")) << r.message;
}

// A declaration the op cannot have is the case's error, naming the entry, the op and the name.
TEST_F(Partial, BadDeclarationsAreErrorsNamingWhatIsWrong) {
  struct Bad {
    const char* op;
    const char* declared;
    const char* says;
  };
  for (const Bad& b : {
           Bad{"sparse_mla", R"({"not_produced": ["lsee"]})",
               "entry 'sparse_mla' (op sparse_mla) declares a partial contract naming output "
               "'lsee', which the op does not have (outputs: out, lse)"},
           Bad{"indexer_logits_decode", R"({"unspecified": {"logits": "tail"}})",
               "naming region 'tail' of output 'logits', which the op does not define (regions "
               "of 'logits': past_context)"},
           Bad{"sparse_mla", R"({"unspecified": {"out": "past_context"}})",
               "naming region 'past_context' of output 'out', which the op does not define "
               "(regions of 'out': none)"},
           Bad{"sparse_mla", R"({"not_produced": "lse"})", "not_produced must be a list"},
           Bad{"sparse_mla", R"({"skipped": ["lse"]})", "unknown key 'skipped'"},
           Bad{"sparse_mla", "lse", "that is not {"},
       }) {
    const Result r = run(b.op, Params::object(), b.declared);
    EXPECT_EQ(r.verdict, Verdict::error) << b.declared << ": " << r.message;
    EXPECT_TRUE(contains(r.message, b.says)) << b.declared << ": " << r.message;
  }
}

// A native library that lost every entry of an op still fails each case: a dropped entry in a
// build must never pass (only Python adapters provide a subset; bridge/tests cover those).
TEST_F(Partial, NativeLibraryWithoutAnOpsEntryFailsItsCases) {
  ::setenv("ATTNCHECK_FAKE_OMIT", "page_indices", 1);
  const Result r = run("page_indices", Params::object(), nullptr);
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
  EXPECT_TRUE(r.not_provided_by.empty());
  EXPECT_TRUE(contains(r.message, "has no entry 'page_indices'")) << r.message;
}

TEST(PartialSummary, CountsCasesPerEntryAndNotProvidedOpsOnce) {
  Summary s;
  Result judged;
  judged.op = judged.kernel_entry = "sparse_mla";
  judged.mode = Mode::kernel;
  judged.verdict = Verdict::failed;
  judged.partial = nlohmann::json::parse(R"({"not_produced": ["lse"], "unspecified": {}})");
  s.add(judged);
  s.add(judged);
  Result absent;
  absent.op = "rope";
  absent.verdict = Verdict::unsupported;
  absent.not_provided_by = "numpy_reference";
  s.add(absent);
  s.add(absent);
  absent.op = "kv_gather";
  s.add(absent);
  EXPECT_EQ(s.failures, 2);
  EXPECT_EQ(s.per_op.count("rope"), 0u);  // not in the table: summed up below it
  std::ostringstream out;
  s.print(out);
  EXPECT_TRUE(contains(out.str(),
                       "not provided by numpy_reference: 2 op(s), 3 case(s), not run "
                       "(kv_gather 1, rope 2)"))
      << out.str();
  EXPECT_TRUE(contains(out.str(),
                       "partial contract: sparse_mla: 2 case(s) judged with 'lse' not "
                       "produced"))
      << out.str();
}

TEST(PartialJson, ResultRoundTripsItsContractAndNotProvided) {
  Result r;
  r.id = "sparse_mla/x";
  r.op = "sparse_mla";
  r.verdict = Verdict::passed;
  r.partial = nlohmann::json::parse(R"({"not_produced": ["lse"], "unspecified": {}})");
  r.not_provided_by = "numpy_reference";
  const Result back = Result::from_json(r.to_json());
  EXPECT_EQ(back.partial, r.partial);
  EXPECT_EQ(back.not_provided_by, "numpy_reference");
  auto j = r.to_json();
  j["partial"] = "lse";
  EXPECT_THROW(Result::from_json(j), std::invalid_argument);
}

}  // namespace
}  // namespace attncheck
