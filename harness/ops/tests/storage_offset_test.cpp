// The issue-21 placements of views in their storages (ops/storage_offset.h): storage_offset moves
// every dense storage 256 bytes in (same values, same aliasing, a nonzero offset, 0xFF before),
// far_last_row puts an output's last row past element 2^31 on a sparse storage holding that row
// only, and the axes added with them keep case ids at their defaults and change the reference
// only where the kernel's arguments change.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ops/op.h"
#include "ops/storage_offset.h"
#include "ops/tests/registered_op.h"

namespace attncheck {
namespace {

Problem problem(const char* name, const Params& given) {
  const Op& op = registered_op(name);
  return op.problem(op.make_case(given));
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  bool same = true;
  a.for_each_index([&](const Index& i, int64_t) { same = same && a.get_bits(i) == b.get_bits(i); });
  return same;
}

TEST(StorageOffset, ShiftKeepsValuesAndAliasingAndPoisonsTheLeadingBytes) {
  const Problem plain = problem("kv_gather", {{"strides", "hybrid"}});
  Problem moved = plain;  // the same inputs (a case's are seeded by its id, which soff1 changes)
  shift_storages(moved);
  ASSERT_EQ(plain.args.size(), moved.args.size());
  for (size_t i = 0; i < plain.args.size(); ++i) {
    const Tensor &a = plain.args[i].tensor, &b = moved.args[i].tensor;
    SCOPED_TRACE(plain.args[i].name);
    EXPECT_EQ(b.offset(),
              a.offset() + kStorageOffsetBytes / static_cast<int64_t>(b.element_size()));
    EXPECT_EQ(a.strides(), b.strides());
    if (plain.args[i].role != Role::output) {
      EXPECT_TRUE(same_values(a, b));
    }
    for (int64_t k = 0; k < kStorageOffsetBytes; ++k)
      EXPECT_EQ(b.storage()->bytes[static_cast<size_t>(k)], std::byte{0xFF});
  }
  // K and V caches of a hybrid layout share one storage, and still do; so do key and value.
  EXPECT_EQ(moved.arg("key_cache").storage(), moved.arg("value_cache").storage());
  EXPECT_EQ(moved.arg("key").storage(), moved.arg("value").storage());
  EXPECT_NE(moved.arg("key").storage(), moved.arg("key_cache").storage());
  // Same kernel parameters, same expected outputs.
  EXPECT_EQ(plain.kernel_params, moved.kernel_params);
  const Op& op = registered_op("kv_gather");
  const TensorMap ea = op.reference(plain), eb = op.reference(moved);
  EXPECT_TRUE(same_values(ea.at("key"), eb.at("key")));
  EXPECT_TRUE(same_values(ea.at("value"), eb.at("value")));
}

TEST(StorageOffset, ShiftRefusesAnUnalignedAmount) {
  Problem p = problem("page_indices", Params::object());
  EXPECT_THROW(shift_storages(p, 8), std::invalid_argument);
  EXPECT_THROW(shift_storages(p, 0), std::invalid_argument);
}

TEST(StorageOffset, EveryOpHasTheAxisOutOfItsIds) {
  for (const Op* op : all_ops()) {
    bool found = false;
    for (const Axis& a : op->axes())
      if (a.name == "storage_offset") {
        found = true;
        EXPECT_FALSE(a.in_id_at_default) << op->name();
      }
    EXPECT_TRUE(found) << op->name() << " has no storage_offset axis";
    const Case moved = op->make_case({{"storage_offset", true}});
    EXPECT_NE(moved.id.find("-soff1"), std::string::npos) << moved.id;
  }
}

TEST(FarLastRow, LastRowPastElement2To31AndOnlyItHeld) {
  const Tensor o = far_last_row(DType::bf16, {3, 4, 8}, 31);
  EXPECT_GE(o.element_offset(std::vector<int64_t>{2, 0, 0}), int64_t{1} << 31);
  EXPECT_TRUE(o.storage()->sparse());
  const Tensor held = o.held_rows();
  ASSERT_EQ(held.size(0), 1);
  EXPECT_EQ(held.offset(), o.element_offset(std::vector<int64_t>{2, 0, 0}));
  Tensor expected = Tensor::full(DType::f32, {3, 4, 8}, 1.0);
  expected.select(0, 2).copy_from(Tensor::full(DType::f32, {4, 8}, 7.0));
  const Tensor rows = held_rows_of(expected, o);
  ASSERT_EQ(rows.shape(), (Shape{1, 4, 8}));
  EXPECT_EQ(rows.get({0, 3, 7}), 7.0);
  EXPECT_THROW(far_last_row(DType::bf16, {1, 4, 8}, 31), std::invalid_argument);
}

// far_row: any row past 0 can be the far one (a writer's last real token), the rows after it
// (padding tokens) lie further and are not held.
TEST(FarLastRow, AnyRowCanBeTheFarOneAndOnlyItHeld) {
  const Tensor t = far_row(DType::u8, {6, 64}, 2, 32);
  EXPECT_GE(t.element_offset(std::vector<int64_t>{2, 0}), int64_t{1} << 32);
  const Tensor held = t.held_rows();
  ASSERT_EQ(held.size(0), 1);
  EXPECT_EQ(held.offset(), t.element_offset(std::vector<int64_t>{2, 0}));
  EXPECT_EQ(t.stride(0) % 16, 0);
  EXPECT_THROW(far_row(DType::u8, {6, 64}, 0, 32), std::invalid_argument);
  EXPECT_THROW(far_row(DType::u8, {6, 64}, 6, 32), std::invalid_argument);
  // The last row: far_last_row's placement, unchanged.
  const Tensor last = far_row(DType::bf16, {3, 4, 8}, 2, 31);
  EXPECT_EQ(last.strides(), far_last_row(DType::bf16, {3, 4, 8}, 31).strides());
}

TEST(FarLastRow, PlaceFarTokenKeepsThatRowsValues) {
  Tensor k = Tensor::empty(DType::bf16, {5, 8});
  k.for_each_index([&](const Index& i, int64_t n) { k.set(i, static_cast<double>(n)); });
  Problem p;
  p.args = {{"k", k, Role::input}};
  place_far_token(p, {"k"}, 3);
  const Tensor& far = p.arg("k");
  EXPECT_GE(far.element_offset(std::vector<int64_t>{3, 0}), int64_t{1} << 31);
  EXPECT_TRUE(same_values(far.slice(0, 3, 4), k.slice(0, 3, 4)));
  EXPECT_EQ(far.held_rows().size(0), 1);
  EXPECT_THROW(place_far_token(p, {"k"}, 3), std::logic_error);  // already sparse
  EXPECT_THROW(place_far_token(p, {"q"}, 1), std::logic_error);
}

// far_rows on the writers (issue 37): the last real token alone writes (every other slot -1),
// from a row past element 2^31; with offset_log2 the caches hold the blocks past byte 2^32 only,
// and the reference returns those blocks, computed from the held row alone.
TEST(Issue37Axes, WritersReadOneFarTokenIntoFarPages) {
  struct Writer {
    const char* op;
    Params params;
    std::vector<const char*> rows, caches;
  };
  const std::vector<Writer> writers = {
      {"kv_cache_write",
       {{"strides", "separate"},
        {"block_size", 1},
        {"tokens", 5},
        {"offset_log2", 32},
        {"far_rows", true}},
       {"key", "value"},
       {"key_cache", "value_cache"}},
      {"indexer_k_cache",
       {{"block_size", 1}, {"offset_log2", 32}, {"far_rows", true}},
       {"k"},
       {"kv_cache"}},
      {"indexer_mxfp4_k_cache",
       {{"block_size", 1},
        {"head_dim", 64},
        {"tokens", 3},
        {"offset_log2", 32},
        {"far_rows", true}},
       {"k"},
       {"kv_cache"}},
      {"sparse_mla_fp4_k_cache",
       {{"block_size", 1}, {"tokens", 3}, {"offset_log2", 32}, {"far_rows", true}},
       {"kv"},
       {"kv_cache"}},
  };
  for (const Writer& w : writers) {
    SCOPED_TRACE(w.op);
    const Problem p = problem(w.op, w.params);
    const Tensor& slots = p.arg("slot_mapping");
    int64_t writing = -1, count = 0;
    for (int64_t t = 0; t < slots.size(0); ++t)
      if (slots.at<int64_t>({t}) >= 0) writing = t, ++count;
    ASSERT_EQ(count, 1);
    for (const char* name : w.rows) {
      const Tensor& r = p.arg(name);
      EXPECT_TRUE(r.storage()->sparse()) << name;
      EXPECT_GE(r.element_offset(std::vector<int64_t>(static_cast<size_t>(r.ndim()), 0)) +
                    writing * r.stride(0),
                int64_t{1} << 31)
          << name;
      EXPECT_EQ(r.held_rows().size(0), 1) << name;
    }
    const TensorMap e = registered_op(w.op).reference(p);
    for (const char* name : w.caches) {
      const Tensor& c = p.arg(name);
      EXPECT_TRUE(c.storage()->sparse()) << name;
      EXPECT_GE(c.held_rows().offset() * static_cast<int64_t>(c.element_size()), int64_t{1} << 32)
          << name;
      EXPECT_EQ(e.at(name).shape(), c.held_rows().shape()) << name;
    }
  }
}

// sparse_mla_fp4 (issue 37): record pages past byte 2^32, the last token's q, top-k and out rows
// past element 2^31; the reference sees that token alone over the held pages.
TEST(Issue37Axes, Fp4DecodeReadsFarPagesForAFarToken) {
  const Problem p =
      problem("sparse_mla_fp4", {{"heads", 2}, {"offset_log2", 32}, {"far_rows", true}});
  for (const char* name : {"q", "topk_indices", "out"}) {
    const Tensor& t = p.arg(name);
    EXPECT_GE((t.size(0) - 1) * t.stride(0), int64_t{1} << 31) << name;
    EXPECT_EQ(t.held_rows().size(0), 1) << name;
  }
  EXPECT_GE(p.arg("kv_cache").held_rows().offset(), int64_t{1} << 32);
  const TensorMap e = registered_op("sparse_mla_fp4").reference(p);
  EXPECT_EQ(e.at("out").size(0), 1);
  bool finite = true;
  e.at("out").for_each_index(
      [&](const Index& i, int64_t) { finite = finite && std::isfinite(e.at("out").get(i)); });
  EXPECT_TRUE(finite);
}

TEST(Issue21Axes, OnlyTheLastRowOfALargeOutputIsExpected) {
  const Problem d =
      problem("decode_attention",
              {{"lk_lv", "128x128"}, {"is_mla", false}, {"kv_heads", 2}, {"o_offset_log2", 31}});
  const TensorMap e = registered_op("decode_attention").reference(d);
  EXPECT_EQ(e.at("o").size(0), 1);
  EXPECT_EQ(e.at("lse").size(0), d.arg("q").size(0));
  const Problem m =
      problem("mla_decode", {{"dims", "96x64"}, {"qlen", 2}, {"out_offset_log2", 31}});
  EXPECT_EQ(registered_op("mla_decode").reference(m).at("out").size(0), 1);
  const Problem g = problem("kv_gather", {{"out_offset_log2", 31}});
  EXPECT_EQ(g.arg("key").storage(), g.arg("value").storage());
  EXPECT_EQ(registered_op("kv_gather").reference(g).at("value").size(0), 1);
}

// partials_log2 (issue 37): the kernel's split partials [B, Hq, S, Lv + 1] reach past element
// 2^31 for the last two requests, which alone o holds and the reference returns; the requests
// before the last seven are 1 token long, so a batch of hundreds stays cheap.
TEST(Issue37Axes, TheLastRequestsPartialsLiePastElement2To31) {
  const Problem d = problem("decode_attention", {{"lk_lv", "576x512"},
                                                 {"heads", 16},
                                                 {"splits", 512},
                                                 {"batch", 600},
                                                 {"max_ctx", 1024},
                                                 {"partials_log2", 31}});
  const int64_t B = d.arg("q").size(0), per = 16 * 512 * 513;
  ASSERT_EQ(B, 600);
  EXPECT_GE((B - 2) * per, int64_t{1} << 31);  // every held request's partial rows
  EXPECT_LT(500 * per, int64_t{1} << 31);      // vLLM's measured right shape stays below
  const Tensor& lens = d.arg("b_seq_len");
  for (int64_t b = 0; b < B - 7; ++b) ASSERT_EQ(lens.at<int32_t>({b}), 1) << b;
  EXPECT_EQ(lens.at<int32_t>({B - 1}), 1024);
  EXPECT_TRUE(d.arg("o").storage()->sparse());
  EXPECT_EQ(d.arg("o").held_rows().size(0), 2);
  const TensorMap e = registered_op("decode_attention").reference(d);
  EXPECT_EQ(e.at("o").size(0), 2);
  EXPECT_EQ(e.at("lse").size(0), B);
  // Too small a batch for the limit is not built (it would test nothing past 2^31).
  const Op& op = registered_op("decode_attention");
  EXPECT_ANY_THROW((void)op.problem(
      op.make_case({{"heads", 16}, {"splits", 512}, {"batch", 500}, {"partials_log2", 31}})));
}

// q_offset_log2 (issue 37): q, o and lse hold the last request's rows only, q's past element 2^31;
// the reference sees that request alone.
TEST(Issue37Axes, OnlyTheLastRequestOfAFarQueryIsRead) {
  const Problem d =
      problem("decode_attention",
              {{"lk_lv", "128x128"}, {"is_mla", false}, {"kv_heads", 2}, {"q_offset_log2", 31}});
  const int64_t B = d.arg("q").size(0);
  for (const char* name : {"q", "o", "lse"}) {
    SCOPED_TRACE(name);
    const Tensor& t = d.arg(name);
    EXPECT_TRUE(t.storage()->sparse());
    EXPECT_EQ(t.held_rows().size(0), 1);
  }
  EXPECT_GE((B - 1) * d.arg("q").stride(0), int64_t{1} << 31);
  const TensorMap e = registered_op("decode_attention").reference(d);
  EXPECT_EQ(e.at("o").size(0), 1);
  EXPECT_EQ(e.at("lse").size(0), 1);
  bool finite = true;  // computed from the held row only, never from the poisoned ones
  e.at("o").for_each_index(
      [&](const Index& i, int64_t) { finite = finite && std::isfinite(e.at("o").get(i)); });
  EXPECT_TRUE(finite);
}

// pad_strides / compact / interleave (issue 37): same values, other strides, gaps 0xFF.
TEST(Issue37Axes, RestridedArgumentsKeepTheirValues) {
  const Problem plain = problem("kv_cache_write", {{"strides", "separate"}});
  Problem moved = plain;
  interleave_args(moved, {"key", "key_cache"});
  for (const char* name : {"key", "key_cache"}) {
    SCOPED_TRACE(name);
    const Tensor &a = plain.arg(name), &b = moved.arg(name);
    EXPECT_TRUE(same_values(a, b));
    EXPECT_EQ(b.stride(-1), 2 * a.stride(-1));
    EXPECT_EQ(b.storage()->bytes[static_cast<size_t>(b.element_size())], std::byte{0xFF});
  }
  Problem padded = plain;
  pad_outer_strides(padded, {"key"});
  EXPECT_TRUE(same_values(plain.arg("key"), padded.arg("key")));
  EXPECT_EQ(padded.arg("key").stride(0), plain.arg("key").stride(0) + 8);  // 16 bytes of bf16
  EXPECT_FALSE(padded.arg("key").is_contiguous());
  Problem packed = padded;
  compact_args(packed, {"key"});
  EXPECT_TRUE(packed.arg("key").is_contiguous());
  EXPECT_TRUE(same_values(plain.arg("key"), packed.arg("key")));
  EXPECT_THROW(pad_outer_strides(padded, {"nope"}), std::logic_error);
  // A cache the op marks for padding is refused where the ABI requires it contiguous.
  const Problem mla = problem("mla_decode", {{"dims", "96x64"}, {"pad_strides", true}});
  EXPECT_TRUE(mla.expect_refusal);
  EXPECT_FALSE(mla.arg("kv_cache").is_contiguous());
}

TEST(Issue21Axes, PassedValuesNoOtherArgumentDetermines) {
  const Problem lk = problem("decode_attention", Params::object());
  const Problem sm = problem("decode_attention", {{"scales", "sm"}});
  EXPECT_DOUBLE_EQ(sm.kernel_params["sm_scale"].get<double>(),
                   static_cast<double>(static_cast<float>(0.75 / std::sqrt(576.0))));
  EXPECT_NE(sm.kernel_params["sm_scale"], lk.kernel_params["sm_scale"]);
  const Problem fn = problem("decode_attention", {{"scales", "kscale"}, {"kv_dtype", "e4m3fn"}});
  const Problem fnuz =
      problem("decode_attention", {{"scales", "kscale"}, {"kv_dtype", "e4m3fnuz"}});
  EXPECT_EQ(fn.kernel_params["k_scale"], fnuz.kernel_params["k_scale"]);

  const Problem longer = problem("kv_gather", {{"key_rows", "longer"}});
  const auto total = longer.kernel_params["total_tokens"].get<int64_t>();
  EXPECT_EQ(longer.arg("key").size(0), total + 3);
  EXPECT_EQ(longer.arg("token_to_batch").size(0), total + 8);
  // The rows past total_tokens come back unchanged: the expected key holds them as built.
  const TensorMap e = registered_op("kv_gather").reference(longer);
  EXPECT_TRUE(same_values(e.at("key").slice(0, total, total + 3),
                          longer.arg("key").slice(0, total, total + 3)));

  const Problem ragged = problem("mla_decode", {{"qlen", 4}, {"batch", 3}, {"ragged_qlen", true}});
  EXPECT_EQ(ragged.kernel_params["max_seqlen_q"].get<int64_t>(), 4);
  EXPECT_EQ(ragged.arg("q").size(0), 4 + 3 + 2);
  EXPECT_EQ(ragged.arg("query_start_loc").at<int32_t>({3}), 9);
}

}  // namespace
}  // namespace attncheck
