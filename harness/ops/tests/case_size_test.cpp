// The size budget (CaseSize in ops/op.h, docs/cases.md "Size budget"): each op's declared size
// bounds what its make() holds and is close enough to mean something, every case of the
// repository's tiers fits the default budget, and cases past it are refused by name before
// anything is allocated (issue 38 item 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>

#include "ops/op.h"
#include "run/cases.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

// The host bytes a problem's arguments hold: each storage once, a sparse one by its window.
double held_bytes(const Problem& p) {
  std::set<const Storage*> seen;
  double n = 0;
  for (const auto& a : p.args) {
    const auto& s = a.tensor.storage();
    if (s && seen.insert(s.get()).second) n += static_cast<double>(s->bytes.size());
  }
  return n;
}

std::string refusal(const std::string& op, const Params& params) {
  try {
    (void)find_op(op)->make_case(params);
  } catch (const CaseSizeError& e) {
    return e.what();
  }
  return "";
}

// Every smoke case and every fifth quick case of each op: the declared bytes are at least what
// make() holds (64 KiB of fixed overhead aside: guards, 256-byte storage offsets) and at most
// 64 times it plus 4 MiB, so a declaration can neither miss a tensor nor be vacuous.
TEST(CaseSize, DeclaredBytesBoundWhatMakeHolds) {
  const auto files = load_case_dir(default_root() + "/cases");
  std::map<std::string, int> checked;
  for (const auto& f : files)
    for (const char* tier : {"smoke", "quick"}) {
      const auto it = f.tiers.find(tier);
      if (it == f.tiers.end()) continue;
      for (size_t i = 0; i < it->second.size(); i += std::string(tier) == "smoke" ? 1 : 5) {
        const Case& c = it->second[i];
        const Op* op = find_op(c.op);
        const double declared = op->size(c.params).bytes();
        const double held = held_bytes(op->problem(c));
        EXPECT_GE(declared + 65536, held) << c.id << ": declares less than make() holds";
        EXPECT_LE(declared, 64 * held + 4.0 * (1 << 20)) << c.id << ": declares far too much";
        ++checked[c.op];
      }
    }
  for (const Op* op : all_ops()) {
    if (op->name().rfind("selftest", 0) != 0) {
      EXPECT_GT(checked[op->name()], 0) << op->name();
    }
  }
}

// Today's cases fit the default budget: the accuracy tiers with room (a quarter of it), the
// production-sized bench cases (decode_attention's MHA cache alone holds 1.07 GB) whole.
TEST(CaseSize, EveryRepositoryCaseFitsTheDefaultBudget) {
  SizeLimits quarter;
  quarter.bytes /= 4;
  quarter.work /= 4;
  for (const auto& f : load_case_dir(default_root() + "/cases"))
    for (const auto& [tier, cases] : f.tiers)
      for (const auto& c : cases) {
        const auto why =
            find_op(c.op)->size_error(c.params, tier == "bench" ? SizeLimits{} : quarter);
        EXPECT_FALSE(why) << c.id << " (" << tier << "): " << why.value_or("");
      }
}

// The probes of issue 38: refused at once, naming the case, the axis and the limit.
TEST(CaseSize, OversizedCasesAreRefusedBeforeAllocation) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = refusal("page_indices", {{"max_ctx", 100000000}, {"batch", 16}});
  EXPECT_NE(ctx.find("page_indices/bs16-b16-ctx100000000"), std::string::npos) << ctx;
  EXPECT_NE(ctx.find("axis 'max_ctx' = 100000000 is outside"), std::string::npos) << ctx;
  EXPECT_NE(ctx.find("131072"), std::string::npos) << ctx;

  const std::string huge = refusal("page_indices", {{"max_ctx", int64_t{1} << 40}});
  EXPECT_NE(huge.find("axis 'max_ctx'"), std::string::npos) << huge;

  const std::string square = refusal("page_indices", {{"max_ctx", 131072}, {"batch", 131072}});
  EXPECT_NE(square.find("too large: axis '"), std::string::npos) << square;
  EXPECT_NE(square.find("$ATTNCHECK_MAX_CASE_BYTES"), std::string::npos) << square;

  const std::string decode = refusal("decode_attention", {{"max_ctx", 100000}, {"batch", 100000}});
  EXPECT_NE(decode.find("decode_attention/"), std::string::npos) << decode;
  EXPECT_NE(decode.find("too large: axis '"), std::string::npos) << decode;

  // A count of nothing is a case error (Op::case_error), as the op's own unbuildable() is.
  const Op& pages = *find_op("page_indices");
  EXPECT_EQ(pages.case_error(pages.make_case({{"batch", 0}}).params).value_or(""),
            "axis 'batch' = 0 counts nothing: it must be at least 1");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// The limits come from the environment, and a value that is no positive integer names its
// variable.
TEST(CaseSize, LimitsFromTheEnvironment) {
  ::setenv("ATTNCHECK_MAX_CASE_BYTES", "1000", 1);
  const std::string small = refusal("page_indices", Params::object());
  EXPECT_NE(small.find("over the limit of 1000 bytes"), std::string::npos) << small;
  ::setenv("ATTNCHECK_MAX_CASE_BYTES", "abc", 1);
  try {
    (void)size_limits();
    ADD_FAILURE() << "a bad limit was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("$ATTNCHECK_MAX_CASE_BYTES='abc'"), std::string::npos);
  }
  ::unsetenv("ATTNCHECK_MAX_CASE_BYTES");
  EXPECT_EQ(refusal("page_indices", Params::object()), "");
}

}  // namespace
}  // namespace attncheck
