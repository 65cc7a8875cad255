// sparse_mla: DeepSeek-V3.2-style sparse MLA (docs/ops/sparse_mla.md, docs/ops/mla_decode.md):
// request-local top-k token positions -> global cache slots
// (triton_convert_req_index_to_global_index), ragged packing, non-causal attention of every token
// over its own key set, heads padded to 16 as in the dense decode. Patterns: "causal" (vLLM's test:
// positions 0..topk-1 masked above the token), "random" (a random subset of the visible positions,
// shuffled, -1 padded at the end) and "holes" (invalid entries in the middle of rows: negative
// positions and positions past the table, and one row with no valid entry, which must give out = 0
// and lse = -inf). fp8_codes and offset_log2 as in mla_decode (issue 14).
#include <algorithm>

#include "core/rng.h"
#include "ops/mla_inputs.h"
#include "reference/sparse_mla.h"

namespace attncheck {
namespace {

enum class Pattern { causal, random, holes };

struct SparseMlaParams : mla::CommonParams {
  int64_t topk = 64;
  Pattern pattern = Pattern::random;
  bool storage_offset = false;  // ops/storage_offset.h
  int64_t out_offset_log2 = 0;
  bool far_rows = false;  // ops/storage_offset.h
  // sparse_mla's defaults where they differ from mla_decode's.
  SparseMlaParams() {
    block_size = 64;
    scale = mla::Scale::yarn;
  }
};

// Request-local top-k rows for every token; invalid entries per `pattern` (see the file comment).
Tensor make_topk(const std::string& case_id, Pattern pattern, mla::Layout layout,
                 const Tensor& seq_lens, int64_t qlen, int64_t topk, int64_t table_positions,
                 int64_t seed) {
  const int64_t B = seq_lens.size(0), T = B * qlen;
  Tensor view;
  if (layout == mla::Layout::contiguous)
    view = Tensor::full(DType::i32, {T, topk}, -9);
  else if (layout == mla::Layout::strided)
    view = Tensor::full(DType::i32, {T, topk + 5}, -9).slice(1, 0, topk);
  else
    view = Tensor::full(DType::i32, {topk, T}, -9).permute({1, 0});
  Rng rng(case_id, "topk_indices", static_cast<uint64_t>(seed));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t L = seq_lens.at<int32_t>({t / qlen});
    const int64_t last = L - qlen + t % qlen;  // the token's own position
    const int64_t n = std::min(topk, last + 1);
    std::vector<int64_t> row(static_cast<size_t>(topk), -1);
    if (pattern == Pattern::causal) {
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = j;
    } else {
      const auto order = permutation(last + 1, rng);
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = order[static_cast<size_t>(j)];
      if (pattern == Pattern::holes) {
        // Interior invalid entries: a quarter of the row, or all of token 0's row.
        for (int64_t j = 0; j < topk; ++j) {
          if (t != 0 && rng.uniform() >= 0.25) continue;
          const int64_t kind = rng.uniform_int(0, 2);
          row[static_cast<size_t>(j)] = kind == 0   ? -1
                                        : kind == 1 ? -rng.uniform_int(2, 1000)
                                                    : table_positions + rng.uniform_int(0, 500);
        }
      }
    }
    for (int64_t j = 0; j < topk; ++j)
      view.at<int32_t>({t, j}) = static_cast<int32_t>(row[static_cast<size_t>(j)]);
  }
  return view;
}

class SparseMlaOp final : public ContractDependentTypedOp<SparseMlaParams> {
 public:
  using P = SparseMlaParams;
  std::string name() const override { return "sparse_mla"; }
  // far_rows: each query token reads its own top-k slots (req_id_per_token names its table row).
  FarRows far_rows_args(const P&) const override {
    return {{"q", "topk_indices"}, {"out", "lse"}, {"req_id_per_token"}};
  }
  // pad_strides: a padded kv_cache, which the ABI refuses (mla::invalid).
  std::vector<std::string> padded_args(const P&) const override { return {"kv_cache"}; }
  Fields<P> fields() const override {
    const mla::AxisTexts texts{
        .block_size = "cache block size",
        .qlen = "query tokens per request",
        .batch = "requests",
        .layout = "q/out/lse/topk views (as in mla_decode)",
        .dims = "Lk x Lv",
        .scale = "softmax scale",
        .fp8_codes =
            "special: cache codes span the fp8 format; the slots of every request's "
            "context hold the saturation codes and, in e4m3fn, -0; every other slot "
            "the format's NaN codes (fp8 kv_dtype only)",
        .offset_log2 =
            "31 / 32: every block of every request starts past byte 2^31 / 2^32 "
            "of the cache; the host holds only those blocks",
        .qlen_values = {1, 2, 3, 4, 8},
    };
    Fields<P> f;
    mla::add_shape_fields(f, texts);
    f.add("topk", "k", &P::topk, "indices per token (2048 for DeepSeek-V3.2)")
        .choice(
            "pattern", "", &P::pattern,
            {{Pattern::causal, "causal"}, {Pattern::random, "random"}, {Pattern::holes, "holes"}},
            "index pattern");
    mla::add_input_fields(f, texts);
    f.add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp).out_of_id_at_default();
    add_far_rows(f, &P::far_rows);
    f.add("out_offset_log2", "ooff", &P::out_offset_log2,
          "31: out's token stride puts the last token's row past element 2^31 (byte 2^32); a "
          "sparse storage holds only that row, which alone is compared. contiguous layout")
        .only({0, 31})
        .out_of_id_at_default();
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.topk < 1) return "topk must be >= 1";
    if (p.out_offset_log2 != 0 && (p.layout != mla::Layout::contiguous || p.batch * p.qlen < 2))
      return "out_offset_log2 needs the contiguous layout and two or more tokens";
    return mla::unbuildable(p);
  }
  std::optional<std::string> invalid(const P& p) const override { return mla::invalid(p); }

  // The common MLA inputs (ops/mla_inputs.h) and the top-k indices; every query row reads topk
  // tokens.
  CaseSize size(const P& p) const override {
    CaseSize s = mla::common_size(p);
    const double T = static_cast<double>(p.batch * p.qlen), k = static_cast<double>(p.topk);
    s.input_bytes += 4 * (T + 1) * (k + 5) + 4 * T;
    s.work = 2 * T * k * static_cast<double>(p.heads) * static_cast<double>(p.lk() + p.lv());
    return s.count("topk", p.topk);
  }

  Problem make(const Case& c, const P& p) const override {
    const mla::Inputs in = mla::make_inputs(c.id, p);
    const int64_t T = in.tokens, lk = p.lk(), lv = p.lv();
    Tensor req = Tensor::empty(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) req.at<int32_t>({t}) = static_cast<int32_t>(t / p.qlen);
    const Tensor topk = make_topk(c.id, p.pattern, p.layout, in.pages.seq_lens, p.qlen, p.topk,
                                  in.pages.block_table.size(1) * p.block_size, p.seed);

    Tensor out = in.out;
    if (p.out_offset_log2 > 0) {
      out = far_last_row(p.dtype, {T, p.heads, lv}, p.out_offset_log2);
      poison(out);
    }

    Problem prob;
    prob.args = {{"q", in.q, Role::input},
                 {"kv_cache", in.cache, Role::input},
                 {"block_table", in.pages.block_table, Role::input},
                 {"req_id_per_token", req, Role::input},
                 {"topk_indices", topk, Role::input},
                 {"out", out, Role::output},
                 {"lse", in.lse, Role::output}};
    const double keys = static_cast<double>(T * p.topk);
    prob.flops = 2.0 * keys * static_cast<double>(p.heads * (lk + lv));
    prob.bytes =
        keys * static_cast<double>(lk * static_cast<int64_t>(dtype_size(p.cache_dtype()))) +
        static_cast<double>(T * p.heads * (lk + lv)) * static_cast<double>(dtype_size(p.dtype));
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return mla::common_kernel_params(p);
  }

  // Graph replay (docs/verification.md "Graph replay"): captured with the second half of each
  // token's top-k indices -1 (every row shorter) and another block order, replayed with the case's
  // own: row lengths, their maximum or an indptr read on the host at capture are stale.
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(
        prob, {second_half_dropped("topk_indices"), permuted_block_ids("block_table")});
  }

  // Invariance (docs/verification.md "Invariance"): tokens are independent rows (their request
  // id and top-k row travel with them): the tokens in another order, the last token alone, one
  // KV split instead of the kernel's choice, the blocks shuffled, the same cache at block size 1
  // (mla::at_block_size_one).
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    BatchArgs tokens{{"q", "req_id_per_token", "topk_indices", "out", "lse"}, {}, ""};
    tokens.unit = "token";
    std::vector<Relation> out;
    const int64_t T = request_count(prob, tokens);
    if (T > 1) {
      out.push_back(permuted_requests(prob, tokens, derangement(T, static_cast<uint64_t>(p.seed))));
      out.push_back(request_alone(prob, tokens, T - 1));
    }
    out.push_back(with_kernel_param(prob, "num_kv_splits 1 (the kernel's choice otherwise)",
                                    "num_kv_splits", 1, p));
    out.back().own_budgets = false;  // the budgets hold for any split count
    out.back().bitwise_under = {kSplitInvariant};
    if (auto shuffled =
            shuffled_pages(prob, {"kv_cache"}, "block_table", static_cast<uint64_t>(p.seed)))
      out.push_back(std::move(*shuffled));
    if (auto repaged = mla::at_block_size_one(prob, p)) out.push_back(std::move(*repaged));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    const auto r = ref::sparse_mla(prob.arg("q"), {prob.arg("kv_cache"), p.kv_scale()},
                                   packed(prob, p), p.softmax_scale(), p.lv());
    return {{"out", held_rows_of(r.out, prob.arg("out"))}, {"lse", r.lse}};
  }

  std::vector<OutputCheck> contract_checks(const Problem& prob, const P& p,
                                           const TensorMap& expected,
                                           const Contract& contract) const override {
    auto checks = budget_checks(prob, p, contract);
    if (const auto out = expected.find("out"); out != expected.end())
      mla::widen_for_output_underflow(checks.at(0).budget, out->second, prob.arg("out").dtype());
    return checks;
  }

 private:
  static ref::RaggedIndices packed(const Problem& prob, const P& p) {
    return ref::sparse_mla_pack(
        ref::sparse_mla_global_indices(prob.arg("topk_indices"), prob.arg("req_id_per_token"),
                                       prob.arg("block_table"), p.block_size));
  }

  // Each query row reads its packed slots.
  static std::vector<OutputCheck> budget_checks(const Problem& prob, const P& p,
                                                const Contract& contract) {
    const auto idx = packed(prob, p);
    mla::RowSlots rows;
    rows.slots.resize(static_cast<size_t>(idx.indices.numel()));
    for (size_t i = 0; i < rows.slots.size(); ++i)
      rows.slots[i] = idx.indices.at<int32_t>({static_cast<int64_t>(i)});
    int64_t keys_max = 0;
    for (int64_t t = 0; t + 1 < idx.indptr.numel(); ++t) {
      rows.begin.push_back(idx.indptr.at<int32_t>({t}));
      rows.end.push_back(idx.indptr.at<int32_t>({t + 1}));
      keys_max = std::max<int64_t>(keys_max, rows.end.back() - rows.begin.back());
    }
    return mla::problem_checks(prob, p, rows, keys_max, contract);
  }
};

const OpRegistrar kRegister(std::make_unique<SparseMlaOp>());

}  // namespace
}  // namespace attncheck
