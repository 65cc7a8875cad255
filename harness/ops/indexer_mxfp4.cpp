// The indexer with MXFP4 keys and queries (docs/ops/indexer_mxfp4.md), in the paged cache layout
// of AITER's paged MXFP4 MQA-logits kernel (vLLM indexer_kv_dtype = "mxfp4"):
// indexer_mxfp4_k_cache (bf16 K -> packed e2m1 + e8m0 scales in the slot's page; bitwise) and
// indexer_mxfp4_logits_decode (paged MQA logits of MXFP4 q against the cache; derived budget).
// What they guard against: scales rounded the wrong way, nibble order swapped, the scale slice of
// another block, the e8m0 byte 0 (2^-127) read as zero, NaN scales of unread slots leaking in.
// Axis `format` = nvfp4 swaps the keys for NVFP4 (16-element blocks, e4m3fn scales, one fp32
// global scale per cache, a kernel parameter): the global scale applied twice or not at all, the
// 16- and 32-element blocks confused, the e4m3 scale truncated instead of rounded.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/fp4.h"
#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "ops/values.h"
#include "reference/indexer_mxfp4.h"

namespace attncheck {
namespace {

namespace mx = ref::mxfp4;

enum class Layout { natural, shuffle16, shuffle32 };
const std::vector<std::pair<Layout, std::string>> kLayoutNames = {{Layout::natural, "natural"},
                                                                  {Layout::shuffle16, "shuffle16"},
                                                                  {Layout::shuffle32, "shuffle32"}};
constexpr const char* kLayoutHelp =
    "page order: token order, or AITER's preshuffle with n_per_tile 16 / 32 (scale mode 1)";

int64_t n_per_tile_of(Layout layout) {
  return layout == Layout::shuffle16 ? 16 : (layout == Layout::shuffle32 ? 32 : 0);
}

const std::vector<std::pair<mx::KeyFormat, std::string>> kFormatNames = {
    {mx::KeyFormat::mxfp4, "mxfp4"}, {mx::KeyFormat::nvfp4, "nvfp4"}};
constexpr const char* kFormatHelp =
    "key format: mxfp4 (32-element blocks, e8m0 scales) or nvfp4 (16-element blocks, e4m3fn "
    "scales, one fp32 global scale per cache; natural page order only)";

// The NVFP4 cache's global scale, fixed per case (fp32, none a power of two): "odd" puts typical
// block scales near 20..300, "saturating" sends most to e4m3's 448 (0x7E), "tiny" most to e4m3
// subnormals or 0, "unit" is 1.
enum class GlobalScale { odd, saturating, tiny, unit };
const std::vector<std::pair<GlobalScale, std::string>> kGlobalNames = {
    {GlobalScale::odd, "odd"},
    {GlobalScale::saturating, "sat"},
    {GlobalScale::tiny, "tiny"},
    {GlobalScale::unit, "unit"}};
constexpr const char* kGlobalHelp =
    "nvfp4 global scale: odd 0.0371, sat 0.00123 (block scales saturate at 448), tiny 11.3 "
    "(block scales subnormal or 0), unit 1";
float global_scale_value(GlobalScale g) {
  switch (g) {
    case GlobalScale::odd:
      return 0.0371f;
    case GlobalScale::saturating:
      return 0.00123f;
    case GlobalScale::tiny:
      return 11.3f;
    case GlobalScale::unit:
      return 1.0f;
  }
  return 1.0f;
}

// The trailing fields both ops share, in case-id order: the key format and the NVFP4 global scale
// (both out of ids at their defaults), the seed and the storage offset.
template <class P>
Fields<P> add_key_format_fields(Fields<P>& f) {
  f.choice("format", "", &P::format, kFormatNames, kFormatHelp)
      .out_of_id_at_default()
      .choice("global_scale", "g", &P::global_scale, kGlobalNames, kGlobalHelp)
      .out_of_id_at_default()
      .add("seed", "s", &P::seed, "input seed");
  add_storage_offset(f, &P::storage_offset);
  add_pad_strides(f, &P::pad_strides);
  add_compact(f, &P::compact);
  add_far_rows(f, &P::far_rows);
  add_offset_log2(f, &P::offset_log2,
                  "31 / 32: every page the op writes or reads starts past byte 2^31 / 2^32 of "
                  "the cache; the host holds (and a writer's case compares) those pages only, "
                  "the device poisons the rest");
  return f;
}

// Why an nvfp4-only axis is set on an mxfp4 case (nullopt when it is not).
std::optional<std::string> format_problem(mx::KeyFormat f, GlobalScale g) {
  if (f == mx::KeyFormat::mxfp4 && g != GlobalScale::odd)
    return "global_scale applies to format nvfp4 only";
  return std::nullopt;
}

// The nvfp4 kernel parameters (none for mxfp4, whose cases keep their parameters).
void add_format_params(nlohmann::json& j, const mx::CacheGeometry& g) {
  if (g.format != mx::KeyFormat::nvfp4) return;
  j["format"] = "nvfp4";
  j["global_scale"] = static_cast<double>(g.global_scale);
}

// The geometry of a case, or why it describes no cache (an error in the case file).
std::optional<std::string> geometry_problem(const mx::CacheGeometry& g) {
  try {
    mx::check_geometry(g);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return std::nullopt;
}

// A u8 cache of `pages` pages, each padded by `pad` bytes: every byte `fill`, or random bytes
// from `random` when given. first > 0 (large offsets): pages [0, first) come before them, on a
// sparse storage whose host window holds pages [first, first + pages) only.
Tensor make_cache(const mx::CacheGeometry& g, int64_t pages, int64_t pad, std::byte fill,
                  const Rng* random = nullptr, int64_t first = 0) {
  const int64_t stride = g.page_bytes() + pad, total = first + pages;
  Tensor storage = paged_storage(first, pages, stride);
  std::fill(storage.storage()->bytes.begin(), storage.storage()->bytes.end(), fill);
  if (random) fill_uniform_int(storage.slice(0, first * stride, total * stride), *random, 0, 255);
  return storage.as_strided({total, g.page_size, g.entry_bytes()}, {stride, g.entry_bytes(), 1}, 0);
}

// bf16 rows with non-power-of-two magnitudes per row and per `block`-element block.
void fill_rows(const Tensor& t, const Rng& rng, int64_t block = 32) {
  const int64_t rows = t.size(0), D = t.size(1);
  std::vector<double> values(static_cast<size_t>(block));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < D / block; ++b) {
      const double factor = std::exp(rng.normal_at(static_cast<uint64_t>(1000000 + r * 64 + b)));
      rng.normal_run(static_cast<uint64_t>(r * D + b * block), values);  // normal_at, batched
      for (int64_t d = b * block; d < b * block + block; ++d)
        t.set({r, d}, factor * values[static_cast<size_t>(d - b * block)]);
    }
}

// ---------------------------------------------------------------------------------------------
enum class Values { model, extreme };

struct KCacheParams {
  int64_t block_size = 64;
  int64_t head_dim = 128;
  Layout layout = Layout::natural;
  int64_t tokens = 41;
  fp4::MxScaleRule scale_rule = fp4::MxScaleRule::ceil;
  Values values = Values::model;
  int64_t pad = 0;
  mx::KeyFormat format = mx::KeyFormat::mxfp4;
  GlobalScale global_scale = GlobalScale::odd;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  bool pad_strides = false;     // ops/storage_offset.h
  bool compact = false;         // ops/storage_offset.h
  bool far_rows = false;        // ops/storage_offset.h (a writer's: place_far_token)
  int64_t offset_log2 = 0;      // ops/paged.h
  mx::CacheGeometry geometry() const {
    return {head_dim, block_size, n_per_tile_of(layout), format, global_scale_value(global_scale)};
  }
};

class IndexerMxfp4KCacheOp final : public TypedOp<KCacheParams> {
 public:
  using P = KCacheParams;
  std::string name() const override { return "indexer_mxfp4_k_cache"; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override { return {"k"}; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("block_size", "bs", &P::block_size, "entries per cache page")
        .only({1, 16, 64})
        .add("head_dim", "d", &P::head_dim, "index head dim D")
        .only({32, 64, 128})
        .choice("layout", "", &P::layout, kLayoutNames, kLayoutHelp)
        .add("tokens", "t", &P::tokens,
             "slot_mapping entries (k has 3 more rows); odd counts leave a partial page")
        .bounds(0, 4096)
        .choice("scale_rule", "", &P::scale_rule,
                {{fp4::MxScaleRule::ceil, "ceil"},
                 {fp4::MxScaleRule::ocp_floor, "ocp_floor"},
                 {fp4::MxScaleRule::even, "even"}},
                "e8m0 scale rule (docs/formats.md)")
        .choice("values", "", &P::values, {{Values::model, "model"}, {Values::extreme, "extreme"}},
                "extreme: zero rows, rows at 1e-38 and 3e38 (scale bytes 0 and 253), blocks whose "
                "amax sits on the rules' boundaries (6, 6.5, 7 times a power of two)")
        .add("pad", "pad", &P::pad, "bytes after each page (page stride = page + pad)")
        .bounds(0, 4096);
    return add_key_format_fields(f);
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (auto f = format_problem(p.format, p.global_scale)) return f;
    if (p.format == mx::KeyFormat::nvfp4 && p.scale_rule != fp4::MxScaleRule::ceil)
      return "scale_rule applies to format mxfp4 only (nvfp4 rounds its e4m3 scale to nearest)";
    if (p.far_rows && p.tokens < 2) return "far_rows needs two or more tokens";
    return geometry_problem(p.geometry());
  }

  // The bf16 rows, the slots, and a cache of up to twice the pages the tokens need.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), bs = static_cast<double>(p.block_size);
    const double D = static_cast<double>(p.head_dim);
    const double pages = 2 * std::ceil(T / std::max(bs, 1.0)) + 4;
    CaseSize s;
    s.input_bytes = 2 * (T + 3) * D + 8 * T;
    s.output_bytes = pages * (bs * D + static_cast<double>(p.pad) + 64);
    s.work = T * D;
    return s.count("tokens", p.tokens, /*min=*/0).count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& prm) const override {
    const mx::CacheGeometry g = prm.geometry();
    const int64_t T = prm.tokens, seed = prm.seed;
    const int64_t D = g.head_dim, pages = (T + g.page_size - 1) / g.page_size + 2;
    // Large offsets: page ids start at `first`, past byte 2^offset_log2; the host holds those.
    const int64_t first = first_block_past(prm.offset_log2, g.page_bytes() + prm.pad);
    Tensor k = Tensor::empty(DType::bf16, {T + 3, D});
    fill_rows(k, Rng(c.id, "k", static_cast<uint64_t>(seed)), g.block());
    if (prm.values == Values::extreme) plant_extremes(k);
    Rng rng(c.id, "slots", static_cast<uint64_t>(seed));
    const std::vector<int64_t> order = permutation(pages * g.page_size, rng);
    Tensor slots = Tensor::empty(DType::i64, {T});
    // far_rows: the last token alone writes (its k row is the far one, place_far_token).
    for (int64_t i = 0; i < T; ++i) {
      const bool padding = prm.far_rows ? i != T - 1 : i % 7 == 3;
      slots.at<int64_t>({i}) = padding ? -1 : first * g.page_size + order[i];
    }
    const Rng bytes(c.id, "cache", static_cast<uint64_t>(seed));
    Tensor cache = make_cache(g, pages, prm.pad, std::byte{0}, &bytes, first);
    Problem p;
    p.args = {{"k", k, Role::input},
              {"slot_mapping", slots, Role::input},
              {"kv_cache", cache, Role::inout}};
    if (prm.far_rows) place_far_token(p, {"k"}, T - 1);
    p.bytes = static_cast<double>(T) * static_cast<double>(2 * D + g.entry_bytes() + 8);
    return p;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    nlohmann::json j = {{"n_per_tile", n_per_tile_of(p.layout)},
                        {"scale_rule", std::string(fp4::scale_rule_name(p.scale_rule))}};
    add_format_params(j, p.geometry());
    return j;
  }

  // Invariance (docs/verification.md "Invariance"): each token writes only its own slot (slots
  // are distinct): the tokens in another order, and the second half written alone into the cache
  // the first half left; the cache compared whole.
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    BatchArgs tokens{{"slot_mapping", "k"}, {}, ""};
    tokens.unit = "token";
    tokens.whole = {"kv_cache"};
    std::vector<Relation> out;
    const int64_t T = request_count(prob, tokens);
    if (T > 1)
      out.push_back(permuted_requests(prob, tokens, derangement(T, static_cast<uint64_t>(p.seed))));
    if (auto chunked =
            chunked_write(prob, tokens, [&](const Problem& first) { return reference(first, p); }))
      out.push_back(std::move(*chunked));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    // A large-offset cache is compared over the pages the host holds (run/device.cpp).
    return {{"kv_cache", mx::write_k_cache(prob.arg("kv_cache"), prob.arg("k"),
                                           prob.arg("slot_mapping"), p.geometry(), p.scale_rule)
                             .held_rows()}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
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
enum class Scales { model, extreme };

// The logits' value kinds (harness/ops/values.h) on the fp32 head weights, as the fp8 logits ops
// do (harness/ops/indexer_scores.cpp): typical N(0, 1); large x 2^40 (logits near 2^40, past
// fp16: a half-precision head sum or store overflows); tiny x 2^-130 (every weight an fp32
// subnormal: a kernel that flushes them returns 0).
const std::vector<values::Values> kWeightValues = {values::Values::typical, values::Values::large,
                                                   values::Values::tiny};
constexpr const char* kWeightValuesHelp =
    "head weight distribution (harness/ops/indexer_mxfp4.cpp): typical N(0, 1); large = x 2^40 "
    "(logits near 2^40); tiny = x 2^-130 (fp32 subnormal weights)";

void shape_weights(values::Values v, const Tensor& w) {
  if (v == values::Values::large) values::scale_finite(w, std::ldexp(1.0, 40));
  if (v == values::Values::tiny) values::scale_finite(w, std::ldexp(1.0, -130));
}

struct LogitsParams {
  int64_t heads = 32;
  int64_t head_dim = 128;
  int64_t block_size = 64;
  Layout layout = Layout::natural;
  int64_t batch = 3;
  int64_t next_n = 1;
  int64_t max_ctx = 200;
  Scales scales = Scales::model;
  values::Values values = values::Values::typical;
  mx::KeyFormat format = mx::KeyFormat::mxfp4;
  GlobalScale global_scale = GlobalScale::odd;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  bool pad_strides = false;     // ops/storage_offset.h
  bool compact = false;         // ops/storage_offset.h
  bool far_rows = false;        // ops/storage_offset.h
  int64_t offset_log2 = 0;      // ops/paged.h
  mx::CacheGeometry geometry() const {
    return {head_dim, block_size, n_per_tile_of(layout), format, global_scale_value(global_scale)};
  }
};

class IndexerMxfp4LogitsDecodeOp final : public TypedOp<LogitsParams> {
 public:
  using P = LogitsParams;
  std::string name() const override { return "indexer_mxfp4_logits_decode"; }
  std::vector<OutputRegion> output_regions() const override { return logits_past_context_region(); }
  bool in_region(const std::string& output, const std::string& region, const Problem& prob,
                 const Index& idx) const override {
    return output == "logits" && region == kPastContext && logits_past_context(prob, idx);
  }
  // far_rows (next_n = 1: one logits row per request): each request reads only its own rows.
  FarRows far_rows_args(const P& p) const override {
    if (p.next_n != 1)
      throw std::invalid_argument("indexer_mxfp4_logits_decode: far_rows needs next_n 1");
    return {{"q", "logits"}, {}, {"q_scale", "weights", "context_lens", "block_table"}};
  }
  // compact: the arguments built strided here that docs/ops also allows contiguous.
  std::vector<std::string> compacted_args(const P&) const override {
    return {"kv_cache", "logits"};
  }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override {
    return {"q", "q_scale", "weights", "block_table"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add("heads", "h", &P::heads, "index heads")
        .bounds(1, 128)
        .add("head_dim", "d", &P::head_dim, "index head dim D")
        .only({32, 64, 128})
        .add("block_size", "bs", &P::block_size, "entries per cache page")
        .only({1, 16, 64})
        .choice("layout", "", &P::layout, kLayoutNames, kLayoutHelp)
        .add("batch", "b", &P::batch, "requests")
        .bounds(1, 64)
        .add("next_n", "nn", &P::next_n, "query rows per request")
        .bounds(1, 16)
        .add("max_ctx", "ctx", &P::max_ctx, "longest context (request 0); the others ragged")
        .bounds(1, 65536)
        .choice("scales", "sc", &P::scales,
                {{Scales::model, "model"}, {Scales::extreme, "extreme"}},
                "extreme: K block 0 scale bytes 0..2 against q bytes 250..252, K block 1 bytes "
                "250..252 against q bytes 0..2 (products stay fp32-normal); nvfp4: K block 0 "
                "e4m3 bytes 0x00 (zero), 0x01 (2^-9), 0x7E (448), q unchanged");
    values::add_field(f, &P::values, kWeightValues, kWeightValuesHelp);
    return add_key_format_fields(f);
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (auto f = format_problem(p.format, p.global_scale)) return f;
    return geometry_problem(p.geometry());
  }

  // The cache pages the requests own, the table, q (bf16 and packed) with its weights, and
  // logits as wide as the context; each logit sums every head's dot product.
  CaseSize size(const P& p) const override {
    const double B = static_cast<double>(p.batch), ctx = static_cast<double>(p.max_ctx);
    const double rows = B * static_cast<double>(p.next_n), H = static_cast<double>(p.heads);
    const double D = static_cast<double>(p.head_dim);
    CaseSize s;
    const double per_request = std::ceil(ctx / std::max(static_cast<double>(p.block_size), 1.0));
    s.input_bytes = (B * per_request + 2) * (static_cast<double>(p.block_size) * D + 16) +
                    4 * B * (per_request + 2) + rows * H * (3 * D + 4);
    s.output_bytes = 4 * rows * (ctx + 21);
    s.work = rows * ctx * H * D;
    return s.count("batch", p.batch)
        .count("max_ctx", p.max_ctx)
        .count("next_n", p.next_n)
        .count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& prm) const override {
    const mx::CacheGeometry g = prm.geometry();
    const int64_t H = prm.heads, B = prm.batch, NN = prm.next_n, max_ctx = prm.max_ctx,
                  seed = prm.seed, D = g.head_dim, S = g.page_size;
    const bool extreme = prm.scales == Scales::extreme;
    Rng rng(c.id, "layout", static_cast<uint64_t>(seed));
    std::vector<int64_t> lens(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      lens[b] = b == 0 ? max_ctx : (b == 1 ? 1 : rng.uniform_int(1, max_ctx));
    const int64_t W = (max_ctx + S - 1) / S + 1;
    int64_t used = 0;
    for (int64_t L : lens) used += (L + S - 1) / S;
    const int64_t pages = used + 2;  // two pages nobody owns
    const std::vector<int64_t> order = permutation(pages, rng);
    // Unread bytes are 0xFF: NaN scales and -6 elements that must never reach a logit. Large
    // offsets: page ids start at `first`, past byte 2^offset_log2; the host holds those.
    const int64_t first = first_block_past(prm.offset_log2, g.page_bytes() + 16);
    Tensor cache = make_cache(g, pages, 16, std::byte{0xFF}, nullptr, first);
    Tensor table = Tensor::empty(DType::i32, {B, W});
    Tensor context = Tensor::empty(DType::i32, {B});
    int64_t next_page = 0;
    for (int64_t b = 0; b < B; ++b) {
      context.at<int32_t>({b}) = static_cast<int32_t>(lens[b]);
      for (int64_t j = 0; j < W; ++j)
        table.at<int32_t>({b, j}) = static_cast<int32_t>(
            first + (j < (lens[b] + S - 1) / S ? order[next_page++] : order[pages - 1]));
      // far_rows: only the last request's row is held and compared (the others' q rows are
      // device poison), so the other requests' keys stay 0xFF: max_ctx 65536 stays cheap.
      if (!prm.far_rows || b + 1 == B) write_keys(c, g, cache, table, b, lens[b], extreme, seed);
    }
    Tensor qb = Tensor::empty(DType::bf16, {B * NN * H, D});
    fill_rows(qb, Rng(c.id, "q", static_cast<uint64_t>(seed)));
    Tensor q = Tensor::empty(DType::u8, {B, NN, H, D / 2});
    Tensor qs = Tensor::empty(DType::u8, {B, NN, H, D / 32});
    quantize_rows(qb, reinterpret_cast<uint8_t*>(q.data()), reinterpret_cast<uint8_t*>(qs.data()));
    if (extreme && g.format == mx::KeyFormat::mxfp4)
      for (int64_t i = 0; i < B * NN * H; ++i) {
        auto* s = reinterpret_cast<uint8_t*>(qs.data()) + i * (D / 32);
        s[0] = static_cast<uint8_t>(250 + i % 3);
        if (D >= 64) s[1] = static_cast<uint8_t>(i % 3);
      }
    Tensor w = Tensor::empty(DType::f32, {B * NN, H});
    fill_normal(w, Rng(c.id, "weights", static_cast<uint64_t>(seed)));
    shape_weights(prm.values, w);
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
    double pairs = 0;
    for (int64_t L : lens) pairs += static_cast<double>(std::min(L, width) * NN);
    p.flops = 2.0 * static_cast<double>(H * D) * pairs;
    p.bytes = pairs / static_cast<double>(NN) * static_cast<double>(g.entry_bytes()) +
              4.0 * static_cast<double>(B * NN * width);
    return p;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    nlohmann::json j = {{"n_per_tile", n_per_tile_of(p.layout)}};
    add_format_params(j, p.geometry());
    return j;
  }

  // Invariance (docs/verification.md "Invariance"): each request's next_n rows read only its q,
  // scales, weights, length and pages: the requests in another order, the longest alone, the
  // pages shuffled.
  std::vector<Relation> relations(const Problem& prob) const override {
    const auto seed = static_cast<uint64_t>(typed(prob).seed);
    BatchArgs batch{{"q", "q_scale", "context_lens", "block_table"}, {"weights", "logits"}, ""};
    batch.tokens_per_request = prob.arg("q").size(1);
    auto out = permuted_and_alone(prob, batch, longest_request(prob.arg("context_lens")), seed);
    if (auto shuffled = shuffled_pages(prob, {"kv_cache"}, "block_table", seed))
      out.push_back(std::move(*shuffled));
    return out;
  }

  TensorMap reference(const Problem& prob, const P& prm) const override {
    return {
        {"logits", mx::paged_logits(prob.arg("q"), prob.arg("q_scale"), prob.arg("kv_cache"),
                                    prm.geometry(), prob.arg("weights"), prob.arg("context_lens"),
                                    prob.arg("block_table"), prob.arg("logits").size(1))}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const P& prm, const TensorMap&) const override {
    const int64_t H = prm.heads, D = prm.head_dim;
    const double terms = mx::max_logit_terms(
        p.arg("q"), p.arg("q_scale"), p.arg("kv_cache"), prm.geometry(), p.arg("weights"),
        p.arg("context_lens"), p.arg("block_table"), p.arg("logits").size(1));
    const double u = unit_roundoff(DType::f32);
    // NVFP4 keys: e2m1 x e2m1 x e4m3 x 2^k is exact in fp32, the global scale adds one rounding
    // to each term and a kernel may apply it per term or per block (two more: gamma_{D+2}).
    const bool nv = prm.format == mx::KeyFormat::nvfp4;
    const int64_t n = nv ? D + 2 : D;
    return {{"logits",
             BudgetBuilder("logits")
                 .absolute(gamma_n(n, u) * terms,
                           "q.k: " + std::to_string(D) +
                               (nv ? " exact e2m1 x e2m1 x e4m3 x 2^k products times the fp32 "
                                     "global scale (two roundings), summed in fp32, any order "
                                     "(gamma_(D+2) * max sum_h |w| sum_d |q k|)"
                                   : " exact e2m1 x e2m1 x 2^k products summed in fp32, any order "
                                     "(gamma_D * max sum_h |w| sum_d |q k|)"))
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

  // Request b's keys: generated bf16, quantized (MXFP4: ceil rule; NVFP4: fp4::nvfp4_quantize with
  // the case's global scale), written in the page order of g. Extreme MXFP4 scales: block 0 bytes
  // 0..2, block 1 bytes 250..252; extreme NVFP4 scales: block 0 bytes 0x00, 0x01, 0x7E.
  static void write_keys(const Case& c, const mx::CacheGeometry& g, const Tensor& cache,
                         const Tensor& table, int64_t b, int64_t len, bool extreme, int64_t seed) {
    const int64_t D = g.head_dim, ns = g.scale_count();
    const bool nv = g.format == mx::KeyFormat::nvfp4;
    Tensor kb = Tensor::empty(DType::bf16, {len, D});
    fill_rows(kb, Rng(c.id, "k" + std::to_string(b), static_cast<uint64_t>(seed)), g.block());
    std::vector<uint8_t> packed(static_cast<size_t>(len * D / 2)),
        scales(static_cast<size_t>(len * ns));
    if (nv)
      quantize_nvfp4_rows(kb, g.global_scale, packed.data(), scales.data());
    else
      quantize_rows(kb, packed.data(), scales.data());
    for (int64_t p = 0; p < len; ++p) {
      uint8_t* s = scales.data() + p * ns;
      if (extreme && nv) {
        constexpr uint8_t kPlanted[3] = {0x00, 0x01, 0x7E};  // zero, 2^-9, 448
        s[0] = kPlanted[p % 3];
      } else if (extreme) {
        s[0] = static_cast<uint8_t>(p % 3);
        if (D >= 64) s[1] = static_cast<uint8_t>(250 + p % 3);
      }
      const int64_t page = table.at<int32_t>({b, p / g.page_size}), t = p % g.page_size;
      auto* base = reinterpret_cast<uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
      for (int64_t i = 0; i < D / 2; ++i) base[mx::value_offset(g, t, i)] = packed[p * D / 2 + i];
      for (int64_t i = 0; i < ns; ++i) base[mx::scale_offset(g, t, i)] = s[i];
    }
  }

  static void quantize_nvfp4_rows(const Tensor& rows, float global, uint8_t* packed,
                                  uint8_t* scales) {
    const int64_t n = rows.size(0), D = rows.size(1), ns = D / fp4::kNvfp4Block;
    std::vector<double> x(static_cast<size_t>(D));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t d = 0; d < D; ++d) x[d] = rows.get({r, d});
      fp4::nvfp4_quantize(x, global, fp4::E2m1Rounding::nearest_even, fp4::NibbleOrder::low_first,
                          std::span(packed + r * D / 2, static_cast<size_t>(D / 2)),
                          std::span(scales + r * ns, static_cast<size_t>(ns)));
    }
  }
};

const OpRegistrar kRegisterKCache(std::make_unique<IndexerMxfp4KCacheOp>());
const OpRegistrar kRegisterLogits(std::make_unique<IndexerMxfp4LogitsDecodeOp>());

}  // namespace
}  // namespace attncheck
