// `attncheck shrink`, `run --shrink` and `repro --params` end to end, with the fake kernel
// library's injected faults as the failures (docs/cli.md "shrink").
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"

namespace attncheck::clitest {
namespace {

namespace fs = std::filesystem;

class ShrinkCli : public GoldenSuite<ShrinkCli> {
 protected:
  static void SetUpTestSuite() {
    generate_goldens("attncheck_shrink_cli_");
    ASSERT_EQ(generated_.status, 0) << generated_.text;
  }
  // Faults of the fake library only for launches whose kernel parameters hold `when`.
  static std::string fault(const std::string& kind, const std::string& when) {
    return "ATTNCHECK_FAKE_FAULT=" + kind + " ATTNCHECK_FAKE_FAULT_WHEN='" + when + "' ";
  }
};

TEST_F(ShrinkCli, ShrinksToTheAxesTheFaultNeedsAndPrintsALineThatReproducesIt) {
  const Output o = sh(fault("unwritten", R"({"kernel_block_size":1})") + at() +
                      " shrink page_indices/bs1-b5-ctx130-strided-s0 --kernels " + kFake);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "check     page_indices (exact)")) << o.text;
  EXPECT_TRUE(has(o.text, "minimal   page_indices/bs1-b1-ctx1-contiguous-s0")) << o.text;
  // The test case file sets batch = 5 in [defaults]: the entry must override it.
  EXPECT_TRUE(has(o.text, "case      { block_size = 1, batch = 1, max_ctx = 1 }")) << o.text;
  EXPECT_TRUE(has(o.text, "stopped: no simpler value fails the same way")) << o.text;
  // The printed repro line (an ad-hoc case: --params) reruns the minimal case and fails it.
  const auto at_repro = o.text.find("repro     attncheck repro ");
  ASSERT_NE(at_repro, std::string::npos) << o.text;
  std::string line = o.text.substr(at_repro + 20);
  line = line.substr(0, line.find('\n'));
  EXPECT_TRUE(has(line, "--params '{\"batch\":1,\"block_size\":1,\"max_ctx\":1}'")) << line;
  const fs::path bundle = dir("bundle.h5");
  const Output again = sh(fault("unwritten", R"({"kernel_block_size":1})") + kBin + " " + line +
                          " --bundle " + bundle.string());
  EXPECT_EQ(again.status, 1) << again.text;
  EXPECT_TRUE(has(again.text, "case     page_indices/bs1-b1-ctx1-contiguous-s0")) << again.text;
  EXPECT_TRUE(has(again.text, "source   --params")) << again.text;
  EXPECT_TRUE(has(again.text, "were never written")) << again.text;
  EXPECT_TRUE(fs::exists(bundle));
}

TEST_F(ShrinkCli, ACrashingKernelIsShrunkInWorkersWithoutKillingTheShrinker) {
  const Output o =
      sh(fault("segfault", R"({"kernel_block_size":16})") + at() +
         " shrink page_indices/bs16-b5-ctx130-strided-s0 --kernels " + kFake + " --jobs 2 --json");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "check     crash")) << o.text;
  EXPECT_TRUE(has(o.text, "minimal   page_indices/bs16-b1-ctx1-contiguous-s0")) << o.text;
  const auto json_at = o.text.rfind("\n{");
  ASSERT_NE(json_at, std::string::npos) << o.text;
  const auto j = nlohmann::json::parse(o.text.substr(json_at + 1));
  EXPECT_EQ(j["id"], "page_indices/bs16-b1-ctx1-contiguous-s0");
  EXPECT_EQ(j["original_id"], "page_indices/bs16-b5-ctx130-strided-s0");
  EXPECT_EQ(j["check"], "crash");
  EXPECT_EQ(j["params"]["block_size"], 16);
  EXPECT_GT(j["evaluations"].get<int>(), 0);
}

TEST_F(ShrinkCli, RunShrinkWritesTheMinimalCaseBesideTheFailure) {
  const fs::path out = dir("out");
  const Output o = sh(fault("unwritten", R"({"kernel_block_size":1})") + at() +
                      " run --tier quick --kernels " + kFake + " --shrink 1 --out " + out.string());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_TRUE(has(o.text, "shrinking page_indices/bs1-")) << o.text;
  std::istringstream lines(read(out / "results.jsonl"));
  int records = 0, failing = 0, with_shrunk = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    ++records;
    failing += j["failing"].get<bool>();
    if (!j.contains("shrunk")) continue;
    ++with_shrunk;
    EXPECT_TRUE(j["failing"].get<bool>());
    const auto& s = j["shrunk"];
    EXPECT_EQ(s["original_id"], j["id"]);
    EXPECT_EQ(s["id"], "page_indices/bs1-b1-ctx1-contiguous-s0");
    EXPECT_EQ(s["check"], "page_indices (exact)");
    EXPECT_EQ(s["case_file_entry"], "{ block_size = 1, batch = 1, max_ctx = 1 }");
    EXPECT_TRUE(has(s["repro"].get<std::string>(), "--params '{")) << s.dump();
    EXPECT_FALSE(s["steps"].empty());
  }
  EXPECT_EQ(records, 12);
  EXPECT_EQ(failing, 4);
  EXPECT_EQ(with_shrunk, 1);  // --shrink 1: the first failure only
}

TEST_F(ShrinkCli, NothingToShrinkAndBadArgumentsSayWhy) {
  const Output passes =
      sh(at() + " shrink page_indices/bs16-b5-ctx17-contiguous-s0 --kernels " + kFake);
  EXPECT_EQ(passes.status, 0) << passes.text;
  EXPECT_TRUE(has(passes.text, "does not fail (verdict passed): nothing to shrink")) << passes.text;
  const Output no_check =
      sh(fault("unwritten", R"({"kernel_block_size":1})") + at() +
         " shrink page_indices/bs1-b5-ctx17-contiguous-s0 --kernels " + kFake + " --check nope");
  EXPECT_EQ(no_check.status, 2) << no_check.text;
  EXPECT_TRUE(has(no_check.text, "has no failing check 'nope' (it fails: page_indices (exact)"))
      << no_check.text;
  const Output unknown = sh(at() + " shrink page_indices/bs2 --kernels " + kFake);
  EXPECT_EQ(unknown.status, 2) << unknown.text;
  EXPECT_TRUE(has(unknown.text, "no case 'page_indices/bs2'")) << unknown.text;
  const Output no_lib = sh(at() + " shrink page_indices/bs1-b5-ctx17-contiguous-s0");
  EXPECT_EQ(no_lib.status, 2) << no_lib.text;
  const Output bad_params =
      sh(at() + " repro page_indices/bs1 --params '{\"block_size\":1}' --allow-missing-goldens");
  EXPECT_EQ(bad_params.status, 2) << bad_params.text;
  EXPECT_TRUE(has(bad_params.text, "describe case 'page_indices/bs1-")) << bad_params.text;
  const Output bad_axis = sh(at() + " repro page_indices --params '{\"blok\":1}'");
  EXPECT_EQ(bad_axis.status, 2) << bad_axis.text;
  EXPECT_TRUE(has(bad_axis.text, "unknown axis 'blok'")) << bad_axis.text;
}

}  // namespace
}  // namespace attncheck::clitest
