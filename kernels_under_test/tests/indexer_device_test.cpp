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

const char* const kOps[] = {
    "indexer_k_cache",       "indexer_gather",       "indexer_q_quant",    "indexer_logits_prefill",
    "indexer_logits_decode", "indexer_topk_prefill", "indexer_topk_decode"};

std::string repo_file(const std::string& rel) {
  if (const char* d = std::getenv("ATTNCHECK_SOURCE_DIR")) return std::string(d) + "/" + rel;
  if (fs::exists(rel)) return rel;  // run from the repository root
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
    *why = "no GPU: " + *why;
    return std::nullopt;
  }
  g.arch = dev->arch;
  g.runner = std::make_unique<DeviceRunner>(*g.lib, dev->arch);
  return g;
}

std::optional<Gpu> main_gpu(std::string* why) {
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  return open_gpu(path ? path : "", why);
}

// Cases of the given tiers, each id once.
std::vector<Case> cases_of(const char* op, std::initializer_list<const char*> tiers) {
  const CaseFile f = load_case_file(repo_file(std::string("cases/") + op + ".toml"));
  std::vector<Case> out;
  std::set<std::string> seen;
  for (const char* t : tiers) {
    const auto it = f.tiers.find(t);
    if (it == f.tiers.end()) continue;
    for (const auto& c : it->second)
      if (seen.insert(c.id).second) out.push_back(c);
  }
  return out;
}

struct Tally {
  int cases = 0, passed = 0, refused = 0;
  double kernel_ms = 0, worst_ratio = 0, max_calc_diff = 0;
  std::string worst_where;
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
    t.passed += r.verdict == Verdict::passed;
    t.refused += r.verdict == Verdict::refused_as_expected;
    if (r.verdict != Verdict::passed && r.verdict != Verdict::refused_as_expected)
      t.failures.push_back(c.id + ": " + std::string(verdict_name(r.verdict)) + ": " + r.message);
    for (const auto& ch : r.checks) {
      if (ch.budget.kind == Budget::Kind::numeric)
        t.max_calc_diff = std::max(t.max_calc_diff, ch.metrics.calc_diff);
      if (ch.budget.kind == Budget::Kind::numeric && ch.metrics.worst.ratio > t.worst_ratio) {
        t.worst_ratio = ch.metrics.worst.ratio;
        t.worst_where = c.id + " " + ch.name;
      }
    }
  }
  return t;
}

void report(const char* what, const char* op, const Tally& t, const std::string& arch) {
  std::printf(
      "[%s %s on %s] %d passed + %d refused as expected / %d, worst err/budget %.3g%s%s, calc_diff "
      "max %.2g, "
      "kernel wall %.1f ms\n",
      what, op, arch.c_str(), t.passed, t.refused, t.cases, t.worst_ratio,
      t.worst_where.empty() ? "" : " at ", t.worst_where.c_str(), t.max_calc_diff, t.kernel_ms);
  for (size_t i = 0; i < t.failures.size() && i < 5; ++i)
    std::printf("  FAIL %s\n", t.failures[i].c_str());
}

TEST(IndexerDevice, SmokeAndQuickTiersPass) {
  std::string why;
  auto gpu = main_gpu(&why);
  if (!gpu) GTEST_SKIP() << why;
  for (const char* name : kOps) {
    const Op* op = find_op(name);
    ASSERT_NE(op, nullptr) << name;
    const auto cases = cases_of(name, {"smoke", "quick"});
    ASSERT_FALSE(cases.empty()) << name;
    const Tally t = run_all(*op, cases, *gpu, 2);
    report("smoke+quick", name, t, gpu->arch);
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

std::vector<std::pair<std::string, std::string>> mutants() {  // name, case regex
  std::ifstream in(repo_file("kernels_under_test/indexer.mutants"));
  std::vector<std::pair<std::string, std::string>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // name | description | regex: the regex may itself hold '|', the description may not.
    const auto first = line.find('|'), last = line.find('|', first + 1);
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t\r") + 1);
      return s;
    };
    out.emplace_back(trim(line.substr(0, first)), trim(line.substr(last + 1)));
  }
  return out;
}

TEST(IndexerDevice, MutantsAreKilledByTheirCases) {
  const auto list = mutants();
  ASSERT_EQ(list.size(),
            3u);  // indexer_shuffle_at_bs1, indexer_preshuffle_only_bs64, indexer_chunkq_unclamped
  const char* kernels = std::getenv("ATTNCHECK_KERNELS");
  const char* dir = std::getenv("ATTNCHECK_MUTANT_DIR");
  const fs::path base = dir ? fs::path(dir) : fs::path(kernels ? kernels : "").parent_path();
  const char* only = std::getenv("ATTNCHECK_INDEXER_MUTANT");  // one mutant per process
  int tested = 0;
  for (const auto& [name, re] : list) {
    if (only && name != only) continue;
    std::string why;
    auto gpu = open_gpu((base / ("libattncheck_kernels_mutant_" + name + ".so")).string(), &why);
    if (!gpu) {
      std::printf("[mutant %s] skipped: %s\n", name.c_str(), why.c_str());
      continue;
    }
    ++tested;
    int targeted = 0, killed = 0, refused = 0;
    std::string example;
    for (const char* op_name : kOps) {
      std::vector<Case> hit;
      for (const auto& c : cases_of(op_name, {"quick"}))
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
    const Tally t = run_all(*find_op(name), cases_of(name, {"full"}), *gpu, 1);
    report("full", name, t, gpu->arch);
    EXPECT_TRUE(t.failures.empty()) << name << ": " << t.failures.front();
  }
}

}  // namespace
}  // namespace attncheck
