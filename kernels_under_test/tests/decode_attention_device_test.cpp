// decode_attention on a GPU through the library named by ATTNCHECK_KERNELS: the smoke and quick
// tiers of cases/decode_attention.toml plus the DeepSeek/Kimi head counts and a long context
// (every (Lk, Lv) pair, MHA/GQA/MQA/MLA, page sizes 1/16/64, splits 1..16, fp8 both formats,
// strided and cross-layer layouts), the refusals, timings, and, when the mutant library sits beside
// it (or in ATTNCHECK_MUTANT_DIR), proof that the pre-fix tile is caught by the 320/256 MLA cases
// only. Skips, with the reason, when there is no library or no GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>

#include "device_test_support.h"

namespace attncheck {
namespace {

using namespace devtest;

const Op& op() {
  return registered_op("decode_attention");
}

void print(const char* what, const Gpu& gpu, const Tally& t) {
  std::printf(
      "[decode_attention %s on %s] %d cases: %d passed, %d refused as expected, %zu failed; "
      "worst error/budget %.3f (%s of %s); kernel wall %.1f ms\n",
      what, gpu.arch.c_str(), t.cases, t.passed, t.refused, t.failures.size(), t.worst_ratio,
      t.worst_check.c_str(), t.worst_case.c_str(), t.kernel_ms);
}

// Beyond the quick tier: DeepSeek-V3 / Kimi-K2 at TP1 (128 heads) and a long batch, every shape
// through the MHA kernel, fp8 with the soft-cap, and group 24 (> BLOCK_H, not a multiple).
std::vector<Case> extra_cases() {
  std::vector<Params> given = {
      {{"heads", 128}, {"batch", 2}, {"max_ctx", 300}, {"splits", 16}},
      {{"heads", 16}, {"batch", 8}, {"max_ctx", 3000}, {"splits", 8}},
      {{"heads", 64}, {"kv_dtype", "e4m3fnuz"}, {"logit_cap", 30}, {"page_size", 64}},
      {{"lk_lv", "320x256"}, {"heads", 128}, {"batch", 2}, {"kv_dtype", "e4m3fn"}},
      {{"lk_lv", "192x128"}, {"is_mla", false}, {"heads", 48}, {"kv_heads", 2}, {"dtype", "f16"}},
  };
  for (const char* dims : {"576x512", "576x128", "320x256", "288x256", "192x128", "128x128"})
    given.push_back({{"lk_lv", dims},
                     {"is_mla", false},
                     {"heads", 8},
                     {"kv_heads", 8},
                     {"layout", "strided"},
                     {"kv_dtype", "e4m3fn"},
                     {"splits", 16}});
  std::vector<Case> cases;
  for (auto& g : given) {
    g["seed"] = 11;
    cases.push_back(op().make_case(g));
  }
  return cases;
}

TEST(DecodeAttentionDevice, SmokeQuickAndExtraCasesPass) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  // ATTNCHECK_DA_TIERS picks the tiers: "smoke" under compute-sanitizer's racecheck, "full" too
  // for a nightly-sized run.
  const char* only = std::getenv("ATTNCHECK_DA_TIERS");
  const std::string tiers = only ? only : "smoke,quick,extra";
  Tally all;
  for (const std::string tier : {"smoke", "quick", "extra", "full"}) {
    if (tiers.find(tier) == std::string::npos) continue;
    const auto cases = tier == "extra" ? extra_cases() : tier_cases("decode_attention", {tier});
    ASSERT_FALSE(cases.empty()) << tier;
    const Tally t = run_all(op(), cases, *gpu, 2);
    print(tier.c_str(), *gpu, t);
    for (const auto& f : t.failures) ADD_FAILURE() << f;
    all.merge(t);
  }
  ASSERT_GT(all.cases, 0) << "ATTNCHECK_DA_TIERS selected nothing: " << tiers;
  print("summary", *gpu, all);
}

TEST(DecodeAttentionDevice, RefusesWhatItCannotServe) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  struct Bad {
    Params given;
    const char* param;
    nlohmann::json value;
    const char* message;
  };
  const Bad bad[] = {
      {{{"is_mla", false}},
       "is_mla",
       true,
       "is_mla needs v_buffer to be k_buffer[..., :Lv] (same storage)"},
      {{{"kv_dtype", "e4m3fn"}}, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"},
      {Params::object(), "k_scale", 0.5, "k_scale and v_scale apply to fp8 caches only"},
      {Params::object(), "page_size", 8, "page_size 8 does not match k_buffer's 16"},
      {Params::object(), "num_kv_splits", 0, "num_kv_splits must be in [1, 65535], got 0"},
      {{{"kv_dtype", "e4m3fn"}},
       "v_scale",
       0.25,
       "is_mla: V is K's storage, so v_scale == k_scale"},
  };
  for (const auto& b : bad) {
    Problem p = op().make(op().make_case(b.given));
    p.kernel = "decode_attention";
    p.kernel_params[b.param] = b.value;
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED) << b.message;
    EXPECT_NE(o.message.find(b.message), std::string::npos) << o.message;
  }
}

TEST(DecodeAttentionDevice, TimesDecodeShapes) {
  std::string why;
  auto gpu = open_default_gpu(&why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  const Params shapes[] = {
      {{"heads", 16}, {"batch", 8}, {"max_ctx", 3000}, {"splits", 8}},
      {{"heads", 128}, {"batch", 8}, {"max_ctx", 3000}, {"splits", 8}},
      {{"lk_lv", "128x128"},
       {"is_mla", false},
       {"heads", 32},
       {"kv_heads", 8},
       {"batch", 8},
       {"max_ctx", 3000},
       {"splits", 8}},
  };
  for (const auto& s : shapes) {
    const Case c = op().make_case(s);
    Problem p = op().make(c);
    p.kernel = "decode_attention";
    std::string err;
    const double ms = gpu->runner->time(p, 3, 20, &err);
    ASSERT_TRUE(err.empty()) << c.id << ": " << err;
    std::printf("[decode_attention time] %s: %.3f ms, %.1f GB/s, %.2f TFLOP/s\n", c.id.c_str(), ms,
                p.bytes / ms * 1e-6, p.flops / ms * 1e-9);
  }
}

TEST(DecodeAttentionDevice, TileFromLkMutantIsCaughtBy320x256MlaCasesOnly) {
  std::string why;
  auto gpu = open_gpu(mutant_library("decode_tile_from_lk"), &why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << "mutant: " << why;
  const std::string re = mutant_regex("decode_attention", "decode_tile_from_lk");
  ASSERT_EQ(re, "^decode_attention/d320x256-mla1-");
  std::vector<Case> targeted, controls;
  for (const auto& c : tier_cases("decode_attention", {"quick"})) {
    if (std::regex_search(c.id, std::regex(re)))
      targeted.push_back(c);
    else if (c.params.at("is_mla") == true && c.params.at("lk_lv") != "128x128")
      controls.push_back(c);  // 576/512 and 288/256 MLA: BLOCK_DMODEL == BLOCK_DV either way
  }
  ASSERT_FALSE(targeted.empty());
  ASSERT_FALSE(controls.empty());
  const Tally hit = run_all(op(), targeted, *gpu, 1);
  const Tally ctl = run_all(op(), controls, *gpu, 1);
  const int killed = hit.cases - hit.passed - hit.refused;
  std::printf(
      "[mutant decode_tile_from_lk] quick cases matching %s: %d/%d fail (worst error/budget "
      "%.3g); 576/512 + 288/256 MLA controls: %d/%d pass\n",
      re.c_str(), killed, hit.cases, hit.worst_ratio, ctl.passed, ctl.cases);
  if (!hit.failures.empty()) std::printf("  e.g. %s\n", hit.failures.front().c_str());
  EXPECT_EQ(killed, hit.cases) << "some 320/256 MLA cases did not catch the mutant";
  for (const auto& f : ctl.failures) ADD_FAILURE() << "control failed: " << f;
}

}  // namespace
}  // namespace attncheck
