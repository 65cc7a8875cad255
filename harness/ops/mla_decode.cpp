// mla_decode: absorbed MLA decode over a paged latent cache (docs/ops/mla_decode.md).
// Seed bugs the axes aim at: fewer than 16 heads (padding by repeat-interleave, strided un-pad),
// invalid head counts that must be refused, qlen 2..8 where every position needs its own causal
// limit (aiter #2720: position 0's result broadcast), block sizes 1/16/64 through page-index
// expansion over permuted tables, fp8 caches in both e4m3 flavours, strided q/out views, fp8
// special codes (saturation, -0, NaN in unread slots) and blocks past byte 2^31 / 2^32 (issue 14).
#include <algorithm>

#include "ops/mla_inputs.h"
#include "ops/op.h"
#include "ops/paged.h"
#include "reference/mla_decode.h"
#include "reference/page_indices.h"

namespace attncheck {
namespace {

class MlaDecodeOp final : public ContractDependentOp {
 public:
  std::string name() const override { return "mla_decode"; }
  std::vector<Axis> axes() const override {
    return {
        {"heads", "h", 16, mla::kHeadValues,
         "query heads; 3, 5, 12, 24, 40 break the 16-head rule and must be refused"},
        {"block_size", "bs", 16, {1, 16, 64}, "cache block size = kernel block size"},
        {"qlen", "q", 1, {1, 2, 3, 4, 5, 6, 7, 8}, "query tokens per request (MTP drafts + 1)"},
        {"dtype", "", "bf16", {"bf16", "f16"}, "query and output dtype"},
        {"kv_dtype", "kv", "auto", {"auto", "e4m3fn", "e4m3fnuz"}, "cache dtype (auto = dtype)"},
        {"batch", "b", 3, {}, "requests (uniform qlen, ragged kv lengths)"},
        {"ctx", "ctx", 65, {}, "longest kv length; others ragged with block-edge lengths"},
        {"layout",
         "",
         "contiguous",
         {"contiguous", "strided", "transposed"},
         "q/out/lse views: contiguous (+ spare row), strided (gaps, odd offset, wide table rows), "
         "transposed (head-major storage)"},
        {"dims", "d", "576x512", {"576x512", "96x64"}, "Lk x Lv (latent + rope, latent)"},
        {"scale", "sc", "lk", {"lk", "yarn"}, "softmax scale: 1/sqrt(Lk) or DeepSeek-V3 YaRN"},
        {"seed", "s", 0, {}, "input seed"},
        fp8_codes_axis("special: cache codes span the fp8 format; the slots requests read hold "
                       "the saturation codes (+-448 e4m3fn, +-240 e4m3fnuz) and, in e4m3fn, -0; "
                       "every other slot the format's NaN codes (fp8 kv_dtype only)"),
        offset_log2_axis("31 / 32: every block a request reads starts past byte 2^31 / 2^32 of "
                         "the cache (block ids past 2^31 / block bytes); the host holds only "
                         "those blocks, the device the whole extent, NaN-poisoned"),
    };
  }

  Problem make(const Case& c) const override {
    const auto& pr = c.params;
    const int64_t N = param_int(pr, "heads"), P = param_int(pr, "block_size");
    const int64_t qlen = param_int(pr, "qlen"), B = param_int(pr, "batch");
    const int64_t seed = param_int(pr, "seed");
    const DType qd = param_dtype(pr, "dtype");
    const DType kvd = mla::cache_dtype(param_str(pr, "kv_dtype"), qd);
    const auto [lk, lv] = mla::parse_dims(param_str(pr, "dims"));
    const std::string layout = param_str(pr, "layout");
    const bool specials = param_str(pr, "fp8_codes") == "special";
    if (specials && !is_fp8(kvd))
      throw std::invalid_argument(c.id + ": fp8_codes = special needs an fp8 kv_dtype");
    const auto pl = paged_layout(c.id, B, param_int(pr, "ctx"), P, layout == "strided", seed, qlen);

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
    Tensor qsl = Tensor::empty(DType::i32, {B + 1});
    for (int64_t r = 0; r <= B; ++r) qsl.at<int32_t>({r}) = static_cast<int32_t>(r * qlen);

    Problem p;
    p.args = {{"q", mla::make_query(c.id, layout, qd, T, N, lk, seed), Role::input},
              {"kv_cache", cache, Role::input},
              {"block_table", pl.block_table, Role::input},
              {"seq_lens", pl.seq_lens, Role::input},
              {"query_start_loc", qsl, Role::input},
              {"out", mla::make_token_head_view(layout, qd, T, N, lv), Role::output},
              {"lse", mla::make_lse_view(layout, T, N), Role::output}};
    const double kv_scale =
        is_fp8(kvd) ? mla::fp8_kv_scale(seed, specials ? max_finite(kvd) : 4.0) : 1.0;
    p.kernel_params = {{"scale", mla::softmax_scale(param_str(pr, "scale"), lk)},
                       {"kv_scale", kv_scale},
                       {"kernel_block_size", P},
                       {"lv", lv},
                       {"max_seqlen_q", qlen}};
    if (is_fp8(kvd)) p.kernel_params["fp8_format"] = param_str(pr, "kv_dtype");
    if (!ref::mla_num_heads_valid(N)) p.expect_refusal = ref::mla_num_heads_message(N);

    double keys = 0, kv_bytes = 0;
    for (int64_t r = 0; r < B; ++r) {
      const int64_t L = pl.seq_lens.at<int32_t>({r});
      for (int64_t i = 0; i < qlen; ++i) keys += static_cast<double>(L - qlen + i + 1);
      kv_bytes += static_cast<double>(L * lk) * static_cast<double>(dtype_size(kvd));
    }
    p.flops = 2.0 * keys * static_cast<double>(N * (lk + lv));
    p.bytes =
        kv_bytes + static_cast<double>(T * N * (lk + lv)) * static_cast<double>(dtype_size(qd));
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    const auto& kp = p.kernel_params;
    const auto r =
        ref::mla_decode(p.arg("q"), {p.arg("kv_cache"), kp.at("kv_scale").get<double>()},
                        p.arg("block_table"), p.arg("seq_lens"), p.arg("query_start_loc"),
                        kp.at("scale").get<double>(), kp.at("lv").get<int64_t>());
    return {{"out", r.out}, {"lse", r.lse}};
  }

  std::vector<OutputCheck> contract_checks(const Problem& p, const TensorMap&,
                                           const Contract& contract) const override {
    return budget_checks(p, contract);
  }

 private:
  // Every request's slots (page_indices order), each query row reading its request's.
  static std::vector<OutputCheck> budget_checks(const Problem& p, const Contract& contract) {
    const Tensor& lens = p.arg("seq_lens");
    const Tensor slots = ref::page_indices(p.arg("block_table"), lens,
                                           p.kernel_params.at("kernel_block_size").get<int64_t>());
    const Tensor& qsl = p.arg("query_start_loc");
    mla::RowSlots rows;
    rows.slots.resize(static_cast<size_t>(slots.numel()));
    for (size_t i = 0; i < rows.slots.size(); ++i)
      rows.slots[i] = slots.at<int32_t>({static_cast<int64_t>(i)});
    int64_t keys_max = 0, first = 0;
    for (int64_t r = 0; r < lens.size(0); ++r) {
      const int64_t L = lens.at<int32_t>({r});
      keys_max = std::max<int64_t>(keys_max, L);
      for (int64_t t = qsl.at<int32_t>({r}); t < qsl.at<int32_t>({r + 1}); ++t) {
        rows.begin.push_back(first);
        rows.end.push_back(first + L);
      }
      first += L;
    }
    return mla::problem_checks(p, rows, keys_max, contract);
  }
};

const OpRegistrar kRegister(std::make_unique<MlaDecodeOp>());

}  // namespace
}  // namespace attncheck
