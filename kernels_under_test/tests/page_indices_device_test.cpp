// Runs every registered op's built-in smoke cases through the kernel library named by
// ATTNCHECK_KERNELS; skips (with the reason) when there is no library or no GPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "run/device.h"
#include "run/runner.h"

namespace attncheck {
namespace {

TEST(DeviceSmoke, PageIndices) {
  const char* path = std::getenv("ATTNCHECK_KERNELS");
  if (!path || !*path) GTEST_SKIP() << "ATTNCHECK_KERNELS not set: no kernel library to test";
  auto lib = KernelLibrary::open(path);
  std::string why;
  auto dev = lib->device(&why);
  if (!dev) GTEST_SKIP() << "no GPU: " << why;
  DeviceRunner runner(*lib, dev->arch);
  const Op* op = find_op("page_indices");
  ASSERT_NE(op, nullptr);
  RunOptions opt;
  opt.arch = dev->arch;
  opt.repeat = 2;
  for (int bs : {1, 16, 64})
    for (const char* table : {"contiguous", "strided"}) {
      Case c =
          op->make_case({{"block_size", bs}, {"table", table}, {"batch", 9}, {"max_ctx", 1000}});
      Result r = run_case(*op, c, &runner, opt);
      EXPECT_EQ(r.verdict, Verdict::passed) << c.id << ": " << r.message;
    }
}

}  // namespace
}  // namespace attncheck
