// kv_gather: cp_mha_gather_cache (docs/ops/kv_gather.md). Exact op: bitwise.
// What it guards against: kernels that assume contiguous caches (the hybrid attention+Mamba
// [K0][V0][K1][V1]... re-striding gives a block stride of 2H, #35925 -> #37228), hard-coded
// SHUFFLE offsets, chunk or window starts ignored, block tables read past the request's blocks or
// through the wrong row stride, fp8 dequantization re-quantized to the cache dtype, writes past
// the gathered tokens into the rest of the workspace, and caches assumed contiguous within a block
// (the packed (nb, Hkv, P, 2D) layout of vLLM #44455, whose K and V views interleave per slot),
// fp8 dequant exact only on ordinary codes, and offsets past 2^31 / 2^32 (issue 14).
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/policy.h"
#include "ops/kv_cache_axes.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "reference/kv_gather.h"

namespace attncheck {
namespace {

enum class Context { full, chunk, window };
enum class Table { contiguous, strided };
enum class KeyRows { exact, longer };

struct KvGatherParams {
  ref::KvLayout layout = ref::KvLayout::nhd;
  ref::KvStrides strides = ref::KvStrides::contiguous;
  KvDtype kv = KvDtype::model;
  DType dtype = DType::bf16;
  int64_t heads = 1;
  int64_t head_dim = 64;
  int64_t block_size = 16;
  Context context = Context::full;
  int64_t span = 20;
  int64_t batch = 4;
  int64_t max_ctx = 50;
  Table table = Table::contiguous;
  int64_t seed = 0;
  Fp8Codes fp8_codes = Fp8Codes::ordinary;
  int64_t offset_log2 = 0;
  KeyRows key_rows = KeyRows::exact;
  bool storage_offset = false;  // ops/storage_offset.h
  int64_t out_offset_log2 = 0;
  int64_t table_step = 1;   // ops/paged.h
  bool interleave = false;  // ops/storage_offset.h
};

// out_offset_log2: key and value in one sparse storage, their token rows `stride` apart and
// value's one row after key's, so that the last token's K and V rows lie past element 2^log2 side
// by side in the host window and only they are compared.
std::pair<Tensor, Tensor> far_key_value(DType dtype, int64_t tokens, int64_t Hkv, int64_t D,
                                        int64_t log2) {
  if (tokens < 2) throw std::invalid_argument("out_offset_log2 needs two or more tokens");
  const int64_t row = Hkv * D;
  const int64_t stride = ((int64_t{1} << log2) + tokens - 2) / (tokens - 1) + 2 * row;
  const int64_t last = (tokens - 1) * stride;
  const Tensor storage = Tensor::sparse(dtype, {last + 2 * row}, last, 2 * row);
  poison(storage);
  return {storage.as_strided({tokens, Hkv, D}, {stride, D, 1}, 0),
          storage.as_strided({tokens, Hkv, D}, {stride, D, 1}, row)};
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

class KvGatherOp final : public TypedOp<KvGatherParams> {
 public:
  using P = KvGatherParams;
  std::string name() const override { return "kv_gather"; }
  // interleave: the caches take any strides, the innermost included (docs/ops/kv_gather.md).
  std::vector<std::string> interleaved_args(const P&) const override {
    return {"key_cache", "value_cache"};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.choice("layout", "", &P::layout,
             {{ref::KvLayout::nhd, "nhd"}, {ref::KvLayout::shuffle, "shuffle"}},
             "NHD [nb,P,Hkv,D] or SHUFFLE 5-d tiles");
    add_kv_strides(f, &P::strides,
                   "hybrid: [K0][V0][K1][V1]... one storage, block stride 2H; padded: every "
                   "stride + 16 B; separate: two storages; packed: one (nb, Hkv, P, 2D) tensor "
                   "split along its last dim (NHD only)");
    add_kv_dtype(f, &P::kv, false, "cache dtype; fp8 dequantizes");
    add_model_dtype(f, &P::dtype, "model (output) dtype");
    f.add("heads", "h", &P::heads, "KV heads Hkv")
        .only({1, 2, 4, 8})
        .add("head_dim", "d", &P::head_dim, "head size D")
        .only({64, 128, 192, 256})
        .add("block_size", "bs", &P::block_size, "tokens per cache block P")
        .only({16, 32, 48})
        .choice("context", "", &P::context,
                {{Context::full, "full"}, {Context::chunk, "chunk"}, {Context::window, "window"}},
                "full context; its second chunk of `span` tokens; its last `span` tokens (SWA)")
        .add("span", "sp", &P::span, "chunk size or window for context = chunk | window")
        .add("batch", "b", &P::batch, "requests (edge lengths 0, 1, P-1, P, P+1, 2P+1 first)")
        .add("max_ctx", "ctx", &P::max_ctx, "longest context")
        .choice("table", "", &P::table,
                {{Table::contiguous, "contiguous"}, {Table::strided, "strided"}},
                "block table row stride")
        .add("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default();
    add_fp8_codes(f, &P::fp8_codes,
                  "special: the tokens gathered hold the saturation codes (+-448 e4m3fn, +-240 "
                  "e4m3fnuz) and, in e4m3fn, -0 (dequantized to -0); every slot not gathered "
                  "holds the format's NaN codes (fp8 kv only)");
    add_offset_log2(f, &P::offset_log2,
                    "31 / 32: every block a request reads starts past byte 2^31 / 2^32 of its "
                    "cache storage (hybrid, separate or packed strides); the host holds only "
                    "those blocks");
    add_table_step(f, &P::table_step);
    add_interleave(f, &P::interleave);
    f.choice("key_rows", "kr", &P::key_rows,
             {{KeyRows::exact, "exact"}, {KeyRows::longer, "longer"}},
             "exact: key / value are [total_tokens, Hkv, D]; longer: [total_tokens + 3, ...] "
             "(the ABI's [>= total_tokens, ...]), whose last 3 rows hold data the kernel must "
             "leave alone (inout), so no extent tells total_tokens")
        .out_of_id_at_default()
        .add("out_offset_log2", "ooff", &P::out_offset_log2,
             "31: key / value's token stride puts the last token's rows past element 2^31 "
             "(byte 2^32); a sparse storage holds only those, which alone are compared")
        .only({0, 31})
        .out_of_id_at_default();
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.context != Context::full &&
        (p.span < 1 || (p.context == Context::chunk && p.span >= p.max_ctx)))
      return "span must be in [1, max_ctx) for chunked contexts";
    if (p.fp8_codes == Fp8Codes::special && !is_fp8(cache_dtype_of(p)))
      return "fp8_codes = special needs an fp8 kv";
    if (p.offset_log2 != 0 && p.strides != ref::KvStrides::hybrid &&
        p.strides != ref::KvStrides::separate && p.strides != ref::KvStrides::packed)
      return "offset_log2 needs hybrid, separate or packed strides";
    // ref::make_kv_cache's text (reference/kv_gather.cpp), here so that the error names the case.
    if (p.out_offset_log2 != 0 && p.key_rows != KeyRows::exact)
      return "out_offset_log2 needs key_rows = exact";
    if (p.strides == ref::KvStrides::packed && p.layout == ref::KvLayout::shuffle)
      return "the packed (nb, Hkv, P, 2D) cache is an NHD layout, not SHUFFLE";
    return std::nullopt;
  }

  // The held blocks of both caches (a large-offset cache holds those only), the layout, and the
  // key/value workspace of every request's tokens; each token row is copied once.
  CaseSize size(const P& p) const override {
    const double row = static_cast<double>(p.heads) * static_cast<double>(p.head_dim);
    const double tokens = static_cast<double>(p.batch) * static_cast<double>(p.max_ctx) + 8;
    CaseSize s;
    s.input_bytes = 2 * paged_blocks(p.batch, p.max_ctx, p.block_size) *
                        static_cast<double>(p.block_size) * row * 4 +
                    paged_layout_bytes(p.batch, p.max_ctx, p.block_size) +
                    16 * static_cast<double>(p.batch + 2);
    s.output_bytes = 2 * (tokens + 6) * row * static_cast<double>(dtype_size(p.dtype));
    s.work = 2 * tokens * row;
    return s.count("batch", p.batch)
        .count("max_ctx", p.max_ctx)
        .count("heads", p.heads)
        .count("head_dim", p.head_dim)
        .count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const DType cache_dtype = cache_dtype_of(p);
    const int64_t Hkv = p.heads, D = p.head_dim, bs = p.block_size;
    const auto seed = static_cast<uint64_t>(p.seed);
    const auto paged = paged_layout(c.id, p.batch, p.max_ctx, bs, p.table == Table::strided, p.seed,
                                    /*min_len=*/0, /*long_from=*/0, p.table_step);
    // token_to_batch entries past total_tokens (hold B); 8 beside key's 3 extra rows, so neither
    // extent tells total_tokens.
    const int64_t kPad = p.key_rows == KeyRows::longer ? 8 : 5;
    const ref::KvGatherMeta meta =
        p.context == Context::chunk    ? ref::chunk_meta(paged.seq_lens, p.span, 1, kPad)
        : p.context == Context::window ? ref::window_meta(paged.seq_lens, p.span, kPad)
                                       : ref::chunk_meta(paged.seq_lens, p.max_ctx, 0, kPad);

    // Large offsets: block ids start past 2^offset_log2 / (bytes per block id of a storage:
    // K and V of a block for hybrid and packed caches, K or V alone for separate ones).
    const int64_t block_bytes = (p.strides == ref::KvStrides::separate ? 1 : 2) * bs * Hkv * D *
                                static_cast<int64_t>(dtype_size(cache_dtype));
    const int64_t first = first_block_past(p.offset_log2, block_bytes);
    shift_block_ids(paged, first);
    auto cache =
        ref::make_kv_cache(cache_dtype, p.layout, p.strides, paged.num_blocks, bs, Hkv, D, first);
    const Tensor k_held = cache.key_cache.slice(0, first, first + paged.num_blocks);
    const Tensor v_held = cache.value_cache.slice(0, first, first + paged.num_blocks);
    const Rng k_rng(c.id, "key_cache", seed);
    const Rng v_rng(c.id, "value_cache", seed);
    Tensor k_scale = Tensor::full(DType::f32, {1}, 1.0);
    Tensor v_scale = Tensor::full(DType::f32, {1}, 1.0);
    if (is_fp8(cache_dtype)) {
      // Codes up to +-200 (inside both formats) and non-unit scales: a product re-quantized to
      // fp8 or a scale ignored cannot pass.
      fill_fp8_codes(k_held, k_rng, 200.0);
      fill_fp8_codes(v_held, v_rng, 200.0);
      Rng s_rng(c.id, "scales", seed);
      k_scale.set({0}, s_rng.uniform(0.004, 0.03));
      v_scale.set({0}, s_rng.uniform(0.5, 3.0));
      if (p.fp8_codes == Fp8Codes::special)
        plant_fp8_specials(cache, p.layout, paged, meta, first, bs, Hkv, D);
    } else {
      fill_normal(k_held, k_rng);
      fill_normal(v_held, v_rng);
    }

    // One workspace for both outputs, like the builder's [2, N, Hkv, D]: rows past the key and
    // value views stay poisoned and must stay untouched. key_rows = longer: the views hold 3 rows
    // past the gathered tokens, with data (inout).
    const int64_t total = meta.total_tokens;
    const bool longer = p.key_rows == KeyRows::longer;
    const int64_t rows = longer ? total + 3 : total;
    Tensor workspace = Tensor::empty(p.dtype, {2, rows + 3, Hkv, D});
    poison(workspace);
    if (longer) fill_normal(workspace.slice(1, total, rows), Rng(c.id, "key_rows_past", seed));
    const Role out_role = longer ? Role::inout : Role::output;
    Tensor key = workspace.select(0, 0).slice(0, 0, rows);
    Tensor value = workspace.select(0, 1).slice(0, 0, rows);
    if (p.out_offset_log2 > 0)
      std::tie(key, value) = far_key_value(p.dtype, total, Hkv, D, p.out_offset_log2);

    Problem prob;
    prob.args = {{"key_cache", cache.key_cache, Role::input},
                 {"value_cache", cache.value_cache, Role::input},
                 {"block_tables", paged.block_table, Role::input},
                 {"cu_seqlens_kv", meta.cu_seqlens_kv, Role::input},
                 {"token_to_batch", meta.token_to_batch, Role::input},
                 {"seq_starts", meta.seq_starts, Role::input},
                 {"k_scale", k_scale, Role::input},
                 {"v_scale", v_scale, Role::input},
                 {"key", key, out_role},
                 {"value", value, out_role}};
    const double elems = 2.0 * static_cast<double>(total * Hkv * D);
    prob.bytes = elems * static_cast<double>(dtype_size(cache_dtype) + dtype_size(p.dtype));
    return prob;
  }

  // Graph replay: captured with the block ids permuted (each request gathers other pages).
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(prob, {permuted_block_ids("block_tables")});
  }

  nlohmann::json kernel_params(const P& p, const Problem& inputs) const override {
    const DType cache_dtype = cache_dtype_of(p);
    nlohmann::json kp = {
        {"kv_cache_layout", p.layout == ref::KvLayout::shuffle ? "SHUFFLE" : "NHD"},
        {"dequant", is_fp8(cache_dtype)},
        {"total_tokens", total_tokens(inputs, p)}};
    if (is_fp8(cache_dtype)) kp["fp8_format"] = fp8_format_name(cache_dtype);
    return kp;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    ref::KvGatherArgs a;
    a.key_cache = prob.arg("key_cache");
    a.value_cache = prob.arg("value_cache");
    a.block_tables = prob.arg("block_tables");
    a.cu_seqlens_kv = prob.arg("cu_seqlens_kv");
    a.token_to_batch = prob.arg("token_to_batch");
    a.seq_starts = prob.arg("seq_starts");
    a.layout = p.layout;
    a.total_tokens = total_tokens(prob, p);
    a.out_dtype = p.dtype;
    if (is_fp8(cache_dtype_of(p)))
      a.dequant = ref::KvDequant{static_cast<float>(prob.arg("k_scale").get({0})),
                                 static_cast<float>(prob.arg("v_scale").get({0}))};
    auto g = ref::kv_gather(a);
    return {{"key", held_rows_of(with_tail(g.key, prob.arg("key")), prob.arg("key")).contiguous()},
            {"value",
             held_rows_of(with_tail(g.value, prob.arg("value")), prob.arg("value")).contiguous()}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P& p, const TensorMap&) const override {
    const Budget b = exact_budget(
        is_fp8(cache_dtype_of(p))
            ? "fp8 dequant is one fp32 product and one round-to-nearest-even to the output dtype, "
              "both correctly rounded: bitwise"
            : "gather is a copy: bitwise");
    return {{"key", b, {}, {}}, {"value", b, {}, {}}};
  }

 private:
  static DType cache_dtype_of(const P& p) { return kv_cache_dtype(p.kv, p.dtype); }
  // The tokens gathered: the rows of the key output (a view of the workspace's first rows), but
  // for its 3 trailing rows when key_rows = longer.
  static int64_t total_tokens(const Problem& prob, const P& p) {
    return prob.arg("key").size(0) - (p.key_rows == KeyRows::longer ? 3 : 0);
  }
  // The expected final contents of an output view longer than the gathered rows: those rows,
  // then its trailing rows as they were (nothing may write them).
  static Tensor with_tail(const Tensor& gathered, const Tensor& initial) {
    if (initial.size(0) == gathered.size(0)) return gathered;
    Tensor all = initial.contiguous();
    all.slice(0, 0, gathered.size(0)).copy_from(gathered);
    return all;
  }
};

const OpRegistrar kRegister(std::make_unique<KvGatherOp>());

}  // namespace
}  // namespace attncheck
