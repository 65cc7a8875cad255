// Indexer ops, part 1 (docs/ops/indexer.md "Semantics"): the K quantize + paged cache write, the
// prefill gather and the q quantizer; plus the input generators every indexer op shares.
// Part 2 (logits, top-k) is indexer_scores.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/indexer_inputs.h"
#include "ops/storage_offset.h"
#include "ops/values.h"
#include "reference/page_indices.h"

namespace attncheck::indexer_ops {

const std::vector<std::pair<DType, std::string>>& fp8_formats() {
  static const std::vector<std::pair<DType, std::string>> formats = {{DType::e4m3fn, "e4m3fn"},
                                                                     {DType::e4m3fnuz, "e4m3fnuz"}};
  return formats;
}
std::string fp8_format_name(DType fp8) {
  for (const auto& [format, name] : fp8_formats())
    if (format == fp8) return name;
  throw std::logic_error("not an indexer fp8 format");
}
float quant_max_of(DType fp8, QuantMax variant) {
  return ix::quant_max(
      fp8, variant == QuantMax::aiter ? ix::QuantMaxVariant::aiter : ix::QuantMaxVariant::vllm);
}

std::optional<std::string> block_size_problem(int64_t bs) {
  if (bs == 1 || (bs > 1 && bs % ix::kTile == 0)) return std::nullopt;
  return "block size " + std::to_string(bs) +
         " is neither 1 (NORMAL) nor a multiple of 16 (SHUFFLE)";
}
std::optional<std::string> page_stride_problem(int64_t pad) {
  if (pad % 4 == 0) return std::nullopt;
  return "page stride is not a multiple of 4";
}

Tensor i32_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(DType::i32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i)
    t.at<int32_t>({static_cast<int64_t>(i)}) = static_cast<int32_t>(v[i]);
  return t;
}

int64_t padded_stride(int64_t width) {
  return (width + 15) / 16 * 16 + 16;
}
Tensor padded_rows(DType dtype, const Shape& shape, int64_t row_stride) {
  Shape full = shape;
  full.back() = row_stride;
  return Tensor::empty(dtype, full).slice(static_cast<int64_t>(shape.size()) - 1, 0, shape.back());
}

void fill_quant_rows(const Tensor& rows, const std::string& case_id, const std::string& name,
                     int64_t seed, float qmax, RowMix mix) {
  const auto s = static_cast<uint64_t>(seed);
  fill_normal(rows, Rng(case_id, name, s));
  Rng rng(case_id, name + "/rows", s);
  const int64_t R = rows.size(0), D = rows.size(1);
  for (int64_t r = 0; r < R; ++r) {
    const int e = static_cast<int>(rng.uniform_int(-12, 4));
    const double sign = rng.uniform() < 0.5 ? -1.0 : 1.0;
    const int64_t at = rng.uniform_int(0, D - 1);
    const int64_t kind = r % 16 == 0 || mix == RowMix::edges ? r % 16 : 4;
    switch (kind) {
      case 0:  // all zero: the amax floor decides the scale
        for (int64_t d = 0; d < D; ++d) rows.set({r, d}, 0.0);
        break;
      case 1:  // peak exactly M * 2^e: scale 2^e, the peak encodes to the largest code used
      case 2:  // the next bf16 above: the scale doubles
        for (int64_t d = 0; d < D; ++d) rows.set({r, d}, rows.get({r, d}) * std::ldexp(1.0, e));
        rows.set({r, at}, sign * std::ldexp(static_cast<double>(qmax), e));
        if (kind == 2)
          rows.set_bits(Index{r, at}, rows.get_bits(Index{r, at}) + 1);  // magnitude up one ulp
        break;
      case 3:  // a sweep over 2^-21 .. 1 of the peak: fp8 subnormals and values that flush to 0
        for (int64_t d = 0; d < D; ++d)
          rows.set({r, d}, (d % 2 ? -1.0 : 1.0) * std::ldexp(1.0, e - static_cast<int>(d % 22)));
        break;
      default: {  // ordinary rows: 2^-18 .. 2^6 (edges), 2^-2 .. 2^2 (model)
        const int mag = mix == RowMix::edges ? 3 * e / 2 : e % 3;
        for (int64_t d = 0; d < D; ++d) rows.set({r, d}, rows.get({r, d}) * std::ldexp(1.0, mag));
      }
    }
  }
}

Tensor paged_cache(const std::string& case_id, const PagedLayout& layout, int64_t bs, int64_t pad,
                   DType fp8, int64_t seed, RowMix mix, int64_t first, CacheCodes codes) {
  const int64_t stride = bs * ix::kTokenBytes + pad, blocks = layout.num_blocks;
  const int64_t total = first + blocks;
  Tensor storage = paged_storage(first, blocks, stride);
  fill_uniform_int(storage.slice(0, first * stride, total * stride),
                   Rng(case_id, "kv_cache/stale", static_cast<uint64_t>(seed)), 0, 255);
  Tensor cache = storage.as_strided({total, bs, ix::kTokenBytes}, {stride, ix::kTokenBytes, 1}, 0);
  if (block_size_problem(bs)) return cache;
  std::vector<int64_t> slots;
  for (int64_t r = 0; r < layout.seq_lens.size(0); ++r)
    for (int64_t p = 0; p < layout.seq_lens.at<int32_t>({r}); ++p)
      slots.push_back(int64_t{layout.block_table.at<int32_t>({r, p / bs})} * bs + p % bs);
  const auto T = static_cast<int64_t>(slots.size());
  Tensor slot = Tensor::empty(DType::i64, {T});
  for (int64_t i = 0; i < T; ++i) slot.at<int64_t>({i}) = slots[static_cast<size_t>(i)];
  Tensor k = Tensor::empty(DType::bf16, {T, ix::kHeadDim});
  const float qmax = ix::quant_max(fp8, ix::QuantMaxVariant::vllm);
  fill_quant_rows(k, case_id, "k", seed, qmax, mix);
  const ix::CacheLayout cl = ix::layout_for_block_size(bs);
  Tensor written = ix::write_k_cache(cache, k, slot, cl, fp8, qmax);
  if (codes == CacheCodes::ordinary) return written;
  // Position of the token in each slot of the held pages, -1 where nobody writes.
  std::vector<int64_t> position(static_cast<size_t>(blocks * bs), -1);
  size_t i = 0;
  for (int64_t r = 0; r < layout.seq_lens.size(0); ++r)
    for (int64_t p = 0; p < layout.seq_lens.at<int32_t>({r}); ++p)
      position[static_cast<size_t>(slots[i++] - first * bs)] = p;
  for (int64_t s = 0; s < blocks * bs; ++s) {
    auto* page = reinterpret_cast<uint8_t*>(written.element_ptr(Index{first + s / bs, 0, 0}));
    const int64_t t = s % bs, p = position[static_cast<size_t>(s)];
    for (int64_t d = 0; d < ix::kHeadDim; ++d) {
      uint8_t& byte = page[ix::value_offset(cl, bs, t, d)];
      if (p < 0) {
        if (codes == CacheCodes::decoded) byte = fp8_nan_code(t + d, fp8);
      } else if (const auto code = fp8_special_code(p + d, fp8)) {
        byte = *code;
      } else if (codes == CacheCodes::copied && (p + d) % 11 == 3) {
        byte = fp8_nan_code(p + d, fp8);
      }
    }
  }
  return written;
}

PagedInputs paged_inputs(const std::string& case_id, const PagedReadParams& p, RowMix mix,
                         CacheCodes special_codes) {
  PagedInputs in{
      paged_layout(case_id, p.batch, p.max_ctx, p.block_size, p.table == Table::strided, p.seed,
                   /*min_len=*/0, /*long_from=*/0, p.table_step),
      Tensor()};
  const int64_t first = first_block_past(p.offset_log2, p.block_size * ix::kTokenBytes + p.pad);
  shift_block_ids(in.layout, first);
  in.cache = paged_cache(case_id, in.layout, p.block_size, p.pad, p.fp8, p.seed, mix, first,
                         p.fp8_codes == Fp8Codes::special ? special_codes : CacheCodes::ordinary);
  return in;
}

void plant_fp8_specials(const Tensor& t) {
  if (!t.is_contiguous()) throw std::invalid_argument("plant_fp8_specials: not contiguous");
  auto* bytes = reinterpret_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i)
    if (const auto code = fp8_special_code(i, t.dtype())) bytes[i] = *code;
}

std::optional<std::string> windows_unbuildable(const WindowParams& p) {
  if (p.batch >= 1 && p.max_ctx >= 1 && p.qlen >= 1) return std::nullopt;
  return "prefill windows need batch, max_ctx, qlen >= 1";
}

PrefillWindows prefill_windows(const std::string& case_id, const WindowParams& p, int64_t seed) {
  if (const auto why = windows_unbuildable(p)) throw std::invalid_argument(*why);
  Rng rng(case_id, "prefill_windows", static_cast<uint64_t>(seed));
  const int64_t batch = p.batch;
  std::vector<int64_t> len(batch), q(batch);
  PrefillWindows w;
  for (int64_t r = 0; r < batch; ++r) {
    len[r] = r + 1 == batch ? p.max_ctx : rng.uniform_int(1, p.max_ctx);
    q[r] = std::min(p.qlen, len[r]);
    w.N += len[r];
    w.M += q[r];
  }
  std::vector<int64_t> ks, ke;
  int64_t cu = 0;
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t i = 0; i < q[r]; ++i) {
      if (p.mask == Mask::causal) {
        ks.push_back(cu);
        ke.push_back(cu + len[r] - q[r] + 1 + i);
      } else {
        const auto row = static_cast<int64_t>(ks.size());
        int64_t a = rng.uniform_int(0, w.N), b = rng.uniform_int(0, w.N);
        if (row == 0) a = 0, b = w.N;  // the full range
        if (row == 1) b = a;           // empty
        ks.push_back(std::min(a, b));
        ke.push_back(std::max(a, b));
      }
    }
    cu += len[r];
  }
  w.ks = i32_tensor(ks);
  w.ke = i32_tensor(ke);
  return w;
}

double key_factor(const Tensor& k_fp8, const Tensor& k_scale) {
  // The key rows the host holds: all of them, or a far_rows case's far one (the rest is device
  // poison no window reaches).
  const int64_t first = first_held_row(k_fp8), held = k_fp8.held_rows().size(0);
  double best = 0;
  for (int64_t j = first; j < first + held; ++j) {
    double m = 0;
    for (int64_t d = 0; d < ix::kHeadDim; ++d) m = std::max(m, std::fabs(k_fp8.get({j, d})));
    best = std::max(best, m * k_scale.get({j}));
  }
  return best;
}

Budget logits_budget(const Tensor& q, const Tensor& weights, double max_key_factor) {
  const int64_t H = q.size(-2), rows = weights.size(0);
  // q may come with padded outer strides (pad_strides): a contiguous copy reshapes.
  const Tensor qr = (q.is_contiguous() ? q : q.contiguous()).reshape({rows, H, ix::kHeadDim});
  double max_row = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double r = 0;
    for (int64_t h = 0; h < H; ++h) {
      double l1 = 0;
      for (int64_t d = 0; d < ix::kHeadDim; ++d) l1 += std::fabs(qr.get({i, h, d}));
      r += std::fabs(weights.get({i, h})) * l1;
    }
    max_row = std::max(max_row, r);
  }
  const double u = unit_roundoff(DType::f32), terms = max_row * max_key_factor;
  return BudgetBuilder("logits")
      .absolute(2 * gamma_n(ix::kHeadDim, u) * terms,
                "q.k: 128 exact fp8 products summed in fp32, any order, x2 for tensor cores that "
                "truncate (2 gamma_128 * max_i sum_h |w| sum_d |q| * max_j k_scale max_d |k|)")
      .accumulation(H + 1, DType::f32, terms, Bound::worst_case,
                    "weight product and " + std::to_string(H) + "-head sum")
      .output_rounding(DType::f32)
      .relative(u, "the expected value stored as fp32")
      .build();
}

namespace {

// The quantizers' kernel scalars.
nlohmann::json quantizer_kernel_params(const QuantParams& p) {
  return {{"fp8_format", fp8_format_name(p.fp8)},
          {"quant_max", static_cast<double>(quant_max_of(p.fp8, p.quant_max))}};
}

// The quantizers' value kinds (harness/ops/values.h) on their bf16 rows: typical, or large =
// every row x 2^112 (amax up to 2^125, near bf16's top; ue8m0 scales up to 2^117). Exact in bf16
// (a power of two), the codes stay those of typical rows and only the scales move: a kernel that
// takes the amax, the scale or its reciprocal through fp16 / bf16, or clamps the scale exponent,
// writes inf, NaN or wrong codes. (A tiny kind has nothing to show: the amax floors, 1e-4 and
// 1e-10, lie far above bf16's subnormals, and zero rows already take the floored scale.)
const std::vector<values::Values> kQuantValues = {values::Values::typical, values::Values::large};
constexpr const char* kQuantValuesHelp =
    "input value distribution (harness/ops/indexer.cpp): typical; large = the bf16 rows x 2^112 "
    "(amax near bf16's top, scales up to 2^117)";

void shape_quant_rows(values::Values v, const Tensor& rows) {
  if (v == values::Values::large) values::scale_finite(rows, std::ldexp(1.0, 112));
}

// ---------------------------------------------------------------------------------------------
// indexer_k_cache: per-token K quantization + paged cache write (docs/ops/indexer.md).
struct KCacheParams : QuantParams {
  int64_t block_size = 64;
  int64_t tokens = 40;
  int64_t pad = 0;
  int64_t k_stride = 128;
  int64_t offset_log2 = 0;
  values::Values values = values::Values::typical;
};

class IndexerKCacheOp final : public TypedOp<KCacheParams> {
 public:
  using P = KCacheParams;
  std::string name() const override { return "indexer_k_cache"; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("block_size", "bs", &P::block_size,
          "cache block size: 1 (NORMAL) or a multiple of 16 (SHUFFLE)")
        .add("tokens", "t", &P::tokens, "slot_mapping entries (k has 3 more rows)");
    add_fp8(f);
    add_quant_max(f);
    f.add("pad", "pad", &P::pad, "bytes of padding after each page (page stride BS*132 + pad)")
        .add("k_stride", "ks", &P::k_stride,
             "row stride of k in elements (192: k inside the fused wk|weights output)");
    add_seed(f);
    add_offset_log2(f,
                    "31 / 32: every page the writer fills starts past byte 2^31 / 2^32 of the "
                    "cache (slots past 2^31 / token bytes); the host holds and compares "
                    "only those pages, the device poisons the rest with 0xFF");
    values::add_field(f, &P::values, kQuantValues, kQuantValuesHelp);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.block_size < 1 || p.tokens < 1 || p.pad < 0 || p.k_stride < ix::kHeadDim)
      return "block_size, tokens >= 1, pad >= 0, k_stride >= 128";
    if (p.far_rows && p.tokens < 2) return "far_rows needs two or more tokens";
    return std::nullopt;
  }

  std::optional<std::string> invalid(const P& p) const override {
    if (p.pad % 4)
      return "page stride " + std::to_string(p.block_size * ix::kTokenBytes + p.pad) +
             " is not a multiple of 4 (fp32 scales would be misaligned)";
    return block_size_problem(p.block_size);
  }

  // The k rows (k_stride wide), the slots, and the cache of twice the pages the tokens need
  // (a large-offset cache holds those only).
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), bs = static_cast<double>(p.block_size);
    const double pages = 2 * std::ceil(T / std::max(bs, 1.0)) + 2;
    CaseSize s;
    s.input_bytes = 2 * (T + 3) * static_cast<double>(p.k_stride) + 8 * T;
    s.output_bytes = pages * (bs * ix::kTokenBytes + static_cast<double>(p.pad));
    s.work = T * ix::kHeadDim;
    return s.count("tokens", p.tokens).count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t bs = p.block_size, T = p.tokens;
    // Half the pages are mapped, in a random order; the others must keep their 0xFF sentinels.
    // Large offsets: page ids start at `first`, past byte 2^offset_log2.
    const int64_t pages = (T + bs - 1) / bs, blocks = 2 * pages + 2;
    const int64_t stride = bs * ix::kTokenBytes + p.pad;
    const int64_t first = first_block_past(p.offset_log2, stride);
    Rng rng(c.id, "slots", static_cast<uint64_t>(p.seed));
    const auto page_ids = permutation(blocks, rng);
    auto order = permutation(T, rng);
    Tensor slot = Tensor::empty(DType::i64, {T});
    for (int64_t i = 0; i < T; ++i) {
      const int64_t j = order[static_cast<size_t>(i)];  // tokens arrive in a shuffled slot order
      // Padding tokens: slot -1. far_rows: the last token alone writes (its k row is the far
      // one, place_far_token).
      const bool skipped = rng.uniform() < 0.15;
      slot.at<int64_t>({i}) = (p.far_rows ? i != T - 1 : skipped)
                                  ? -1
                                  : (first + page_ids[static_cast<size_t>(j / bs)]) * bs + j % bs;
    }
    Tensor k_storage = Tensor::empty(DType::bf16, {T + 3, p.k_stride});
    fill_normal(k_storage, Rng(c.id, "k_storage", static_cast<uint64_t>(p.seed)));
    Tensor k = k_storage.slice(1, 0, ix::kHeadDim);
    fill_quant_rows(k, c.id, "k", p.seed, quant_max_of(p.fp8, p.quant_max), RowMix::edges);
    shape_quant_rows(p.values, k);
    const int64_t total = first + blocks;
    Tensor storage = paged_storage(first, blocks, stride);
    std::fill(storage.storage()->bytes.begin(), storage.storage()->bytes.end(), std::byte{0xFF});
    Tensor cache =
        storage.as_strided({total, bs, ix::kTokenBytes}, {stride, ix::kTokenBytes, 1}, 0);
    Problem prob;
    prob.args = {{"k", k, Role::input},
                 {"slot_mapping", slot, Role::input},
                 {"kv_cache", cache, Role::inout}};
    if (p.far_rows) place_far_token(prob, {"k"}, T - 1);
    prob.bytes = static_cast<double>(T) * (2 * ix::kHeadDim + ix::kTokenBytes);
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return quantizer_kernel_params(p);
  }

  // Invariance (docs/verification.md "Invariance"): each token writes only its own slot (slots
  // are distinct): the tokens in another order, and the second half of the tokens written alone
  // into the cache the first half left (a writer fed in chunks must not touch the other tokens of
  // a page it writes); the cache compared whole.
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    BatchArgs tokens{{"slot_mapping", "k"}, {}, ""};
    tokens.unit = "token";
    tokens.whole = {"kv_cache"};
    const auto seed = static_cast<uint64_t>(p.seed);
    std::vector<Relation> out;
    if (request_count(prob, tokens) > 1)
      out.push_back(
          permuted_requests(prob, tokens, derangement(request_count(prob, tokens), seed)));
    if (auto chunked = chunked_write(prob, tokens, [&](const Problem& first) {
          return TensorMap{{"kv_cache", written_cache(first, p)}};
        }))
      out.push_back(std::move(*chunked));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    // A large-offset cache is compared over the pages the host holds (the rows a device
    // read-back returns, run/device.cpp).
    return {{"kv_cache", written_cache(prob, p).held_rows()}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    return {{"kv_cache",
             exact_budget("cache bytes compared bitwise over every page, unmapped 0xFF pages "
                          "included (fp32 amax, exact power-of-two ue8m0 scale, RNE fp8: "
                          "deterministic)"),
             {},
             {}}};
  }

 private:
  // The cache as the reference leaves it after `prob`'s tokens (same view, its own storage).
  // far_rows: the last token alone writes and the host holds its k row only (the reference
  // quantizes every row it is given).
  static Tensor written_cache(const Problem& prob, const P& p) {
    const Tensor& k = prob.arg("k");
    const Tensor& slots = prob.arg("slot_mapping");
    const int64_t T = slots.size(0), from = p.far_rows && T > 0 ? T - 1 : 0;
    return ix::write_k_cache(prob.arg("kv_cache"), k.slice(0, from, k.size(0)),
                             slots.slice(0, from, T), ix::layout_for_block_size(p.block_size),
                             p.fp8, quant_max_of(p.fp8, p.quant_max));
  }
};

// ---------------------------------------------------------------------------------------------
// indexer_gather: paged cache -> contiguous k_fp8 + k_scale for prefill (docs/ops/indexer.md).
struct GatherParams : PagedReadParams {};

class IndexerGatherOp final : public TypedOp<GatherParams> {
 public:
  using P = GatherParams;
  std::string name() const override { return "indexer_gather"; }
  // far_rows: each gathered row is one token; the reference gathers them all (kept: the last).
  FarRows far_rows_args(const P&) const override { return {{"k_fp8"}, {"k_scale"}, {}}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"k_fp8"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    add_paged_layout(f, {"cache block size", "requests",
                         "longest request; ragged lengths with block-edge cases"});
    add_paged_read_tail(f,
                        "special: the tokens gathered hold the saturation codes, -0 "
                        "(e4m3fn) and NaN codes, which the byte copy must keep");
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.block_size < 1 || p.pad < 0) return "block_size >= 1, pad >= 0";
    return std::nullopt;
  }

  std::optional<std::string> invalid(const P& p) const override {
    if (const auto why = page_stride_problem(p.pad)) return why;
    return block_size_problem(p.block_size);
  }

  // The held cache pages, the layout, and the gathered values and scales of every token.
  CaseSize size(const P& p) const override {
    const double N = static_cast<double>(p.batch) * static_cast<double>(p.max_ctx) + 2;
    CaseSize s;
    s.input_bytes =
        paged_blocks(p.batch, p.max_ctx, p.block_size) *
            (static_cast<double>(p.block_size) * ix::kTokenBytes + static_cast<double>(p.pad)) +
        paged_layout_bytes(p.batch, p.max_ctx, p.block_size) + 4 * static_cast<double>(p.batch + 1);
    s.output_bytes = N * ix::kTokenBytes;
    s.work = N * ix::kTokenBytes;
    return s.count("batch", p.batch).count("max_ctx", p.max_ctx).count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const auto in = paged_inputs(c.id, p, RowMix::edges, CacheCodes::copied);
    const Tensor cu = ref::cumulative_lengths(in.layout.seq_lens);
    const int64_t N = cu.at<int32_t>({cu.size(0) - 1});
    // Outputs sit at the front of longer poisoned buffers: rows past N must stay untouched.
    Tensor values = Tensor::empty(p.fp8, {N + 2, ix::kHeadDim});
    Tensor scales = Tensor::empty(DType::f32, {N + 2});
    poison(values);
    poison(scales);
    Problem prob;
    prob.args = {{"kv_cache", in.cache, Role::input},
                 {"block_table", in.layout.block_table, Role::input},
                 {"cu_seq_lens", cu, Role::input},
                 {"k_fp8", values.slice(0, 0, N), Role::output},
                 {"k_scale", scales.slice(0, 0, N), Role::output}};
    prob.bytes = static_cast<double>(N) * 2 * ix::kTokenBytes;
    return prob;
  }

  nlohmann::json kernel_params(const P&, const Problem&) const override {
    return nlohmann::json::object();
  }

  // Invariance (docs/verification.md "Invariance"): each request's rows are a copy of its own
  // pages: the requests in another order, the longest alone, the pages shuffled.
  std::vector<Relation> relations(const Problem& prob) const override {
    const auto seed = static_cast<uint64_t>(typed(prob).seed);
    const BatchArgs batch{{"block_table"}, {"k_fp8", "k_scale"}, "cu_seq_lens"};
    const Tensor& cu = prob.arg("cu_seq_lens");
    int64_t longest = 0;
    for (int64_t r = 0; r + 1 < cu.size(0); ++r)
      if (cu.at<int32_t>({r + 1}) - cu.at<int32_t>({r}) >
          cu.at<int32_t>({longest + 1}) - cu.at<int32_t>({longest}))
        longest = r;
    auto out = permuted_and_alone(prob, batch, longest, seed);
    if (auto shuffled = shuffled_pages(prob, {"kv_cache"}, "block_table", seed))
      out.push_back(std::move(*shuffled));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    const auto g = ix::gather_k_cache(
        {prob.arg("kv_cache"), p.block_size, ix::layout_for_block_size(p.block_size)},
        prob.arg("block_table"), prob.arg("cu_seq_lens"), p.fp8);
    return {{"k_fp8", g.values}, {"k_scale", g.scales}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    const Budget b = exact_budget("gather copies cache bytes: bitwise");
    return {{"k_fp8", b, {}, {}}, {"k_scale", b, {}, {}}};
  }
};

// ---------------------------------------------------------------------------------------------
// indexer_q_quant: per (token, head) fp8 quantization of q and the head weights
// (docs/ops/indexer.md).
struct QQuantParams : QuantParams {
  int64_t tokens = 16;
  int64_t heads = 64;
  values::Values values = values::Values::typical;
};

class IndexerQQuantOp final : public TypedOp<QQuantParams> {
 public:
  using P = QQuantParams;
  std::string name() const override { return "indexer_q_quant"; }
  // far_rows: tokens are independent; q and q_fp8 past 2^31, the other outputs hold the last row.
  FarRows far_rows_args(const P&) const override {
    return {{"q", "q_fp8"}, {"q_scale", "weights"}, {"weights_raw"}};
  }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override { return {"weights_raw"}; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override {
    return {"q", "q_fp8", "q_scale", "weights"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("tokens", "t", &P::tokens, "tokens")
        .add("heads", "h", &P::heads,
             "index heads (64 DSv3.2, 32 GLM-5, fewer per rank when sharded)");
    add_fp8(f);
    add_quant_max(f);
    add_seed(f);
    values::add_field(f, &P::values, kQuantValues, kQuantValuesHelp);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.tokens < 1 || p.heads < 1) return "tokens and heads must be >= 1";
    return std::nullopt;
  }

  // q and the fused k|weights rows in bf16, the fp8 q with its scales and weights.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), H = static_cast<double>(p.heads);
    CaseSize s;
    s.input_bytes = 2 * T * H * ix::kHeadDim + 2 * T * (ix::kHeadDim + H);
    s.output_bytes = T * H * (ix::kHeadDim + 8);
    s.work = T * H * ix::kHeadDim;
    return s.count("tokens", p.tokens).count("heads", p.heads);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t T = p.tokens, H = p.heads;
    Tensor q = Tensor::empty(DType::bf16, {T, H, ix::kHeadDim});
    fill_quant_rows(q.reshape({T * H, ix::kHeadDim}), c.id, "q", p.seed,
                    quant_max_of(p.fp8, p.quant_max), RowMix::edges);
    shape_quant_rows(p.values, q);
    // weights_raw is the tail of the fused wk|weights_proj GEMM output [T, 128 + H].
    Tensor kw = Tensor::empty(DType::bf16, {T, ix::kHeadDim + H});
    fill_normal(kw, Rng(c.id, "kw", static_cast<uint64_t>(p.seed)));
    Tensor q_fp8 = Tensor::empty(p.fp8, {T, H, ix::kHeadDim});
    Tensor q_scale = Tensor::empty(DType::f32, {T, H});
    Tensor weights = Tensor::empty(DType::f32, {T, H});
    for (const Tensor* t : {&q_fp8, &q_scale, &weights}) poison(*t);
    Problem prob;
    prob.args = {{"q", q, Role::input},
                 {"weights_raw", kw.slice(1, ix::kHeadDim, ix::kHeadDim + H), Role::input},
                 {"q_fp8", q_fp8, Role::output},
                 {"q_scale", q_scale, Role::output},
                 {"weights", weights, Role::output}};
    prob.bytes = static_cast<double>(T * H) * (3 * ix::kHeadDim + 10);
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return quantizer_kernel_params(p);
  }

  // Invariance (docs/verification.md "Invariance"): tokens are quantized independently: the
  // tokens in another order, and the second half alone (chunked vs whole).
  std::vector<Relation> relations(const Problem& prob) const override {
    BatchArgs tokens{{"q", "weights_raw", "q_fp8", "q_scale", "weights"}, {}, ""};
    tokens.unit = "token";
    return permuted_and_chunked(prob, tokens, static_cast<uint64_t>(typed(prob).seed));
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    const auto q = ix::quantize_q(prob.arg("q"), prob.arg("weights_raw"), p.fp8,
                                  quant_max_of(p.fp8, p.quant_max));
    return {{"q_fp8", q.q_fp8}, {"q_scale", q.q_scale}, {"weights", q.weights}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    Budget exact;
    exact.kind = Budget::Kind::exact;
    exact.why = "quantization is deterministic (fp32 amax, power-of-two scale, RNE): bitwise";
    Budget w;
    w.rtol = 3 * unit_roundoff(DType::f32);
    w.why =
        "weights = raw * q_scale * 128^-0.5 * H^-0.5: three fp32 products (vLLM order); a "
        "kernel folding the constants may round differently: rtol 3u";
    return {{"q_fp8", exact, {}, {}}, {"q_scale", exact, {}, {}}, {"weights", w, {}, {}}};
  }
};

const OpRegistrar kRegisterKCache(std::make_unique<IndexerKCacheOp>());
const OpRegistrar kRegisterGather(std::make_unique<IndexerGatherOp>());
const OpRegistrar kRegisterQQuant(std::make_unique<IndexerQQuantOp>());

}  // namespace
}  // namespace attncheck::indexer_ops
