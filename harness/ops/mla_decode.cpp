// mla_decode: absorbed MLA decode over a paged latent cache (docs/ops/mla_decode.md).
// Seed bugs the axes aim at: fewer than 16 heads (padding by repeat-interleave, strided un-pad),
// invalid head counts that must be refused, qlen 2..8 where every position needs its own causal
// limit (aiter #2720: position 0's result broadcast), block sizes 1/16/64 through page-index
// expansion over permuted tables, fp8 caches in both e4m3 flavours, strided q/out views, fp8
// special codes (saturation, -0, NaN in unread slots) and blocks past byte 2^31 / 2^32 (issue 14).
#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "ops/mla_inputs.h"
#include "reference/mla_decode.h"
#include "reference/page_indices.h"

namespace attncheck {
namespace {

struct MlaDecodeParams : mla::CommonParams {
  bool ragged_qlen = false;
  bool storage_offset = false;  // ops/storage_offset.h
  int64_t out_offset_log2 = 0;
  bool far_rows = false;  // ops/storage_offset.h
};

// Query tokens of each request: qlen for all, or with ragged_qlen qlen, qlen - 1, .., 1, qlen,
// .. (request 0 keeps qlen, so max_seqlen_q = qlen while T / B is smaller).
std::vector<int64_t> request_qlens(const MlaDecodeParams& p) {
  std::vector<int64_t> qlens(static_cast<size_t>(p.batch), p.qlen);
  if (p.ragged_qlen)
    for (int64_t r = 0; r < p.batch; ++r) qlens[static_cast<size_t>(r)] = p.qlen - r % p.qlen;
  return qlens;
}

class MlaDecodeOp final : public ContractDependentTypedOp<MlaDecodeParams> {
 public:
  using P = MlaDecodeParams;
  std::string name() const override { return "mla_decode"; }
  // pad_strides: a padded kv_cache, which the ABI refuses (mla::invalid).
  std::vector<std::string> padded_args(const P&) const override { return {"kv_cache"}; }
  // far_rows: the last query token's q row past element 2^31; out and lse hold its row. The
  // reference sees that token as a request of its own (far_view).
  FarRows far_rows_args(const P&) const override { return {{"q"}, {"out", "lse"}, {}}; }
  Fields<P> fields() const override {
    const mla::AxisTexts texts{
        .block_size = "cache block size = kernel block size",
        .qlen = "query tokens per request (MTP drafts + 1)",
        .batch = "requests (uniform qlen, ragged kv lengths)",
        .layout =
            "q/out/lse views: contiguous (+ spare row), strided (gaps, odd offset, wide "
            "table rows), transposed (head-major storage)",
        .dims = "Lk x Lv (latent + rope, latent)",
        .scale = "softmax scale: 1/sqrt(Lk) or DeepSeek-V3 YaRN",
        .fp8_codes =
            "special: cache codes span the fp8 format; the slots requests read hold "
            "the saturation codes (+-448 e4m3fn, +-240 e4m3fnuz) and, in e4m3fn, -0; "
            "every other slot the format's NaN codes (fp8 kv_dtype only)",
        .offset_log2 =
            "31 / 32: every block a request reads starts past byte 2^31 / 2^32 of "
            "the cache (block ids past 2^31 / block bytes); the host holds only "
            "those blocks, the device the whole extent, NaN-poisoned",
        .qlen_values = {1, 2, 3, 4, 5, 6, 7, 8},
    };
    Fields<P> f;
    mla::add_shape_fields(f, texts);
    mla::add_input_fields(f, texts);
    f.template add<bool>("ragged_qlen", "ragged", &P::ragged_qlen,
                         "request r has qlen - r % qlen query tokens (query_start_loc ragged, "
                         "max_seqlen_q = qlen > T / B); needs qlen >= 2 and batch >= 2")
        .out_of_id_at_default()
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default()
        .add("out_offset_log2", "ooff", &P::out_offset_log2,
             "31: out's token stride puts the last token's row past element 2^31 (byte 2^32); "
             "a sparse storage holds only that row, which alone is compared. contiguous layout")
        .only({0, 31})
        .out_of_id_at_default();
    add_far_rows(f, &P::far_rows);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.ragged_qlen && (p.qlen < 2 || p.batch < 2))
      return "mla_decode: ragged_qlen needs qlen >= 2 and batch >= 2";
    if (p.out_offset_log2 != 0 && (p.layout != mla::Layout::contiguous || p.batch * p.qlen < 2))
      return "mla_decode: out_offset_log2 needs the contiguous layout and two or more tokens";
    if (p.far_rows &&
        (p.layout != mla::Layout::contiguous || p.batch * p.qlen < 2 || p.out_offset_log2 != 0))
      return "mla_decode: far_rows needs the contiguous layout, two or more tokens and no "
             "out_offset_log2";
    return mla::unbuildable(p);
  }
  std::optional<std::string> invalid(const P& p) const override { return mla::invalid(p); }

  // The common MLA inputs (ops/mla_inputs.h); every query row reads its request's context.
  CaseSize size(const P& p) const override {
    CaseSize s = mla::common_size(p);
    s.work = 2 * static_cast<double>(p.batch * p.qlen) * static_cast<double>(p.ctx) *
             static_cast<double>(p.heads) * static_cast<double>(p.lk() + p.lv());
    return s;
  }

  Problem make(const Case& c, const P& p) const override {
    const mla::Inputs in = mla::make_inputs(c.id, p);
    const int64_t B = p.batch, lk = p.lk(), lv = p.lv();
    const auto qlens = request_qlens(p);
    Tensor qsl = Tensor::empty(DType::i32, {B + 1});
    int64_t T = 0;
    for (int64_t r = 0; r <= B; ++r) {
      qsl.at<int32_t>({r}) = static_cast<int32_t>(T);
      if (r < B) T += qlens[static_cast<size_t>(r)];
    }
    // Ragged: the first T of the B * qlen rows make_inputs built; the rest of their storages
    // lies outside every view and must stay untouched.
    const Tensor q = in.q.slice(0, 0, T), lse = in.lse.slice(0, 0, T);
    Tensor out = in.out.slice(0, 0, T);
    if (p.out_offset_log2 > 0) {
      out = far_last_row(p.dtype, {T, p.heads, lv}, p.out_offset_log2);
      poison(out);
    }

    Problem prob;
    prob.args = {{"q", q, Role::input},
                 {"kv_cache", in.cache, Role::input},
                 {"block_table", in.pages.block_table, Role::input},
                 {"seq_lens", in.pages.seq_lens, Role::input},
                 {"query_start_loc", qsl, Role::input},
                 {"out", out, Role::output},
                 {"lse", lse, Role::output}};
    const auto kv_size = static_cast<double>(dtype_size(p.cache_dtype()));
    double keys = 0, kv_bytes = 0;
    for (int64_t r = 0; r < B; ++r) {
      const int64_t L = in.pages.seq_lens.at<int32_t>({r}), qlen = qlens[static_cast<size_t>(r)];
      for (int64_t i = 0; i < qlen; ++i) keys += static_cast<double>(L - qlen + i + 1);
      kv_bytes += static_cast<double>(L * lk) * kv_size;
    }
    prob.flops = 2.0 * keys * static_cast<double>(p.heads * (lk + lv));
    prob.bytes = kv_bytes + static_cast<double>(T * p.heads * (lk + lv)) *
                                static_cast<double>(dtype_size(p.dtype));
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    nlohmann::json kp = mla::common_kernel_params(p);
    kp["max_seqlen_q"] = p.qlen;
    return kp;
  }

  // Graph replay (docs/verification.md "Graph replay"): captured at half the lengths (never below
  // the most query tokens of a request, the causal minimum) and another block order, replayed
  // with the case's own: a maximum length or page indices read on the host at capture are stale.
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    const Tensor& qsl = prob.arg("query_start_loc");
    int64_t qlen = 1;
    for (int64_t r = 0; r + 1 < qsl.size(0); ++r)
      qlen = std::max<int64_t>(qlen, qsl.at<int32_t>({r + 1}) - qsl.at<int32_t>({r}));
    return metadata_variant(prob, {halved("seq_lens", qlen), permuted_block_ids("block_table")});
  }

  // Invariance (docs/verification.md "Invariance"): the requests in another order, the longest
  // alone, one KV split instead of the kernel's choice, the blocks shuffled, the same cache at
  // block size 1 (mla::at_block_size_one).
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    const BatchArgs batch{{"block_table", "seq_lens"}, {"q", "out", "lse"}, "query_start_loc"};
    std::vector<Relation> out;
    const int64_t B = request_count(prob, batch);
    if (B > 1) {
      out.push_back(permuted_requests(prob, batch, derangement(B, static_cast<uint64_t>(p.seed))));
      out.push_back(request_alone(prob, batch, longest_request(prob.arg("seq_lens"))));
    }
    // The budgets hold for any split count (the kernel chooses it), so the case's apply.
    out.push_back(with_kernel_param(prob, "num_kv_splits 1 (the kernel's choice otherwise)",
                                    "num_kv_splits", 1, p));
    out.back().own_budgets = false;
    out.back().bitwise_under = {kSplitInvariant};
    if (auto shuffled =
            shuffled_pages(prob, {"kv_cache"}, "block_table", static_cast<uint64_t>(p.seed)))
      out.push_back(std::move(*shuffled));
    if (auto repaged = mla::at_block_size_one(prob, p)) out.push_back(std::move(*repaged));
    return out;
  }

  TensorMap reference(const Problem& host, const P& p) const override {
    const Problem prob = far_view(host, p);
    const auto r = ref::mla_decode(prob.arg("q"), {prob.arg("kv_cache"), p.kv_scale()},
                                   prob.arg("block_table"), prob.arg("seq_lens"),
                                   prob.arg("query_start_loc"), p.softmax_scale(), p.lv());
    return {{"out", held_rows_of(r.out, prob.arg("out"))}, {"lse", r.lse}};
  }

  std::vector<OutputCheck> contract_checks(const Problem& prob, const P& p,
                                           const TensorMap& expected,
                                           const Contract& contract) const override {
    auto checks = budget_checks(far_view(prob, p), p, contract);
    if (const auto out = expected.find("out"); out != expected.end())
      mla::widen_for_output_underflow(checks.at(0).budget, out->second, prob.arg("out").dtype());
    return checks;
  }

 private:
  // far_rows: the host view (q, out, lse cut to the last token's row) with that token as a
  // request of its own: the last request's table row and length, query_start_loc [0, 1]. The
  // last query token of a request sees its whole context, as a one-token request does.
  static Problem far_view(const Problem& host, const P& p) {
    if (!p.far_rows) return host;
    Problem v = host;
    const int64_t B = host.arg("seq_lens").size(0);
    v.arg("block_table") = host.arg("block_table").slice(0, B - 1, B);
    v.arg("seq_lens") = host.arg("seq_lens").slice(0, B - 1, B);
    Tensor qsl = Tensor::empty(DType::i32, {2});
    qsl.at<int32_t>({0}) = 0;
    qsl.at<int32_t>({1}) = 1;
    v.arg("query_start_loc") = qsl;
    return v;
  }

  // Every request's slots (page_indices order), each query row reading its request's.
  static std::vector<OutputCheck> budget_checks(const Problem& prob, const P& p,
                                                const Contract& contract) {
    const Tensor& lens = prob.arg("seq_lens");
    const Tensor slots = ref::page_indices(prob.arg("block_table"), lens, p.block_size);
    const Tensor& qsl = prob.arg("query_start_loc");
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
    return mla::problem_checks(prob, p, rows, keys_max, contract);
  }
};

const OpRegistrar kRegister(std::make_unique<MlaDecodeOp>());

}  // namespace
}  // namespace attncheck
