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
#include <regex>

#include "device_test_support.h"

namespace attncheck {
namespace {

using namespace devtest;

const Op& op(const std::string& name) {
  return registered_op(name);
}

// Smoke and quick tiers (unique ids), then `extra`.
std::vector<Case> cases_of(const std::string& name, const std::vector<Params>& extra) {
  std::vector<Case> out = tier_cases(name, {"smoke", "quick"}, MissingTier::error);
  for (const auto& p : extra) out.push_back(op(name).make_case(p));
  return out;
}

// Worst error/budget of out and of lse, and the worst calc_diff of out against its budget.
struct Accuracy {
  double worst_ratio[2] = {0, 0};  // out, lse
  std::string worst_id[2];
  double worst_calc_diff = 0, calc_diff_budget = 0;
  void add(const Case& c, const Result& r) {
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

// Runs `cases` twice each (determinism) and prints the summary.
Tally run_and_summarize(const std::string& name, const std::vector<Case>& cases, const Gpu& gpu) {
  Accuracy a;
  const Tally t =
      run_all(op(name), cases, gpu, 2, [&](const Case& c, const Result& r) { a.add(c, r); });
  std::printf(
      "[%s on %s] %d cases: %d passed, %d refused as expected, %zu failed; worst error/budget "
      "out %.3f (%s), lse %.3f (%s); worst calc_diff %.2e (budget %.2e); kernel wall %.0f ms\n",
      name.c_str(), gpu.arch.c_str(), t.cases, t.passed, t.refused, t.failures.size(),
      a.worst_ratio[0], a.worst_id[0].c_str(), a.worst_ratio[1], a.worst_id[1].c_str(),
      a.worst_calc_diff, a.calc_diff_budget, t.kernel_ms);
  for (size_t i = 0; i < t.failures.size() && i < 12; ++i)
    std::printf("  FAIL %s\n", t.failures[i].c_str());
  return t;
}

TEST(MlaDevice, Roofline) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no usable GPU: ");
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
  auto gpu = open_default_gpu(&why, "no usable GPU: ");
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
  const Tally t = run_and_summarize("mla_decode", cases, *gpu);
  EXPECT_TRUE(t.failures.empty()) << t.failures.front();
}

TEST(MlaDevice, SparseMlaCases) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no usable GPU: ");
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
  const Tally t = run_and_summarize("sparse_mla", cases, *gpu);
  EXPECT_TRUE(t.failures.empty()) << t.failures.front();
}

// Production-sized launches timed against the roofline floor max(bytes / copy, flops / matrix).
TEST(MlaDevice, Timings) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no usable GPU: ");
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

// ATTNCHECK_MLA_MUTANT=<name> with ATTNCHECK_KERNELS = that mutant's library (one mutant per
// process: every plugin carries its own static GPU runtime). The mutant must fail at least one
// quick-tier case its regex names; cases outside the regex may fail too (a mutant can break more
// than it aims at) and are counted.
TEST(MlaDevice, MutantIsKilled) {
  const char* name = std::getenv("ATTNCHECK_MLA_MUTANT");
  if (!name || !*name)
    GTEST_SKIP() << "set ATTNCHECK_MLA_MUTANT=<name> and ATTNCHECK_KERNELS to its library";
  std::string why;
  auto gpu = open_default_gpu(&why, "no usable GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  const std::string regex = mutant_regex("mla", name);
  ASSERT_FALSE(regex.empty()) << name << " is not listed in kernels_under_test/mla.mutants";
  const std::regex re(regex);
  int matched = 0, killed = 0, others_failed = 0, others = 0;
  std::string first;
  for (const std::string op_name : {"mla_decode", "sparse_mla"}) {
    run_all(op(op_name), tier_cases(op_name, {"quick"}, MissingTier::error), *gpu, 1,
            [&](const Case& c, const Result& r) {
              const bool failed = r.failing();
              if (std::regex_search(c.id, re)) {
                ++matched;
                if (failed && killed++ == 0) first = c.id + ": " + r.message.substr(0, 200);
              } else {
                ++others;
                others_failed += failed;
              }
            });
  }
  std::printf(
      "[mutant %s] killed by %d of %d quick cases matching /%s/ (first: %s); %d of %d "
      "other quick cases failed\n",
      name, killed, matched, regex.c_str(), first.c_str(), others_failed, others);
  EXPECT_GT(killed, 0) << name << " survived every case matching " << regex;
}

}  // namespace
}  // namespace attncheck
