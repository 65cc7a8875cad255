// Sizes nobody bounded (issue 38 item 2, and item 8's bad inputs): ad-hoc --params outside the
// bounds case files enforce, axes within bounds that together describe enormous problems, a
// pairwise group expanded before it was sized, and the nearest-id search for an absurd id. Each
// must end at once with a clear error and exit 2 (bad input), never run, allocate or hang. Every
// command runs under `timeout` so that a regression fails instead of hanging the suite.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_test_support.h"

namespace attncheck::clitest {
namespace {

namespace fs = std::filesystem;

// The command with the test case files, killed after 60 s; its seconds in `seconds`.
Output timed(const std::string& args, double& seconds, const std::string& env = "") {
  const auto t0 = std::chrono::steady_clock::now();
  Output o = sh(env + " timeout 60 " + kBin + " --cases " + kData + "/cases " + args);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

// A case directory holding one page_indices.toml of `groups`.
fs::path case_dir(const std::string& name, const std::string& groups) {
  const fs::path d =
      fs::temp_directory_path() / ("attncheck_size_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "page_indices.toml") << "op = \"page_indices\"\n\n" << groups;
  return d;
}

std::string numbers(int from, int count) {
  std::string s;
  for (int i = 0; i < count; ++i) s += (i ? ", " : "") + std::to_string(from + i);
  return "[" + s + "]";
}

TEST(SizeBudget, ReproParamsOutsideTheAxisBoundsAreRefused) {
  double s = 0;
  // Took 157 s and 5.1 GB, wrote a 391 MB bundle and exited 0.
  Output o = timed("repro page_indices --params '{\"max_ctx\":100000000,\"batch\":16}'", s);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "page_indices/bs16-b16-ctx100000000")) << o.text;
  EXPECT_TRUE(has(o.text, "axis 'max_ctx' = 100000000 is outside")) << o.text;
  EXPECT_TRUE(has(o.text, "131072")) << o.text;
  EXPECT_LT(s, 10) << o.text;
  // Ended in std::bad_alloc.
  o = timed("repro page_indices --params '{\"max_ctx\":1099511627776}'", s);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "axis 'max_ctx' = 1099511627776 is outside")) << o.text;
  EXPECT_FALSE(has(o.text, "bad_alloc")) << o.text;
  EXPECT_LT(s, 10) << o.text;
}

TEST(SizeBudget, ShrinkOfAnOversizedCaseIsRefused) {
  double s = 0;
  // Said "nothing to shrink" and exited 0.
  const Output o = timed(
      "shrink page_indices --params '{\"max_ctx\":100000000,\"batch\":16}' "
      "--kernels " +
          kFake + " --in-process",
      s);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "axis 'max_ctx' = 100000000 is outside")) << o.text;
  EXPECT_FALSE(has(o.text, "nothing to shrink")) << o.text;
  EXPECT_LT(s, 10) << o.text;
}

TEST(SizeBudget, AxesWithinBoundsThatDescribeAnEnormousProblemAreRefused) {
  double s = 0;
  // Ran until killed.
  const Output o =
      timed("repro decode_attention --params '{\"batch\":100000,\"max_ctx\":100000}'", s);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "decode_attention/")) << o.text;
  EXPECT_TRUE(has(o.text, "too large: axis '")) << o.text;
  EXPECT_TRUE(has(o.text, "over the limit of")) << o.text;
  EXPECT_LT(s, 10) << o.text;
}

TEST(SizeBudget, CoverageOfAnEnormousCaseFileCaseIsRefused) {
  // 77-97 s, then std::bad_alloc.
  const fs::path d = case_dir("coverage",
                              "[[group]]\nname = \"huge\"\ntiers = { quick = \"list\" }\n"
                              "cases = [ { batch = 131072, max_ctx = 131072 } ]\n");
  const auto t0 = std::chrono::steady_clock::now();
  const Output o = sh("timeout 60 " + kBin + " --cases " + d.string() + " coverage --tier quick");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, (d / "page_indices.toml").string() + ":")) << o.text;
  EXPECT_TRUE(has(o.text, "page_indices/bs16-b131072-ctx131072")) << o.text;
  EXPECT_TRUE(has(o.text, "too large: axis '")) << o.text;
  EXPECT_TRUE(has(o.text, "$ATTNCHECK_MAX_CASE_BYTES")) << o.text;
  EXPECT_LT(s, 10) << o.text;
  fs::remove_all(d);
}

TEST(SizeBudget, APairwiseGroupIsSizedBeforeItIsExpanded) {
  // Three axes of 1,000 values made `list` hang past 90 s.
  const fs::path d = case_dir("pairwise",
                              "[[group]]\nname = \"wide\"\n"
                              "tiers = { quick = \"pairwise\" }\naxes = { batch = " +
                                  numbers(1, 1000) + ", max_ctx = " + numbers(1, 1000) +
                                  ", seed = " + numbers(0, 1000) + " }\n");
  const auto t0 = std::chrono::steady_clock::now();
  const Output o = sh("timeout 60 " + kBin + " --cases " + d.string() + " list --tier quick");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text,
                  "group 'wide' tier 'quick' (pairwise): its axes hold 3000000 value "
                  "pairs to cover"))
      << o.text;
  EXPECT_TRUE(has(o.text, "$ATTNCHECK_MAX_CASES_PER_TIER")) << o.text;
  EXPECT_LT(s, 10) << o.text;
  fs::remove_all(d);
}

TEST(SizeBudget, AnAbsurdUnknownIdAnswersAtOnce) {
  // 94 s of nearest-id search over the repository's cases, then the id echoed in full. Here
  // 10,000 ids, each compared with the whole id before: tens of seconds.
  const fs::path d = case_dir("nearest",
                              "[[group]]\nname = \"many\"\n"
                              "tiers = { smoke = \"cartesian\" }\naxes = { batch = " +
                                  numbers(1, 100) + ", seed = " + numbers(0, 100) + " }\n");
  const std::string id = "page_indices/" + std::string(100000, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  const Output o = sh("timeout 60 " + kBin + " --cases " + d.string() + " repro " + id);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.status, 2) << o.text.substr(0, 2000);
  EXPECT_TRUE(has(o.text, "(100013 characters)")) << o.text.substr(0, 2000);
  EXPECT_TRUE(has(o.text, "nearest:\n  page_indices/")) << o.text.substr(0, 2000);
  EXPECT_LT(o.text.size(), 20000u);
  EXPECT_LT(s, 15) << o.text.substr(0, 2000);
  fs::remove_all(d);
}

TEST(SizeBudget, ABatchOfZeroIsBadInput) {
  double s = 0;
  // Ended as an error verdict, exit 1.
  Output o = timed("repro page_indices --params '{\"batch\":0}'", s);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "axis 'batch' = 0 counts nothing: it must be at least 1")) << o.text;
  const fs::path d = case_dir("zero",
                              "[[group]]\nname = \"none\"\ntiers = { smoke = \"list\" }\n"
                              "cases = [ { batch = 0 } ]\n");
  o = sh("timeout 60 " + kBin + " --cases " + d.string() + " list");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, (d / "page_indices.toml").string() + ":6: page_indices/")) << o.text;
  EXPECT_TRUE(has(o.text, "axis 'batch' = 0 counts nothing")) << o.text;
  fs::remove_all(d);
}

TEST(SizeBudget, ABadMaxCasesVariableIsNamed) {
  double s = 0;
  // Was reported as --max-cases, an option nobody gave.
  const Output o = timed("list", s, "ATTNCHECK_MAX_CASES=abc");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "$ATTNCHECK_MAX_CASES='abc': expected a positive integer")) << o.text;
  EXPECT_FALSE(has(o.text, "--max-cases")) << o.text;
}

}  // namespace
}  // namespace attncheck::clitest
