// The invariance check on the CPU (docs/verification.md "Invariance"): the relation builders keep
// the logical problem, and against the fake kernel library a correct kernel passes every relation
// (bitwise where it declares the property) while a kernel whose result depends on the batch is
// caught by the declared batch invariance, the relation named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "ops/relation.h"
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

// A small decode_attention case: 4 requests of up to 40 tokens, page size 16, 4 splits.
const Params kDecode = {{"lk_lv", "128x128"}, {"is_mla", false}, {"heads", 4}, {"kv_heads", 2},
                        {"batch", 4},         {"max_ctx", 40},   {"splits", 4}};

Problem decode_problem(const Params& extra = Params::object()) {
  const Op* op = find_op("decode_attention");
  Params given = kDecode;
  given.update(extra);
  return op->problem(op->make_case(given));
}

TEST(Relations, DerangementMovesEveryRequest) {
  for (int64_t n = 2; n < 9; ++n) {
    const auto order = derangement(n, 7);
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_NE(order[static_cast<size_t>(i)], i) << n;
  }
  EXPECT_EQ(derangement(1, 7), std::vector<int64_t>{0});
}

TEST(Relations, DecodeDeclaresPermutationAloneSplitsAndPages) {
  const Problem p = decode_problem();
  const auto rels = find_op("decode_attention")->relations(p);
  std::vector<std::string> names;
  for (const auto& r : rels) names.push_back(r.name);
  ASSERT_EQ(rels.size(), 5u);
  EXPECT_TRUE(contains(names[0], "batch permutation [")) << names[0];
  EXPECT_TRUE(contains(names[1], "alone vs in the batch of 4")) << names[1];
  EXPECT_EQ(names[2], "split count 4 -> 1");
  EXPECT_TRUE(contains(names[3], "shuffled physical page order")) << names[3];
  EXPECT_TRUE(contains(names[4], "the same cache at page size 1")) << names[4];
  // Page size 1: the same storages as 3-D caches, one table entry per token.
  const Problem& ones = rels[4].problem;
  const int64_t P = p.arg("k_buffer").size(1);
  ASSERT_GT(P, 1);
  EXPECT_EQ(ones.kernel_params["page_size"], 1);
  EXPECT_EQ(ones.arg("k_buffer").ndim(), 3);
  EXPECT_EQ(ones.arg("k_buffer").size(0), p.arg("k_buffer").size(0) * P);
  EXPECT_EQ(ones.arg("k_buffer").storage(), p.arg("k_buffer").storage());
  EXPECT_EQ(ones.arg("req_to_token").size(1), p.arg("req_to_token").size(1) * P);
  const int32_t first_page = p.arg("req_to_token").at<int32_t>({0, 0});
  EXPECT_EQ(ones.arg("req_to_token").at<int32_t>({0, 1}), first_page * P + 1);
  EXPECT_TRUE(rels[4].bitwise_under.empty());
  EXPECT_EQ(rels[2].problem.kernel_params["num_kv_splits"], 1);
  EXPECT_TRUE(rels[2].own_budgets);
  // The longest request alone: a batch of one with its block-table row and length.
  const Problem& alone = rels[1].problem;
  EXPECT_EQ(alone.arg("q").size(0), 1);
  EXPECT_EQ(alone.arg("b_seq_len").at<int32_t>({0}), 40);
}

// The reference of each transformed problem, mapped back, is the case's reference: the relations
// keep the logical problem (pages moved with their table entries, requests with their rows). Up to
// float64 rounding: the MLA reference's matrix products are not batch-invariant themselves.
TEST(Relations, MappedBackReferenceIsTheCasesReference) {
  Params decode_strided = kDecode, decode_cross = kDecode;
  decode_strided.update(Params{{"layout", "strided"}, {"page_size", 1}});
  decode_cross.update(Params{{"layout", "cross_layer"}, {"is_mla", true}, {"lk_lv", "576x512"}});
  const Params mla = {{"heads", 16}, {"qlen", 2}, {"batch", 3}};
  const Params mla_odd = {
      {"heads", 8}, {"qlen", 3}, {"batch", 2}, {"layout", "transposed"}, {"block_size", 1}};
  const std::vector<std::pair<const char*, Params>> cases = {{"decode_attention", kDecode},
                                                             {"decode_attention", decode_strided},
                                                             {"decode_attention", decode_cross},
                                                             {"mla_decode", mla},
                                                             {"mla_decode", mla_odd},
                                                             {"sparse_mla", mla},
                                                             {"sparse_mla", mla_odd}};
  for (const auto& [op_name, given] : cases) {
    const Op* op = find_op(op_name);
    const Problem p = op->problem(op->make_case(given));
    const TensorMap expected = op->reference(p);
    for (const auto& rel : op->relations(p)) {
      EXPECT_EQ(rel.problem.kernel, p.kernel);
      const TensorMap mapped = rel.back(op->reference(rel.problem), expected);
      for (const auto& [name, t] : expected) {
        const auto want = t.to_vector(), got = mapped.at(name).to_vector();
        ASSERT_EQ(want.size(), got.size());
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_LE(std::fabs(want[i] - got[i]), 1e-9 * (1 + std::fabs(want[i])))
              << op_name << ": " << rel.name << ": '" << name << "' element " << i;
      }
    }
  }
}

// The indexer ops and page_indices (issue 37): which relations each declares on a small case,
// by name; every one keeps the logical problem (the reference mapped back is the case's, exactly:
// these references are row-wise or bitwise).
const std::vector<std::pair<const char*, Params>>& indexer_cases() {
  static const std::vector<std::pair<const char*, Params>> cases = {
      {"indexer_k_cache", {{"tokens", 40}, {"block_size", 16}}},
      {"indexer_k_cache", {{"tokens", 9}, {"block_size", 1}, {"k_stride", 192}}},
      {"indexer_gather", {{"batch", 3}, {"max_ctx", 70}, {"block_size", 16}}},
      {"indexer_q_quant", {{"tokens", 6}, {"heads", 8}}},
      {"indexer_logits_prefill", {{"heads", 16}, {"max_ctx", 40}, {"qlen", 6}}},
      {"indexer_logits_decode", {{"heads", 16}, {"batch", 3}, {"next_n", 2}, {"max_ctx", 70}}},
      {"indexer_topk_prefill", {{"topk", 8}, {"max_ctx", 40}, {"qlen", 6}}},
      {"indexer_topk_decode", {{"topk", 8}, {"batch", 4}, {"next_n", 2}, {"max_ctx", 40}}},
      {"indexer_mxfp4_k_cache", {{"tokens", 20}}},
      {"indexer_mxfp4_logits_decode", {{"heads", 8}, {"batch", 3}, {"next_n", 2}}},
      {"page_indices", {{"batch", 4}, {"max_ctx", 60}}},
      {"kv_cache_write", {{"tokens", 24}}},
      {"kv_cache_write", {{"tokens", 15}, {"kv", "e4m3fn"}, {"key", "qkv"}, {"layout", "shuffle"}}},
      {"kv_cache_write",
       {{"quant", "per_token"}, {"layout", "paged"}, {"kv", "e4m3fnuz"}, {"rows", "zero_tiny"}}}};
  return cases;
}

TEST(Relations, IndexerOpsDeclareTheirRelations) {
  const std::map<std::string, std::vector<std::string>> want = {
      {"indexer_k_cache",
       {"token permutation [",
        "tokens [20, 40) alone vs the whole 40 "
        "(chunked), into the outputs as tokens [0, 20)"}},
      {"indexer_gather", {"batch permutation [", "alone vs in the batch of 3", "shuffled"}},
      {"indexer_q_quant", {"token permutation [", "tokens [3, 6) alone vs the whole 6"}},
      {"indexer_logits_prefill", {"query row permutation [", "query rows ["}},
      {"indexer_logits_decode", {"batch permutation [", "alone vs in the batch of 3", "shuffled"}},
      {"indexer_topk_prefill", {"row permutation [", "rows ["}},
      {"indexer_topk_decode", {"batch permutation [", "alone vs in the batch of 4"}},
      {"indexer_mxfp4_k_cache", {"token permutation [", "(chunked), into the outputs"}},
      {"kv_cache_write",
       {"token permutation [", "tokens [12, 24) alone vs the whole 24 (chunked)"}},
      {"indexer_mxfp4_logits_decode",
       {"batch permutation [", "alone vs in the batch of 3", "shuffled"}},
      {"page_indices", {"batch permutation [", "alone vs in the batch of 4"}}};
  std::set<std::string> seen;
  for (const auto& [op_name, given] : indexer_cases()) {
    if (!seen.insert(op_name).second) continue;
    const Op* op = find_op(op_name);
    const auto rels = op->relations(op->problem(op->make_case(given)));
    const auto& names = want.at(op_name);
    ASSERT_EQ(rels.size(), names.size()) << op_name;
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_TRUE(contains(rels[i].name, names[i])) << op_name << ": " << rels[i].name;
  }
}

TEST(Relations, IndexerRelationsKeepTheLogicalProblem) {
  for (const auto& [op_name, given] : indexer_cases()) {
    const Op* op = find_op(op_name);
    const Problem p = op->problem(op->make_case(given));
    const TensorMap expected = op->reference(p);
    const auto rels = op->relations(p);
    ASSERT_FALSE(rels.empty()) << op_name;
    for (const auto& rel : rels) {
      const TensorMap mapped = rel.back(op->reference(rel.problem), expected);
      for (const auto& [name, t] : expected) {
        const auto want = t.to_vector(), got = mapped.at(name).to_vector();
        ASSERT_EQ(want.size(), got.size()) << op_name << ": " << rel.name;
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_TRUE(want[i] == got[i] || (std::isnan(want[i]) && std::isnan(got[i])))
              << op_name << ": " << rel.name << ": '" << name << "' element " << i << ": "
              << want[i] << " vs " << got[i];
      }
    }
  }
}

// The chunked write is not vacuous: a writer that starts the second chunk from the case's
// original cache (losing the first chunk's tokens, as one rewriting whole pages from scratch
// would) fails it.
TEST(Relations, ChunkedWriteSeesAWriterThatLosesTheFirstChunk) {
  for (const char* op_name : {"indexer_k_cache", "indexer_mxfp4_k_cache", "kv_cache_write"}) {
    const Op* op = find_op(op_name);
    const Problem p = op->problem(op->make_case({{"tokens", 24}}));
    const TensorMap expected = op->reference(p);
    for (const auto& rel : op->relations(p)) {
      if (!contains(rel.name, "chunked")) continue;
      Problem lost = rel.problem;
      for (const auto& [name, t] : expected) lost.arg(name) = p.arg(name);
      const TensorMap mapped = rel.back(op->reference(lost), expected);
      bool same = true;
      for (const auto& c : check_outputs(op->checks(p, expected), expected, mapped))
        same = same && c.passed;
      EXPECT_FALSE(same) << op_name << ": " << rel.name;
    }
  }
}

TEST(Relations, PagesOfASparseCacheAreNotShuffled) {
  const Problem p = decode_problem({{"offset_log2", 31}, {"batch", 2}});
  for (const auto& rel : find_op("decode_attention")->relations(p))
    EXPECT_FALSE(contains(rel.name, "page order")) << rel.name;
}

class FakeInvariance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { lib_ = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS).release(); }
  void TearDown() override {
    ::unsetenv("ATTNCHECK_FAKE_FAULT");
    ::unsetenv("ATTNCHECK_FAKE_PROPERTIES");
  }
  Result run(const char* fault, const char* properties) {
    if (fault)
      ::setenv("ATTNCHECK_FAKE_FAULT", fault, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_FAULT");
    if (properties)
      ::setenv("ATTNCHECK_FAKE_PROPERTIES", properties, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_PROPERTIES");
    const Op* op = find_op("decode_attention");
    // Its own library object: the declared properties are asked once per entry and kept.
    const auto lib = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS);
    DeviceRunner runner(*lib, "fake-cpu");
    EvalContext ctx;
    ctx.device = &runner;
    ctx.options.arch = "fake-cpu";
    return evaluate(op->make_case(kDecode), ctx);
  }
  static inline KernelLibrary* lib_ = nullptr;  // never closed
};

TEST_F(FakeInvariance, CorrectKernelPassesEveryRelationBitwise) {
  const Result r = run(nullptr, "batch-invariant, split-invariant,page-order-invariant");
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  ASSERT_EQ(r.invariance.size(), 5u);
  for (const auto& o : r.invariance) {
    EXPECT_TRUE(o.passed) << o.relation << ": " << o.message;
    // No property names the page size: that relation holds within the case's budgets.
    const bool page_size = contains(o.relation, "page size 1");
    EXPECT_EQ(o.mode, page_size ? "budget" : "bitwise") << o.relation;
  }
  // The record carries the outcomes through results.jsonl.
  const Result back = Result::from_json(r.to_json());
  ASSERT_EQ(back.invariance.size(), 5u);
  EXPECT_EQ(back.invariance[1].relation, r.invariance[1].relation);
  EXPECT_EQ(back.invariance[1].mode, "bitwise");
}

TEST_F(FakeInvariance, WithoutPropertiesRelationsHoldWithinBudget) {
  const Result r = run(nullptr, nullptr);
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  ASSERT_EQ(r.invariance.size(), 5u);
  for (const auto& o : r.invariance) {
    EXPECT_TRUE(o.passed) << o.relation << ": " << o.message;
    EXPECT_EQ(o.mode, "budget") << o.relation;
  }
}

// A kernel whose result changes in a batch of one (like a split count chosen from the batch size):
// within every budget, so only the declared batch invariance catches it, naming the relation.
TEST_F(FakeInvariance, BatchDependentKernelFailsTheDeclaredBatchInvariance) {
  const Result caught = run("batch_of_one", "batch-invariant");
  EXPECT_EQ(caught.verdict, Verdict::failed) << caught.message;
  EXPECT_TRUE(contains(caught.message,
                       "invariance: request 3 alone vs in the batch of 4: 'lse' "
                       "differs bitwise"))
      << caught.message;
  int failed = 0;
  for (const auto& o : caught.invariance) failed += !o.passed;
  EXPECT_EQ(failed, 1);
  // Undeclared, the same kernel is within budget: the relation passes at budget level.
  const Result budget = run("batch_of_one", nullptr);
  EXPECT_EQ(budget.verdict, Verdict::passed) << budget.message;
}

TEST_F(FakeInvariance, UnknownPropertyFailsNamingIt) {
  const Result r = run(nullptr, "batch-invariant,order-free");
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_TRUE(contains(r.message, "declares unknown properties 'order-free'")) << r.message;
}

TEST_F(FakeInvariance, OffInRunOptions) {
  const Op* op = find_op("decode_attention");
  DeviceRunner runner(*lib_, "fake-cpu");
  EvalContext ctx;
  ctx.device = &runner;
  ctx.options.invariance = false;
  const Result r = evaluate(op->make_case(kDecode), ctx);
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_TRUE(r.invariance.empty());
}

}  // namespace
}  // namespace attncheck
