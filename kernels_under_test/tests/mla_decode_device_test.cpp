// mla_decode and sparse_mla on a GPU through the library named by ATTNCHECK_KERNELS: the smoke and
// quick tiers of cases/mla_decode.toml and cases/sparse_mla.toml (every head count including the
// invalid ones, block sizes 1/16/64, qlen 1..8, fp8 in both formats, strided and head-major views)
// plus production-sized cases, with repeats (determinism); the roofline (the tile-MMA GEMM checks
// itself before it is timed); timings against the roofline; and, with ATTNCHECK_MLA_MUTANT set,
// proof that a mutant of kernels_under_test/mla.mutants is killed by the cases its regex names.
// Skips, with the reason, when there is no library or no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "run/cases.h"
#include "run/device.h"
#include "run/runner.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

std::string repo_file(const std::string& rel) {
  if (const char* d = std::getenv("ATTNCHECK_SOURCE_DIR")) return std::string(d) + "/" + rel;
  if (fs::exists(rel)) return rel;
  return std::string(ATTNCHECK_SOURCE_DIR) + "/" + rel;
}

struct Gpu {
  std::unique_ptr<KernelLibrary> lib;
  std::unique_ptr<DeviceRunner> runner;
  std::string arch;
};

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
  if (!dev) {
    *why = "no usable GPU: " + *why;
    return std::nullopt;
  }
  g.arch = dev->arch;
  g.runner = std::make_unique<DeviceRunner>(*g.lib, dev->arch);
  return g;
}

std::optional<Gpu> open_default(std::string* why) {
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  return open_gpu(path ? path : "", why);
}

const Op& op(const std::string& name) {
  const Op* o = find_op(name);
  if (!o) throw std::runtime_error(name + " is not registered");
  return *o;
}

// Smoke and quick tiers (unique ids), then `extra`.
std::vector<Case> cases_of(const std::string& name, const std::vector<Params>& extra) {
  const CaseFile f = load_case_file(repo_file("cases/" + name + ".toml"));
  std::vector<Case> out;
  std::set<std::string> ids;
  for (const char* tier : {"smoke", "quick"})
    for (const Case& c : f.tiers.at(tier))
      if (ids.insert(c.id).second) out.push_back(c);
  for (const auto& p : extra) out.push_back(op(name).make_case(p));
  return out;
}

struct Tally {
  int cases = 0, passed = 0, refused = 0;
  double worst_ratio[2] = {0, 0};  // out, lse
  std::string worst_id[2];
  double worst_calc_diff = 0, calc_diff_budget = 0;
  double kernel_ms = 0;
  std::vector<std::string> failures;
  void add(const Case& c, const Result& r) {
    ++cases;
    kernel_ms += r.timings.kernel_ms;
    if (r.verdict == Verdict::passed) ++passed;
    if (r.verdict == Verdict::refused_as_expected) ++refused;
    if (r.verdict != Verdict::passed && r.verdict != Verdict::refused_as_expected)
      failures.push_back(c.id + ": " + std::string(verdict_name(r.verdict)) + ": " + r.message);
    for (const auto& ch : r.checks) {
      const int k = ch.name == "out" ? 0 : 1;
      if (ch.metrics.worst.ratio > worst_ratio[k]) {
        worst_ratio[k] = ch.metrics.worst.ratio;
        worst_id[k] = c.id;
      }
      if (k == 0 && ch.metrics.calc_diff / ch.budget.max_calc_diff >
                        worst_calc_diff / std::max(calc_diff_budget, 1e-30)) {
        worst_calc_diff = ch.metrics.calc_diff;
        calc_diff_budget = ch.budget.max_calc_diff;
      }
    }
  }
};

Tally run_all(const std::string& name, const std::vector<Case>& cases, const Gpu& gpu) {
  Tally t;
  RunOptions opt;
  opt.arch = gpu.arch;
  opt.repeat = 2;
  for (const auto& c : cases) t.add(c, run_case(op(name), c, gpu.runner.get(), opt));
  return t;
}

void summarize(const std::string& name, const Gpu& gpu, const Tally& t) {
  std::printf(
      "[%s on %s] %d cases: %d passed, %d refused as expected, %zu failed; worst error/budget "
      "out %.3f (%s), lse %.3f (%s); worst calc_diff %.2e (budget %.2e); kernel wall %.0f ms\n",
      name.c_str(), gpu.arch.c_str(), t.cases, t.passed, t.refused, t.failures.size(),
      t.worst_ratio[0], t.worst_id[0].c_str(), t.worst_ratio[1], t.worst_id[1].c_str(),
      t.worst_calc_diff, t.calc_diff_budget, t.kernel_ms);
  for (size_t i = 0; i < t.failures.size() && i < 12; ++i)
    std::printf("  FAIL %s\n", t.failures[i].c_str());
}

TEST(MlaDevice, Roofline) {
  std::string why;
  auto gpu = open_default(&why);
  if (!gpu) GTEST_SKIP() << why;
  double gbps = 0, tflops = 0;
  char msg[512] = {0};
  const int st = gpu->lib->api().roofline(&gbps, &tflops, msg, sizeof msg);
  ASSERT_EQ(st, ATTNCHECK_OK) << msg;
  std::printf(
      "[roofline on %s] copy %.0f GB/s; bf16 tile-MMA GEMM 8192^3 (mma.h, verified "
      "bit-exact first) %.1f TFLOP/s\n",
      gpu->arch.c_str(), gbps, tflops);
  EXPECT_GT(tflops, 1.0);
}

TEST(MlaDevice, MlaDecodeCases) {
  std::string why;
  auto gpu = open_default(&why);
  if (!gpu) GTEST_SKIP() << why;
  const auto cases = cases_of(
      "mla_decode",
      {
          {{"heads", 128}, {"qlen", 1}, {"batch", 4}, {"ctx", 2048}, {"seed", 7}},
          {{"heads", 16},
           {"qlen", 4},
           {"batch", 6},
           {"ctx", 1000},
           {"block_size", 64},
           {"seed", 7}},
          {{"heads", 64}, {"qlen", 2}, {"kv_dtype", "e4m3fnuz"}, {"ctx", 700}, {"seed", 7}},
          {{"heads", 8},
           {"qlen", 8},
           {"dtype", "f16"},
           {"layout", "strided"},
           {"ctx", 600},
           {"seed", 7}},
          {{"heads", 32},
           {"qlen", 6},
           {"kv_dtype", "e4m3fn"},
           {"layout", "transposed"},
           {"block_size", 1},
           {"scale", "yarn"},
           {"seed", 7}},
          {{"heads", 1}, {"qlen", 3}, {"ctx", 4096}, {"batch", 1}, {"seed", 7}},
      });
  const Tally t = run_all("mla_decode", cases, *gpu);
  summarize("mla_decode", *gpu, t);
  EXPECT_TRUE(t.failures.empty()) << t.failures.front();
}

TEST(MlaDevice, SparseMlaCases) {
  std::string why;
  auto gpu = open_default(&why);
  if (!gpu) GTEST_SKIP() << why;
  const auto cases = cases_of("sparse_mla", {
                                                {{"heads", 128},
                                                 {"topk", 2048},
                                                 {"ctx", 4000},
                                                 {"batch", 2},
                                                 {"dims", "576x512"},
                                                 {"seed", 7}},
                                                {{"heads", 32},
                                                 {"topk", 512},
                                                 {"qlen", 4},
                                                 {"pattern", "holes"},
                                                 {"ctx", 900},
                                                 {"kv_dtype", "e4m3fnuz"},
                                                 {"seed", 7}},
                                                {{"heads", 4},
                                                 {"topk", 256},
                                                 {"qlen", 8},
                                                 {"pattern", "causal"},
                                                 {"layout", "strided"},
                                                 {"dtype", "f16"},
                                                 {"seed", 7}},
                                            });
  const Tally t = run_all("sparse_mla", cases, *gpu);
  summarize("sparse_mla", *gpu, t);
  EXPECT_TRUE(t.failures.empty()) << t.failures.front();
}

// Production-sized launches timed against the roofline floor max(bytes / copy, flops / matrix).
TEST(MlaDevice, Timings) {
  std::string why;
  auto gpu = open_default(&why);
  if (!gpu) GTEST_SKIP() << why;
  double gbps = 0, tflops = 0;
  char msg[512] = {0};
  ASSERT_EQ(gpu->lib->api().roofline(&gbps, &tflops, msg, sizeof msg), ATTNCHECK_OK) << msg;
  const std::vector<std::pair<std::string, Params>> timed = {
      {"mla_decode", {{"heads", 16}, {"batch", 16}, {"ctx", 2048}, {"block_size", 64}}},
      {"mla_decode", {{"heads", 128}, {"batch", 8}, {"ctx", 2048}, {"block_size", 64}}},
      {"mla_decode",
       {{"heads", 16}, {"qlen", 4}, {"batch", 16}, {"ctx", 1024}, {"kv_dtype", "e4m3fn"}}},
      {"sparse_mla",
       {{"heads", 16}, {"batch", 8}, {"topk", 2048}, {"ctx", 4096}, {"pattern", "random"}}},
  };
  for (const auto& [name, params] : timed) {
    const Case c = op(name).make_case(params);
    Problem p = op(name).make(c);
    p.kernel = name;
    std::string err;
    const double ms = gpu->runner->time(p, 2, 10, &err);
    ASSERT_TRUE(err.empty()) << c.id << ": " << err;
    const double floor_ms = std::max(p.bytes / (gbps * 1e9), p.flops / (tflops * 1e12)) * 1e3;
    std::printf("[timing %s] %.3f ms: %.0f GB/s, %.1f TFLOP/s; roofline floor %.3f ms (%.0f%%)\n",
                c.id.c_str(), ms, p.bytes / (ms * 1e-3) / 1e9, p.flops / (ms * 1e-3) / 1e12,
                floor_ms, 100.0 * floor_ms / ms);
  }
}

struct Mutant {
  std::string name, regex;
};

std::vector<Mutant> mutants() {
  std::ifstream in(repo_file("kernels_under_test/mla.mutants"));
  std::vector<Mutant> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // name | seed bug | regex: the regex is everything after the second '|' (it may hold '|').
    const auto a = line.find('|');
    const auto b = a == std::string::npos ? a : line.find('|', a + 1);
    if (b == std::string::npos) continue;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t\r") + 1);
      return s;
    };
    out.push_back({trim(line.substr(0, a)), trim(line.substr(b + 1))});
  }
  return out;
}

// ATTNCHECK_MLA_MUTANT=<name> with ATTNCHECK_KERNELS = that mutant's library (one mutant per
// process: every plugin carries its own static GPU runtime). The mutant must fail at least one
// quick-tier case its regex names; cases outside the regex may fail too (a mutant can break more
// than it aims at) and are counted.
TEST(MlaDevice, MutantIsKilled) {
  const char* name = std::getenv("ATTNCHECK_MLA_MUTANT");
  if (!name || !*name)
    GTEST_SKIP() << "set ATTNCHECK_MLA_MUTANT=<name> and ATTNCHECK_KERNELS to its library";
  std::string why;
  auto gpu = open_default(&why);
  if (!gpu) GTEST_SKIP() << why;
  std::string regex;
  for (const auto& m : mutants())
    if (m.name == name) regex = m.regex;
  ASSERT_FALSE(regex.empty()) << name << " is not listed in kernels_under_test/mla.mutants";
  const std::regex re(regex);
  int matched = 0, killed = 0, others_failed = 0, others = 0;
  std::string first;
  for (const std::string op_name : {"mla_decode", "sparse_mla"}) {
    const CaseFile f = load_case_file(repo_file("cases/" + op_name + ".toml"));
    RunOptions opt;
    opt.arch = gpu->arch;
    for (const Case& c : f.tiers.at("quick")) {
      const bool aimed = std::regex_search(c.id, re);
      const Result r = run_case(op(op_name), c, gpu->runner.get(), opt);
      const bool failed = verdict_is_failure(r.verdict);
      if (aimed) {
        ++matched;
        if (failed && killed++ == 0) first = c.id + ": " + r.message.substr(0, 200);
      } else {
        ++others;
        others_failed += failed;
      }
    }
  }
  std::printf(
      "[mutant %s] killed by %d of %d quick cases matching /%s/ (first: %s); %d of %d "
      "other quick cases failed\n",
      name, killed, matched, regex.c_str(), first.c_str(), others_failed, others);
  EXPECT_GT(killed, 0) << name << " survived every case matching " << regex;
}

}  // namespace
}  // namespace attncheck
