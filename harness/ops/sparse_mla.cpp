// sparse_mla: DeepSeek-V3.2-style sparse MLA (docs/ops/sparse_mla.md, docs/ops/mla_decode.md):
// request-local top-k token positions -> global cache slots
// (triton_convert_req_index_to_global_index), ragged packing, non-causal attention of every token
// over its own key set, heads padded to 16 as in the dense decode. Patterns: "causal" (vLLM's test:
// positions 0..topk-1 masked above the token), "random" (a random subset of the visible positions,
// shuffled, -1 padded at the end) and "holes" (invalid entries in the middle of rows: negative
// positions and positions past the table, and one row with no valid entry, which must give out = 0
// and lse = -inf). fp8_codes and offset_log2 as in mla_decode (issue 14).
#include <algorithm>

#include "ops/mla_inputs.h"
#include "ops/op.h"
#include "ops/paged.h"
#include "reference/sparse_mla.h"

namespace attncheck {
namespace {

// Request-local top-k rows for every token; invalid entries per `pattern` (see the file comment).
Tensor make_topk(const std::string& case_id, const std::string& pattern, const std::string& layout,
                 const Tensor& seq_lens, int64_t qlen, int64_t topk, int64_t table_positions,
                 int64_t seed) {
  const int64_t B = seq_lens.size(0), T = B * qlen;
  Tensor view;
  if (layout == "contiguous")
    view = Tensor::full(DType::i32, {T, topk}, -9);
  else if (layout == "strided")
    view = Tensor::full(DType::i32, {T, topk + 5}, -9).slice(1, 0, topk);
  else
    view = Tensor::full(DType::i32, {topk, T}, -9).permute({1, 0});
  Rng rng(case_id, "topk_indices", static_cast<uint64_t>(seed));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t L = seq_lens.at<int32_t>({t / qlen});
    const int64_t last = L - qlen + t % qlen;  // the token's own position
    const int64_t n = std::min(topk, last + 1);
    std::vector<int64_t> row(static_cast<size_t>(topk), -1);
    if (pattern == "causal") {
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = j;
    } else {
      const auto order = permutation(last + 1, rng);
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = order[static_cast<size_t>(j)];
      if (pattern == "holes") {
        // Interior invalid entries: a quarter of the row, or all of token 0's row.
        for (int64_t j = 0; j < topk; ++j) {
          if (t != 0 && rng.uniform() >= 0.25) continue;
          const int64_t kind = rng.uniform_int(0, 2);
          row[static_cast<size_t>(j)] = kind == 0   ? -1
                                        : kind == 1 ? -rng.uniform_int(2, 1000)
                                                    : table_positions + rng.uniform_int(0, 500);
        }
      } else if (pattern != "random") {
        throw std::invalid_argument("unknown index pattern '" + pattern + "'");
      }
    }
    for (int64_t j = 0; j < topk; ++j)
      view.at<int32_t>({t, j}) = static_cast<int32_t>(row[static_cast<size_t>(j)]);
  }
  return view;
}

class SparseMlaOp final : public ContractDependentOp {
 public:
  std::string name() const override { return "sparse_mla"; }
  std::vector<Axis> axes() const override {
    return {
        {"heads", "h", 16, mla::kHeadValues,
         "query heads; 3, 5, 12, 24, 40 break the 16-head rule and must be refused"},
        {"block_size", "bs", 64, {1, 16, 64}, "cache block size"},
        {"qlen", "q", 1, {1, 2, 3, 4, 8}, "query tokens per request"},
        {"dtype", "", "bf16", {"bf16", "f16"}, "query and output dtype"},
        {"kv_dtype", "kv", "auto", {"auto", "e4m3fn", "e4m3fnuz"}, "cache dtype (auto = dtype)"},
        {"batch", "b", 3, {}, "requests"},
        {"ctx", "ctx", 65, {}, "longest kv length; others ragged with block-edge lengths"},
        {"topk", "k", 64, {}, "indices per token (2048 for DeepSeek-V3.2)"},
        {"pattern", "", "random", {"causal", "random", "holes"}, "index pattern"},
        {"layout",
         "",
         "contiguous",
         {"contiguous", "strided", "transposed"},
         "q/out/lse/topk views (as in mla_decode)"},
        {"dims", "d", "576x512", {"576x512", "96x64"}, "Lk x Lv"},
        {"scale", "sc", "yarn", {"lk", "yarn"}, "softmax scale"},
        {"seed", "s", 0, {}, "input seed"},
        fp8_codes_axis("special: cache codes span the fp8 format; the slots of every request's "
                       "context hold the saturation codes and, in e4m3fn, -0; every other slot "
                       "the format's NaN codes (fp8 kv_dtype only)"),
        offset_log2_axis("31 / 32: every block of every request starts past byte 2^31 / 2^32 "
                         "of the cache; the host holds only those blocks"),
    };
  }

  Problem make(const Case& c) const override {
    const auto& pr = c.params;
    const int64_t N = param_int(pr, "heads"), P = param_int(pr, "block_size");
    const int64_t qlen = param_int(pr, "qlen"), B = param_int(pr, "batch");
    const int64_t topk = param_int(pr, "topk"), seed = param_int(pr, "seed");
    if (topk < 1) throw std::invalid_argument("topk must be >= 1");
    const DType qd = param_dtype(pr, "dtype");
    const DType kvd = mla::cache_dtype(param_str(pr, "kv_dtype"), qd);
    const auto [lk, lv] = mla::parse_dims(param_str(pr, "dims"));
    const std::string layout = param_str(pr, "layout");
    const bool specials = param_str(pr, "fp8_codes") == "special";
    if (specials && !is_fp8(kvd))
      throw std::invalid_argument(c.id + ": fp8_codes = special needs an fp8 kv_dtype");
    const auto pl = paged_layout(c.id, B, param_int(pr, "ctx"), P, layout == "strided", seed, qlen);
    // Every slot of every request's context may be selected; the rest is NaN.
    std::vector<bool> readable(static_cast<size_t>(pl.num_blocks * P), false);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < pl.seq_lens.at<int32_t>({r}); ++t)
        readable[static_cast<size_t>(pl.block_table.at<int32_t>({r, t / P}) * P + t % P)] = true;
    const int64_t first = first_block_past(param_int(pr, "offset_log2"),
                                           P * lk * static_cast<int64_t>(dtype_size(kvd)));
    shift_block_ids(pl, first);
    const Tensor cache =
        mla::make_cache(c.id, kvd, pl.num_blocks, P, lk, readable, seed, first, specials);
    const int64_t T = B * qlen;
    Tensor req = Tensor::empty(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) req.at<int32_t>({t}) = static_cast<int32_t>(t / qlen);

    Problem p;
    p.args = {{"q", mla::make_query(c.id, layout, qd, T, N, lk, seed), Role::input},
              {"kv_cache", cache, Role::input},
              {"block_table", pl.block_table, Role::input},
              {"req_id_per_token", req, Role::input},
              {"topk_indices",
               make_topk(c.id, param_str(pr, "pattern"), layout, pl.seq_lens, qlen, topk,
                         pl.block_table.size(1) * P, seed),
               Role::input},
              {"out", mla::make_token_head_view(layout, qd, T, N, lv), Role::output},
              {"lse", mla::make_lse_view(layout, T, N), Role::output}};
    const double kv_scale =
        is_fp8(kvd) ? mla::fp8_kv_scale(seed, specials ? max_finite(kvd) : 4.0) : 1.0;
    p.kernel_params = {{"scale", mla::softmax_scale(param_str(pr, "scale"), lk)},
                       {"kv_scale", kv_scale},
                       {"kernel_block_size", P},
                       {"lv", lv}};
    if (is_fp8(kvd)) p.kernel_params["fp8_format"] = param_str(pr, "kv_dtype");
    if (!ref::mla_num_heads_valid(N)) p.expect_refusal = ref::mla_num_heads_message(N);
    const double keys = static_cast<double>(T * topk);
    p.flops = 2.0 * keys * static_cast<double>(N * (lk + lv));
    p.bytes = keys * static_cast<double>(lk * static_cast<int64_t>(dtype_size(kvd))) +
              static_cast<double>(T * N * (lk + lv)) * static_cast<double>(dtype_size(qd));
    return p;
  }

  static ref::RaggedIndices packed(const Problem& p) {
    return ref::sparse_mla_pack(ref::sparse_mla_global_indices(
        p.arg("topk_indices"), p.arg("req_id_per_token"), p.arg("block_table"),
        p.kernel_params.at("kernel_block_size").get<int64_t>()));
  }

  TensorMap reference(const Problem& p) const override {
    const auto& kp = p.kernel_params;
    const auto r =
        ref::sparse_mla(p.arg("q"), {p.arg("kv_cache"), kp.at("kv_scale").get<double>()}, packed(p),
                        kp.at("scale").get<double>(), kp.at("lv").get<int64_t>());
    return {{"out", r.out}, {"lse", r.lse}};
  }

  std::vector<OutputCheck> contract_checks(const Problem& p, const TensorMap&,
                                           const Contract& contract) const override {
    return budget_checks(p, contract);
  }

 private:
  // Each query row reads its packed slots.
  static std::vector<OutputCheck> budget_checks(const Problem& p, const Contract& contract) {
    const auto idx = packed(p);
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
    return mla::problem_checks(p, rows, keys_max, contract);
  }
};

const OpRegistrar kRegister(std::make_unique<SparseMlaOp>());

}  // namespace
}  // namespace attncheck
