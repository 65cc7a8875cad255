// rope and indexer_qk_rope on a GPU: the smoke and quick tiers of cases/rope.toml and
// cases/indexer_qk_rope.toml through the library named by ATTNCHECK_KERNELS; refusals; and, when
// the mutant library sits beside it (or in ATTNCHECK_MUTANT_DIR), proof that a fast path that
// discards an out-of-place RoPE is caught at positions >= 1 and only there. Skips, with the
// reason, when there is no library or no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>

#include "device_test_support.h"

namespace attncheck {
namespace {

using namespace devtest;

TEST(RopeDevice, SmokeAndQuickTiersPass) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  for (const char* op_name : {"rope", "indexer_qk_rope"}) {
    const Op* op = find_op(op_name);
    ASSERT_NE(op, nullptr);
    for (const std::string& tier : device_tiers()) {
      const auto cases = tier_cases(op_name, {tier});
      ASSERT_FALSE(cases.empty()) << op_name << " " << tier;
      // Every case must pass: here a refusal is a failure too.
      double max_abs = 0;
      const Tally t = run_all(*op, cases, *gpu, 2, [&](const Case& c, const Result& r) {
        if (r.verdict != Verdict::passed)
          ADD_FAILURE() << c.id << ": " << verdict_name(r.verdict) << ": " << r.message;
        for (const auto& ch : r.checks) max_abs = std::max(max_abs, ch.metrics.max_abs);
      });
      std::printf(
          "[%s %s on %s] %d/%d passed (repeat 2), max |err| %.3g, worst err/budget %.3f "
          "(%s), kernel wall %.1f ms\n",
          op_name, tier.c_str(), gpu->arch.c_str(), t.passed, t.cases, max_abs, t.worst_ratio,
          t.worst_where().c_str(), t.kernel_ms);
    }
  }
}

TEST(RopeDevice, RefusesInconsistentArguments) {
  std::string why;
  auto gpu = open_default_gpu(&why, "");
  if (!gpu) GTEST_SKIP() << why;
  {
    // q's rotated width must be the cache's rot.
    const Op* op = find_op("rope");
    Problem p = op->make(op->make_case({{"rot", 32}}));
    for (auto& a : p.args)
      if (a.name == "cos_sin_cache") a.tensor = Tensor::full(DType::f32, {16, 64}, 0.5);
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED);
    EXPECT_NE(o.message.find("rope: views must be [T=8, H, rot=64]"), std::string::npos)
        << o.message;
  }
  {
    const Op* op = find_op("indexer_qk_rope");
    Problem p = op->make(op->make_case(Params::object()));
    p.kernel_params["path"] = "fused";
    const auto o = gpu->runner->run(p);
    EXPECT_EQ(o.status, ATTNCHECK_REFUSED);
    EXPECT_NE(o.message.find("path must be generic or fast, got 'fused'"), std::string::npos)
        << o.message;
  }
}

TEST(RopeDevice, DiscardOutOfPlaceMutantIsCaughtAtPositionsAboveZeroOnly) {
  expect_mutant_killed(
      "rope", "rope_discard_out_of_place", "indexer_qk_rope", [](const Case&) { return true; },
      "generic path and position-0");
}

}  // namespace
}  // namespace attncheck
