// One gtest per smoke-tier case of cases/*.toml (ctest labels "smoke" and the op name; see
// harness/run/tests/CMakeLists.txt). With a kernel library ($ATTNCHECK_KERNELS) and a GPU the
// kernel is checked (vs the golden when its inputs match, else the reference); without, the
// reference is checked against the golden and the test is skipped with the reason. Each ctest test
// is its own process, so a crashing kernel fails only its case. GTEST_TOTAL_SHARDS /
// GTEST_SHARD_INDEX shard a direct run of the binary; under ctest with a resource spec
// (ci/ctest-resources.json) each test gets one GPU through CTEST_RESOURCE_GROUP_0_GPUS.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "run/provenance.h"
#include "run/scheduling.h"
#include "run/worker.h"

namespace attncheck {

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.id;
}

namespace {

std::string root_dir() {
  return default_root();
}

std::vector<Case> smoke_cases() {
  static const std::vector<Case> cases = [] {
    try {
      const auto files = load_case_dir((std::filesystem::path(root_dir()) / "cases").string());
      Selection sel;
      sel.tier = "smoke";
      return select_cases(files, sel);
    } catch (const std::exception& e) {
      // SmokeCaseFiles.Load reports it; no parameterized tests then.
      std::fprintf(stderr, "smoke_tests: %s\n", e.what());
      return std::vector<Case>{};
    }
  }();
  return cases;
}

CaseContext& context() {
  static std::unique_ptr<CaseContext> ctx = [] {
    use_ctest_gpu();
    WorkerConfig cfg;
    cfg.cases_dir = (std::filesystem::path(root_dir()) / "cases").string();
    cfg.golden_dir = (std::filesystem::path(root_dir()) / "golden").string();
    const char* k = std::getenv("ATTNCHECK_KERNELS");
    cfg.kernels = k ? k : "";
    cfg.repeat = 2;
    return make_context(cfg);
  }();
  return *ctx;
}

TEST(SmokeCaseFiles, Load) {
  EXPECT_NO_THROW((void)load_case_dir((std::filesystem::path(root_dir()) / "cases").string()));
  EXPECT_FALSE(smoke_cases().empty()) << "no smoke case in " << root_dir() << "/cases";
}

class Smoke : public ::testing::TestWithParam<Case> {};

TEST_P(Smoke, Case) {
  const Case& c = GetParam();
  CaseContext& ctx = context();
  const Result r = run_case_id(ctx, c.id);
  EXPECT_FALSE(r.failing()) << c.id << " (" << c.source << "): " << verdict_name(r.verdict) << ": "
                            << r.message << "\nrepro: " << r.repro;
  if (r.mode != Mode::kernel)
    GTEST_SKIP() << "REFERENCE ONLY, kernels not checked (" << mode_name(r.mode)
                 << " mode): " << r.message;
  if (r.verdict == Verdict::known_bug) GTEST_SKIP() << r.message;
}

std::string test_name(const ::testing::TestParamInfo<Case>& info) {
  static std::set<std::string> used;  // gtest names: letters, digits, '_' only, unique
  std::string s;
  for (char ch : info.param.id)
    s += ch == '/'                                      ? std::string("__")
         : std::isalnum(static_cast<unsigned char>(ch)) ? std::string(1, ch)
                                                        : std::string("_");
  std::string name = s;
  for (int i = 2; !used.insert(name).second; ++i) name = s + "_" + std::to_string(i);
  return name;
}

INSTANTIATE_TEST_SUITE_P(smoke, Smoke, ::testing::ValuesIn(smoke_cases()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Smoke);

}  // namespace
}  // namespace attncheck
