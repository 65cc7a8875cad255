// The indexer family on a GPU: the smoke and quick tiers of cases/indexer_*.toml (and the full tier
// when ATTNCHECK_INDEXER_FULL=1) through the library named by ATTNCHECK_KERNELS, refusals with
// their reasons, device timings, and, when the mutant libraries sit beside it (or in
// ATTNCHECK_MUTANT_DIR; ATTNCHECK_INDEXER_MUTANT=<name> tests one), proof that each seed-bug mutant
// fails the quick cases its regex names.
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

const char* const kOps[] = {
    "indexer_k_cache",       "indexer_gather",       "indexer_q_quant",    "indexer_logits_prefill",
    "indexer_logits_decode", "indexer_topk_prefill", "indexer_topk_decode"};

std::optional<Gpu> main_gpu(std::string* why) {
  return open_default_gpu(why, "no GPU: ");
}

// Worst error/budget and largest calc_diff over the numeric checks (exact ones compare bitwise).
struct Numeric {
  double worst_ratio = 0, max_calc_diff = 0;
  std::string worst_where;
  void add(const Case& c, const Result& r) {
    for (const auto& ch : r.checks) {
      if (ch.budget.kind != Budget::Kind::numeric) continue;
      max_calc_diff = std::max(max_calc_diff, ch.metrics.calc_diff);
      if (ch.metrics.worst.ratio > worst_ratio) {
        worst_ratio = ch.metrics.worst.ratio;
        worst_where = c.id + " " + ch.name;
      }
    }
  }
};

// Runs `cases` and prints "[what op on arch] ..." with the first failures.
Tally run_and_report(const char* what, const char* op, const std::vector<Case>& cases,
                     const Gpu& gpu, int repeat) {
  Numeric n;
  const Tally t = run_all(*find_op(op), cases, gpu, repeat,
                          [&](const Case& c, const Result& r) { n.add(c, r); });
  std::printf(
      "[%s %s on %s] %d passed + %d refused as expected / %d, worst err/budget %.3g%s%s, calc_diff "
      "max %.2g, "
      "kernel wall %.1f ms\n",
      what, op, gpu.arch.c_str(), t.passed, t.refused, t.cases, n.worst_ratio,
      n.worst_where.empty() ? "" : " at ", n.worst_where.c_str(), n.max_calc_diff, t.kernel_ms);
  for (size_t i = 0; i < t.failures.size() && i < 5; ++i)
    std::printf("  FAIL %s\n", t.failures[i].c_str());
  return t;
}

TEST(IndexerDevice, SmokeAndQuickTiersPass) {
  std::string why;
  auto gpu = main_gpu(&why);
  if (!gpu) GTEST_SKIP() << why;
  for (const char* name : kOps) {
    const Op* op = find_op(name);
    ASSERT_NE(op, nullptr) << name;
    const auto cases = tier_cases(name, {"smoke", "quick"});
    ASSERT_FALSE(cases.empty()) << name;
    const Tally t = run_and_report("smoke+quick", name, cases, *gpu, 2);
    EXPECT_TRUE(t.failures.empty())
        << name << ": " << t.failures.size() << " failures, first: " << t.failures.front();
  }
}

// Refusals name what is wrong.
TEST(IndexerDevice, RefusesWithReasons) {
  std::string why;
  auto gpu = main_gpu(&why);
  if (!gpu) GTEST_SKIP() << why;
  struct Bad {
    const char* op;
    Params params;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {"indexer_k_cache",
       {{"block_size", 24}},
       "kv_cache block size 24 is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)"},
      {"indexer_k_cache",
       {{"block_size", 16}, {"pad", 2}},
       "kv_cache page stride 2114 is not a multiple of 4"},
      {"indexer_gather",
       {{"block_size", 8}},
       "kv_cache block size 8 is neither 1 (NORMAL) nor a multiple of 16"},
      {"indexer_logits_decode",
       {{"heads", 48}, {"chunk_q", 32}},
       "heads 48 is not a multiple of ChunkQ 32"},
      {"indexer_logits_decode", {{"chunk_q", 0}}, "chunk_q must be >= 1, got 0"},
      {"indexer_logits_decode", {{"heads", 256}}, "heads 256 outside [1, 128]"},
      {"indexer_logits_prefill", {{"heads", 0}}, "heads 0 outside [1, 128]"},
  };
  for (const auto& b : bad) {
    const Op* op = find_op(b.op);
    Problem p = op->make(op->make_case(b.params));
    p.kernel = op->name();
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED) << b.op << " " << b.params.dump();
    EXPECT_NE(o.message.find(b.message), std::string::npos) << b.op << ": " << o.message;
  }
  {  // a quant max the format cannot hold
    const Op* op = find_op("indexer_q_quant");
    Problem p = op->make(op->make_case({{"fp8", "e4m3fnuz"}}));
    p.kernel = op->name();
    p.kernel_params["quant_max"] = 448.0;
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED);
    EXPECT_NE(o.message.find("quant_max 448.000000 outside (0, 240.000000]"), std::string::npos)
        << o.message;
  }
  {
    const Op* op = find_op("indexer_topk_decode");
    Problem p = op->make(op->make_case(Params::object()));
    p.kernel = op->name();
    p.kernel_params["next_n"] = 0;
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED);
    EXPECT_NE(o.message.find("next_n must be >= 1, got 0"), std::string::npos) << o.message;
  }
}

TEST(IndexerDevice, Timings) {
  std::string why;
  auto gpu = main_gpu(&why);
  if (!gpu) GTEST_SKIP() << why;
  const std::vector<std::pair<const char*, Params>> shapes = {
      {"indexer_logits_decode",
       {{"heads", 64}, {"block_size", 64}, {"batch", 8}, {"max_ctx", 16384}}},
      {"indexer_logits_decode",
       {{"heads", 32}, {"block_size", 1}, {"next_n", 2}, {"batch", 8}, {"max_ctx", 16384}}},
      {"indexer_logits_prefill", {{"heads", 64}, {"batch", 1}, {"max_ctx", 4096}, {"qlen", 1024}}},
      {"indexer_topk_decode", {{"topk", 2048}, {"batch", 64}, {"max_ctx", 32768}}},
      {"indexer_k_cache", {{"block_size", 64}, {"tokens", 16384}}},
      {"indexer_q_quant", {{"tokens", 4096}, {"heads", 64}}},
  };
  for (const auto& [name, params] : shapes) {
    const Op* op = find_op(name);
    const Case c = op->make_case(params);
    Problem p = op->make(c);
    p.kernel = op->name();
    std::string err;
    const double ms = gpu->runner->time(p, 3, 10, &err);
    ASSERT_GE(ms, 0) << c.id << ": " << err;
    std::printf("[time %s] %.3f ms", c.id.c_str(), ms);
    if (p.flops > 0) std::printf(", %.1f TFLOP/s", p.flops / ms * 1e-9);
    if (p.bytes > 0) std::printf(", %.0f GB/s", p.bytes / ms * 1e-6);
    std::printf("\n");
  }
}

TEST(IndexerDevice, MutantsAreKilledByTheirCases) {
  const auto list = read_mutants("indexer");
  // indexer_shuffle_at_bs1, indexer_preshuffle_only_bs64, indexer_chunkq_unclamped,
  // indexer_fp8_ordinary_only, indexer_page_offset_int32 (which may fault the device: give it a
  // process of its own through ATTNCHECK_INDEXER_MUTANT), indexer_weights_ftz,
  // indexer_gather_contiguous_out, indexer_decode_batch8, indexer_k_offset_int32 (may fault too).
  ASSERT_EQ(list.size(), 9u);
  const char* only = std::getenv("ATTNCHECK_INDEXER_MUTANT");  // one mutant per process
  int tested = 0;
  for (const auto& [name, re] : list) {
    if (only && name != only) continue;
    std::string why;
    auto gpu = open_gpu(mutant_library(name), &why, "no GPU: ");
    if (!gpu) {
      std::printf("[mutant %s] skipped: %s\n", name.c_str(), why.c_str());
      continue;
    }
    ++tested;
    int targeted = 0, killed = 0, refused = 0;
    std::string example;
    for (const char* op_name : kOps) {
      std::vector<Case> hit;
      for (const auto& c : tier_cases(op_name, {"quick"}))
        if (std::regex_search(c.id, std::regex(re))) hit.push_back(c);
      if (hit.empty()) continue;
      const Tally t = run_all(*find_op(op_name), hit, *gpu, 1);
      // Invalid configurations the regex also names are refused by every build: not targets.
      targeted += t.cases - t.refused;
      refused += t.refused;
      killed += t.cases - t.passed - t.refused;
      if (example.empty() && !t.failures.empty()) example = t.failures.front();
    }
    std::printf(
        "[mutant %s] valid quick cases matching %s: %d/%d fail (%d invalid ones refused)\n  e.g. "
        "%s\n",
        name.c_str(), re.c_str(), killed, targeted, refused, example.substr(0, 400).c_str());
    EXPECT_GT(targeted, 0) << name;
    EXPECT_EQ(killed, targeted) << name << ": some targeted cases missed the mutant";
  }
  if (tested == 0) GTEST_SKIP() << "no mutant libraries next to ATTNCHECK_KERNELS";
}

TEST(IndexerDevice, FullTierPasses) {
  if (!std::getenv("ATTNCHECK_INDEXER_FULL")) GTEST_SKIP() << "ATTNCHECK_INDEXER_FULL not set";
  std::string why;
  auto gpu = main_gpu(&why);
  if (!gpu) GTEST_SKIP() << why;
  for (const char* name : kOps) {
    const Tally t = run_and_report("full", name, tier_cases(name, {"full"}), *gpu, 1);
    EXPECT_TRUE(t.failures.empty()) << name << ": " << t.failures.front();
  }
}

}  // namespace
}  // namespace attncheck
