#include "run/prepared.h"

#include <gtest/gtest.h>

#include "ops/op.h"

namespace attncheck {
namespace {

Case axpy_case(int heads) {
  const Op* op = find_op("selftest_axpy");
  EXPECT_NE(op, nullptr);
  return op->make_case({{"heads", heads}});
}

Problem make_axpy(const Case& c, int* made) {
  ++*made;
  return find_op(c.op)->problem(c);
}

TEST(PreparedCases, MakesACaseOnceAndSharesItsStorages) {
  PreparedCases kept;
  const Case c = axpy_case(4);
  int made = 0;
  const Problem first = kept.problem(c, [&] { return make_axpy(c, &made); });
  const Problem again = kept.problem(c, [&] { return make_axpy(c, &made); });
  EXPECT_EQ(made, 1);
  ASSERT_EQ(first.args.size(), again.args.size());
  EXPECT_EQ(first.args[0].tensor.storage(), again.args[0].tensor.storage());
  EXPECT_EQ(kept.kept_cases(), 1u);
}

TEST(PreparedCases, AnotherCaseUnderTheSameIdIsMadeAnew) {
  PreparedCases kept;
  Case c = axpy_case(4);
  int made = 0;
  (void)kept.problem(c, [&] { return make_axpy(c, &made); });
  c.params["heads"] = 2;
  const Problem other = kept.problem(c, [&] { return make_axpy(c, &made); });
  EXPECT_EQ(made, 2);
  EXPECT_EQ(other.args[0].tensor.size(0), 2);
  EXPECT_EQ(kept.kept_cases(), 1u);
}

TEST(PreparedCases, DropsTheLeastRecentlyUsedBeyondItsBytes) {
  const Case a = axpy_case(4), b = axpy_case(3);
  int made = 0;
  PreparedCases probe;
  (void)probe.problem(a, [&] { return make_axpy(a, &made); });
  PreparedCases kept(probe.kept_bytes() + 1);  // room for one of them
  made = 0;
  (void)kept.problem(a, [&] { return make_axpy(a, &made); });
  (void)kept.problem(b, [&] { return make_axpy(b, &made); });
  (void)kept.problem(a, [&] { return make_axpy(a, &made); });
  EXPECT_EQ(made, 3);
  EXPECT_EQ(kept.kept_cases(), 1u);
  EXPECT_LE(kept.kept_bytes(), probe.kept_bytes() + 1);
}

TEST(PreparedCases, DerivesDefaultChecksOncePerSourceOfExpectedOutputs) {
  PreparedCases kept;
  const Case c = axpy_case(4);
  int made = 0, derived = 0;
  (void)kept.problem(c, [&] { return make_axpy(c, &made); });
  auto derive = [&] {
    ++derived;
    return std::vector<OutputCheck>{OutputCheck{"out", {}, {}, {}}};
  };
  EXPECT_EQ(kept.default_checks(c.id, "golden", derive).size(), 1u);
  EXPECT_EQ(kept.default_checks(c.id, "golden", derive).size(), 1u);
  EXPECT_EQ(derived, 1);
  (void)kept.default_checks(c.id, "reference", derive);
  EXPECT_EQ(derived, 2);
  (void)kept.default_checks("selftest_axpy/not-kept", "golden", derive);
  (void)kept.default_checks("selftest_axpy/not-kept", "golden", derive);
  EXPECT_EQ(derived, 4);  // a case whose problem is not kept keeps no checks either
}

}  // namespace
}  // namespace attncheck
