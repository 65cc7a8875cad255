// kv_cache_write: reshape_and_cache_flash and its SHUFFLE / packed variants
// (docs/ops/kv_cache_write.md). Exact op: both caches are inout views compared bitwise over every
// element, so a slot written where it should not be (another slot, another block, the other half
// of a hybrid or packed block) fails, and the harness checks the bytes outside the views (padding).
// What it guards against: writers that take block or head offsets from the shape instead of the
// strides (vLLM #39192, AITER #3492: the SHUFFLE writer on hybrid caches), that assume K and V are
// contiguous within a block (the packed layout, vLLM #44455), that write padding tokens (slot -1),
// or that quantize to fp8 with the wrong scale direction, rounding or overflow.
// quant = "per_token" is AITER's reshape_and_cache_with_pertoken_quant (entry
// kv_cache_write_pertoken_quant): one scale per (token, head) from the row's amax, stored beside
// the codes in two inout scale tensors, so a scale at the wrong index or from the wrong row fails.
#include <cmath>
#include <stdexcept>

#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/kv_cache_axes.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "reference/kv_cache_write.h"

namespace attncheck {
namespace {

enum class Quant { per_tensor, per_token };
enum class WriteLayout { nhd, shuffle, paged };
enum class Slots { scattered, tail };
enum class KeySource { contiguous, qkv };
enum class Rows { normal, zero_tiny };

struct KvCacheWriteParams {
  Quant quant = Quant::per_tensor;
  WriteLayout layout = WriteLayout::nhd;
  ref::KvStrides strides = ref::KvStrides::contiguous;
  KvDtype kv = KvDtype::model;
  DType dtype = DType::bf16;
  int64_t heads = 2;
  int64_t head_dim = 64;
  int64_t block_size = 16;
  int64_t tokens = 24;
  Slots slots = Slots::scattered;
  KeySource key = KeySource::contiguous;
  Rows rows = Rows::normal;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  bool pad_strides = false;     // ops/storage_offset.h
  bool interleave = false;      // ops/storage_offset.h
  int64_t offset_log2 = 0;      // ops/paged.h
  bool far_rows = false;        // ops/storage_offset.h (place_far_token)
};

constexpr int64_t kTrailingPad = 3;  // padding tokens at the end (slot -1), like a padded batch

// Slots of the T tokens. scattered: distinct slots of half the blocks in a random order, about
// one token in six padding, the cache's very last slot always among them; tail: consecutive slots
// ending at the cache's last slot (a prefill into the last blocks). The last kTrailingPad are -1.
Tensor make_slots(const std::string& id, Slots mode, int64_t T, int64_t total, int64_t seed) {
  Rng rng(id, "slots", static_cast<uint64_t>(seed));
  Tensor slots = Tensor::empty(DType::i64, {T});
  const int64_t real = T - kTrailingPad;
  const auto perm = permutation(total, rng);
  for (int64_t t = 0; t < T; ++t) {
    int64_t s = -1;
    if (t < real && mode == Slots::tail) {
      s = total - real + t;
    } else if (t < real) {
      s = t == real / 2 ? total - 1 : perm[static_cast<size_t>(t)];
      if (t != real / 2 && (s == total - 1 || rng.uniform() < 1.0 / 6)) s = -1;
    }
    slots.at<int64_t>({t}) = s;
  }
  return slots;
}

// Old contents (earlier tokens) from 16 values, k/4 for k in [-8, 8), exact in every cache dtype:
// every element the op must not write has a value to keep that no written token (normal, mostly
// not a multiple of 1/4) repeats, in few bits, so the expected caches committed as goldens
// compress.
// int8 caches hold k - 8 (integers: an int8 code is a count of scale steps).
void fill_old_contents(const Tensor& cache, const Rng& rng) {
  cache.for_each_index([&](const Index& i, int64_t k) {
    const double u = std::floor(rng.uniform_at(static_cast<uint64_t>(k)) * 16.0);
    const double v = u / 4.0 - 2.0;
    if (cache.dtype() == DType::i8)
      cache.set(i, u - 8.0);
    else if (is_fp8(cache.dtype()))
      cache.set_bits(i, fp8_encode(v, cache.dtype()));
    else
      cache.set(i, v);
  });
}

// Old dequant scales: 16 positive values (k + 1) / 64, none of them a scale the rows produce in
// practice (amax / M of normal samples is not a multiple of 1/64).
Tensor old_scales(const Shape& shape, const Rng& rng) {
  Tensor t = Tensor::empty(DType::f32, shape);
  t.for_each_index([&](const Index& i, int64_t k) {
    t.set(i, (std::floor(rng.uniform_at(static_cast<uint64_t>(k)) * 16.0) + 1.0) / 64.0);
  });
  return t;
}

struct TokenPair {
  Tensor key, value;
};

// key/value [T, Hkv, D]: contiguous, or views of a fused qkv row (2 Hkv query heads first).
TokenPair make_tokens(const Case& c, const KvCacheWriteParams& p) {
  const int64_t T = p.tokens, Hkv = p.heads, D = p.head_dim;
  const auto seed = static_cast<uint64_t>(p.seed);
  TokenPair kv;
  if (p.key == KeySource::qkv) {
    const int64_t row = (2 * Hkv + 2 * Hkv) * D;  // q (2 Hkv heads) | k | v
    Tensor qkv = Tensor::empty(p.dtype, {T, row});
    fill_normal(qkv, Rng(c.id, "qkv", seed));
    kv.key = qkv.as_strided({T, Hkv, D}, {row, D, 1}, 2 * Hkv * D);
    kv.value = qkv.as_strided({T, Hkv, D}, {row, D, 1}, 3 * Hkv * D);
  } else {
    kv.key = Tensor::empty(p.dtype, {T, Hkv, D});
    kv.value = Tensor::empty(p.dtype, {T, Hkv, D});
    fill_normal(kv.key, Rng(c.id, "key", seed));
    fill_normal(kv.value, Rng(c.id, "value", seed));
  }
  return kv;
}

// Per-token rows: head h scaled by 2^(h % 4 - 1), so the heads of one token have different amax
// (a scale taken from another head or over all heads is visibly wrong). rows = zero_tiny: rows
// with (t + 2h) % 5 == 1 are all zero (scale 0: the eps clamp keeps 1 / scale finite) and rows with
// (t + 2h) % 5 == 3 are scaled by 2^-40 (bf16: amax < 1e-12 * M, so the clamped scale quantizes
// them) or 2^-16 (f16, which has no such values: f16 subnormal inputs instead).
void shape_pertoken_rows(const Tensor& x, bool zero_tiny) {
  const int64_t T = x.size(0), Hkv = x.size(1), D = x.size(2);
  const double tiny = std::ldexp(1.0, x.dtype() == DType::bf16 ? -40 : -16);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t kind = zero_tiny ? (t + 2 * h) % 5 : 0;
      const double m = std::ldexp(1.0, static_cast<int>(h % 4) - 1) * (kind == 3 ? tiny : 1.0);
      for (int64_t d = 0; d < D; ++d)  // zero rows +0: x * 0 would keep the signs (-0)
        x.set({t, h, d}, kind == 1 ? 0.0 : x.get({t, h, d}) * m);
    }
}

constexpr const char* kPertokenEntry = "kv_cache_write_pertoken_quant";

class KvCacheWriteOp final : public TypedOp<KvCacheWriteParams> {
 public:
  using P = KvCacheWriteParams;
  std::string name() const override { return "kv_cache_write"; }
  // pad_strides: the arguments docs/ops lets a caller pass with any outer strides.
  std::vector<std::string> padded_args(const P&) const override {
    return {"k_dequant_scales", "v_dequant_scales"};
  }
  // interleave: key, value and the caches take any strides, the innermost included.
  std::vector<std::string> interleaved_args(const P&) const override {
    return {"key", "value", "key_cache", "value_cache"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.choice("quant", "", &P::quant,
             {{Quant::per_tensor, "per_tensor"}, {Quant::per_token, "per_token"}},
             "per_tensor: reshape_and_cache_flash (scales k_scale/v_scale given, fp8 only); "
             "per_token: AITER reshape_and_cache_with_pertoken_quant (a scale per token and head, "
             "written)")
        .out_of_id_at_default()
        .choice("layout", "", &P::layout,
                {{WriteLayout::nhd, "nhd"},
                 {WriteLayout::shuffle, "shuffle"},
                 {WriteLayout::paged, "paged"}},
                "NHD [nb,P,Hkv,D]; SHUFFLE 5-d tiles (per_token: asm_layout); paged (per_token "
                "only): K SHUFFLE tile, V [nb,Hkv,D,P]");
    add_kv_strides(f, &P::strides,
                   "one storage K then V; hybrid [K0][V0][K1][V1]...; every stride + 16 B; two "
                   "storages; packed (nb, Hkv, P, 2D) (NHD only)");
    add_kv_dtype(f, &P::kv, true, "cache dtype; fp8 quantizes; int8 per_token only");
    add_model_dtype(f, &P::dtype, "key/value dtype");
    f.add("heads", "h", &P::heads, "KV heads Hkv")
        .add("head_dim", "d", &P::head_dim, "head size D")
        .add("block_size", "bs", &P::block_size, "tokens per cache block P")
        .add("tokens", "t", &P::tokens, "slot_mapping entries (the last 3 are padding, slot -1)")
        .choice("slots", "", &P::slots, {{Slots::scattered, "scattered"}, {Slots::tail, "tail"}},
                "random distinct slots incl. the last one, or consecutive slots ending the cache")
        .choice("key", "", &P::key,
                {{KeySource::contiguous, "contiguous"}, {KeySource::qkv, "qkv"}},
                "key/value contiguous, or views of a fused qkv row (2*Hkv query heads before them)")
        .choice("rows", "", &P::rows, {{Rows::normal, "normal"}, {Rows::zero_tiny, "zero_tiny"}},
                "per_token: also all-zero rows and rows below the scale eps (bf16) / f16 "
                "subnormal rows")
        .out_of_id_at_default()
        .add("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default();
    add_pad_strides(f, &P::pad_strides);
    add_interleave(f, &P::interleave);
    add_offset_log2(f, &P::offset_log2,
                    "31 / 32: every block of the caches starts past byte 2^31 / 2^32 of its "
                    "storage (per_tensor; hybrid, separate or packed strides); the host holds "
                    "and compares those blocks only, the device poisons the rest");
    f.add("far_rows", "far", &P::far_rows,
          "true: one token is written (the last real one, into the cache's last slot; every "
          "other slot -1), its key and value rows past element 2^31 / byte 2^32 of sparse "
          "storages holding that row only")
        .out_of_id_at_default();
    return f;
  }

  std::vector<std::string> kernel_entries() const override {
    return {"kv_cache_write", kPertokenEntry};
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.quant == Quant::per_token) {
      if (p.layout == WriteLayout::nhd) return "per_token caches are shuffle (asm_layout) or paged";
      if (p.kv == KvDtype::model) return "per_token caches are e4m3fn, e4m3fnuz or int8";
    } else {
      if (p.layout == WriteLayout::paged) return "layout paged is a per_token layout";
      if (p.kv == KvDtype::int8) return "int8 caches are per_token only";
      if (p.rows != Rows::normal) return "rows = zero_tiny is for per_token cases";
    }
    if (p.heads < 1 || p.head_dim < 1 || p.block_size < 1 || p.tokens <= kTrailingPad)
      return "heads, head_dim, block_size >= 1 and tokens > 3";
    // The texts ref::make_kv_cache / make_pertoken_cache throw (reference/kv_gather.cpp,
    // reference/kv_cache_write.cpp), here so that the case error names the case.
    if (p.strides == ref::KvStrides::packed && p.quant == Quant::per_token)
      return "the packed (nb, Hkv, P, 2D) cache is an NHD layout";
    if (p.strides == ref::KvStrides::packed && p.layout == WriteLayout::shuffle)
      return "the packed (nb, Hkv, P, 2D) cache is an NHD layout, not SHUFFLE";
    if (p.far_rows && p.tokens < kTrailingPad + 2)
      return "far_rows needs a real token past token 0 (tokens >= 5)";
    if (p.offset_log2 != 0 &&
        (p.quant != Quant::per_tensor || p.strides == ref::KvStrides::contiguous ||
         p.strides == ref::KvStrides::padded))
      return "offset_log2 needs per_tensor quant and hybrid, separate or packed strides (the "
             "held blocks in one window per storage)";
    return std::nullopt;
  }

  // The tokens (in a fused qkv row at most four times as wide), the slots, and a cache of up
  // to twice the blocks the tokens need with per-token scales; each element is written once.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), bs = static_cast<double>(p.block_size);
    const double row = static_cast<double>(p.heads) * static_cast<double>(p.head_dim);
    const double slots = (2 * std::ceil(T / std::max(bs, 1.0)) + 4) * bs;
    CaseSize s;
    s.input_bytes = 4 * T * row * static_cast<double>(dtype_size(p.dtype)) + 8 * T;
    s.output_bytes = 2 * slots * (row * 4 + 8 * static_cast<double>(p.heads));
    s.work = 2 * T * row;
    return s.count("tokens", p.tokens)
        .count("heads", p.heads)
        .count("head_dim", p.head_dim)
        .count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    return p.quant == Quant::per_token ? make_pertoken(c, p) : make_per_tensor(c, p);
  }

  // Graph replay: captured with the slot mapping reversed (each token written to another's slot).
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(prob, {reversed("slot_mapping")});
  }

  // Invariance (docs/verification.md "Invariance"): each token writes only its own slot (slots
  // are distinct, padding tokens none): the tokens in another order, and the second half written
  // alone into the caches (and per-token scales) as the first half leaves them; those compared
  // whole.
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    BatchArgs tokens{{"slot_mapping", "key", "value"}, {}, ""};
    tokens.unit = "token";
    tokens.whole = {"key_cache", "value_cache", "k_dequant_scales", "v_dequant_scales"};
    const auto seed = static_cast<uint64_t>(p.seed);
    std::vector<Relation> out;
    if (const int64_t T = request_count(prob, tokens); T > 1)
      out.push_back(permuted_requests(prob, tokens, derangement(T, seed)));
    if (auto chunked =
            chunked_write(prob, tokens, [&](const Problem& first) { return reference(first, p); }))
      out.push_back(std::move(*chunked));
    return out;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    const DType cache_dtype = kv_cache_dtype(p.kv, p.dtype);
    nlohmann::json kp;
    if (p.quant == Quant::per_token) {
      // Strings, not JSON booleans: the kernels and adapters read "true" / "false".
      kp = {{"asm_layout", p.layout == WriteLayout::shuffle ? "true" : "false"},
            {"kv_cache_dtype", p.kv == KvDtype::int8 ? "int8" : "fp8"}};
    } else {
      kp = {{"kv_cache_layout", p.layout == WriteLayout::shuffle ? "SHUFFLE" : "NHD"},
            {"kv_cache_dtype", is_fp8(cache_dtype) ? "fp8" : "auto"}};
    }
    if (is_fp8(cache_dtype)) kp["fp8_format"] = fp8_format_name(cache_dtype);
    return kp;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    if (p.quant == Quant::per_token) {
      ref::KvPertokenWriteArgs a;
      a.key = prob.arg("key");
      a.value = prob.arg("value");
      a.key_cache = prob.arg("key_cache");
      a.value_cache = prob.arg("value_cache");
      a.k_dequant_scales = prob.arg("k_dequant_scales");
      a.v_dequant_scales = prob.arg("v_dequant_scales");
      a.slot_mapping = prob.arg("slot_mapping");
      a.asm_layout = p.layout == WriteLayout::shuffle;
      const ref::KvPertokenWritten w = ref::kv_cache_write_pertoken_quant(a);
      return {{"key_cache", w.key_cache},
              {"value_cache", w.value_cache},
              {"k_dequant_scales", w.k_dequant_scales},
              {"v_dequant_scales", w.v_dequant_scales}};
    }
    ref::KvCacheWriteArgs a;
    a.key = prob.arg("key");
    a.value = prob.arg("value");
    a.key_cache = prob.arg("key_cache");
    a.value_cache = prob.arg("value_cache");
    a.slot_mapping = prob.arg("slot_mapping");
    a.layout = p.layout == WriteLayout::shuffle ? ref::KvLayout::shuffle : ref::KvLayout::nhd;
    if (is_fp8(kv_cache_dtype(p.kv, p.dtype)))
      a.quant = ref::KvQuant{static_cast<float>(prob.arg("k_scale").get({0})),
                             static_cast<float>(prob.arg("v_scale").get({0}))};
    const ref::KvCaches w = ref::kv_cache_write(a);
    // A large-offset cache is compared over the blocks the host holds (run/device.cpp).
    return {{"key_cache", w.key_cache.held_rows()}, {"value_cache", w.value_cache.held_rows()}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P& p, const TensorMap&) const override {
    if (p.quant == Quant::per_token) {
      // The upstream kernel fixes every fp32 operation (docs/ops/kv_cache_write.md, "Per-token
      // quant"): amax is exact, the scale one correctly rounded division, the reciprocal one more,
      // the product one more, then one conversion. No step leaves a choice, so bits are compared.
      const Budget codes =
          exact_budget(std::string("every cache element bitwise: written slots hold ") +
                       (p.kv == KvDtype::int8 ? "trunc" : "RNE_fp8") +
                       "(fp32(x * fp32(1 / max(scale, 1e-12f)))) of their (token, head) row, every "
                       "other element "
                       "its old value");
      const Budget scales = exact_budget(
          "every scale bitwise: written (slot, head) entries hold fp32(amax_row / M) (one "
          "correctly "
          "rounded division of exact operands), every other entry its old value");
      return {{"key_cache", codes, {}, {}},
              {"value_cache", codes, {}, {}},
              {"k_dequant_scales", scales, {}, {}},
              {"v_dequant_scales", scales, {}, {}}};
    }
    const Budget b = exact_budget(
        is_fp8(kv_cache_dtype(p.kv, p.dtype))
            ? "every cache element bitwise: written slots hold RNE_fp8(fp32 x / scale) saturated "
              "(one correctly rounded division, one rounding), every other element its old value"
            : "every cache element bitwise: written slots hold the token's bits, every other "
              "element its old value");
    return {{"key_cache", b, {}, {}}, {"value_cache", b, {}, {}}};
  }

 private:
  // The cache's block count: twice the blocks the tokens need, plus two nobody writes.
  static int64_t cache_blocks(const P& p) {
    return 2 * ((p.tokens + p.block_size - 1) / p.block_size) + 2;
  }

  // The old contents of both caches (earlier tokens) in the blocks the host holds, drawn from
  // the case.
  static void fill_old_caches(const Case& c, const P& p, const ref::KvCacheViews& cache) {
    const auto seed = static_cast<uint64_t>(p.seed);
    fill_old_contents(cache.key_cache.held_rows(), Rng(c.id, "old_key_cache", seed));
    fill_old_contents(cache.value_cache.held_rows(), Rng(c.id, "old_value_cache", seed));
  }

  // Block ids of a large-offset cache start at `first` (past byte 2^offset_log2 of a storage:
  // K and V of a block for hybrid and packed caches, K or V alone for separate ones).
  static int64_t first_block(const P& p) {
    const DType cache_dtype = kv_cache_dtype(p.kv, p.dtype);
    const int64_t per_id = (p.strides == ref::KvStrides::separate ? 1 : 2) * p.block_size *
                           p.heads * p.head_dim * static_cast<int64_t>(dtype_size(cache_dtype));
    return first_block_past(p.offset_log2, per_id);
  }

  // The slots, moved to the held blocks. far_rows: the last real token alone writes, into the
  // cache's last slot (its key and value rows are the far ones, place_far_token).
  static Tensor slot_mapping(const Case& c, const P& p) {
    const int64_t first = first_block(p) * p.block_size, held = cache_blocks(p) * p.block_size;
    Tensor slots = make_slots(c.id, p.slots, p.tokens, held, p.seed);
    for (int64_t t = 0; t < p.tokens; ++t) {
      auto& s = slots.at<int64_t>({t});
      if (p.far_rows) s = t == far_token(p) ? held - 1 : -1;
      if (s >= 0) s += first;
    }
    return slots;
  }
  static int64_t far_token(const P& p) { return p.tokens - kTrailingPad - 1; }

  // reshape_and_cache_flash: NHD or SHUFFLE caches of the model dtype or fp8 (per-tensor scales).
  static Problem make_per_tensor(const Case& c, const P& p) {
    const DType cache_dtype = kv_cache_dtype(p.kv, p.dtype);
    const auto cache = ref::make_kv_cache(
        cache_dtype, p.layout == WriteLayout::shuffle ? ref::KvLayout::shuffle : ref::KvLayout::nhd,
        p.strides, cache_blocks(p), p.block_size, p.heads, p.head_dim, first_block(p));
    fill_old_caches(c, p, cache);

    const auto [key, value] = make_tokens(c, p);
    Tensor k_scale = Tensor::full(DType::f32, {1}, 1.0);
    Tensor v_scale = Tensor::full(DType::f32, {1}, 1.0);
    if (is_fp8(cache_dtype)) {
      // k: |x| / scale small, so fp8 subnormals and ties occur; v: small scale, so some |x| / scale
      // pass the format's max and saturate. A multiplied (not divided) scale cannot pass.
      Rng s_rng(c.id, "scales", static_cast<uint64_t>(p.seed));
      k_scale.set({0}, s_rng.uniform(0.5, 3.0));
      v_scale.set({0}, s_rng.uniform(0.005, 0.009));
    }

    Problem prob;
    prob.args = {{"key", key, Role::input},
                 {"value", value, Role::input},
                 {"key_cache", cache.key_cache, Role::inout},
                 {"value_cache", cache.value_cache, Role::inout},
                 {"slot_mapping", slot_mapping(c, p), Role::input},
                 {"k_scale", k_scale, Role::input},
                 {"v_scale", v_scale, Role::input}};
    if (p.far_rows) place_far_token(prob, {"key", "value"}, far_token(p));
    const double elems = 2.0 * static_cast<double>(p.tokens * p.heads * p.head_dim);
    prob.bytes = elems * static_cast<double>(dtype_size(p.dtype) + dtype_size(cache_dtype));
    return prob;
  }

  // AITER reshape_and_cache_with_pertoken_quant: K SHUFFLE tile, V SHUFFLE (asm_layout) or
  // [nb, Hkv, D, P], 1-byte codes, f32 scales per (slot, head).
  static Problem make_pertoken(const Case& c, const P& p) {
    const bool asm_layout = p.layout == WriteLayout::shuffle;
    const int64_t nb = cache_blocks(p);
    const auto cache = ref::make_pertoken_cache(kv_cache_dtype(p.kv, p.dtype), asm_layout,
                                                p.strides, nb, p.block_size, p.heads, p.head_dim);
    fill_old_caches(c, p, cache);
    const Shape s_shape =
        asm_layout ? Shape{nb, p.heads, p.block_size} : Shape{p.heads, nb * p.block_size};
    const auto seed = static_cast<uint64_t>(p.seed);
    Tensor k_scales = old_scales(s_shape, Rng(c.id, "old_k_scales", seed));
    Tensor v_scales = old_scales(s_shape, Rng(c.id, "old_v_scales", seed));

    const auto [key, value] = make_tokens(c, p);
    const bool zero_tiny = p.rows == Rows::zero_tiny;
    shape_pertoken_rows(key, zero_tiny);  // through the views: a qkv row keeps its q heads
    shape_pertoken_rows(value, zero_tiny);

    Problem prob;
    prob.kernel = kPertokenEntry;
    prob.args = {{"key", key, Role::input},
                 {"value", value, Role::input},
                 {"key_cache", cache.key_cache, Role::inout},
                 {"value_cache", cache.value_cache, Role::inout},
                 {"k_dequant_scales", k_scales, Role::inout},
                 {"v_dequant_scales", v_scales, Role::inout},
                 {"slot_mapping", slot_mapping(c, p), Role::input}};
    if (p.far_rows) place_far_token(prob, {"key", "value"}, far_token(p));
    const double elems = 2.0 * static_cast<double>(p.tokens * p.heads * p.head_dim);
    prob.bytes = elems * static_cast<double>(dtype_size(p.dtype) + 1) +
                 2.0 * static_cast<double>(p.tokens * p.heads) * 4.0;
    return prob;
  }
};

const OpRegistrar kRegister(std::make_unique<KvCacheWriteOp>());

}  // namespace
}  // namespace attncheck
