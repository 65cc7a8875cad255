// kv_gather on a GPU: the smoke and quick tiers of cases/kv_gather.toml through the library named
// by ATTNCHECK_KERNELS; refusals of inconsistent arguments; and, when the mutant library sits
// beside it (or in ATTNCHECK_MUTANT_DIR), proof that the pre-#37228 contiguous-offset kernel is
// caught by the hybrid-stride cases and passes the contiguous ones, and that the fp8
// ordinary-only and int32-offset mutants are caught by the special-code and large-offset cases
// only. Skips, with the reason, when there is no library or no GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "device_test_support.h"

namespace attncheck {
namespace {

using namespace devtest;

TEST(KvGatherDevice, SmokeAndQuickTiersPassBitwise) {
  expect_tiers_pass_bitwise("kv_gather");
}

TEST(KvGatherDevice, RefusesInconsistentArguments) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  expect_refusals(
      *gpu, "kv_gather",
      {
          {{{"layout", "shuffle"}}, "kv_cache_layout", "NHD", "has 5 dimensions, expected 4"},
          {{{"layout", "nhd"}}, "kv_cache_layout", "HND", "kv_cache_layout must be NHD or SHUFFLE"},
          {{{"kv", "e4m3fn"}}, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"},
          {{{"kv", "e4m3fn"}}, "dequant", false, "without dequant the caches must have the output"},
      });
}

TEST(KvGatherDevice, ContiguousStridesMutantIsCaughtByHybridCasesOnly) {
  expect_mutant_killed(
      "kv_gather", "kv_gather_contiguous_strides", "kv_gather",
      [](const Case& c) { return c.params.at("strides") == "contiguous"; }, "contiguous-cache");
}

// Issue 14: the fp8 special-code cases catch a dequant exact only on ordinary codes; fp8 cases with
// ordinary codes (up to +-200) cannot see it and pass.
TEST(KvGatherDevice, Fp8OrdinaryOnlyMutantIsCaughtBySpecialCodeCasesOnly) {
  expect_mutant_killed(
      "kv_gather", "kv_gather_fp8_ordinary_only", "kv_gather",
      [](const Case& c) { return c.params.at("kv") != "model"; }, "ordinary-code fp8");
}

// Issue 14: the large-offset cases catch element offsets kept in int32; every other case passes.
TEST(KvGatherDevice, Int32OffsetMutantIsCaughtByLargeOffsetCasesOnly) {
  expect_mutant_killed(
      "kv_gather", "kv_gather_offset_int32", "kv_gather", [](const Case&) { return true; },
      "small-offset");
}

}  // namespace
}  // namespace attncheck
