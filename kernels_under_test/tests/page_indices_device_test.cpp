// Runs every registered op's built-in smoke cases through the kernel library named by
// ATTNCHECK_KERNELS; skips (with the reason) when there is no library or no GPU.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace attncheck
