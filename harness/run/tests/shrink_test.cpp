// The shrinker (run/shrink.h) against a deterministic fake failure: decode_attention "fails" its
// output check exactly when heads >= 8 and page_size == 64, so the minimal case must have exactly
// heads 8 and page size 64, and no other axis may have a simpler value that makes a valid case.
#include "run/shrink.h"

#include <gtest/gtest.h>

#include "ops/op.h"

namespace attncheck {
namespace {

const Op& decode() {
  const Op* op = find_op("decode_attention");
  EXPECT_NE(op, nullptr);
  return *op;
}

Result failing_output_check(const Case& c, const std::string& output) {
  Result r;
  r.id = c.id;
  r.op = c.op;
  r.params = c.params;
  r.mode = Mode::kernel;
  r.verdict = Verdict::failed;
  CheckResult ch;
  ch.name = output;
  ch.passed = false;
  ch.message = "3 of 40 elements beyond budget";
  r.checks.push_back(ch);
  r.message = output + ": " + ch.message;
  return r;
}

Result passing(const Case& c) {
  Result r;
  r.id = c.id;
  r.op = c.op;
  r.params = c.params;
  r.mode = Mode::kernel;
  r.verdict = Verdict::passed;
  r.message = "all checks within budget";
  return r;
}

// The fake kernel bug, counting what it is asked.
struct FakeBug {
  int evaluated = 0;
  std::vector<Result> operator()(const std::vector<Case>& cases) {
    std::vector<Result> out;
    for (const auto& c : cases) {
      ++evaluated;
      EXPECT_FALSE(decode().invalid_reason(c.params)) << c.id << ": a refused case was evaluated";
      const bool bug = c.params.at("heads").get<int64_t>() >= 8 && c.params.at("page_size") == 64;
      out.push_back(bug ? failing_output_check(c, "o") : passing(c));
    }
    return out;
  }
};

Case big_failing_case() {
  return decode().make_case({{"heads", 32},
                             {"kv_heads", 2},
                             {"page_size", 64},
                             {"splits", 8},
                             {"batch", 6},
                             {"max_ctx", 300},
                             {"layout", "strided"},
                             {"dtype", "f16"},
                             {"seed", 7}});
}

bool valid(const Op& op, const Params& p) {
  try {
    const Case c = op.make_case(p);
    return !op.case_error(c.params) && !op.invalid_reason(c.params);
  } catch (const std::exception&) {
    return false;
  }
}

TEST(Shrink, ReachesExactlyTheFailingCoreOfAFakeBug) {
  const Case start = big_failing_case();
  ASSERT_FALSE(decode().invalid_reason(start.params));
  FakeBug bug;
  const FailureSignature target{"o", "numeric"};
  ShrinkOptions opt;
  opt.max_evaluations = 1000;
  const auto s = shrink(
      decode(), start, failing_output_check(start, "o"), target,
      [&](const std::vector<Case>& cs) { return bug(cs); }, opt);
  EXPECT_TRUE(s.shrunk());
  EXPECT_EQ(s.minimal.params.at("heads"), 8) << s.minimal.id;
  EXPECT_EQ(s.minimal.params.at("page_size"), 64) << s.minimal.id;
  EXPECT_EQ(s.minimal.params.at("batch"), 1) << s.minimal.id;
  EXPECT_EQ(s.minimal.params.at("seed"), 0) << s.minimal.id;
  EXPECT_EQ(s.minimal.params.at("layout"), "contiguous") << s.minimal.id;
  EXPECT_EQ(s.minimal.params.at("dtype"), "bf16") << s.minimal.id;
  EXPECT_TRUE(fails_with(s.minimal_result, target));
  EXPECT_EQ(s.minimal_result.id, s.minimal.id);
  EXPECT_EQ(s.evaluations, bug.evaluated);
  EXPECT_EQ(s.stopped, "no simpler value fails the same way");
  // Locally minimal: no other axis has a simpler value that still makes a valid case.
  for (const auto& axis : decode().axes()) {
    if (axis.name == "heads" || axis.name == "page_size") continue;
    for (const auto& v : simpler_values(axis, s.minimal.params.at(axis.name))) {
      Params p = s.minimal.params;
      p[axis.name] = v;
      EXPECT_FALSE(valid(decode(), p)) << axis.name << " = " << v.dump() << " would be simpler";
    }
  }
  // The steps replay from the original to the minimal case.
  Params replay = start.params;
  for (const auto& st : s.steps)
    for (const auto& [name, value] : st.to.items()) {
      EXPECT_EQ(replay.at(name), st.from.at(name));
      replay[name] = value;
    }
  EXPECT_EQ(decode().make_case(replay).id, s.minimal.id);
}

TEST(Shrink, StopsAtTheEvaluationLimitWithTheBestCaseSoFar) {
  const Case start = big_failing_case();
  FakeBug bug;
  ShrinkOptions opt;
  opt.max_evaluations = 12;
  const auto s = shrink(
      decode(), start, failing_output_check(start, "o"), {"o", "numeric"},
      [&](const std::vector<Case>& cs) { return bug(cs); }, opt);
  EXPECT_LE(bug.evaluated, 12);
  EXPECT_EQ(s.stopped, "evaluation limit (12) reached");
  EXPECT_TRUE(fails_with(s.minimal_result, {"o", "numeric"}));
}

TEST(Shrink, AnotherFailureDoesNotCount) {
  // Smaller head counts fail a different output: not the same failure, so heads stays.
  const Case start = big_failing_case();
  auto eval = [](const std::vector<Case>& cs) {
    std::vector<Result> out;
    for (const auto& c : cs)
      out.push_back(
          failing_output_check(c, c.params.at("heads").get<int64_t>() >= 32 ? "o" : "lse"));
    return out;
  };
  const auto s = shrink(decode(), start, failing_output_check(start, "o"), {"o", "numeric"}, eval,
                        ShrinkOptions{});
  EXPECT_EQ(s.minimal.params.at("heads"), 32);
  EXPECT_EQ(s.minimal.params.at("batch"), 1);
}

TEST(Shrink, SignaturesNameChecksAndProblemKinds) {
  const Case c = big_failing_case();
  Result r = failing_output_check(c, "o");
  r.message += "; 12 of 40 elements of 'lse' were never written (first at [0, 1]): they keep";
  const auto sigs = failure_signatures(r);
  ASSERT_EQ(sigs.size(), 2u);
  EXPECT_EQ(sigs[0].describe(), "o (numeric)");
  EXPECT_EQ(sigs[1].describe(), "lse (unwritten)");
  EXPECT_EQ(pick_target(r, "").describe(), "o (numeric)");
  EXPECT_EQ(pick_target(r, "unwritten").describe(), "lse (unwritten)");
  EXPECT_EQ(pick_target(r, "lse").describe(), "lse (unwritten)");
  try {
    pick_target(r, "nope");
    ADD_FAILURE() << "no such check";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("it fails: o (numeric), lse (unwritten)"),
              std::string::npos)
        << e.what();
  }
  Result crash = lost_case_result(c, Mode::kernel, RunOptions{},
                                  "worker process died with SIGSEGV (Segmentation fault)");
  EXPECT_EQ(pick_target(crash, "").describe(), "crash");
  EXPECT_THROW(pick_target(passing(c), ""), std::invalid_argument);
}

TEST(Shrink, SimplerValuesFollowTheAxisTypes) {
  Axis ints;
  ints.name = "n";
  ints.default_value = 16;
  ints.min = 1;
  ints.max = 1024;
  EXPECT_EQ(simpler_values(ints, 100), (std::vector<nlohmann::json>{1, 16, 50, 75, 99}));
  EXPECT_TRUE(simpler_values(ints, 1).empty());
  Axis listed = ints;
  listed.allowed = {1, 16, 64};
  EXPECT_EQ(simpler_values(listed, 64), (std::vector<nlohmann::json>{1, 16}));
  Axis choice;
  choice.type = FieldType::choice;
  choice.default_value = "b";
  choice.allowed = {"a", "b", "c"};
  EXPECT_EQ(simpler_values(choice, "c"), (std::vector<nlohmann::json>{"b", "a"}));
  EXPECT_EQ(simpler_values(choice, "a"), (std::vector<nlohmann::json>{"b"}));
  EXPECT_TRUE(simpler_values(choice, "b").empty());
  Axis flag;
  flag.type = FieldType::boolean;
  flag.default_value = false;
  EXPECT_EQ(simpler_values(flag, true), (std::vector<nlohmann::json>{false}));
}

TEST(Shrink, CaseFileEntryAndAdhocCasesRoundTrip) {
  const Case c = decode().make_case({{"heads", 8}, {"page_size", 64}, {"layout", "strided"}});
  EXPECT_EQ(case_file_entry(decode(), c.params),
            "{ heads = 8, page_size = 64, layout = \"strided\" }");
  EXPECT_EQ(case_file_entry(decode(), c.params, {{"seed", 3}}),
            "{ heads = 8, page_size = 64, layout = \"strided\", seed = 0 }");
  const Params given = non_default_params(decode(), c.params);
  EXPECT_EQ(given.size(), 3u);
  EXPECT_EQ(adhoc_case("decode_attention", given).id, c.id);
  EXPECT_EQ(adhoc_case(c.id, given).id, c.id);
  EXPECT_THROW(adhoc_case("decode_attention/h9", given), std::invalid_argument);
  EXPECT_THROW(adhoc_case("no_such_op", given), std::invalid_argument);
  EXPECT_THROW(adhoc_case("decode_attention", {{"hedas", 8}}), std::invalid_argument);
  RunOptions opt;
  opt.kernels_path = "lib.so";
  EXPECT_EQ(shrunk_repro_command(decode(), c, opt),
            "attncheck repro '" + c.id + "' --kernels lib.so --params '" + given.dump() + "'");
}

}  // namespace
}  // namespace attncheck
