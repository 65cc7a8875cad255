// kv_cache_write, kv_gather, rope and indexer_qk_rope as typed ops (ops/typed_op.h): case ids
// stay as they were (goldens are named by them), axis combinations that describe no case are case
// errors naming the case, none of these ops refuses a buildable case, the kernel's JSON keeps its
// wire types, and references read the typed parameters, never the kernel's JSON back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/op.h"
#include "ops/tests/registered_op.h"

namespace attncheck {
namespace {

const Op& op(const char* name) {
  return registered_op(name);
}

Problem problem(const char* name, const Params& given) {
  return op(name).problem(op(name).make_case(given));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  bool same = true;
  a.for_each_index([&](const Index& i, int64_t) { same = same && a.get_bits(i) == b.get_bits(i); });
  return same;
}

TEST(KvRopeOps, CaseIdsAtDefaultsAndOutOfIdAxes) {
  EXPECT_EQ(op("kv_cache_write").make_case(Params::object()).id,
            "kv_cache_write/nhd-contiguous-kvmodel-bf16-h2-d64-bs16-t24-scattered-contiguous-s0");
  EXPECT_EQ(op("kv_cache_write")
                .make_case({{"quant", "per_token"},
                            {"layout", "paged"},
                            {"kv", "int8"},
                            {"rows", "zero_tiny"},
                            {"dtype", "f16"}})
                .id,
            "kv_cache_write/per_token-paged-contiguous-kvint8-f16-h2-d64-bs16-t24-scattered-"
            "contiguous-zero_tiny-s0");
  EXPECT_EQ(op("kv_gather").make_case(Params::object()).id,
            "kv_gather/nhd-contiguous-kvmodel-bf16-h1-d64-bs16-full-sp20-b4-ctx50-contiguous-s0");
  EXPECT_EQ(op("kv_gather")
                .make_case({{"kv", "e4m3fn"},
                            {"strides", "hybrid"},
                            {"fp8_codes", "special"},
                            {"offset_log2", 32}})
                .id,
            "kv_gather/nhd-hybrid-kve4m3fn-bf16-h1-d64-bs16-full-sp20-b4-ctx50-contiguous-s0-"
            "fp8special-offlog32");
  EXPECT_EQ(op("rope").make_case(Params::object()).id,
            "rope/neox-front-inplace-bf16-csf32-possmall-h4-hd128-rot64-t8-s0");
  EXPECT_EQ(op("indexer_qk_rope").make_case({{"style", "gptj"}, {"cache", "model"}}).id,
            "indexer_qk_rope/gptj-fast-bf16-csmodel-possmall-h8-t8-s0");
}

TEST(KvRopeOps, UnbuildableCombinationsAreCaseErrorsNamingTheCase) {
  struct Bad {
    const char* op;
    Params given;
    std::string why;
  };
  const std::vector<Bad> bad = {
      {"kv_cache_write",
       {{"quant", "per_token"}, {"kv", "int8"}},
       "per_token caches are shuffle (asm_layout) or paged"},
      {"kv_cache_write",
       {{"quant", "per_token"}, {"layout", "shuffle"}},
       "per_token caches are e4m3fn, e4m3fnuz or int8"},
      {"kv_cache_write", {{"layout", "paged"}}, "layout paged is a per_token layout"},
      {"kv_cache_write", {{"kv", "int8"}}, "int8 caches are per_token only"},
      {"kv_cache_write", {{"rows", "zero_tiny"}}, "rows = zero_tiny is for per_token cases"},
      {"kv_cache_write", {{"tokens", 3}}, "heads, head_dim, block_size >= 1 and tokens > 3"},
      {"kv_cache_write",
       {{"quant", "per_token"}, {"layout", "paged"}, {"kv", "e4m3fn"}, {"block_size", 0}},
       "heads, head_dim, block_size >= 1 and tokens > 3"},
      {"kv_cache_write",
       {{"layout", "shuffle"}, {"strides", "packed"}},
       "the packed (nb, Hkv, P, 2D) cache is an NHD layout, not SHUFFLE"},
      {"kv_cache_write",
       {{"quant", "per_token"}, {"layout", "paged"}, {"kv", "int8"}, {"strides", "packed"}},
       "the packed (nb, Hkv, P, 2D) cache is an NHD layout"},
      {"kv_gather",
       {{"layout", "shuffle"}, {"strides", "packed"}},
       "the packed (nb, Hkv, P, 2D) cache is an NHD layout, not SHUFFLE"},
      {"kv_gather",
       {{"context", "chunk"}, {"span", 50}},
       "span must be in [1, max_ctx) for chunked contexts"},
      {"kv_gather",
       {{"context", "window"}, {"span", 0}},
       "span must be in [1, max_ctx) for chunked contexts"},
      {"kv_gather", {{"fp8_codes", "special"}}, "fp8_codes = special needs an fp8 kv"},
      {"kv_gather",
       {{"offset_log2", 31}, {"strides", "padded"}},
       "offset_log2 needs hybrid, separate or packed strides"},
      {"rope", {{"tokens", 0}}, "tokens must be >= 1"},
      {"indexer_qk_rope", {{"tokens", -2}}, "tokens must be >= 1"},
  };
  for (const auto& b : bad) {
    const Case c = op(b.op).make_case(b.given);
    EXPECT_EQ(op(b.op).case_error(c.params).value_or("(none)"), b.why) << c.id;
    try {
      op(b.op).problem(c);
      ADD_FAILURE() << c.id << ": built";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), c.id + ": " + b.why);
    }
  }
}

TEST(KvRopeOps, BuildableCasesAreNeverRefused) {
  const std::vector<std::pair<const char*, Params>> good = {
      {"kv_cache_write", Params::object()},
      {"kv_cache_write", {{"quant", "per_token"}, {"layout", "shuffle"}, {"kv", "e4m3fnuz"}}},
      {"kv_gather", {{"kv", "e4m3fn"}, {"fp8_codes", "special"}}},
      {"kv_gather", {{"strides", "separate"}, {"offset_log2", 31}}},
      {"rope", {{"contract", "out_of_place"}}},
      {"indexer_qk_rope", Params::object()},
  };
  for (const auto& [name, given] : good) {
    const Case c = op(name).make_case(given);
    EXPECT_FALSE(op(name).case_error(c.params)) << c.id;
    EXPECT_FALSE(op(name).invalid_reason(c.params)) << c.id;
    EXPECT_FALSE(op(name).problem(c).expect_refusal) << c.id;
  }
}

// The JSON the kernels and adapters read: its keys, values and JSON types are the ABI.
TEST(KvRopeOps, KernelParamsKeepTheirWireTypes) {
  const auto shuffle =
      problem("kv_cache_write", {{"quant", "per_token"}, {"layout", "shuffle"}, {"kv", "e4m3fn"}});
  EXPECT_EQ(shuffle.kernel, "kv_cache_write_pertoken_quant");
  EXPECT_EQ(shuffle.kernel_params,
            nlohmann::json({{"asm_layout", "true"},  // a string, as the kernels read it
                            {"kv_cache_dtype", "fp8"},
                            {"fp8_format", "e4m3fn"}}));
  const auto paged =
      problem("kv_cache_write", {{"quant", "per_token"}, {"layout", "paged"}, {"kv", "int8"}});
  EXPECT_EQ(paged.kernel_params,
            nlohmann::json({{"asm_layout", "false"}, {"kv_cache_dtype", "int8"}}));
  EXPECT_EQ(
      problem("kv_cache_write", {{"layout", "shuffle"}, {"kv", "e4m3fnuz"}}).kernel_params,
      nlohmann::json(
          {{"kv_cache_layout", "SHUFFLE"}, {"kv_cache_dtype", "fp8"}, {"fp8_format", "e4m3fnuz"}}));
  EXPECT_EQ(problem("kv_cache_write", Params::object()).kernel_params,
            nlohmann::json({{"kv_cache_layout", "NHD"}, {"kv_cache_dtype", "auto"}}));

  const auto gather = problem("kv_gather", {{"kv", "e4m3fn"}});
  ASSERT_TRUE(gather.kernel_params.at("dequant").is_boolean());
  EXPECT_TRUE(gather.kernel_params.at("dequant").get<bool>());
  ASSERT_TRUE(gather.kernel_params.at("total_tokens").is_number_integer());
  EXPECT_EQ(gather.kernel_params.at("total_tokens").get<int64_t>(), gather.arg("key").size(0));
  EXPECT_EQ(gather.kernel_params.at("fp8_format"), "e4m3fn");

  EXPECT_EQ(problem("rope", {{"style", "gptj"}}).kernel_params,
            nlohmann::json({{"is_neox", false}}));
  EXPECT_EQ(problem("indexer_qk_rope", {{"path", "generic"}}).kernel_params,
            nlohmann::json({{"is_neox", true}, {"path", "generic"}}));
}

// The references take the typed parameters: a problem whose kernel JSON is gone gives the same
// expected outputs (the JSON is written for the kernel, never read back).
TEST(KvRopeOps, ReferencesDoNotReadTheKernelJsonBack) {
  const std::vector<std::pair<const char*, Params>> cases = {
      {"kv_cache_write", {{"quant", "per_token"}, {"layout", "shuffle"}, {"kv", "e4m3fn"}}},
      {"kv_cache_write", {{"layout", "shuffle"}, {"kv", "e4m3fn"}}},
      {"kv_gather", {{"layout", "shuffle"}, {"kv", "e4m3fnuz"}}},
      {"rope", {{"style", "gptj"}}},
      {"indexer_qk_rope", {{"style", "gptj"}}},
  };
  for (const auto& [name, given] : cases) {
    const Problem p = problem(name, given);
    Problem bare = p;
    bare.kernel_params = nlohmann::json::object();
    const TensorMap want = op(name).reference(p), got = op(name).reference(bare);
    ASSERT_EQ(want.size(), got.size()) << name;
    for (const auto& [arg, t] : want) EXPECT_TRUE(same_bits(t, got.at(arg))) << name << " " << arg;
    EXPECT_EQ(op(name).checks(bare, want).size(), want.size()) << name;
  }
}

}  // namespace
}  // namespace attncheck
