// Indexer ops, part 2 (docs/ops/indexer.md): fp8 MQA logits for prefill (ks/ke
// windows) and paged decode (next_n, Preshuffle reader, ChunkQ), and top-k for both.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/policy.h"
#include "ops/indexer_inputs.h"

namespace attncheck::indexer_ops {
namespace {

constexpr int64_t kMaxHeads = 128;

// q fp8 [rows, H, 128] and weights f32 [rows, H] from the vLLM quantizer on generated bf16 q.
ix::QuantizedQ make_q(const std::string& id, int64_t rows, int64_t H, DType fp8, int64_t seed) {
  const float qmax = ix::quant_max(fp8, ix::QuantMaxVariant::vllm);
  Tensor q = Tensor::empty(DType::bf16, {rows, H, ix::kHeadDim});
  if (rows * H > 0)
    fill_quant_rows(q.reshape({rows * H, ix::kHeadDim}), id, "q", seed, qmax, RowMix::model);
  Tensor raw = Tensor::empty(DType::bf16, {rows, H});
  fill_normal(raw, Rng(id, "weights_raw", static_cast<uint64_t>(seed)));
  return ix::quantize_q(q, raw, fp8, qmax);
}

Tensor poisoned_logits(int64_t rows, int64_t width) {
  Tensor t = padded_rows(DType::f32, {rows, width}, padded_stride(width));
  poison(t);
  return t;
}

std::string heads_problem(int64_t H) {
  if (H >= 1 && H <= kMaxHeads) return "";
  return "heads " + std::to_string(H) + " outside [1, " + std::to_string(kMaxHeads) + "]";
}

// ---------------------------------------------------------------------------------------------
class IndexerLogitsPrefillOp final : public Op {
 public:
  std::string name() const override { return "indexer_logits_prefill"; }
  std::vector<Axis> axes() const override {
    return {{"heads", "h", 32, {}, "index heads"},
            {"batch", "b", 2, {}, "requests in the chunk"},
            {"max_ctx", "ctx", 160, {}, "longest request (the last one)"},
            {"qlen", "q", 24, {}, "queries per request (at most its length)"},
            {"mask",
             "",
             "causal",
             {"causal", "random"},
             "causal: vLLM prefill windows; random: any ks <= ke"},
            fp8_axis(),
            {"seed", "s", 0, {}, "input seed"},
            fp8_codes_axis("special: q and k hold the saturation codes (+-448 e4m3fn, +-240 "
                           "e4m3fnuz) every 11th element and, in e4m3fn, -0")};
  }

  Problem make(const Case& c) const override {
    const int64_t H = param_int(c.params, "heads"), seed = param_int(c.params, "seed");
    const auto w =
        prefill_windows(c.id, param_int(c.params, "batch"), param_int(c.params, "max_ctx"),
                        param_int(c.params, "qlen"), param_str(c.params, "mask"), seed);
    const DType fp8 = fp8_of(c.params);
    Problem p;
    p.expect_refusal = heads_problem(H);
    if (H < 0) throw std::invalid_argument(c.id + ": heads must be >= 0");
    const auto q = make_q(c.id, w.M, H, fp8, seed);
    Tensor kb = Tensor::empty(DType::bf16, {w.N, ix::kHeadDim});
    fill_quant_rows(kb, c.id, "k", seed, ix::quant_max(fp8, ix::QuantMaxVariant::vllm),
                    RowMix::model);
    const auto k = ix::quantize_k(kb, fp8, ix::quant_max(fp8, ix::QuantMaxVariant::vllm));
    if (param_str(c.params, "fp8_codes") == "special") {
      plant_fp8_specials(q.q_fp8);
      plant_fp8_specials(k.values);
    }
    p.args = {{"q", q.q_fp8, Role::input},
              {"k_fp8", k.values, Role::input},
              {"k_scale", k.scales, Role::input},
              {"weights", q.weights, Role::input},
              {"cu_seqlen_ks", w.ks, Role::input},
              {"cu_seqlen_ke", w.ke, Role::input},
              {"logits", poisoned_logits(w.M, w.N), Role::output}};
    p.kernel_params = {{"fp8_format", param_str(c.params, "fp8")}};
    double pairs = 0;
    for (int64_t i = 0; i < w.M; ++i) pairs += w.ke.at<int32_t>({i}) - w.ks.at<int32_t>({i});
    p.flops = 2.0 * static_cast<double>(H * ix::kHeadDim) * pairs;
    p.bytes =
        static_cast<double>(w.M * (H * (ix::kHeadDim + 4)) + w.N * ix::kTokenBytes + 4 * w.M * w.N);
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    if (!p.expect_refusal.empty()) throw InvalidConfig(p.expect_refusal);
    return {
        {"logits", ix::mqa_logits(p.arg("q"), p.arg("k_fp8"), p.arg("k_scale"), p.arg("weights"),
                                  p.arg("cu_seqlen_ks"), p.arg("cu_seqlen_ke"))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    return {
        {"logits",
         logits_budget(p.arg("q"), p.arg("weights"), key_factor(p.arg("k_fp8"), p.arg("k_scale"))),
         {},
         {}}};
  }
};

// ---------------------------------------------------------------------------------------------
class IndexerLogitsDecodeOp final : public Op {
 public:
  std::string name() const override { return "indexer_logits_decode"; }
  std::vector<Axis> axes() const override {
    return {
        {"heads", "h", 32, {}, "index heads: 8/16 per rank when sharded, 32 GLM-5, 64 DSv3.2"},
        {"next_n", "nn", 1, {}, "tokens decoded per request (MTP)"},
        {"block_size",
         "bs",
         64,
         {},
         "cache block size: 1 reads NORMAL, multiples of 16 Preshuffle"},
        {"batch",
         "b",
         8,
         {},
         "requests: block-edge lengths (0, 1, K-1, K, K+1, 2K+1), then random, the last max_ctx"},
        {"max_ctx", "ctx", 300, {}, "longest context"},
        {"chunk_q",
         "cq",
         64,
         {},
         "heads per program requested (clamped to heads; AITER default 64)"},
        fp8_axis(),
        {"pad", "pad", 0, {}, "bytes of padding after each page"},
        {"table", "", "contiguous", {"contiguous", "strided"}, "strided: table row stride > W"},
        {"seed", "s", 0, {}, "input seed"},
        fp8_codes_axis("special: q and the tokens read hold the saturation codes and, in e4m3fn, "
                       "-0; every other value byte of the pages NaN codes"),
        offset_log2_axis("31 / 32: every page a request reads starts past byte 2^31 / 2^32 of "
                         "the cache; the host holds only those pages")};
  }

  Problem make(const Case& c) const override {
    const int64_t H = param_int(c.params, "heads"), NN = param_int(c.params, "next_n");
    const int64_t bs = param_int(c.params, "block_size"), cq = param_int(c.params, "chunk_q");
    const int64_t pad = param_int(c.params, "pad"), seed = param_int(c.params, "seed");
    const int64_t max_ctx = param_int(c.params, "max_ctx");
    if (NN < 1 || bs < 1 || pad < 0)
      throw std::invalid_argument(c.id + ": next_n, block_size >= 1, pad >= 0");
    Problem p;
    p.expect_refusal = block_size_problem(bs);
    if (p.expect_refusal.empty()) p.expect_refusal = heads_problem(H);
    if (p.expect_refusal.empty() && cq < 1)
      p.expect_refusal = "chunk_q " + std::to_string(cq) + " < 1";
    if (p.expect_refusal.empty() && H % std::min(cq, H) != 0)
      p.expect_refusal =
          "heads " + std::to_string(H) + " not a multiple of chunk_q " + std::to_string(cq);
    if (p.expect_refusal.empty() && pad % 4)
      p.expect_refusal = "page stride is not a multiple of 4";
    const auto layout = paged_layout(c.id, param_int(c.params, "batch"), max_ctx, bs,
                                     param_str(c.params, "table") == "strided", seed);
    const int64_t first =
        first_block_past(param_int(c.params, "offset_log2"), bs * ix::kTokenBytes + pad);
    shift_block_ids(layout, first);
    const bool specials = param_str(c.params, "fp8_codes") == "special";
    const int64_t B = layout.seq_lens.size(0), rows = B * NN;
    const int64_t max_model_len = max_ctx + 37;  // columns past every context must read -inf
    const DType fp8 = fp8_of(c.params);
    if (H < 0) throw std::invalid_argument(c.id + ": heads must be >= 0");
    const auto q = make_q(c.id, rows, H, fp8, seed);
    if (specials) plant_fp8_specials(q.q_fp8);
    p.args = {{"q",
               H > 0 ? q.q_fp8.reshape({B, NN, H, ix::kHeadDim})
                     : Tensor::empty(fp8, {B, NN, 0, ix::kHeadDim}),
               Role::input},
              {"kv_cache",
               paged_cache(c.id, layout, bs, pad, fp8, seed, RowMix::model, first,
                           specials ? CacheCodes::decoded : CacheCodes::ordinary),
               Role::input},
              {"weights", q.weights, Role::input},
              {"context_lens", layout.seq_lens, Role::input},
              {"block_table", layout.block_table, Role::input},
              {"logits", poisoned_logits(rows, max_model_len), Role::output}};
    p.kernel_params = {{"fp8_format", param_str(c.params, "fp8")}, {"chunk_q", cq}};
    double pairs = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < NN; ++n)
        pairs += static_cast<double>(
            ix::decode_row_end(layout.seq_lens.at<int32_t>({b}), NN, n, max_model_len));
    p.flops = 2.0 * static_cast<double>(H * ix::kHeadDim) * pairs;
    p.bytes = static_cast<double>(rows * H * (ix::kHeadDim + 4)) +
              pairs / static_cast<double>(NN) * ix::kTokenBytes +
              4.0 * static_cast<double>(rows * max_model_len);
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    if (!p.expect_refusal.empty()) throw InvalidConfig(p.expect_refusal);
    const Tensor& cache = p.arg("kv_cache");
    const int64_t bs = cache.size(1);
    return {{"logits", ix::paged_mqa_logits(p.arg("q"), {cache, bs, ix::layout_for_block_size(bs)},
                                            p.arg("weights"), p.arg("context_lens"),
                                            p.arg("block_table"), p.arg("logits").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    // C_j over the tokens any row can see.
    const Tensor& cache = p.arg("kv_cache");
    const int64_t bs = cache.size(1);
    const ix::CacheView view{cache, bs, ix::layout_for_block_size(bs)};
    const Tensor& lens = p.arg("context_lens");
    const Tensor& table = p.arg("block_table");
    const auto lut_fp8 = p.arg("q").dtype();
    double kf = 0;
    uint8_t bytes[ix::kHeadDim];
    for (int64_t b = 0; b < lens.size(0); ++b)
      for (int64_t t = 0; t < std::min<int64_t>(lens.at<int32_t>({b}), p.arg("logits").size(1));
           ++t) {
        float s = 0;
        ix::read_token(view, table.at<int32_t>({b, t / bs}), t % bs, bytes, &s);
        double m = 0;
        for (uint8_t x : bytes) m = std::max(m, std::fabs(fp8_decode(x, lut_fp8)));
        kf = std::max(kf, m * s);
      }
    return {{"logits", logits_budget(p.arg("q"), p.arg("weights"), kf), {}, {}}};
  }
};

// ---------------------------------------------------------------------------------------------
// Top-k inputs: logits inside each row's window (random, or few distinct values for many ties);
// outside it, and in the padding columns, values larger than any inside: a kernel that looks past
// its window picks them.
constexpr double kOutside = 1.0e4;

void fill_window_logits(const Tensor& logits, const std::vector<int64_t>& begin,
                        const std::vector<int64_t>& end, const std::string& data,
                        const std::string& id, int64_t seed) {
  Rng rng(id, "logits", static_cast<uint64_t>(seed));
  Tensor all =
      logits.as_strided({logits.size(0), logits.stride(0)}, {logits.stride(0), 1}, logits.offset());
  for (int64_t i = 0; i < all.size(0); ++i)
    for (int64_t j = 0; j < all.size(1); ++j) {
      const bool inside = j >= begin[i] && j < end[i];
      double v = rng.normal();
      if (data == "ties") v = std::round(v * 4.0) / 4.0;
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

class IndexerTopkPrefillOp final : public Op {
 public:
  std::string name() const override { return "indexer_topk_prefill"; }
  std::vector<Axis> axes() const override {
    return {{"topk", "k", 64, {}, "indices per row (2048 in the models)"},
            {"batch", "b", 3, {}, "requests"},
            {"max_ctx", "ctx", 200, {}, "longest request"},
            {"qlen", "q", 16, {}, "queries per request"},
            {"mask", "", "causal", {"causal", "random"}, "window pattern"},
            {"data", "", "random", {"random", "ties"}, "ties: few distinct values"},
            {"seed", "s", 0, {}, "input seed"}};
  }

  Problem make(const Case& c) const override {
    const int64_t k = param_int(c.params, "topk"), seed = param_int(c.params, "seed");
    if (k < 1) throw std::invalid_argument(c.id + ": topk must be >= 1");
    const auto w =
        prefill_windows(c.id, param_int(c.params, "batch"), param_int(c.params, "max_ctx"),
                        param_int(c.params, "qlen"), param_str(c.params, "mask"), seed);
    Tensor logits = padded_rows(DType::f32, {w.M, w.N}, padded_stride(w.N));
    std::vector<int64_t> begin(w.M), end(w.M);
    for (int64_t i = 0; i < w.M; ++i)
      begin[i] = w.ks.at<int32_t>({i}), end[i] = w.ke.at<int32_t>({i});
    fill_window_logits(logits, begin, end, param_str(c.params, "data"), c.id, seed);
    Problem p;
    p.args = {{"logits", logits, Role::input},
              {"cu_seqlen_ks", w.ks, Role::input},
              {"cu_seqlen_ke", w.ke, Role::input},
              {"topk_indices", topk_output(w.M, k), Role::output}};
    p.bytes = 4.0 * static_cast<double>(w.M * (w.N + k));
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    return {
        {"topk_indices", ix::topk_prefill(p.arg("logits"), p.arg("cu_seqlen_ks"),
                                          p.arg("cu_seqlen_ke"), p.arg("topk_indices").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    const Tensor& ks = p.arg("cu_seqlen_ks");
    std::vector<int64_t> offsets(ks.size(0));
    for (int64_t i = 0; i < ks.size(0); ++i) offsets[i] = ks.at<int32_t>({i});
    return {{"topk_indices", fp32_topk_budget(), p.arg("logits"), offsets}};
  }
};

class IndexerTopkDecodeOp final : public Op {
 public:
  std::string name() const override { return "indexer_topk_decode"; }
  std::vector<Axis> axes() const override {
    return {{"topk", "k", 64, {}, "indices per row"},
            {"next_n", "nn", 1, {}, "rows per request"},
            {"batch", "b", 6, {}, "requests: lengths around k (k-1, k, k+1 ...) and max_ctx"},
            {"max_ctx", "ctx", 300, {}, "longest context"},
            {"data", "", "random", {"random", "ties"}, "ties: few distinct values"},
            {"seed", "s", 0, {}, "input seed"}};
  }

  Problem make(const Case& c) const override {
    const int64_t k = param_int(c.params, "topk"), NN = param_int(c.params, "next_n");
    const int64_t B = param_int(c.params, "batch"), max_ctx = param_int(c.params, "max_ctx");
    const int64_t seed = param_int(c.params, "seed");
    if (k < 1 || NN < 1 || B < 1 || max_ctx < 1)
      throw std::invalid_argument(c.id + ": sizes must be >= 1");
    // Row windows just below, at and just above k, then random; the last request is max_ctx long.
    Rng rng(c.id, "seq_lens", static_cast<uint64_t>(seed));
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
    fill_window_logits(logits, begin, end, param_str(c.params, "data"), c.id, seed);
    Problem p;
    p.args = {{"logits", logits, Role::input},
              {"seq_lens", i32_tensor(lens), Role::input},
              {"topk_indices", topk_output(rows, k), Role::output}};
    p.kernel_params = {{"next_n", NN}};
    p.bytes = 4.0 * static_cast<double>(rows * (width + k));
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    return {{"topk_indices", ix::topk_decode(p.arg("logits"), p.arg("seq_lens"),
                                             p.kernel_params.at("next_n").get<int64_t>(),
                                             p.arg("topk_indices").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    return {{"topk_indices", fp32_topk_budget(), p.arg("logits"), {}}};
  }
};

const OpRegistrar kRegisterPrefill(std::make_unique<IndexerLogitsPrefillOp>());
const OpRegistrar kRegisterDecode(std::make_unique<IndexerLogitsDecodeOp>());
const OpRegistrar kRegisterTopkPrefill(std::make_unique<IndexerTopkPrefillOp>());
const OpRegistrar kRegisterTopkDecode(std::make_unique<IndexerTopkDecodeOp>());

}  // namespace
}  // namespace attncheck::indexer_ops
