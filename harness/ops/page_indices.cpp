// page_indices: block table -> per-token flat slots (docs/ops/mla_decode.md "Semantics": page-index
// expansion). Exact op: compared bitwise. What it guards against: kernels that read table columns
// past the request's last block, ignore the table's row stride, or write past the request's tokens
// (rows of the next request, padding), and slots computed past int32 (block ids past 2^31 / K must
// be refused, not wrapped).
#include <algorithm>

#include "core/rng.h"
#include "core/policy.h"
#include "ops/typed_op.h"
#include "ops/paged.h"
#include "reference/page_indices.h"

namespace attncheck {
namespace {

enum class Table { contiguous, strided };
enum class BlockIds { low, top, over };

struct PageIndicesParams {
  int64_t block_size = 16;
  int64_t batch = 4;
  int64_t max_ctx = 300;
  Table table = Table::contiguous;
  int64_t seed = 0;
  BlockIds block_ids = BlockIds::low;
  bool storage_offset = false;  // ops/storage_offset.h
};

class PageIndicesOp final : public TypedOp<PageIndicesParams> {
 public:
  using P = PageIndicesParams;
  std::string name() const override { return "page_indices"; }
  Fields<P> fields() const override {
    return Fields<P>()
        .add("block_size", "bs", &P::block_size, "kernel block size K")
        .only({1, 16, 64})
        .add("batch", "b", &P::batch, "requests")
        .add("max_ctx", "ctx", &P::max_ctx,
             "longest request; lengths are ragged with block-edge cases")
        .choice("table", "", &P::table,
                {{Table::contiguous, "contiguous"}, {Table::strided, "strided"}},
                "strided: row stride wider than the table")
        .add("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default()
        .choice("block_ids", "ids", &P::block_ids,
                {{BlockIds::low, "low"}, {BlockIds::top, "top"}, {BlockIds::over, "over"}},
                "low: ids below the block pool size; top: the largest id in use is the largest "
                "whose slots fit int32 (2^31 / K - 1, its last slot up to 2^31 - 1); over: one "
                "past it (slots past 2^31 - 1: refused, block_size > 1)")
        .out_of_id_at_default();
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.block_ids == BlockIds::over && p.block_size == 1)
      return "block_ids = over needs block_size > 1 (an int32 block id times 1 always fits)";
    return std::nullopt;
  }

  // Invalid exactly when some request's slots pass int32: block_ids = over puts the largest id in
  // use at 2^31 / K, and every layout has a request that reaches its last block.
  std::optional<std::string> invalid(const P& p) const override {
    if (p.block_ids != BlockIds::over) return std::nullopt;
    const auto layout = layout_of(p, case_id(p));
    const int64_t target = (int64_t{1} << 31) / p.block_size;
    for (int64_t r = 0; r < layout.seq_lens.size(0); ++r)
      for (int64_t j = 0; j < blocks_of(layout, r, p.block_size); ++j)
        if (layout.block_table.at<int32_t>({r, j}) == target)
          return ref::page_indices_overflow_message(r, target, p.block_size);
    return std::nullopt;
  }

  // The table and lengths, and the output with its tail; the reference visits each token once.
  CaseSize size(const P& p) const override {
    const double B = static_cast<double>(p.batch), ctx = static_cast<double>(p.max_ctx);
    CaseSize s;
    s.input_bytes = paged_layout_bytes(p.batch, p.max_ctx, p.block_size) + 4 * (B + 1);
    s.output_bytes = 4 * (B * ctx + 37);
    s.work = B * ctx;
    return s.count("batch", p.batch).count("max_ctx", p.max_ctx);
  }

  Problem make(const Case& c, const P& p) const override {
    const auto layout = layout_of(p, c.id);
    int64_t total = 0;
    for (int64_t r = 0; r < layout.seq_lens.size(0); ++r) total += layout.seq_lens.at<int32_t>({r});
    // The output buffer is longer than the tokens: the tail is outside the view and must stay
    // untouched.
    Tensor out_buf = Tensor::filled_bytes(DType::i32, {total + 37}, std::byte{0xFF});
    Problem prob;
    prob.args = {{"block_table", layout.block_table, Role::input},
                 {"seq_lens", layout.seq_lens, Role::input},
                 {"cu_seq_lens", ref::cumulative_lengths(layout.seq_lens), Role::input},
                 {"page_indices", out_buf.slice(0, 0, total), Role::output}};
    prob.bytes = static_cast<double>(total) * 8.0;
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"kernel_block_size", p.block_size}};
  }

  // Graph replay (docs/verification.md "Graph replay"): captured with another block order,
  // replayed with the case's own: slots (or a table) read on the host at capture are stale. The
  // lengths stay: the output holds exactly cu_seq_lens[B] slots, so a capture at other lengths
  // would be another output shape, not other metadata.
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(prob, {permuted_block_ids("block_table")});
  }

  // Invariance (docs/verification.md "Invariance"): each request's slots come from its own row
  // and length: the requests in another order, the longest alone.
  std::vector<Relation> relations(const Problem& prob) const override {
    const BatchArgs batch{{"block_table", "seq_lens"}, {"page_indices"}, "cu_seq_lens"};
    return permuted_and_alone(prob, batch, longest_request(prob.arg("seq_lens")),
                              static_cast<uint64_t>(typed(prob).seed));
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    return {{"page_indices",
             ref::page_indices(prob.arg("block_table"), prob.arg("seq_lens"), p.block_size)}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    return {{"page_indices", exact_budget("index arithmetic: bitwise"), {}, {}}};
  }

 private:
  static int64_t blocks_of(const PagedLayout& layout, int64_t r, int64_t K) {
    return (layout.seq_lens.at<int32_t>({r}) + K - 1) / K;
  }

  // The block table and lengths; with block_ids top / over, the pool moved so that its largest
  // id in use is 2^31 / K - 1 (top) or 2^31 / K (over). `id`, the case id, seeds the layout.
  static PagedLayout layout_of(const P& p, const std::string& id) {
    const int64_t K = p.block_size;
    const auto layout = paged_layout(id, p.batch, p.max_ctx, K, p.table == Table::strided, p.seed);
    if (p.block_ids == BlockIds::low) return layout;
    int64_t largest = -1;
    for (int64_t r = 0; r < layout.seq_lens.size(0); ++r)
      for (int64_t j = 0; j < blocks_of(layout, r, K); ++j)
        largest = std::max<int64_t>(largest, layout.block_table.at<int32_t>({r, j}));
    const int64_t target = (int64_t{1} << 31) / K - (p.block_ids == BlockIds::top ? 1 : 0);
    if (largest >= 0) shift_block_ids(layout, target - largest);
    return layout;
  }
};

const OpRegistrar kRegister(std::make_unique<PageIndicesOp>());

}  // namespace
}  // namespace attncheck
