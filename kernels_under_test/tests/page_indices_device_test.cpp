// page_indices through the kernel library named by ATTNCHECK_KERNELS: built-in smoke cases, the
// quick tier, and (when the mutant library sits beside it) the unchecked-int32 mutant; skips (with
// the reason) when there is no library or no GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "device_test_support.h"

namespace attncheck {
namespace {

TEST(DeviceSmoke, PageIndices) {
  std::string why;
  auto gpu = devtest::open_default_gpu(&why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  const Op* op = find_op("page_indices");
  ASSERT_NE(op, nullptr);
  EvalContext ctx;
  ctx.device = gpu->runner.get();
  ctx.options.arch = gpu->arch;
  for (int bs : {1, 16, 64})
    for (const char* table : {"contiguous", "strided"}) {
      Case c =
          op->make_case({{"block_size", bs}, {"table", table}, {"batch", 9}, {"max_ctx", 1000}});
      const Result r = evaluate(c, ctx);
      EXPECT_EQ(r.verdict, Verdict::passed) << c.id << ": " << r.message;
    }
}

// The quick tier, block ids at and past 2^31 / K included (issue 14): the top ones expand exactly,
// the ones past int32 are refused.
TEST(DeviceSmoke, PageIndicesQuickTier) {
  std::string why;
  auto gpu = devtest::open_default_gpu(&why, "no GPU: ");
  if (!gpu) GTEST_SKIP() << why;
  const devtest::Tally t = devtest::run_all(
      *find_op("page_indices"), devtest::tier_cases("page_indices", {"quick"}), *gpu, 2);
  std::printf("[page_indices quick on %s] %d passed, %d refused as expected, %zu failed\n",
              gpu->arch.c_str(), t.passed, t.refused, t.failures.size());
  EXPECT_GE(t.refused, 2);
  for (const auto& f : t.failures) ADD_FAILURE() << f;
}

TEST(DeviceSmoke, PageIndicesUncheckedInt32MutantIsCaughtByIdsPastInt32Only) {
  devtest::expect_mutant_killed(
      "page_indices", "page_indices_unchecked_int32", "page_indices",
      [](const Case&) { return true; }, "other");
}

}  // namespace
}  // namespace attncheck
