// kv_gather: cp_mha_gather_cache (docs/ops/kv_gather.md). Exact op: bitwise.
// What it guards against: kernels that assume contiguous caches (the hybrid attention+Mamba
// [K0][V0][K1][V1]... re-striding gives a block stride of 2H, #35925 -> #37228), hard-coded
// SHUFFLE offsets, chunk or window starts ignored, block tables read past the request's blocks or
// through the wrong row stride, fp8 dequantization re-quantized to the cache dtype, writes past
// the gathered tokens into the rest of the workspace, and caches assumed contiguous within a block
// (the packed (nb, Hkv, P, 2D) layout of vLLM #44455, whose K and V views interleave per slot),
// fp8 dequant exact only on ordinary codes, and offsets past 2^31 / 2^32 (issue 14).
#include <stdexcept>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/policy.h"
#include "ops/op.h"
#include "ops/paged.h"
#include "reference/kv_gather.h"

namespace attncheck {
namespace {

ref::KvLayout parse_layout(const std::string& s) {
  return s == "shuffle" ? ref::KvLayout::shuffle : ref::KvLayout::nhd;
}
ref::KvStrides parse_strides(const std::string& s) {
  if (s == "hybrid") return ref::KvStrides::hybrid;
  if (s == "padded") return ref::KvStrides::padded;
  if (s == "separate") return ref::KvStrides::separate;
  if (s == "packed") return ref::KvStrides::packed;
  return ref::KvStrides::contiguous;
}

// fp8_codes = special (docs/formats.md): in every slot the gather reads (each request's
// [seq_start, seq_start + count)), element (h, d) of the token at position pos holds
// fp8_special_code(pos + h + d), in K and V; every other slot of the held blocks holds NaN codes,
// which must never reach the output.
void plant_fp8_specials(const ref::KvCacheViews& cache, ref::KvLayout layout,
                        const PagedLayout& paged, const ref::KvGatherMeta& meta, int64_t first,
                        int64_t P, int64_t Hkv, int64_t D) {
  const DType dt = cache.key_cache.dtype();
  const int64_t x = layout == ref::KvLayout::shuffle ? ref::shuffle_x(dt) : 1;
  std::vector<int64_t> read_at(static_cast<size_t>(paged.num_blocks * P), -1);  // pos or -1
  for (int64_t b = 0; b < meta.seq_starts.size(0); ++b) {
    const int64_t start = meta.seq_starts.at<int32_t>({b});
    const int64_t count =
        meta.cu_seqlens_kv.at<int32_t>({b + 1}) - meta.cu_seqlens_kv.at<int32_t>({b});
    for (int64_t pos = start; pos < start + count; ++pos) {
      const int64_t blk = paged.block_table.at<int32_t>({b, pos / P});
      read_at[static_cast<size_t>((blk - first) * P + pos % P)] = pos;
    }
  }
  for (int64_t i = 0; i < paged.num_blocks * P; ++i) {
    const int64_t pos = read_at[static_cast<size_t>(i)], blk = first + i / P, s = i % P;
    for (int v = 0; v < 2; ++v) {
      const Tensor& t = v ? cache.value_cache : cache.key_cache;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const Index at = ref::kv_cache_index(layout, v == 1, x, blk, s, h, d);
          if (pos < 0)
            t.set_bits(at, fp8_nan_code(s + h + d, dt));
          else if (const auto code = fp8_special_code(pos + h + d, dt))
            t.set_bits(at, *code);
        }
    }
  }
}

class KvGatherOp final : public Op {
 public:
  std::string name() const override { return "kv_gather"; }
  std::vector<Axis> axes() const override {
    return {
        {"layout", "", "nhd", {"nhd", "shuffle"}, "NHD [nb,P,Hkv,D] or SHUFFLE 5-d tiles"},
        {"strides",
         "",
         "contiguous",
         {"contiguous", "hybrid", "padded", "separate", "packed"},
         "hybrid: [K0][V0][K1][V1]... one storage, block stride 2H; padded: every stride + 16 B; "
         "separate: two storages; packed: one (nb, Hkv, P, 2D) tensor split along its last dim "
         "(NHD only)"},
        {"kv", "kv", "model", {"model", "e4m3fn", "e4m3fnuz"}, "cache dtype; fp8 dequantizes"},
        {"dtype", "", "bf16", {"bf16", "f16"}, "model (output) dtype"},
        {"heads", "h", 1, {1, 2, 4, 8}, "KV heads Hkv"},
        {"head_dim", "d", 64, {64, 128, 192, 256}, "head size D"},
        {"block_size", "bs", 16, {16, 32, 48}, "tokens per cache block P"},
        {"context",
         "",
         "full",
         {"full", "chunk", "window"},
         "full context; its second chunk of `span` tokens; its last `span` tokens (SWA)"},
        {"span", "sp", 20, {}, "chunk size or window for context = chunk | window"},
        {"batch", "b", 4, {}, "requests (edge lengths 0, 1, P-1, P, P+1, 2P+1 first)"},
        {"max_ctx", "ctx", 50, {}, "longest context"},
        {"table", "", "contiguous", {"contiguous", "strided"}, "block table row stride"},
        {"seed", "s", 0, {}, "input seed"},
        fp8_codes_axis("special: the tokens gathered hold the saturation codes (+-448 e4m3fn, "
                       "+-240 e4m3fnuz) and, in e4m3fn, -0 (dequantized to -0); every slot not "
                       "gathered holds the format's NaN codes (fp8 kv only)"),
        offset_log2_axis("31 / 32: every block a request reads starts past byte 2^31 / 2^32 of "
                         "its cache storage (hybrid, separate or packed strides); the host holds "
                         "only those blocks"),
    };
  }

  Problem make(const Case& c) const override {
    const auto& p = c.params;
    const auto layout = parse_layout(param_str(p, "layout"));
    const DType out_dtype = param_str(p, "dtype") == "f16" ? DType::f16 : DType::bf16;
    const std::string kv = param_str(p, "kv");
    const DType cache_dtype = kv == "model"    ? out_dtype
                              : kv == "e4m3fn" ? DType::e4m3fn
                                               : DType::e4m3fnuz;
    const int64_t Hkv = param_int(p, "heads"), D = param_int(p, "head_dim");
    const int64_t P = param_int(p, "block_size"), seed = param_int(p, "seed");
    const int64_t max_ctx = param_int(p, "max_ctx"), span = param_int(p, "span");
    const std::string context = param_str(p, "context");
    if (context != "full" && (span < 1 || (context == "chunk" && span >= max_ctx)))
      throw std::invalid_argument(c.id + ": span must be in [1, max_ctx) for chunked contexts");

    const std::string strides = param_str(p, "strides");
    const bool specials = param_str(p, "fp8_codes") == "special";
    const int64_t offset_log2 = param_int(p, "offset_log2");
    if (specials && !is_fp8(cache_dtype))
      throw std::invalid_argument(c.id + ": fp8_codes = special needs an fp8 kv");
    if (offset_log2 != 0 && strides != "hybrid" && strides != "separate" && strides != "packed")
      throw std::invalid_argument(c.id + ": offset_log2 needs hybrid, separate or packed strides");

    const auto paged = paged_layout(c.id, param_int(p, "batch"), max_ctx, P,
                                    param_str(p, "table") == "strided", seed);
    constexpr int64_t kPad = 5;  // token_to_batch entries past total_tokens (hold B)
    const ref::KvGatherMeta meta =
        context == "chunk"    ? ref::chunk_meta(paged.seq_lens, span, 1, kPad)
        : context == "window" ? ref::window_meta(paged.seq_lens, span, kPad)
                              : ref::chunk_meta(paged.seq_lens, max_ctx, 0, kPad);

    // Large offsets: block ids start past 2^offset_log2 / (bytes per block id of a storage:
    // K and V of a block for hybrid and packed caches, K or V alone for separate ones).
    const int64_t block_bytes = (strides == "separate" ? 1 : 2) * P * Hkv * D *
                                static_cast<int64_t>(dtype_size(cache_dtype));
    const int64_t first = first_block_past(offset_log2, block_bytes);
    shift_block_ids(paged, first);
    auto cache = ref::make_kv_cache(cache_dtype, layout, parse_strides(strides), paged.num_blocks,
                                    P, Hkv, D, first);
    const Tensor k_held = cache.key_cache.slice(0, first, first + paged.num_blocks);
    const Tensor v_held = cache.value_cache.slice(0, first, first + paged.num_blocks);
    const Rng k_rng(c.id, "key_cache", static_cast<uint64_t>(seed));
    const Rng v_rng(c.id, "value_cache", static_cast<uint64_t>(seed));
    Tensor k_scale = Tensor::full(DType::f32, {1}, 1.0);
    Tensor v_scale = Tensor::full(DType::f32, {1}, 1.0);
    if (is_fp8(cache_dtype)) {
      // Codes up to +-200 (inside both formats) and non-unit scales: a product re-quantized to
      // fp8 or a scale ignored cannot pass.
      fill_fp8_codes(k_held, k_rng, 200.0);
      fill_fp8_codes(v_held, v_rng, 200.0);
      Rng s_rng(c.id, "scales", static_cast<uint64_t>(seed));
      k_scale.set({0}, s_rng.uniform(0.004, 0.03));
      v_scale.set({0}, s_rng.uniform(0.5, 3.0));
      if (specials) plant_fp8_specials(cache, layout, paged, meta, first, P, Hkv, D);
    } else {
      fill_normal(k_held, k_rng);
      fill_normal(v_held, v_rng);
    }

    // One workspace for both outputs, like the builder's [2, N, Hkv, D]: rows past the gathered
    // tokens stay poisoned and must stay untouched.
    const int64_t total = meta.total_tokens;
    Tensor workspace = Tensor::empty(out_dtype, {2, total + 3, Hkv, D});
    poison(workspace);

    Problem prob;
    prob.args = {{"key_cache", cache.key_cache, Role::input},
                 {"value_cache", cache.value_cache, Role::input},
                 {"block_tables", paged.block_table, Role::input},
                 {"cu_seqlens_kv", meta.cu_seqlens_kv, Role::input},
                 {"token_to_batch", meta.token_to_batch, Role::input},
                 {"seq_starts", meta.seq_starts, Role::input},
                 {"k_scale", k_scale, Role::input},
                 {"v_scale", v_scale, Role::input},
                 {"key", workspace.select(0, 0).slice(0, 0, total), Role::output},
                 {"value", workspace.select(0, 1).slice(0, 0, total), Role::output}};
    prob.kernel_params = {{"kv_cache_layout", layout == ref::KvLayout::shuffle ? "SHUFFLE" : "NHD"},
                          {"dequant", is_fp8(cache_dtype)},
                          {"total_tokens", total}};
    if (is_fp8(cache_dtype)) prob.kernel_params["fp8_format"] = dtype_name_plain(cache_dtype);
    const double elems = 2.0 * static_cast<double>(total * Hkv * D);
    prob.bytes = elems * static_cast<double>(dtype_size(cache_dtype) + dtype_size(out_dtype));
    return prob;
  }

  TensorMap reference(const Problem& p) const override {
    ref::KvGatherArgs a;
    a.key_cache = p.arg("key_cache");
    a.value_cache = p.arg("value_cache");
    a.block_tables = p.arg("block_tables");
    a.cu_seqlens_kv = p.arg("cu_seqlens_kv");
    a.token_to_batch = p.arg("token_to_batch");
    a.seq_starts = p.arg("seq_starts");
    a.layout = p.kernel_params.at("kv_cache_layout") == "SHUFFLE" ? ref::KvLayout::shuffle
                                                                  : ref::KvLayout::nhd;
    a.total_tokens = p.kernel_params.at("total_tokens").get<int64_t>();
    a.out_dtype = p.arg("key").dtype();
    if (p.kernel_params.at("dequant").get<bool>())
      a.dequant = ref::KvDequant{static_cast<float>(p.arg("k_scale").get({0})),
                                 static_cast<float>(p.arg("v_scale").get({0}))};
    auto g = ref::kv_gather(a);
    return {{"key", g.key}, {"value", g.value}};
  }

  std::vector<OutputCheck> checks(const Problem& p, const TensorMap&) const override {
    const Budget b = exact_budget(
        p.kernel_params.at("dequant").get<bool>()
            ? "fp8 dequant is one fp32 product and one round-to-nearest-even to the output dtype, "
              "both correctly rounded: bitwise"
            : "gather is a copy: bitwise");
    return {{"key", b, {}, {}}, {"value", b, {}, {}}};
  }

 private:
  // "e4m3fn" / "e4m3fnuz": the ABI's fp8_format strings.
  static std::string dtype_name_plain(DType t) {
    return t == DType::e4m3fn ? "e4m3fn" : "e4m3fnuz";
  }
};

const OpRegistrar kRegister(std::make_unique<KvGatherOp>());

}  // namespace
}  // namespace attncheck
