// Writes no kernel may make, each caught by its own check (run/device.cpp check_read_back, the
// refusal branch of run/evaluate.cpp), proven with the fake kernel library: a refusal that wrote
// first, any byte of the leading guard (not only the last one before the buffer), and a byte in a
// gap between the elements of a strided output's view (inside its extent, not past it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "run/device.h"
#include "run/evaluate.h"

#ifndef ATTNCHECK_FAKE_KERNELS
#error "ATTNCHECK_FAKE_KERNELS (path of the fake kernel library) must be defined by the build"
#endif

namespace attncheck {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class UnsafeWrites : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("ATTNCHECK_FAKE_FAULT");
    ::unsetenv("ATTNCHECK_FAKE_GUARD_BYTE");
  }
  static Result run(const std::string& op_name, const Params& given, const char* fault) {
    if (fault)
      ::setenv("ATTNCHECK_FAKE_FAULT", fault, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_FAULT");
    const auto lib = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS);
    const Op* op = find_op(op_name);
    EXPECT_NE(op, nullptr);
    DeviceRunner runner(*lib, "fake-cpu");
    EvalContext ctx;
    ctx.device = &runner;
    ctx.options.arch = "fake-cpu";
    return evaluate(op->make_case(given), ctx);
  }
};

// An invalid configuration must be refused without writing: a refusal after a write is a failure
// naming the write, not refused_as_expected.
TEST_F(UnsafeWrites, ARefusalThatWroteFirstFails) {
  const Params invalid = {{"heads", 3}};  // selftest_axpy: heads must be a power of two
  const Result clean = run("selftest_axpy", invalid, nullptr);
  EXPECT_EQ(clean.verdict, Verdict::refused_as_expected) << clean.message;
  const Result wrote = run("selftest_axpy", invalid, "write_then_refuse");
  EXPECT_EQ(wrote.verdict, Verdict::failed) << wrote.message;
  EXPECT_TRUE(
      contains(wrote.message, "refused, but wrote: byte 0 of buffer 'x' changed (input 'x')"))
      << wrote.message;
}

// Every byte of the leading guard is checked: the first (farthest from the buffer), one in the
// middle and the second to last, as well as the last (silent_failures_test.cpp's guard_before).
TEST_F(UnsafeWrites, EveryLeadingGuardByteIsChecked) {
  const size_t G = DeviceRunner::kGuardBytes;
  for (const size_t back : {G, G / 2 + 1, size_t{2}}) {
    const std::string at = std::to_string(back);
    ::setenv("ATTNCHECK_FAKE_GUARD_BYTE", at.c_str(), 1);
    const Result r = run("page_indices", {{"batch", 5}}, "guard_before_at");
    EXPECT_EQ(r.verdict, Verdict::failed) << "byte -" << at << ": " << r.message;
    const std::regex named("guard before buffer of 'page_indices' overwritten at byte -" + at +
                           "(\\D|$)");
    EXPECT_TRUE(std::regex_search(r.message, named)) << "byte -" << at << ": " << r.message;
  }
}

// selftest_axpy's strided layout: rows of 64 elements 71 apart. Element 64 of the storage lies
// inside the output's extent but belongs to no element of the view: writing it is a violation,
// named as a gap of that view. A dense view has no gap: the fault writes nothing and it passes.
TEST_F(UnsafeWrites, AWriteIntoAGapOfAStridedOutputFails) {
  const Result gap = run("selftest_axpy", {{"heads", 2}, {"layout", "strided"}}, "gap_in_view");
  EXPECT_EQ(gap.verdict, Verdict::failed) << gap.message;
  EXPECT_TRUE(contains(gap.message,
                       "byte 256 of buffer 'out' changed (gap inside view of 'out'): the kernel "
                       "must not write there"))
      << gap.message;
  const Result dense = run("selftest_axpy", {{"heads", 2}}, "gap_in_view");
  EXPECT_EQ(dense.verdict, Verdict::passed) << dense.message;
}

}  // namespace
}  // namespace attncheck
