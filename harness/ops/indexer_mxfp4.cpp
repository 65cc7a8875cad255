// The indexer with MXFP4 keys and queries (docs/ops/indexer_mxfp4.md), in the paged cache layout
// of AITER's paged MXFP4 MQA-logits kernel (vLLM indexer_kv_dtype = "mxfp4"):
// indexer_mxfp4_k_cache (bf16 K -> packed e2m1 + e8m0 scales in the slot's page; bitwise) and
// indexer_mxfp4_logits_decode (paged MQA logits of MXFP4 q against the cache; derived budget).
// What they guard against: scales rounded the wrong way, nibble order swapped, the scale slice of
// another block, the e8m0 byte 0 (2^-127) read as zero, NaN scales of unread slots leaking in.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp4.h"
#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/op.h"
#include "reference/indexer_mxfp4.h"

namespace attncheck {
namespace {

namespace mx = ref::mxfp4;

Axis head_dim_axis() {
  return {"head_dim", "d", 128, {32, 64, 128}, "index head dim D"};
}
Axis block_size_axis() {
  return {"block_size", "bs", 64, {1, 16, 64}, "entries per cache page"};
}
Axis layout_axis() {
  return {"layout",
          "",
          "natural",
          {"natural", "shuffle16", "shuffle32"},
          "page order: token order, or AITER's preshuffle with n_per_tile 16 / 32 (scale mode 1)"};
}

int64_t n_per_tile_of(const Params& p) {
  const std::string layout = param_str(p, "layout");
  return layout == "shuffle16" ? 16 : (layout == "shuffle32" ? 32 : 0);
}

mx::CacheGeometry geometry_of(const Case& c) {
  const mx::CacheGeometry g{param_int(c.params, "head_dim"), param_int(c.params, "block_size"),
                            n_per_tile_of(c.params)};
  try {
    mx::check_geometry(g);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(c.id + ": " + e.what());
  }
  return g;
}

mx::CacheGeometry geometry_of(const Problem& p) {
  const Tensor& cache = p.arg("kv_cache");
  return {(cache.size(2) * 32) / 17, cache.size(1),
          p.kernel_params.at("n_per_tile").get<int64_t>()};
}

// A u8 cache of `pages` pages, each padded by `pad` bytes: every byte `fill`, or random bytes
// from `random` when given.
Tensor make_cache(const mx::CacheGeometry& g, int64_t pages, int64_t pad, std::byte fill,
                  const Rng* random = nullptr) {
  const int64_t stride = g.page_bytes() + pad;
  Tensor storage = Tensor::filled_bytes(DType::u8, {pages * stride}, fill);
  if (random) fill_uniform_int(storage, *random, 0, 255);
  return storage.as_strided({pages, g.page_size, g.entry_bytes()}, {stride, g.entry_bytes(), 1}, 0);
}

// bf16 rows with non-power-of-two magnitudes per row and per 32-element block.
void fill_rows(const Tensor& t, const Rng& rng) {
  const int64_t rows = t.size(0), D = t.size(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < D / 32; ++b) {
      const double factor = std::exp(rng.normal_at(static_cast<uint64_t>(1000000 + r * 64 + b)));
      for (int64_t d = b * 32; d < b * 32 + 32; ++d)
        t.set({r, d}, factor * rng.normal_at(static_cast<uint64_t>(r * D + d)));
    }
}

// ---------------------------------------------------------------------------------------------
class IndexerMxfp4KCacheOp final : public Op {
 public:
  std::string name() const override { return "indexer_mxfp4_k_cache"; }
  std::vector<Axis> axes() const override {
    return {block_size_axis(),
            head_dim_axis(),
            layout_axis(),
            {"tokens",
             "t",
             41,
             {},
             "slot_mapping entries (k has 3 more rows); odd counts leave "
             "a partial page"},
            {"scale_rule",
             "",
             "ceil",
             {"ceil", "ocp_floor", "even"},
             "e8m0 scale rule "
             "(docs/formats.md)"},
            {"values",
             "",
             "model",
             {"model", "extreme"},
             "extreme: zero rows, rows at 1e-38 and 3e38 (scale bytes 0 and 253), blocks whose "
             "amax sits on the rules' boundaries (6, 6.5, 7 times a power of two)"},
            {"pad", "pad", 0, {}, "bytes after each page (page stride = page + pad)"},
            {"seed", "s", 0, {}, "input seed"}};
  }

  Problem make(const Case& c) const override {
    const mx::CacheGeometry g = geometry_of(c);
    const int64_t T = param_int(c.params, "tokens"), seed = param_int(c.params, "seed");
    if (T < 0) throw std::invalid_argument(c.id + ": tokens must be >= 0");
    const int64_t D = g.head_dim, pages = (T + g.page_size - 1) / g.page_size + 2;
    Tensor k = Tensor::empty(DType::bf16, {T + 3, D});
    fill_rows(k, Rng(c.id, "k", static_cast<uint64_t>(seed)));
    if (param_str(c.params, "values") == "extreme") plant_extremes(k);
    Rng rng(c.id, "slots", static_cast<uint64_t>(seed));
    const std::vector<int64_t> order = permutation(pages * g.page_size, rng);
    Tensor slots = Tensor::empty(DType::i64, {T});
    for (int64_t i = 0; i < T; ++i) slots.at<int64_t>({i}) = i % 7 == 3 ? -1 : order[i];
    const Rng bytes(c.id, "cache", static_cast<uint64_t>(seed));
    Tensor cache = make_cache(g, pages, param_int(c.params, "pad"), std::byte{0}, &bytes);
    Problem p;
    p.args = {{"k", k, Role::input},
              {"slot_mapping", slots, Role::input},
              {"kv_cache", cache, Role::inout}};
    p.kernel_params = {{"n_per_tile", g.n_per_tile},
                       {"scale_rule", param_str(c.params, "scale_rule")}};
    p.bytes = static_cast<double>(T) * static_cast<double>(2 * D + g.entry_bytes() + 8);
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    const std::string rule = p.kernel_params.at("scale_rule").get<std::string>();
    const fp4::MxScaleRule r = rule == "ceil"        ? fp4::MxScaleRule::ceil
                               : rule == "ocp_floor" ? fp4::MxScaleRule::ocp_floor
                                                     : fp4::MxScaleRule::even;
    return {{"kv_cache", mx::write_k_cache(p.arg("kv_cache"), p.arg("k"), p.arg("slot_mapping"),
                                           geometry_of(p), r)}};
  }

  std::vector<OutputCheck> checks(const Problem&, const TensorMap&) const override {
    return {{"kv_cache", exact_budget("quantized bytes and untouched bytes: bitwise"), {}, {}}};
  }

 private:
  // Row 0 zeros (scale 127), row 1 tiny (clamped to byte 0), row 2 huge (byte 253), row 4 with
  // block amax 6, 6.5 and 7 times powers of two (where the rules part).
  static void plant_extremes(const Tensor& k) {
    const int64_t rows = k.size(0), D = k.size(1);
    for (int64_t d = 0; d < D; ++d) {
      if (rows > 0) k.set({0, d}, 0.0);
      if (rows > 1) k.set({1, d}, static_cast<double>(d % 3 - 1) * 1e-38);
      if (rows > 2) k.set({2, d}, (d % 2 ? -3e38 : 1e38));
    }
    const double boundary[] = {6.0, 6.5, 7.0, 0.75};
    for (int64_t b = 0; rows > 4 && b < D / 32; ++b)
      k.set({4, b * 32 + 5}, boundary[b % 4] * std::ldexp(1.0, static_cast<int>(b) * 3 - 4));
  }
};

// ---------------------------------------------------------------------------------------------
class IndexerMxfp4LogitsDecodeOp final : public Op {
 public:
  std::string name() const override { return "indexer_mxfp4_logits_decode"; }
  std::vector<Axis> axes() const override {
    return {{"heads", "h", 32, {}, "index heads"},
            head_dim_axis(),
            block_size_axis(),
            layout_axis(),
            {"batch", "b", 3, {}, "requests"},
            {"next_n", "nn", 1, {}, "query rows per request"},
            {"max_ctx", "ctx", 200, {}, "longest context (request 0); the others ragged"},
            {"scales",
             "sc",
             "model",
             {"model", "extreme"},
             "extreme: K block 0 scale bytes 0..2 against q bytes 250..252, K block 1 bytes "
             "250..252 against q bytes 0..2 (products stay fp32-normal)"},
            {"seed", "s", 0, {}, "input seed"}};
  }

  Problem make(const Case& c) const override {
    const mx::CacheGeometry g = geometry_of(c);
    const int64_t H = param_int(c.params, "heads"), B = param_int(c.params, "batch"),
                  NN = param_int(c.params, "next_n"), max_ctx = param_int(c.params, "max_ctx"),
                  seed = param_int(c.params, "seed"), D = g.head_dim, S = g.page_size;
    if (H < 1 || B < 1 || NN < 1 || max_ctx < 1)
      throw std::invalid_argument(c.id + ": heads, batch, next_n and max_ctx must be >= 1");
    const bool extreme = param_str(c.params, "scales") == "extreme";
    Rng rng(c.id, "layout", static_cast<uint64_t>(seed));
    std::vector<int64_t> lens(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      lens[b] = b == 0 ? max_ctx : (b == 1 ? 1 : rng.uniform_int(1, max_ctx));
    const int64_t W = (max_ctx + S - 1) / S + 1;
    int64_t used = 0;
    for (int64_t L : lens) used += (L + S - 1) / S;
    const int64_t pages = used + 2;  // two pages nobody owns
    const std::vector<int64_t> order = permutation(pages, rng);
    // Unread bytes are 0xFF: NaN scales and -6 elements that must never reach a logit.
    Tensor cache = make_cache(g, pages, 16, std::byte{0xFF});
    Tensor table = Tensor::empty(DType::i32, {B, W});
    Tensor context = Tensor::empty(DType::i32, {B});
    int64_t next_page = 0;
    for (int64_t b = 0; b < B; ++b) {
      context.at<int32_t>({b}) = static_cast<int32_t>(lens[b]);
      for (int64_t j = 0; j < W; ++j)
        table.at<int32_t>({b, j}) =
            static_cast<int32_t>(j < (lens[b] + S - 1) / S ? order[next_page++] : order[pages - 1]);
      write_keys(c, g, cache, table, b, lens[b], extreme, seed);
    }
    Tensor qb = Tensor::empty(DType::bf16, {B * NN * H, D});
    fill_rows(qb, Rng(c.id, "q", static_cast<uint64_t>(seed)));
    Tensor q = Tensor::empty(DType::u8, {B, NN, H, D / 2});
    Tensor qs = Tensor::empty(DType::u8, {B, NN, H, D / 32});
    quantize_rows(qb, reinterpret_cast<uint8_t*>(q.data()), reinterpret_cast<uint8_t*>(qs.data()));
    if (extreme)
      for (int64_t i = 0; i < B * NN * H; ++i) {
        auto* s = reinterpret_cast<uint8_t*>(qs.data()) + i * (D / 32);
        s[0] = static_cast<uint8_t>(250 + i % 3);
        if (D >= 64) s[1] = static_cast<uint8_t>(i % 3);
      }
    Tensor w = Tensor::empty(DType::f32, {B * NN, H});
    fill_normal(w, Rng(c.id, "weights", static_cast<uint64_t>(seed)));
    const int64_t width = max_ctx + 5;  // columns past every context must read -inf
    Tensor logits_buf = Tensor::empty(DType::f32, {B * NN, width + 16});
    poison(logits_buf);
    Problem p;
    p.args = {{"q", q, Role::input},
              {"q_scale", qs, Role::input},
              {"kv_cache", cache, Role::input},
              {"weights", w, Role::input},
              {"context_lens", context, Role::input},
              {"block_table", table, Role::input},
              {"logits", logits_buf.slice(1, 0, width), Role::output}};
    p.kernel_params = {{"n_per_tile", g.n_per_tile}};
    double pairs = 0;
    for (int64_t L : lens) pairs += static_cast<double>(std::min(L, width) * NN);
    p.flops = 2.0 * static_cast<double>(H * D) * pairs;
    p.bytes = pairs / static_cast<double>(NN) * static_cast<double>(g.entry_bytes()) +
              4.0 * static_cast<double>(B * NN * width);
    return p;
  }

  TensorMap reference(const Problem& p) const override {
    return {{"logits", mx::paged_logits(p.arg("q"), p.arg("q_scale"), p.arg("kv_cache"),
                                        geometry_of(p), p.arg("weights"), p.arg("context_lens"),
                                        p.arg("block_table"), p.arg("logits").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    const int64_t H = p.arg("q").size(2), D = 2 * p.arg("q").size(3);
    const double terms = mx::max_logit_terms(
        p.arg("q"), p.arg("q_scale"), p.arg("kv_cache"), geometry_of(p), p.arg("weights"),
        p.arg("context_lens"), p.arg("block_table"), p.arg("logits").size(1));
    const double u = unit_roundoff(DType::f32);
    return {{"logits",
             BudgetBuilder("logits")
                 .absolute(gamma_n(D, u) * terms,
                           "q.k: " + std::to_string(D) +
                               " exact e2m1 x e2m1 x 2^k products summed in fp32, any order "
                               "(gamma_D * max sum_h |w| sum_d |q k|)")
                 .accumulation(H + 1, DType::f32, terms, Bound::worst_case,
                               "weight product and " + std::to_string(H) + "-head sum")
                 .output_rounding(DType::f32)
                 .build(),
             {},
             {}}};
  }

 private:
  static void quantize_rows(const Tensor& rows, uint8_t* packed, uint8_t* scales) {
    const int64_t n = rows.size(0), D = rows.size(1);
    std::vector<double> x(static_cast<size_t>(D));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t d = 0; d < D; ++d) x[d] = rows.get({r, d});
      fp4::mxfp4_quantize(x, fp4::MxScaleRule::ceil, fp4::E2m1Rounding::nearest_even,
                          fp4::NibbleOrder::low_first,
                          std::span(packed + r * D / 2, static_cast<size_t>(D / 2)),
                          std::span(scales + r * D / 32, static_cast<size_t>(D / 32)));
    }
  }

  // Request b's keys: generated bf16, quantized (ceil rule), written in the page order of g.
  static void write_keys(const Case& c, const mx::CacheGeometry& g, const Tensor& cache,
                         const Tensor& table, int64_t b, int64_t len, bool extreme, int64_t seed) {
    const int64_t D = g.head_dim;
    Tensor kb = Tensor::empty(DType::bf16, {len, D});
    fill_rows(kb, Rng(c.id, "k" + std::to_string(b), static_cast<uint64_t>(seed)));
    std::vector<uint8_t> packed(static_cast<size_t>(len * D / 2)),
        scales(static_cast<size_t>(len * D / 32));
    quantize_rows(kb, packed.data(), scales.data());
    for (int64_t p = 0; p < len; ++p) {
      uint8_t* s = scales.data() + p * (D / 32);
      if (extreme) {
        s[0] = static_cast<uint8_t>(p % 3);
        if (D >= 64) s[1] = static_cast<uint8_t>(250 + p % 3);
      }
      const int64_t page = table.at<int32_t>({b, p / g.page_size}), t = p % g.page_size;
      auto* base = reinterpret_cast<uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
      for (int64_t i = 0; i < D / 2; ++i) base[mx::value_offset(g, t, i)] = packed[p * D / 2 + i];
      for (int64_t i = 0; i < D / 32; ++i) base[mx::scale_offset(g, t, i)] = s[i];
    }
  }
};

const OpRegistrar kRegisterKCache(std::make_unique<IndexerMxfp4KCacheOp>());
const OpRegistrar kRegisterLogits(std::make_unique<IndexerMxfp4LogitsDecodeOp>());

}  // namespace
}  // namespace attncheck
