// Scaffolding shared by the GPU device tests in this folder (each test file is its own executable,
// so everything here is header-only): finding repository files, case tiers and mutants, opening
// the kernel library named by ATTNCHECK_KERNELS (or a mutant library) with a skip reason when
// there is no library or no device, and running cases into a tally.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "run/cases.h"
#include "run/device.h"
#include "run/evaluate.h"
#include "run/scheduling.h"

namespace attncheck::devtest {

// A repository file: from ATTNCHECK_SOURCE_DIR, the working directory (the repository root), or
// the source directory the test was built from.
inline std::string repo_file(const std::string& rel) {
  if (const char* d = std::getenv("ATTNCHECK_SOURCE_DIR")) return std::string(d) + "/" + rel;
  if (std::filesystem::exists(rel)) return rel;
  return std::string(ATTNCHECK_SOURCE_DIR) + "/" + rel;
}

// ATTNCHECK_KERNELS, or "" when unset.
inline std::string kernels_path() {
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  return path ? path : "";
}

// A mutant library sits in ATTNCHECK_MUTANT_DIR, else beside ATTNCHECK_KERNELS.
inline std::string mutant_library(const std::string& name) {
  const char* dir = std::getenv("ATTNCHECK_MUTANT_DIR");
  const std::filesystem::path base =
      dir ? std::filesystem::path(dir) : std::filesystem::path(kernels_path()).parent_path();
  return (base / ("libattncheck_kernels_mutant_" + name + ".so")).string();
}

struct Mutant {
  std::string name, regex;  // regex: the case ids expected to catch it
};

// kernels_under_test/<family>.mutants, lines "name | seed bug | regex": the regex is everything
// after the second '|' (it may hold '|' itself, the description may not). '#' lines are comments.
inline std::vector<Mutant> read_mutants(const std::string& family) {
  std::ifstream in(repo_file("kernels_under_test/" + family + ".mutants"));
  const auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t\r") + 1);
    return s;
  };
  std::vector<Mutant> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto first = line.find('|');
    const auto second = first == std::string::npos ? first : line.find('|', first + 1);
    if (second == std::string::npos) continue;
    out.push_back({trim(line.substr(0, first)), trim(line.substr(second + 1))});
  }
  return out;
}

// The regex of mutant `name` in kernels_under_test/<family>.mutants, "" when it is not listed.
inline std::string mutant_regex(const std::string& family, const std::string& name) {
  for (const Mutant& m : read_mutants(family))
    if (m.name == name) return m.regex;
  return "";
}

struct Gpu {
  std::unique_ptr<KernelLibrary> lib;
  std::unique_ptr<DeviceRunner> runner;
  std::string arch;
};

// nullopt and the skip reason in `why` when there is no library or no device; the library's own
// reason for having no device follows `no_device_prefix`.
inline std::optional<Gpu> open_gpu(const std::string& path, std::string* why,
                                   std::string_view no_device_prefix) {
  if (path.empty()) {
    *why = "ATTNCHECK_KERNELS not set: no kernel library to test";
    return std::nullopt;
  }
  if (!std::filesystem::exists(path)) {
    *why = "no kernel library at " + path;
    return std::nullopt;
  }
  use_ctest_gpu();  // under ctest's resource spec: the GPU ctest gave this test
  if (const char* given = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS"))
    std::fprintf(stderr, "device test on GPU %s (ctest resource group: %s)\n",
                 std::getenv("CUDA_VISIBLE_DEVICES"), given);
  Gpu g;
  g.lib = KernelLibrary::open(path);
  auto dev = g.lib->device(why);
  if (!dev) {
    why->insert(0, no_device_prefix);
    return std::nullopt;
  }
  g.arch = dev->arch;
  g.runner = std::make_unique<DeviceRunner>(*g.lib, dev->arch);
  return g;
}

// The library named by ATTNCHECK_KERNELS.
inline std::optional<Gpu> open_default_gpu(std::string* why, std::string_view no_device_prefix) {
  return open_gpu(kernels_path(), why, no_device_prefix);
}

inline const Op& registered_op(const std::string& name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(name + " is not registered");
  return *o;
}

// Tiers to run: ATTNCHECK_DEVICE_TIERS (comma-separated), default smoke and quick.
inline std::vector<std::string> device_tiers() {
  const char* env = std::getenv("ATTNCHECK_DEVICE_TIERS");
  const std::string s = env && *env ? env : "smoke,quick";
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

enum class MissingTier { empty, error };

// The cases of cases/<op>.toml in the given tiers, in tier order, each id once. A tier the file
// lacks contributes nothing, or throws under MissingTier::error.
inline std::vector<Case> tier_cases(const std::string& op, std::initializer_list<std::string> tiers,
                                    MissingTier missing = MissingTier::empty) {
  const CaseFile f = load_case_file(repo_file("cases/" + op + ".toml"));
  std::vector<Case> out;
  std::set<std::string> seen;
  for (const std::string& tier : tiers) {
    const auto it = f.tiers.find(tier);
    if (it == f.tiers.end()) {
      if (missing == MissingTier::error)
        throw CaseFileError(f.path + " has no tier '" + tier + "'");
      continue;
    }
    for (const Case& c : it->second)
      if (seen.insert(c.id).second) out.push_back(c);
  }
  return out;
}

struct Tally {
  int cases = 0, passed = 0, refused = 0;  // refused: refused_as_expected
  double kernel_ms = 0;
  double worst_ratio = 0;  // worst error/budget over every check of every case
  std::string worst_case, worst_check;
  std::vector<std::string> failures;  // "id: verdict: message" of every other verdict

  int accepted() const { return passed + refused; }
  std::string worst_where() const {
    return worst_case.empty() ? "" : worst_case + " " + worst_check;
  }

  void add(const Case& c, const Result& r) {
    ++cases;
    kernel_ms += r.timings.kernel_ms;
    if (r.verdict == Verdict::passed)
      ++passed;
    else if (r.verdict == Verdict::refused_as_expected)
      ++refused;
    else
      failures.push_back(c.id + ": " + std::string(verdict_name(r.verdict)) + ": " + r.message);
    for (const auto& ch : r.checks)
      if (ch.metrics.worst.ratio > worst_ratio) {
        worst_ratio = ch.metrics.worst.ratio;
        worst_case = c.id;
        worst_check = ch.name;
      }
  }

  void merge(const Tally& t) {
    cases += t.cases;
    passed += t.passed;
    refused += t.refused;
    kernel_ms += t.kernel_ms;
    failures.insert(failures.end(), t.failures.begin(), t.failures.end());
    if (t.worst_ratio > worst_ratio) {
      worst_ratio = t.worst_ratio;
      worst_case = t.worst_case;
      worst_check = t.worst_check;
    }
  }
};

// Called with every case and its result, for statistics a test keeps beyond the tally.
using OnResult = std::function<void(const Case&, const Result&)>;

inline Tally run_all(const Op& op, const std::vector<Case>& cases, const Gpu& gpu, int repeat,
                     const OnResult& on_result = {}) {
  Tally t;
  EvalContext ctx;
  ctx.device = gpu.runner.get();
  ctx.options.arch = gpu.arch;
  ctx.options.repeat = repeat;
  for (const auto& c : cases) {
    if (c.op != op.name()) throw std::logic_error(c.id + " is not a case of " + op.name());
    const Result r = evaluate(c, ctx);
    t.add(c, r);
    if (on_result) on_result(c, r);
  }
  return t;
}

// Every case of `op_name` in each tier of device_tiers() passes or is refused as expected, launched
// twice; one line per tier. Skips without a GPU. For ops whose outputs are compared bitwise.
inline void expect_tiers_pass_bitwise(const std::string& op_name) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  const Op& op = registered_op(op_name);
  for (const std::string& tier : device_tiers()) {
    const auto cases = tier_cases(op_name, {tier});
    ASSERT_FALSE(cases.empty()) << tier;
    const Tally t = run_all(op, cases, *gpu, 2);
    std::printf("[%s %s on %s] %d/%d passed (bitwise, repeat 2), kernel wall %.1f ms\n",
                op_name.c_str(), tier.c_str(), gpu->arch.c_str(), t.accepted(), t.cases,
                t.kernel_ms);
    for (const auto& f : t.failures) ADD_FAILURE() << f;
  }
}

// One kernel parameter made inconsistent with the arguments: the kernel must refuse, saying why.
struct BadArgument {
  Params given;  // the case's axes
  const char* param;
  nlohmann::json value;
  const char* message;  // part of the refusal message
};

inline void expect_refusals(const Gpu& gpu, const std::string& op_name,
                            const std::vector<BadArgument>& bad) {
  const Op& op = registered_op(op_name);
  for (const auto& b : bad) {
    Problem p = op.problem(op.make_case(b.given));
    p.kernel_params[b.param] = b.value;
    const auto o = gpu.runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED) << b.message;
    EXPECT_NE(o.message.find(b.message), std::string::npos) << o.message;
  }
}

// A mutant library against one op's quick cases: every case named by the mutant's regex in
// kernels_under_test/<family>.mutants must fail, and the controls (the other cases `is_control`
// accepts) must pass. Skips without a GPU or without the mutant library. The controls run first:
// a targeted case may fault the device (a wrapped 32-bit offset), which ends the context.
inline void expect_mutant_killed(const std::string& family, const std::string& mutant,
                                 const std::string& op_name,
                                 const std::function<bool(const Case&)>& is_control,
                                 const std::string& controls_what) {
  std::string why;
  auto gpu = open_gpu(mutant_library(mutant), &why, "");
  if (!gpu) GTEST_SKIP() << "mutant: " << why;
  const std::string re = mutant_regex(family, mutant);
  ASSERT_FALSE(re.empty()) << mutant << " is not listed in kernels_under_test/" << family
                           << ".mutants";
  std::vector<Case> targeted, controls;
  for (const auto& c : tier_cases(op_name, {"quick"})) {
    if (std::regex_search(c.id, std::regex(re)))
      targeted.push_back(c);
    else if (is_control(c))
      controls.push_back(c);
  }
  ASSERT_FALSE(targeted.empty());
  ASSERT_FALSE(controls.empty());
  const Op& op = registered_op(op_name);
  const Tally ctl = run_all(op, controls, *gpu, 1);
  const Tally hit = run_all(op, targeted, *gpu, 1);
  const int killed = hit.cases - hit.accepted();
  std::printf("[mutant %s] quick cases matching %s: %d/%d fail; %s controls: %d/%d pass\n",
              mutant.c_str(), re.c_str(), killed, hit.cases, controls_what.c_str(), ctl.accepted(),
              ctl.cases);
  if (!hit.failures.empty()) std::printf("  e.g. %s\n", hit.failures.front().c_str());
  EXPECT_EQ(killed, hit.cases) << "some targeted cases did not catch the mutant";
  for (const auto& f : ctl.failures) ADD_FAILURE() << "control failed: " << f;
}

}  // namespace attncheck::devtest
