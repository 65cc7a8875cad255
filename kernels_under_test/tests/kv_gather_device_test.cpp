// kv_gather on a GPU: the smoke and quick tiers of cases/kv_gather.toml through the library named
// by ATTNCHECK_KERNELS; refusals of inconsistent arguments; and, when the mutant library sits
// beside it (or in ATTNCHECK_MUTANT_DIR), proof that the pre-#37228 contiguous-offset kernel is
// caught by the hybrid-stride cases and passes the contiguous ones. Skips, with the reason, when
// there is no library or no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "run/cases.h"
#include "run/device.h"
#include "run/runner.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

std::string repo_file(const std::string& rel) {
  if (const char* d = std::getenv("ATTNCHECK_SOURCE_DIR")) return std::string(d) + "/" + rel;
  if (fs::exists(rel)) return rel;  // run from the repository root
  return std::string(ATTNCHECK_SOURCE_DIR) + "/" + rel;
}

std::string mutant_library(const std::string& name) {
  const char* kernels = std::getenv("ATTNCHECK_KERNELS");
  const char* dir = std::getenv("ATTNCHECK_MUTANT_DIR");
  const fs::path base = dir ? fs::path(dir) : fs::path(kernels ? kernels : "").parent_path();
  return (base / ("libattncheck_kernels_mutant_" + name + ".so")).string();
}

// The "case id regex expected to catch it" of a mutant, from kernels_under_test/<op>.mutants.
std::string mutant_regex(const std::string& file, const std::string& name) {
  std::ifstream in(repo_file(file));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) != 0 && line.rfind(name + "|", 0) != 0) continue;
    // name | seed bug | regex: the regex is everything after the second '|'.
    const auto first = line.find('|');
    const auto second = first == std::string::npos ? first : line.find('|', first + 1);
    if (second == std::string::npos) return "";
    std::string re = line.substr(second + 1);
    re.erase(0, re.find_first_not_of(" \t"));
    re.erase(re.find_last_not_of(" \t\r") + 1);
    return re;
  }
  return "";
}

struct Gpu {
  std::unique_ptr<KernelLibrary> lib;
  std::unique_ptr<DeviceRunner> runner;
  std::string arch;
};

// nullopt + skip reason when there is no library or no device.
std::optional<Gpu> open_gpu(const std::string& path, std::string* why) {
  if (path.empty()) {
    *why = "ATTNCHECK_KERNELS not set: no kernel library to test";
    return std::nullopt;
  }
  if (!fs::exists(path)) {
    *why = "no kernel library at " + path;
    return std::nullopt;
  }
  Gpu g;
  g.lib = KernelLibrary::open(path);
  auto dev = g.lib->device(why);
  if (!dev) return std::nullopt;  // `why` holds the library's reason
  g.arch = dev->arch;
  g.runner = std::make_unique<DeviceRunner>(*g.lib, dev->arch);
  return g;
}

// Tiers to run: ATTNCHECK_DEVICE_TIERS (comma-separated), default smoke and quick.
std::vector<std::string> device_tiers() {
  const char* env = std::getenv("ATTNCHECK_DEVICE_TIERS");
  std::string s = env && *env ? env : "smoke,quick";
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

std::vector<Case> tier_cases(const std::string& file, const std::string& tier) {
  const CaseFile f = load_case_file(repo_file(file));
  const auto it = f.tiers.find(tier);
  return it == f.tiers.end() ? std::vector<Case>{} : it->second;
}

struct Tally {
  int cases = 0, passed = 0;
  double kernel_ms = 0;
  std::vector<std::string> failures;
};

Tally run_all(const Op& op, const std::vector<Case>& cases, const Gpu& gpu, int repeat) {
  Tally t;
  RunOptions opt;
  opt.arch = gpu.arch;
  opt.repeat = repeat;
  for (const auto& c : cases) {
    const Result r = run_case(op, c, gpu.runner.get(), opt);
    ++t.cases;
    t.kernel_ms += r.timings.kernel_ms;
    if (r.verdict == Verdict::passed || r.verdict == Verdict::refused_as_expected)
      ++t.passed;
    else
      t.failures.push_back(c.id + ": " + std::string(verdict_name(r.verdict)) + ": " + r.message);
  }
  return t;
}

TEST(KvGatherDevice, SmokeAndQuickTiersPassBitwise) {
  std::string why;
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  auto gpu = open_gpu(path ? path : "", &why);
  if (!gpu) GTEST_SKIP() << why;
  const Op* op = find_op("kv_gather");
  ASSERT_NE(op, nullptr);
  for (const std::string& tier : device_tiers()) {
    const auto cases = tier_cases("cases/kv_gather.toml", tier);
    ASSERT_FALSE(cases.empty()) << tier;
    const Tally t = run_all(*op, cases, *gpu, 2);
    std::printf("[kv_gather %s on %s] %d/%d passed (bitwise, repeat 2), kernel wall %.1f ms\n",
                tier.c_str(), gpu->arch.c_str(), t.passed, t.cases, t.kernel_ms);
    for (const auto& f : t.failures) ADD_FAILURE() << f;
  }
}

TEST(KvGatherDevice, RefusesInconsistentArguments) {
  std::string why;
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  auto gpu = open_gpu(path ? path : "", &why);
  if (!gpu) GTEST_SKIP() << why;
  const Op* op = find_op("kv_gather");
  ASSERT_NE(op, nullptr);
  struct Bad {
    Params given;
    const char* param;
    nlohmann::json value;
    const char* message;
  };
  const Bad bad[] = {
      {{{"layout", "shuffle"}}, "kv_cache_layout", "NHD", "has 5 dimensions, expected 4"},
      {{{"layout", "nhd"}}, "kv_cache_layout", "HND", "kv_cache_layout must be NHD or SHUFFLE"},
      {{{"kv", "e4m3fn"}}, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"},
      {{{"kv", "e4m3fn"}}, "dequant", false, "without dequant the caches must have the output"},
  };
  for (const auto& b : bad) {
    Problem p = op->make(op->make_case(b.given));
    p.kernel = "kv_gather";
    p.kernel_params[b.param] = b.value;
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED) << b.message;
    EXPECT_NE(o.message.find(b.message), std::string::npos) << o.message;
  }
}

TEST(KvGatherDevice, ContiguousStridesMutantIsCaughtByHybridCasesOnly) {
  std::string why;
  auto gpu = open_gpu(mutant_library("kv_gather_contiguous_strides"), &why);
  if (!gpu) GTEST_SKIP() << "mutant: " << why;
  const std::string re =
      mutant_regex("kernels_under_test/kv_gather.mutants", "kv_gather_contiguous_strides");
  ASSERT_FALSE(re.empty());
  const Op* op = find_op("kv_gather");
  const auto cases = tier_cases("cases/kv_gather.toml", "quick");
  std::vector<Case> targeted, controls;
  for (const auto& c : cases) {
    if (std::regex_search(c.id, std::regex(re)))
      targeted.push_back(c);
    else if (c.params.at("strides") == "contiguous")
      controls.push_back(c);
  }
  ASSERT_FALSE(targeted.empty());
  ASSERT_FALSE(controls.empty());
  const Tally hit = run_all(*op, targeted, *gpu, 1);
  const Tally ctl = run_all(*op, controls, *gpu, 1);
  const int killed = hit.cases - hit.passed;
  std::printf(
      "[mutant kv_gather_contiguous_strides] quick cases matching %s: %d/%d fail; "
      "contiguous-cache controls: %d/%d pass\n",
      re.c_str(), killed, hit.cases, ctl.passed, ctl.cases);
  if (!hit.failures.empty()) std::printf("  e.g. %s\n", hit.failures.front().c_str());
  EXPECT_GT(killed, 0) << "the mutant survived every targeted case";
  EXPECT_EQ(killed, hit.cases) << "some hybrid cases did not catch the mutant";
  for (const auto& f : ctl.failures) ADD_FAILURE() << "control failed: " << f;
}

}  // namespace
}  // namespace attncheck
