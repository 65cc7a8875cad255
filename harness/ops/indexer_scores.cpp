// Indexer ops, part 2 (docs/ops/indexer.md): fp8 MQA logits for prefill (ks/ke
// windows) and paged decode (next_n, Preshuffle reader, ChunkQ), and top-k for both.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/policy.h"
#include "ops/indexer_inputs.h"
#include "ops/storage_offset.h"
#include "ops/values.h"

namespace attncheck::indexer_ops {
namespace {

constexpr int64_t kMaxHeads = 128;

// The logits ops' value kinds (harness/ops/values.h), on the bf16 q rows and raw head weights
// before the quantizer (so q stays fp8 codes and the weights what the quantizer makes of them):
//   large   raw weights x 2^40: logits near 2^40 (past fp16's range: a half-precision head sum
//           or store overflows)
//   tiny    raw weights x 2^-120 (bf16 near its smallest normal, some subnormal): weights and
//           logits fp32 subnormals (a kernel that flushes them returns 0)
//   cancel  head 2i+1's q row = head 2i's, raw weights 16 r_2i and r_2i+1 - 16 r_2i: each pair of
//           weighted ReLU terms cancels to the size of one, the sums of |terms| 16x the logit
const std::vector<values::Values> kLogitsValues = {values::Values::typical, values::Values::large,
                                                   values::Values::tiny, values::Values::cancel};
constexpr const char* kLogitsValuesHelp =
    "input value distribution (harness/ops/indexer_scores.cpp): typical; large = head weights "
    "x 2^40 (logits near 2^40); tiny = head weights x 2^-120 (fp32 subnormal weights and "
    "logits); cancel = head pairs with equal q and weights that cancel";

void shape_logits_inputs(values::Values v, const Tensor& q, const Tensor& raw) {
  switch (v) {
    case values::Values::large:
      return values::scale_finite(raw, std::ldexp(1.0, 40));
    case values::Values::tiny:
      return values::scale_finite(raw, std::ldexp(1.0, -120));
    case values::Values::cancel:
      for (int64_t t = 0; t < raw.size(0); ++t)
        for (int64_t h = 0; h + 1 < raw.size(1); h += 2) {
          for (int64_t d = 0; d < q.size(2); ++d) q.set({t, h + 1, d}, q.get({t, h, d}));
          const double big = 16 * raw.get({t, h});
          raw.set({t, h + 1}, raw.get({t, h + 1}) - big);
          raw.set({t, h}, big);
        }
      return;
    default:
      return;
  }
}

// q fp8 [rows, H, 128] and weights f32 [rows, H] from the vLLM quantizer on generated bf16 q.
ix::QuantizedQ make_q(const std::string& id, int64_t rows, int64_t H, DType fp8, int64_t seed,
                      values::Values v = values::Values::typical) {
  const float qmax = ix::quant_max(fp8, ix::QuantMaxVariant::vllm);
  Tensor q = Tensor::empty(DType::bf16, {rows, H, ix::kHeadDim});
  if (rows * H > 0)
    fill_quant_rows(q.reshape({rows * H, ix::kHeadDim}), id, "q", seed, qmax, RowMix::model);
  Tensor raw = Tensor::empty(DType::bf16, {rows, H});
  fill_normal(raw, Rng(id, "weights_raw", static_cast<uint64_t>(seed)));
  shape_logits_inputs(v, q, raw);
  return ix::quantize_q(q, raw, fp8, qmax);
}

Tensor poisoned_logits(int64_t rows, int64_t width) {
  Tensor t = padded_rows(DType::f32, {rows, width}, padded_stride(width));
  poison(t);
  return t;
}

std::optional<std::string> heads_problem(int64_t H) {
  if (H >= 1 && H <= kMaxHeads) return std::nullopt;
  return "heads " + std::to_string(H) + " outside [1, " + std::to_string(kMaxHeads) + "]";
}

// ---------------------------------------------------------------------------------------------
struct LogitsPrefillParams : Fp8Params, WindowParams {
  int64_t heads = 32;
  Fp8Codes fp8_codes = Fp8Codes::ordinary;
  values::Values values = values::Values::typical;
};

class IndexerLogitsPrefillOp final : public TypedOp<LogitsPrefillParams> {
 public:
  using P = LogitsPrefillParams;
  std::string name() const override { return "indexer_logits_prefill"; }
  // far_rows: each query row reads its own [ks, ke) of the shared keys; the last one reads the
  // last key alone, whose k_fp8 row make() places past byte 2^32 too (place_far_token).
  FarRows far_rows_args(const P&) const override {
    return {{"q", "logits"}, {}, {"weights", "cu_seqlen_ks", "cu_seqlen_ke"}};
  }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override {
    return {"q", "k_fp8", "weights"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("heads", "h", &P::heads, "index heads");
    add_windows(f, {"requests in the chunk", "longest request (the last one)",
                    "queries per request (at most its length)",
                    "causal: vLLM prefill windows; random: any ks <= ke"});
    add_fp8(f);
    add_seed(f);
    add_fp8_codes(f,
                  "special: q and k hold the saturation codes (+-448 e4m3fn, +-240 "
                  "e4m3fnuz) every 11th element and, in e4m3fn, -0");
    values::add_field(f, &P::values, kLogitsValues, kLogitsValuesHelp);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (const auto why = windows_unbuildable(p)) return why;
    if (p.heads < 0) return "heads must be >= 0";
    if (p.far_rows && p.batch * p.max_ctx < 2) return "far_rows needs two or more keys";
    return values::unbuildable(p.values, p.fp8_codes == Fp8Codes::special, 0);
  }

  std::optional<std::string> invalid(const P& p) const override { return heads_problem(p.heads); }

  // q rows (at most qlen per request) against every key of the batch: logits [M, N].
  CaseSize size(const P& p) const override {
    const double M = static_cast<double>(p.batch) * static_cast<double>(p.qlen);
    const double N = static_cast<double>(p.batch) * static_cast<double>(p.max_ctx);
    const double H = static_cast<double>(p.heads);
    CaseSize s;
    s.input_bytes = M * H * (3 * ix::kHeadDim + 8) + N * (2 * ix::kHeadDim + ix::kTokenBytes);
    s.output_bytes = 4 * M * (N + 48);
    s.work = M * N * (H * ix::kHeadDim + 1);
    return s.count("batch", p.batch).count("max_ctx", p.max_ctx).count("qlen", p.qlen);
  }

  Problem make(const Case& c, const P& p) const override {
    const auto w = prefill_windows(c.id, p, p.seed);
    const int64_t H = p.heads;
    const float qmax = ix::quant_max(p.fp8, ix::QuantMaxVariant::vllm);
    const auto q = make_q(c.id, w.M, H, p.fp8, p.seed, p.values);
    Tensor kb = Tensor::empty(DType::bf16, {w.N, ix::kHeadDim});
    fill_quant_rows(kb, c.id, "k", p.seed, qmax, RowMix::model);
    const auto k = ix::quantize_k(kb, p.fp8, qmax);
    if (p.fp8_codes == Fp8Codes::special) {
      plant_fp8_specials(q.q_fp8);
      plant_fp8_specials(k.values);
    }
    if (p.far_rows) {  // the last query row reads the last key alone (the far one)
      w.ks.at<int32_t>({w.M - 1}) = static_cast<int32_t>(w.N - 1);
      w.ke.at<int32_t>({w.M - 1}) = static_cast<int32_t>(w.N);
    }
    Problem prob;
    prob.args = {{"q", q.q_fp8, Role::input},
                 {"k_fp8", k.values, Role::input},
                 {"k_scale", k.scales, Role::input},
                 {"weights", q.weights, Role::input},
                 {"cu_seqlen_ks", w.ks, Role::input},
                 {"cu_seqlen_ke", w.ke, Role::input},
                 {"logits", poisoned_logits(w.M, w.N), Role::output}};
    if (p.far_rows) place_far_token(prob, {"k_fp8"}, w.N - 1);  // k_scale: contiguous (ABI)
    double pairs = 0;
    for (int64_t i = 0; i < w.M; ++i) pairs += w.ke.at<int32_t>({i}) - w.ks.at<int32_t>({i});
    prob.flops = 2.0 * static_cast<double>(H * ix::kHeadDim) * pairs;
    prob.bytes =
        static_cast<double>(w.M * (H * (ix::kHeadDim + 4)) + w.N * ix::kTokenBytes + 4 * w.M * w.N);
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"fp8_format", fp8_format_name(p.fp8)}};
  }

  // Invariance (docs/verification.md "Invariance"): each query row reads its own q, weights and
  // window of the shared keys: the rows in another order, and the second half of the rows alone
  // (prefill over query chunks vs whole).
  std::vector<Relation> relations(const Problem& prob) const override {
    BatchArgs rows{{"q", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "logits"}, {}, ""};
    rows.unit = "query row";
    return permuted_and_chunked(prob, rows, static_cast<uint64_t>(typed(prob).seed));
  }

  // far_rows: the keys the host holds (the last one) with the windows moved onto them, the
  // logits of the other columns -inf (no window reaches them).
  TensorMap reference(const Problem& prob, const P&) const override {
    const Tensor& k = prob.arg("k_fp8");
    const Tensor held = k.held_rows();
    if (held.size(0) == k.size(0))
      return {{"logits", ix::mqa_logits(prob.arg("q"), k, prob.arg("k_scale"), prob.arg("weights"),
                                        prob.arg("cu_seqlen_ks"), prob.arg("cu_seqlen_ke"))}};
    const int64_t first = first_held_row(k), n = held.size(0);
    const Tensor ks = prob.arg("cu_seqlen_ks").clone(), ke = prob.arg("cu_seqlen_ke").clone();
    for (int64_t i = 0; i < ks.numel(); ++i) {
      const int64_t lo = ks.at<int32_t>({i}), hi = ke.at<int32_t>({i});
      if (lo < hi && (lo < first || hi > first + n))
        throw std::logic_error("indexer_logits_prefill: a window reaches keys the host lacks");
      ks.at<int32_t>({i}) = static_cast<int32_t>(std::clamp<int64_t>(lo - first, 0, n));
      ke.at<int32_t>({i}) = static_cast<int32_t>(std::clamp<int64_t>(hi - first, 0, n));
    }
    const Tensor part =
        ix::mqa_logits(prob.arg("q"), held, prob.arg("k_scale").slice(0, first, first + n),
                       prob.arg("weights"), ks, ke);
    Tensor out = Tensor::full(DType::f32, {part.size(0), k.size(0)},
                              -std::numeric_limits<double>::infinity());
    out.slice(1, first, first + n).copy_from(part);
    return {{"logits", out}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P&, const TensorMap&) const override {
    return {{"logits",
             logits_budget(prob.arg("q"), prob.arg("weights"),
                           key_factor(prob.arg("k_fp8"), prob.arg("k_scale"))),
             {},
             {}}};
  }
};

// ---------------------------------------------------------------------------------------------
struct LogitsDecodeParams : PagedReadParams {
  int64_t heads = 32;
  int64_t next_n = 1;
  int64_t chunk_q = 64;
  values::Values values = values::Values::typical;
  LogitsDecodeParams() { batch = 8; }
};

class IndexerLogitsDecodeOp final : public TypedOp<LogitsDecodeParams> {
 public:
  using P = LogitsDecodeParams;
  std::string name() const override { return "indexer_logits_decode"; }
  std::vector<OutputRegion> output_regions() const override { return logits_past_context_region(); }
  bool in_region(const std::string& output, const std::string& region, const Problem& prob,
                 const Index& idx) const override {
    return output == "logits" && region == kPastContext && logits_past_context(prob, idx);
  }
  // far_rows (next_n = 1: one logits row per request): each request reads only its own rows.
  FarRows far_rows_args(const P& p) const override {
    if (p.next_n != 1)
      throw std::invalid_argument("indexer_logits_decode: far_rows needs next_n 1");
    return {{"q", "logits"}, {}, {"weights", "context_lens", "block_table"}};
  }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override { return {"logits"}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"q", "weights"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("heads", "h", &P::heads, "index heads: 8/16 per rank when sharded, 32 GLM-5, 64 DSv3.2")
        .add("next_n", "nn", &P::next_n, "tokens decoded per request (MTP)");
    add_paged_layout(f, {"cache block size: 1 reads NORMAL, multiples of 16 Preshuffle",
                         "requests: block-edge lengths (0, 1, K-1, K, K+1, 2K+1), then random, "
                         "the last max_ctx",
                         "longest context"});
    f.add("chunk_q", "cq", &P::chunk_q,
          "heads per program requested (clamped to heads; AITER default 64)");
    add_paged_read_tail(f,
                        "special: q and the tokens read hold the saturation codes and, in "
                        "e4m3fn, -0; every other value byte of the pages NaN codes");
    values::add_field(f, &P::values, kLogitsValues, kLogitsValuesHelp);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.next_n < 1 || p.block_size < 1 || p.pad < 0) return "next_n, block_size >= 1, pad >= 0";
    if (p.heads < 0) return "heads must be >= 0";
    return values::unbuildable(p.values, p.fp8_codes == Fp8Codes::special, p.offset_log2);
  }

  std::optional<std::string> invalid(const P& p) const override {
    const int64_t H = p.heads, cq = p.chunk_q;
    if (const auto why = block_size_problem(p.block_size)) return why;
    if (const auto why = heads_problem(H)) return why;
    if (cq < 1) return "chunk_q " + std::to_string(cq) + " < 1";
    if (H % std::min(cq, H) != 0)
      return "heads " + std::to_string(H) + " not a multiple of chunk_q " + std::to_string(cq);
    return page_stride_problem(p.pad);
  }

  // The held cache pages, the layout, q with its weights, and logits as wide as the context.
  CaseSize size(const P& p) const override {
    const double rows = static_cast<double>(p.batch) * static_cast<double>(p.next_n);
    const double ctx = static_cast<double>(p.max_ctx), H = static_cast<double>(p.heads);
    CaseSize s;
    s.input_bytes =
        paged_blocks(p.batch, p.max_ctx, p.block_size) *
            (static_cast<double>(p.block_size) * ix::kTokenBytes + static_cast<double>(p.pad)) +
        paged_layout_bytes(p.batch, p.max_ctx, p.block_size) + rows * H * (3 * ix::kHeadDim + 8);
    s.output_bytes = 4 * rows * (ctx + 37 + 32);
    s.work = rows * ctx * (H * ix::kHeadDim + 1);
    return s.count("batch", p.batch)
        .count("max_ctx", p.max_ctx)
        .count("next_n", p.next_n)
        .count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t H = p.heads, NN = p.next_n;
    const auto in = paged_inputs(c.id, p, RowMix::model, CacheCodes::decoded);
    const int64_t B = in.layout.seq_lens.size(0), rows = B * NN;
    const int64_t max_model_len = p.max_ctx + 37;  // columns past every context must read -inf
    const auto q = make_q(c.id, rows, H, p.fp8, p.seed, p.values);
    if (p.fp8_codes == Fp8Codes::special) plant_fp8_specials(q.q_fp8);
    Problem prob;
    prob.args = {{"q",
                  H > 0 ? q.q_fp8.reshape({B, NN, H, ix::kHeadDim})
                        : Tensor::empty(p.fp8, {B, NN, 0, ix::kHeadDim}),
                  Role::input},
                 {"kv_cache", in.cache, Role::input},
                 {"weights", q.weights, Role::input},
                 {"context_lens", in.layout.seq_lens, Role::input},
                 {"block_table", in.layout.block_table, Role::input},
                 {"logits", poisoned_logits(rows, max_model_len), Role::output}};
    double pairs = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < NN; ++n)
        pairs += static_cast<double>(
            ix::decode_row_end(in.layout.seq_lens.at<int32_t>({b}), NN, n, max_model_len));
    prob.flops = 2.0 * static_cast<double>(H * ix::kHeadDim) * pairs;
    prob.bytes = static_cast<double>(rows * H * (ix::kHeadDim + 4)) +
                 pairs / static_cast<double>(NN) * ix::kTokenBytes +
                 4.0 * static_cast<double>(rows * max_model_len);
    return prob;
  }

  // Graph replay: captured at half the context lengths (never below next_n, the rows' causal
  // minimum) and another page order, replayed with the case's own.
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    const int64_t next_n = prob.arg("q").size(1);
    return metadata_variant(prob,
                            {halved("context_lens", next_n), permuted_block_ids("block_table")});
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"fp8_format", fp8_format_name(p.fp8)}, {"chunk_q", p.chunk_q}};
  }

  // Invariance (docs/verification.md "Invariance"): each request's next_n rows read only its q,
  // weights, length and pages: the requests in another order, the longest alone, the pages
  // shuffled.
  std::vector<Relation> relations(const Problem& prob) const override {
    const auto seed = static_cast<uint64_t>(typed(prob).seed);
    BatchArgs batch{{"q", "context_lens", "block_table"}, {"weights", "logits"}, ""};
    batch.tokens_per_request = prob.arg("q").size(1);
    auto out = permuted_and_alone(prob, batch, longest_request(prob.arg("context_lens")), seed);
    if (auto shuffled = shuffled_pages(prob, {"kv_cache"}, "block_table", seed))
      out.push_back(std::move(*shuffled));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    return {{"logits", ix::paged_mqa_logits(prob.arg("q"), cache_view(prob, p), prob.arg("weights"),
                                            prob.arg("context_lens"), prob.arg("block_table"),
                                            prob.arg("logits").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                  const TensorMap&) const override {
    // C_j over the tokens any row can see.
    const ix::CacheView view = cache_view(prob, p);
    const Tensor& lens = prob.arg("context_lens");
    const Tensor& table = prob.arg("block_table");
    const int64_t bs = p.block_size, width = prob.arg("logits").size(1);
    double kf = 0;
    uint8_t bytes[ix::kHeadDim];
    for (int64_t b = 0; b < lens.size(0); ++b)
      for (int64_t t = 0; t < std::min<int64_t>(lens.at<int32_t>({b}), width); ++t) {
        float s = 0;
        ix::read_token(view, table.at<int32_t>({b, t / bs}), t % bs, bytes, &s);
        double m = 0;
        for (uint8_t x : bytes) m = std::max(m, std::fabs(fp8_decode(x, p.fp8)));
        kf = std::max(kf, m * s);
      }
    return {{"logits", logits_budget(prob.arg("q"), prob.arg("weights"), kf), {}, {}}};
  }

 private:
  static ix::CacheView cache_view(const Problem& prob, const P& p) {
    return {prob.arg("kv_cache"), p.block_size, ix::layout_for_block_size(p.block_size)};
  }
};

// ---------------------------------------------------------------------------------------------
// Top-k inputs: logits inside each row's window (random, or few distinct values for many ties);
// outside it, and in the padding columns, values larger than any inside: a kernel that looks past
// its window picks them.
constexpr double kOutside = 1.0e4;

void fill_window_logits(const Tensor& logits, const std::vector<int64_t>& begin,
                        const std::vector<int64_t>& end, TopkData data, const std::string& id,
                        int64_t seed) {
  Rng rng(id, "logits", static_cast<uint64_t>(seed));
  Tensor all =
      logits.as_strided({logits.size(0), logits.stride(0)}, {logits.stride(0), 1}, logits.offset());
  for (int64_t i = 0; i < all.size(0); ++i)
    for (int64_t j = 0; j < all.size(1); ++j) {
      const bool inside = j >= begin[i] && j < end[i];
      double v = rng.normal();
      if (data == TopkData::ties) v = std::round(v * 4.0) / 4.0;
      all.at<float>({i, j}) = static_cast<float>(inside ? v : kOutside + v);
    }
}

Tensor topk_output(int64_t rows, int64_t k) {
  // 0x5A5A5A5A is no valid index and not -1: unwritten entries are seen.
  return Tensor::filled_bytes(DType::i32, {rows + 1, k}, std::byte{0x5A}).slice(0, 0, rows);
}

Budget fp32_topk_budget() {
  return attncheck::topk_budget(
      0.0,
      "sets compared; the kernel selects from the same fp32 values, so only exactly "
      "equal values may swap; valid indices first, -1 after, no duplicates");
}

struct TopkPrefillParams : SeedParams, WindowParams {
  int64_t topk = 64;
  TopkData data = TopkData::random;
  TopkPrefillParams() {
    batch = 3;
    max_ctx = 200;
    qlen = 16;
  }
};

class IndexerTopkPrefillOp final : public TypedOp<TopkPrefillParams> {
 public:
  using P = TopkPrefillParams;
  std::string name() const override { return "indexer_topk_prefill"; }
  // far_rows: each logits row is ranked alone within its [ks, ke).
  FarRows far_rows_args(const P&) const override {
    return {{"logits", "topk_indices"}, {}, {"cu_seqlen_ks", "cu_seqlen_ke"}};
  }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override { return {"logits"}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"topk_indices"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("topk", "k", &P::topk, "indices per row (2048 in the models)");
    add_windows(f, {"requests", "longest request", "queries per request", "window pattern"});
    add_topk_data(f);
    add_seed(f);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.topk < 1) return "topk must be >= 1";
    return windows_unbuildable(p);
  }

  // Logits [M, N] (at most qlen rows per request, every key of the batch) and the top-k.
  CaseSize size(const P& p) const override {
    const double M = static_cast<double>(p.batch) * static_cast<double>(p.qlen);
    const double N = static_cast<double>(p.batch) * static_cast<double>(p.max_ctx);
    CaseSize s;
    s.input_bytes = 4 * M * (N + 48) + 8 * M;
    s.output_bytes = 4 * (M + 1) * static_cast<double>(p.topk);
    s.work = M * N;
    return s.count("batch", p.batch).count("max_ctx", p.max_ctx).count("qlen", p.qlen);
  }

  Problem make(const Case& c, const P& p) const override {
    const auto w = prefill_windows(c.id, p, p.seed);
    Tensor logits = padded_rows(DType::f32, {w.M, w.N}, padded_stride(w.N));
    std::vector<int64_t> begin(w.M), end(w.M);
    for (int64_t i = 0; i < w.M; ++i)
      begin[i] = w.ks.at<int32_t>({i}), end[i] = w.ke.at<int32_t>({i});
    fill_window_logits(logits, begin, end, p.data, c.id, p.seed);
    Problem prob;
    prob.args = {{"logits", logits, Role::input},
                 {"cu_seqlen_ks", w.ks, Role::input},
                 {"cu_seqlen_ke", w.ke, Role::input},
                 {"topk_indices", topk_output(w.M, p.topk), Role::output}};
    prob.bytes = 4.0 * static_cast<double>(w.M * (w.N + p.topk));
    return prob;
  }

  nlohmann::json kernel_params(const P&, const Problem&) const override {
    return nlohmann::json::object();
  }

  // Invariance (docs/verification.md "Invariance"): each row is ranked alone within its window:
  // the rows in another order, and the second half alone (chunked vs whole).
  std::vector<Relation> relations(const Problem& prob) const override {
    BatchArgs rows{{"logits", "cu_seqlen_ks", "cu_seqlen_ke", "topk_indices"}, {}, ""};
    rows.unit = "row";
    return permuted_and_chunked(prob, rows, static_cast<uint64_t>(typed(prob).seed));
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    return {{"topk_indices", ix::topk_prefill(prob.arg("logits"), prob.arg("cu_seqlen_ks"),
                                              prob.arg("cu_seqlen_ke"), p.topk)}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P&, const TensorMap&) const override {
    const Tensor& ks = prob.arg("cu_seqlen_ks");
    std::vector<int64_t> offsets(ks.size(0));
    for (int64_t i = 0; i < ks.size(0); ++i) offsets[i] = ks.at<int32_t>({i});
    return {{"topk_indices", fp32_topk_budget(), prob.arg("logits"), offsets}};
  }
};

struct TopkDecodeParams : SeedParams {
  int64_t topk = 64;
  int64_t next_n = 1;
  int64_t batch = 6;
  int64_t max_ctx = 300;
  TopkData data = TopkData::random;
};

class IndexerTopkDecodeOp final : public TypedOp<TopkDecodeParams> {
 public:
  using P = TopkDecodeParams;
  std::string name() const override { return "indexer_topk_decode"; }
  // far_rows (next_n = 1: one logits row per request): each row is ranked alone.
  FarRows far_rows_args(const P& p) const override {
    if (p.next_n != 1) throw std::invalid_argument("indexer_topk_decode: far_rows needs next_n 1");
    return {{"logits", "topk_indices"}, {}, {"seq_lens"}};
  }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override { return {"logits"}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"topk_indices"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("topk", "k", &P::topk, "indices per row")
        .add("next_n", "nn", &P::next_n, "rows per request")
        .add("batch", "b", &P::batch, "requests: lengths around k (k-1, k, k+1 ...) and max_ctx")
        .add("max_ctx", "ctx", &P::max_ctx, "longest context");
    add_topk_data(f);
    add_seed(f);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.topk < 1 || p.next_n < 1 || p.batch < 1 || p.max_ctx < 1) return "sizes must be >= 1";
    return std::nullopt;
  }

  // Logits as wide as the context per row, the lengths, and the top-k.
  CaseSize size(const P& p) const override {
    const double rows = static_cast<double>(p.batch) * static_cast<double>(p.next_n);
    CaseSize s;
    s.input_bytes = 4 * rows * (static_cast<double>(p.max_ctx) + 37 + 32) + 4 * rows;
    s.output_bytes = 4 * (rows + 1) * static_cast<double>(p.topk);
    s.work = rows * static_cast<double>(p.max_ctx);
    return s.count("batch", p.batch).count("max_ctx", p.max_ctx).count("next_n", p.next_n);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t k = p.topk, NN = p.next_n, B = p.batch, max_ctx = p.max_ctx;
    // Row windows just below, at and just above k, then random; the last request is max_ctx long.
    Rng rng(c.id, "seq_lens", static_cast<uint64_t>(p.seed));
    const std::vector<int64_t> edges = {1, k + NN - 2, k + NN - 1, k + NN, 2 * k + 3};
    std::vector<int64_t> lens(B);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = b + 1 == B                               ? max_ctx
                        : b < static_cast<int64_t>(edges.size()) ? edges[static_cast<size_t>(b)]
                                                                 : rng.uniform_int(1, max_ctx);
      lens[b] = std::clamp<int64_t>(L, 1, max_ctx);
    }
    const int64_t width = max_ctx + 37, rows = B * NN;
    Tensor logits = padded_rows(DType::f32, {rows, width}, padded_stride(width));
    std::vector<int64_t> begin(rows, 0), end(rows);
    for (int64_t r = 0; r < rows; ++r) end[r] = ix::decode_row_end(lens[r / NN], NN, r % NN, width);
    fill_window_logits(logits, begin, end, p.data, c.id, p.seed);
    Problem prob;
    prob.args = {{"logits", logits, Role::input},
                 {"seq_lens", i32_tensor(lens), Role::input},
                 {"topk_indices", topk_output(rows, k), Role::output}};
    prob.bytes = 4.0 * static_cast<double>(rows * (width + k));
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"next_n", p.next_n}};
  }

  // Invariance (docs/verification.md "Invariance"): each request's next_n rows are ranked within
  // its own length: the requests in another order, the longest alone.
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    BatchArgs batch{{"seq_lens"}, {"logits", "topk_indices"}, ""};
    batch.tokens_per_request = p.next_n;
    return permuted_and_alone(prob, batch, longest_request(prob.arg("seq_lens")),
                              static_cast<uint64_t>(p.seed));
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    return {{"topk_indices",
             ix::topk_decode(prob.arg("logits"), prob.arg("seq_lens"), p.next_n, p.topk)}};
  }

  std::vector<OutputCheck> checks(const Problem& prob, const P&, const TensorMap&) const override {
    return {{"topk_indices", fp32_topk_budget(), prob.arg("logits"), {}}};
  }
};

const OpRegistrar kRegisterPrefill(std::make_unique<IndexerLogitsPrefillOp>());
const OpRegistrar kRegisterDecode(std::make_unique<IndexerLogitsDecodeOp>());
const OpRegistrar kRegisterTopkPrefill(std::make_unique<IndexerTopkPrefillOp>());
const OpRegistrar kRegisterTopkDecode(std::make_unique<IndexerTopkDecodeOp>());

}  // namespace
}  // namespace attncheck::indexer_ops
