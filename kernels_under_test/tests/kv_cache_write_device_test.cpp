// kv_cache_write on a GPU: the smoke and quick tiers of cases/kv_cache_write.toml through the
// library named by ATTNCHECK_KERNELS; refusals of inconsistent arguments; and, when the mutant
// library sits beside it (or in ATTNCHECK_MUTANT_DIR), proof that the SHUFFLE writer with the
// block offset from the shape (pre vLLM #39192) is caught by the hybrid and padded SHUFFLE cases
// and passes the SHUFFLE caches whose shape and strides agree, and that the per-token writer with
// the dequant scale at the token's batch index (AITER before #42) is caught by every paged
// per-token case and passes the asm_layout ones. Skips, with the reason, when there is no library
// or no GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "device_test_support.h"

namespace attncheck {
namespace {

using namespace devtest;

TEST(KvCacheWriteDevice, SmokeAndQuickTiersPassBitwise) {
  expect_tiers_pass_bitwise("kv_cache_write");
}

TEST(KvCacheWriteDevice, RefusesInconsistentArguments) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  expect_refusals(
      *gpu, "kv_cache_write",
      {
          {{{"layout", "shuffle"}}, "kv_cache_layout", "NHD", "has 5 dimensions, expected 4"},
          {{{"layout", "nhd"}}, "kv_cache_layout", "HND", "kv_cache_layout must be NHD or SHUFFLE"},
          {{{"kv", "e4m3fn"}}, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"},
          {{{"kv", "e4m3fn"}}, "kv_cache_dtype", "auto", "caches must have the key's dtype"},
          {{{"kv", "model"}}, "kv_cache_dtype", "fp8_e5m2", "kv_cache_dtype must be auto or fp8"},
      });
}

TEST(KvCacheWriteDevice, PertokenRefusesInconsistentArguments) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  const Params shuffle_fp8 = {{"quant", "per_token"}, {"layout", "shuffle"}, {"kv", "e4m3fn"}};
  const Params paged_int8 = {{"quant", "per_token"}, {"layout", "paged"}, {"kv", "int8"}};
  expect_refusals(*gpu, "kv_cache_write",
                  {
                      {shuffle_fp8, "asm_layout", "yes", "asm_layout must be true or false"},
                      {shuffle_fp8, "asm_layout", "false", "has 5 dimensions, expected 4"},
                      {paged_int8, "asm_layout", "true", "has 4 dimensions, expected 5"},
                      {shuffle_fp8, "kv_cache_dtype", "auto", "kv_cache_dtype must be fp8 or int8"},
                      {shuffle_fp8, "kv_cache_dtype", "int8", "tensor 'key_cache' has dtype"},
                      {paged_int8, "kv_cache_dtype", "fp8", "tensor 'key_cache' has dtype"},
                      {shuffle_fp8, "fp8_format", "e5m2", "fp8_format must be e4m3fn or e4m3fnuz"},
                  });
}

// The K tile of the per-token writer shares the SHUFFLE offsets, so its hybrid and padded cases
// are targets too; its paged V ([nb, Hkv, D, P]) is addressed by strides in the mutant as well.
TEST(KvCacheWriteDevice, ShuffleShapeOffsetMutantIsCaughtByHybridAndPaddedShuffleCases) {
  expect_mutant_killed(
      "kv_cache_write", "kv_cache_write_shuffle_shape_offset", "kv_cache_write",
      [](const Case& c) {
        return c.params.at("layout") == "shuffle" || c.params.at("quant") == "per_token";
      },
      "contiguous and separate SHUFFLE and per-token");
}

TEST(KvCacheWriteDevice, PertokenScaleAtTokenMutantIsCaughtByEveryPagedPertokenCase) {
  expect_mutant_killed(
      "kv_cache_write", "kv_cache_write_pertoken_scale_at_token", "kv_cache_write",
      [](const Case& c) {
        return c.params.at("quant") == "per_token" && c.params.at("layout") == "shuffle";
      },
      "per-token asm_layout");
}

}  // namespace
}  // namespace attncheck
