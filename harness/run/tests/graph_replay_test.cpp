// The graph-replay step without a GPU: the ops' metadata variants (ops/graph_variant.h), the
// step's verdicts (run/graph_replay.h), and the whole step through the fake kernel library, whose
// graph capture records the call and replays it — or, with ATTNCHECK_FAKE_GRAPH=bake, replays
// with the inputs it saw at capture, as a wrapper that read its metadata on the host would.
#include <gtest/gtest.h>

#include <cstdlib>

#include "run/device.h"
#include "run/evaluate.h"
#include "run/graph_replay.h"

#ifndef ATTNCHECK_FAKE_KERNELS
#error "ATTNCHECK_FAKE_KERNELS (path of the fake kernel library) must be defined by the build"
#endif

namespace attncheck {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

Tensor i32(std::vector<int32_t> v) {
  Tensor t = Tensor::empty(DType::i32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.at<int32_t>({static_cast<int64_t>(i)}) = v[i];
  return t;
}

std::vector<int32_t> values(const Tensor& t) {
  std::vector<int32_t> v;
  t.for_each_index([&](const Index& idx, int64_t) { v.push_back(t.at<int32_t>(idx)); });
  return v;
}

TEST(GraphVariant, HalvedLengthsStayAtLeastTheMinimum) {
  const Tensor lens = i32({1, 2, 7, 64});
  EXPECT_TRUE(halve_lengths(lens, 1));
  EXPECT_EQ(values(lens), (std::vector<int32_t>{1, 1, 3, 32}));
  const Tensor short_ones = i32({1, 1});
  EXPECT_FALSE(halve_lengths(short_ones, 1));
  EXPECT_THROW(halve_lengths(Tensor::empty(DType::i64, {2}), 1), std::invalid_argument);
}

TEST(GraphVariant, PermutedBlockIdsAreTheSameIdsElsewhereAndFillersStay) {
  Tensor table = Tensor::full(DType::i32, {2, 3}, -7);
  table.at<int32_t>({0, 0}) = 5;
  table.at<int32_t>({0, 1}) = 2;
  table.at<int32_t>({1, 0}) = 9;
  EXPECT_TRUE(permute_block_ids(table));
  EXPECT_EQ(values(table), (std::vector<int32_t>{9, 5, -7, 2, -7, -7}));
  Tensor single = Tensor::full(DType::i32, {1, 2}, -7);
  single.at<int32_t>({0, 0}) = 3;  // one id: nothing to permute
  EXPECT_FALSE(permute_block_ids(single));
}

TEST(GraphVariant, ReversalChangesOnlyUnequalElements) {
  const Tensor pos = i32({4, 0, 9});
  EXPECT_TRUE(reverse_elements(pos));
  EXPECT_EQ(values(pos), (std::vector<int32_t>{9, 0, 4}));
  EXPECT_FALSE(reverse_elements(i32({3, 3, 3})));
}

TEST(GraphVariant, DroppedSecondHalfKeepsEachRowsFirstIndices) {
  Tensor idx = Tensor::full(DType::i32, {3, 4}, -1);
  for (int32_t j = 0; j < 4; ++j) idx.at<int32_t>({0, j}) = 10 + j;  // 4 valid: keeps 2
  idx.at<int32_t>({1, 1}) = 7;                                       // 1 valid: keeps it
  idx.at<int32_t>({2, 0}) = 3, idx.at<int32_t>({2, 2}) = 5, idx.at<int32_t>({2, 3}) = 6;  // 3: 2
  EXPECT_TRUE(drop_second_half(idx));
  EXPECT_EQ(values(idx), (std::vector<int32_t>{10, 11, -1, -1, -1, 7, -1, -1, 3, -1, 5, -1}));
  Tensor one = Tensor::full(DType::i32, {1, 3}, -1);
  one.at<int32_t>({0, 2}) = 4;
  EXPECT_FALSE(drop_second_half(one));
  EXPECT_THROW(drop_second_half(i32({1, 2})), std::invalid_argument);
}

Problem two_arg_problem() {
  Problem p;
  p.kernel = "k";
  p.args = {{"lens", i32({8, 6}), Role::input}, {"out", i32({0, 0}), Role::output}};
  return p;
}

TEST(GraphVariant, TheCaseKeepsItsContentsAndNothingUnchangedIsDeclared) {
  const Problem p = two_arg_problem();
  const auto v = metadata_variant(p, {halved("lens", 1), reversed("out")});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(values(p.arg("lens")), (std::vector<int32_t>{8, 6}));  // p untouched
  EXPECT_EQ(values(v->capture.arg("lens")), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(v->changed, std::vector<std::string>{"lens"});  // "out" reversed is the same
  EXPECT_EQ(graph_variant_error(p, *v), "");
  EXPECT_FALSE(metadata_variant(p, {reversed("out")}).has_value());
}

TEST(GraphVariant, WrongDeclarationsAreNamed) {
  const Problem p = two_arg_problem();
  GraphVariant v;
  v.capture = with_own_storages(p, {"lens", "out"});
  v.changed = {"lens"};
  EXPECT_TRUE(contains(graph_variant_error(p, v), "nothing changes"));
  v.capture.arg("out").at<int32_t>({0}) = 1;
  EXPECT_TRUE(contains(graph_variant_error(p, v), "'out' differs but is not declared"));
  v.changed = {"lens", "out"};
  EXPECT_TRUE(contains(graph_variant_error(p, v), "only inputs are metadata"));
  GraphVariant params = {with_own_storages(p, {"lens"}), {"lens"}, "x"};
  params.capture.arg("lens").at<int32_t>({0}) = 1;
  params.capture.kernel_params = {{"max_len", 4}};
  EXPECT_TRUE(contains(graph_variant_error(p, params), "kernel parameters"));
  GraphVariant shape = {p, {"lens"}, "x"};
  shape.capture.args[0].tensor = i32({1, 2, 3});
  EXPECT_TRUE(contains(graph_variant_error(p, shape), "argument 'lens'"));
  EXPECT_THROW(with_own_storages(p, {"nope"}), std::invalid_argument);
}

// Every op that declares metadata gives a valid variant of its default case: same structure,
// only the declared inputs changed.
TEST(GraphVariant, DeclaringOpsGiveValidVariantsOfTheirDefaultCases) {
  for (const char* name : {"decode_attention", "kv_gather", "kv_cache_write", "rope",
                           "indexer_logits_decode", "mla_decode", "sparse_mla", "page_indices"}) {
    const Op* op = find_op(name);
    ASSERT_NE(op, nullptr) << name;
    const Problem p = op->problem(op->make_case(Params::object()));
    const auto v = op->graph_variant(p);
    ASSERT_TRUE(v.has_value()) << name << ": the default case changes no metadata";
    EXPECT_EQ(graph_variant_error(p, *v), "") << name;
    EXPECT_FALSE(v->how.empty()) << name;
  }
}

// The wrappers that read metadata on the host (mla_decode, sparse_mla, page_indices): their
// variants are valid problems of the op (the reference takes them) whose answer fails the case's
// checks, so a replay that kept the capture's metadata fails; over their quick-tier shapes.
TEST(GraphVariant, HostMetadataOpsGiveVariantsWhoseStaleAnswerFails) {
  const std::vector<std::pair<const char*, Params>> cases = {
      {"mla_decode", Params::object()},
      {"mla_decode", {{"qlen", 3}, {"batch", 3}, {"block_size", 1}}},
      {"sparse_mla", Params::object()},
      {"sparse_mla", {{"pattern", "holes"}, {"qlen", 2}}},
      {"page_indices", Params::object()},
      {"page_indices", {{"table", "strided"}, {"block_size", 1}}}};
  for (const auto& [name, given] : cases) {
    const Op* op = find_op(name);
    const Problem p = op->problem(op->make_case(given));
    const auto v = op->graph_variant(p);
    ASSERT_TRUE(v.has_value()) << name << " " << given.dump();
    ASSERT_EQ(graph_variant_error(p, *v), "") << name;
    const TensorMap expected = op->reference(p);
    bool failed = false;
    for (const auto& c :
         check_outputs(op->checks(p, expected), expected, op->reference(v->capture)))
      failed = failed || !c.passed;
    EXPECT_TRUE(failed) << name << " " << given.dump() << ": " << v->how;
  }
}

// A large-offset case's indices on a sparse storage (sparse_mla far_rows) keep their values; the
// variant changes what the host holds whole (the block table).
TEST(GraphVariant, MetadataOnASparseStorageIsLeftAsItIs) {
  const Op* op = find_op("sparse_mla");
  const Problem p = op->problem(op->make_case({{"far_rows", true}}));
  ASSERT_TRUE(p.arg("topk_indices").storage()->sparse());
  const auto v = op->graph_variant(p);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->changed, std::vector<std::string>{"block_table"});
  EXPECT_EQ(graph_variant_error(p, *v), "");
}

CheckResult check(bool passed) {
  CheckResult c;
  c.name = "o";
  c.passed = passed;
  c.message = passed ? "ok" : "max error 3 > budget 0.1";
  return c;
}

TEST(GraphReplayVerdict, UnsupportedSkipsWithTheLibrarysReason) {
  DeviceOutcome o;
  o.status = ATTNCHECK_UNSUPPORTED;
  o.message = "entry reads metadata on the host";
  const auto g = judge_graph_replay("lens halved", o, [](const TensorMap&) {
    ADD_FAILURE() << "nothing to judge";
    return std::vector<CheckResult>{};
  });
  EXPECT_EQ(g.kind, GraphReplayOutcome::Kind::skipped);
  EXPECT_EQ(g.message, "graph replay skipped: entry reads metadata on the host");
}

TEST(GraphReplayVerdict, FailuresNameGraphReplayAndTheVariant) {
  DeviceOutcome error;
  error.status = ATTNCHECK_ERROR;
  error.message = "illegal address";
  const auto e = judge_graph_replay("lens halved", error,
                                    [](const TensorMap&) { return std::vector<CheckResult>{}; });
  EXPECT_EQ(e.kind, GraphReplayOutcome::Kind::failed);
  EXPECT_TRUE(e.device_error);
  EXPECT_TRUE(contains(e.message, "graph replay (captured with lens halved")) << e.message;

  DeviceOutcome ok;
  const auto wrong = judge_graph_replay("lens halved", ok, [](const TensorMap&) {
    return std::vector<CheckResult>{check(true), check(false)};
  });
  EXPECT_EQ(wrong.kind, GraphReplayOutcome::Kind::failed);
  EXPECT_FALSE(wrong.device_error);
  EXPECT_TRUE(contains(wrong.message, "graph replay")) << wrong.message;
  EXPECT_TRUE(contains(wrong.message, "max error 3 > budget 0.1")) << wrong.message;

  ok.violations = {"guard after buffer of 'o' overwritten at byte +0"};
  const auto guard = judge_graph_replay(
      "lens halved", ok, [](const TensorMap&) { return std::vector<CheckResult>{check(true)}; });
  EXPECT_EQ(guard.kind, GraphReplayOutcome::Kind::failed);
  EXPECT_TRUE(contains(guard.message, "guard after buffer")) << guard.message;

  ok.violations.clear();
  const auto passed = judge_graph_replay(
      "lens halved", ok, [](const TensorMap&) { return std::vector<CheckResult>{check(true)}; });
  EXPECT_EQ(passed.kind, GraphReplayOutcome::Kind::passed);
  EXPECT_EQ(passed.message, "graph replay within budget (lens halved at capture)");
}

// The whole step through the fake library.
class FakeGraphs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    lib_ = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS).release();
    ::setenv("ATTNCHECK_FAKE_EXT_SIZE", "before_graph", 1);
    old_lib_ = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS).release();
    ::unsetenv("ATTNCHECK_FAKE_EXT_SIZE");
  }
  void TearDown() override { ::unsetenv("ATTNCHECK_FAKE_GRAPH"); }
  static Result run(const KernelLibrary& lib, const std::string& op_name, const char* mode) {
    if (mode)
      ::setenv("ATTNCHECK_FAKE_GRAPH", mode, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_GRAPH");
    const Op* op = find_op(op_name);
    EXPECT_NE(op, nullptr);
    DeviceRunner runner(lib, "fake-cpu");
    EvalContext ctx;
    ctx.device = &runner;
    ctx.options.arch = "fake-cpu";
    return evaluate(op->make_case(Params::object()), ctx);
  }
  // never closed (GPU runtimes dislike dlclose)
  static inline KernelLibrary* lib_ = nullptr;
  static inline KernelLibrary* old_lib_ = nullptr;
};

TEST_F(FakeGraphs, ACorrectCaptureReplaysWithinBudget) {
  for (const char* op :
       {"decode_attention", "rope", "kv_cache_write", "mla_decode", "sparse_mla", "page_indices"}) {
    const Result r = run(*lib_, op, nullptr);
    EXPECT_EQ(r.verdict, Verdict::passed) << op << ": " << r.message;
    EXPECT_TRUE(contains(r.message, "graph replay within budget")) << op << ": " << r.message;
  }
}

TEST_F(FakeGraphs, BakedMetadataFailsNamingGraphReplay) {
  for (const char* op :
       {"decode_attention", "rope", "kv_cache_write", "mla_decode", "sparse_mla", "page_indices"}) {
    const Result r = run(*lib_, op, "bake");
    EXPECT_EQ(r.verdict, Verdict::failed) << op << ": " << r.message;
    EXPECT_TRUE(contains(r.message, "graph replay (captured with")) << op << ": " << r.message;
  }
}

TEST_F(FakeGraphs, AnEntryThatCannotBeCapturedIsSkippedWithItsReason) {
  const Result r = run(*lib_, "decode_attention", "off");
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_TRUE(contains(r.message, "graph replay skipped: fake library: graph capture off"))
      << r.message;
}

TEST_F(FakeGraphs, ALibraryWithoutTheFieldsIsSkippedNotFailed) {
  ASSERT_FALSE(DeviceRunner(*old_lib_, "fake-cpu").can_capture_graphs());
  const Result r = run(*old_lib_, "decode_attention", "bake");
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_TRUE(contains(r.message, "graph replay skipped")) << r.message;
  EXPECT_TRUE(contains(r.message, "offers no graph capture")) << r.message;
}

TEST_F(FakeGraphs, OpsWithoutMetadataKeepTheirMessage) {
  const Result r = run(*lib_, "selftest_axpy", "bake");
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_EQ(r.message, "all checks within budget");
}

}  // namespace
}  // namespace attncheck
