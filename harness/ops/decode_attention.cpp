// decode_attention: vLLM's Triton grouped split-KV decode attention
// (docs/ops/decode_attention.md): one query token per request over a paged cache,
// MHA/GQA/MQA/MLA, fp8 KV with per-tensor scales, logit soft-cap, any split count. What it guards
// against: tiles sized from Lk while the MLA path reuses the K tile as V (320/256, vLLM #40966),
// split bounds that drop or repeat tokens (more splits than tokens), page tables read past a
// request's pages or through the wrong stride, caches whose page stride is not P * token stride
// (cross-layer views), heads mapped to the wrong KV head, fp8 scales applied twice or not at all,
// and writes outside o / lse.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "ops/values.h"
#include "reference/decode_attention.h"

namespace attncheck {
namespace {

// lk_lv: QK head dim x V head dim; the enum's order is the table's.
enum class HeadDims { d576x512, d576x128, d320x256, d288x256, d192x128, d128x128 };
struct HeadDimsEntry {
  HeadDims dims;
  const char* name;
  int64_t lk, lv;
};
constexpr HeadDimsEntry kHeadDims[] = {
    {HeadDims::d576x512, "576x512", 576, 512}, {HeadDims::d576x128, "576x128", 576, 128},
    {HeadDims::d320x256, "320x256", 320, 256}, {HeadDims::d288x256, "288x256", 288, 256},
    {HeadDims::d192x128, "192x128", 192, 128}, {HeadDims::d128x128, "128x128", 128, 128},
};

enum class KvDtype { same, e4m3fn, e4m3fnuz };
enum class Layout { contiguous, strided, cross_layer };
enum class Fp8Codes { ordinary, special };
enum class Scales { lk, sm, kscale };

double to_f32(double v) {
  return static_cast<double>(static_cast<float>(v));
}

struct DecodeAttentionParams {
  HeadDims lk_lv = HeadDims::d576x512;
  bool is_mla = true;
  int64_t heads = 16;
  int64_t kv_heads = 1;
  int64_t page_size = 16;
  int64_t splits = 4;
  int64_t logit_cap = 0;
  DType dtype = DType::bf16;
  KvDtype kv_dtype = KvDtype::same;
  int64_t batch = 4;
  int64_t max_ctx = 70;
  Layout layout = Layout::contiguous;
  int64_t seed = 0;
  Fp8Codes fp8_codes = Fp8Codes::ordinary;
  int64_t offset_log2 = 0;
  values::Values values = values::Values::typical;
  Scales scales = Scales::lk;
  int64_t o_offset_log2 = 0;
  int64_t partials_log2 = 0;
  int64_t table_step = 1;  // ops/paged.h
  int64_t q_offset_log2 = 0;
  bool storage_offset = false;  // ops/storage_offset.h

  int64_t lk() const { return kHeadDims[static_cast<size_t>(lk_lv)].lk; }
  // The elements of one request's split partials [Hq, S, Lv + 1] (upstream's attn_logits row).
  int64_t partials_per_request() const { return heads * splits * (lv() + 1); }
  // partials_log2 > 0: the first request whose partials start at or past element 2^partials_log2.
  int64_t first_far_request() const {
    const int64_t limit = int64_t{1} << partials_log2, per = partials_per_request();
    return (limit + per - 1) / per;
  }
  int64_t lv() const { return kHeadDims[static_cast<size_t>(lk_lv)].lv; }
  DType cache_dtype() const {
    return kv_dtype == KvDtype::same     ? dtype
           : kv_dtype == KvDtype::e4m3fn ? DType::e4m3fn
                                         : DType::e4m3fnuz;
  }
  bool fp8() const { return is_fp8(cache_dtype()); }
  // The caches' standard deviation: fp8 codes span the format like a per-tensor amax scale does.
  double kv_std() const { return fp8() ? max_finite(cache_dtype()) / 5 : 1.0; }
  // scales = sm | kscale pass values no other argument determines: a YaRN-like softmax scale, or
  // one k_scale for both fp8 formats (beside an unchanged v_scale), so the head dim, the format
  // and the other scale no longer tell a kernel that re-derives one of them what it is.
  double sm_scale() const {
    const double factor = scales == Scales::sm ? 0.75 : 1.0;
    return to_f32(factor / std::sqrt(static_cast<double>(lk())));
  }
  double k_scale() const {
    return fp8() ? to_f32(scales == Scales::kscale ? 0.01 : 1.1 / kv_std()) : 1.0;
  }
  double v_scale() const { return fp8() ? (is_mla ? k_scale() : to_f32(0.9 / kv_std())) : 1.0; }
};

// Why the kernel must refuse this configuration, or nothing.
// partials_log2: the requests whose o rows are held and compared (all of them past the limit).
constexpr int64_t kFarRowsHeld = 2;

std::optional<std::string> refusal(const DecodeAttentionParams& p) {
  if (p.kv_heads < 1 || p.heads % p.kv_heads != 0)
    return "heads " + std::to_string(p.heads) + " is not a multiple of kv_heads " +
           std::to_string(p.kv_heads);
  if (p.is_mla && p.lv() >= p.lk())
    return "is_mla needs Lv < Lk (V is the latent prefix of K), got " + std::to_string(p.lk()) +
           "/" + std::to_string(p.lv());
  return std::nullopt;
}

// q_offset_log2: only the last request's q row exists on the host (a sparse storage), so the
// reference and its error terms see that request alone.
ref::DecodeAttentionInputs inputs_of(const Problem& prob, const DecodeAttentionParams& p) {
  ref::DecodeAttentionInputs in;
  in.q = prob.arg("q");
  in.k_buffer = prob.arg("k_buffer");
  in.v_buffer = prob.arg("v_buffer");
  in.req_to_token = prob.arg("req_to_token");
  in.seq_lens = prob.arg("b_seq_len");
  if (p.q_offset_log2 > 0) {
    const int64_t B = in.q.size(0);
    in.q = in.q.held_rows();
    in.req_to_token = in.req_to_token.slice(0, B - 1, B);
    in.seq_lens = in.seq_lens.slice(0, B - 1, B);
  }
  in.sm_scale = p.sm_scale();
  in.logit_cap = static_cast<double>(p.logit_cap);
  in.k_scale = p.k_scale();
  in.v_scale = p.v_scale();
  return in;
}

// fp8_codes = special: in the tokens requests read, every 11th element (by token + dim) holds
// +-max finite (the saturation code) and, in e4m3fn, the next one over -0; every slot no request
// reads (past a request's length in its last page, pages nobody owns) holds the format's NaN
// codes (e4m3fn 0x7F / 0xFF, e4m3fnuz 0x80), which a kernel must never let into the output.
void plant_fp8_specials(const Tensor& cache, const PagedLayout& pl, int64_t P, int64_t first) {
  const DType kt = cache.dtype();
  const bool fn = kt == DType::e4m3fn;
  const uint64_t max_code = encode_value(max_finite(kt), kt);
  const int64_t hkv = cache.size(-2), D = cache.size(-1);
  auto element = [&](int64_t page, int64_t slot, int64_t h, int64_t d) {
    return P == 1 ? Index{page, h, d} : Index{page, slot, h, d};
  };
  auto nan_code = [&](int64_t i) -> uint64_t { return fn ? (i % 2 ? 0xFF : 0x7F) : 0x80; };
  std::vector<bool> owned(static_cast<size_t>(pl.num_blocks), false);
  for (int64_t b = 0; b < pl.seq_lens.size(0); ++b) {
    const int64_t len = pl.seq_lens.at<int32_t>({b});
    for (int64_t n = 0; n < (len + P - 1) / P * P; ++n) {
      const int64_t page = pl.block_table.at<int32_t>({b, n / P});
      owned[static_cast<size_t>(page - first)] = true;
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const Index idx = element(page, n % P, h, d);
          const int64_t k = n + d + h;
          if (n >= len)
            cache.set_bits(idx, nan_code(k));
          else if (k % 11 == 0)
            cache.set_bits(idx, max_code | ((k / 11) % 2 ? 0x80 : 0x00));
          else if (fn && k % 11 == 5)
            cache.set_bits(idx, 0x80);  // -0
        }
    }
  }
  for (int64_t i = 0; i < pl.num_blocks; ++i) {
    if (owned[static_cast<size_t>(i)]) continue;
    for (int64_t slot = 0; slot < P; ++slot)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t d = 0; d < D; ++d)
          cache.set_bits(element(first + i, slot, h, d), nan_code(slot + d));
  }
}

// values (harness/ops/values.h): q N(0, 1) (N(0, 4^2) with a soft-cap), caches N(0, kv_std^2)
// dequantized by k_scale. Under MLA, V is K's first Lv dims: ties share only the dims past Lv and
// zero q on V's.
void shape_values(const DecodeAttentionParams& p, const Tensor& q, const Tensor& k,
                  const Tensor& v) {
  values::Magnitudes m;
  m.scale = p.sm_scale() * p.k_scale();
  m.q = p.logit_cap > 0 ? 4.0 : 1.0;
  m.k = p.kv_std();
  m.tie_from = p.is_mla ? p.lv() : 0;
  values::shape_queries(p.values, q, k, m);
  values::shape_keys(p.values, k, m);
  if (!p.is_mla) values::shape_values(p.values, v, p.kv_std());
}

// q: N(0, 1); with a soft-cap, scores reach the cap's non-linear range.
Tensor make_q(const Case& c, const DecodeAttentionParams& p) {
  const int64_t B = p.batch, hq = p.heads, lk = p.lk();
  const DType qt = p.dtype;
  Tensor q;
  if (p.layout == Layout::strided) {
    q = Tensor::full(qt, {B, hq, lk + 48}, 3.0).slice(2, 16, 16 + lk);
  } else if (p.q_offset_log2 > 0) {
    q = far_last_row(qt, {B, hq, lk}, p.q_offset_log2);
  } else {
    q = Tensor::empty(qt, {B, hq, lk});
  }
  fill_normal(q.held_rows(), Rng(c.id, "q", static_cast<uint64_t>(p.seed)), 0.0,
              p.logit_cap > 0 ? 4.0 : 1.0);
  return q;
}

// Outputs o and lse: NaN everywhere in their storages; the gaps of strided views must stay NaN.
std::pair<Tensor, Tensor> make_outputs(const DecodeAttentionParams& p) {
  const int64_t B = p.batch, hq = p.heads, lv = p.lv();
  const DType qt = p.dtype;
  const bool strided = p.layout == Layout::strided;
  Tensor o, lse;
  if (strided) {
    o = Tensor::empty(qt, {B, hq + 2, lv + 24}).slice(1, 1, 1 + hq).slice(2, 8, 8 + lv);
    lse = Tensor::empty(DType::f32, {B, hq + 5}).slice(1, 2, 2 + hq);
  } else if (p.o_offset_log2 > 0) {
    o = far_last_row(qt, {B, hq, lv}, p.o_offset_log2);
    lse = Tensor::empty(DType::f32, {B, hq});
  } else if (p.q_offset_log2 > 0) {
    // Only the last rows are compared, so o and lse hold those (not far: o_offset_log2's job).
    o = far_last_row(qt, {B, hq, lv}, 16);
    lse = far_last_row(DType::f32, {B, hq}, 16);
  } else if (p.partials_log2 > 0) {
    // o stays contiguous; its host window is the last requests' rows, whose partials lie past
    // 2^partials_log2 (a workspace indexed in 32 bits writes them elsewhere or faults).
    const int64_t row = hq * lv;
    o = Tensor::sparse(qt, {B, hq, lv}, (B - kFarRowsHeld) * row, kFarRowsHeld * row);
    lse = Tensor::empty(DType::f32, {B, hq});
  } else {
    o = Tensor::empty(qt, {B, hq, lv});
    lse = Tensor::empty(DType::f32, {B, hq});
  }
  poison(o);
  poison(lse);
  return {o, lse};
}

class DecodeAttentionOp final : public ContractDependentTypedOp<DecodeAttentionParams> {
 public:
  using P = DecodeAttentionParams;
  std::string name() const override { return "decode_attention"; }
  Fields<P> fields() const override {
    std::vector<std::pair<HeadDims, std::string>> dims;
    for (const auto& d : kHeadDims) dims.emplace_back(d.dims, d.name);
    Fields<P> f;
    f.choice("lk_lv", "d", &P::lk_lv, dims, "QK head dim x V head dim")
        .add("is_mla", "mla", &P::is_mla,
             "V is the first Lv dims of K (same storage); needs Lv < Lk")
        .add("heads", "h", &P::heads, "query heads Hq")
        .add("kv_heads", "hkv", &P::kv_heads,
             "KV heads Hkv (kv_group_num = Hq / Hkv; 1 = MHA kernel)")
        .add("page_size", "p", &P::page_size, "tokens per page; 1 uses a 3-D cache + token table")
        .only({1, 16, 64})
        .add("splits", "sp", &P::splits, "num_kv_splits (may exceed the tokens of a request)")
        .add("logit_cap", "cap", &P::logit_cap, "soft-cap cap * tanh(s / cap); 0 = off")
        .add("dtype", "", &P::dtype, "q and o dtype")
        .only({"bf16", "f16"})
        .choice(
            "kv_dtype", "kv", &P::kv_dtype,
            {{KvDtype::same, "same"}, {KvDtype::e4m3fn, "e4m3fn"}, {KvDtype::e4m3fnuz, "e4m3fnuz"}},
            "cache dtype; fp8 has scales")
        .add("batch", "b", &P::batch,
             "requests; lengths 1, 1, P-1, P, P+1, 2P+1 first, the last max_ctx")
        .add("max_ctx", "ctx", &P::max_ctx, "longest request")
        .choice("layout", "", &P::layout,
                {{Layout::contiguous, "contiguous"},
                 {Layout::strided, "strided"},
                 {Layout::cross_layer, "cross_layer"}},
                "strided: q, o, lse and the page table are padded views; cross_layer: pages of two "
                "layers interleave (page stride 2 P Hkv D') and head rows are padded by 3 elements")
        .add("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default()
        .choice(
            "fp8_codes", "fp8", &P::fp8_codes,
            {{Fp8Codes::ordinary, "ordinary"}, {Fp8Codes::special, "special"}},
            "special: the tokens a request reads hold the saturation codes (+-448 e4m3fn, +-240 "
            "e4m3fnuz) and, in e4m3fn, -0; every slot no request reads holds the format's NaN "
            "codes")
        .out_of_id_at_default()
        .add("offset_log2", "offlog", &P::offset_log2,
             "31 / 32: every page a request reads lies past byte 2^31 / 2^32 of its cache (block "
             "ids "
             "past 2^31 / page bytes). The device holds the whole extent, NaN-poisoned; the host "
             "only "
             "the pages read (a sparse storage, docs/abi.md). contiguous layout only")
        .only({0, 31, 32})
        .out_of_id_at_default()
        .choice("scales", "sc", &P::scales,
                {{Scales::lk, "lk"}, {Scales::sm, "sm"}, {Scales::kscale, "kscale"}},
                "lk: sm_scale 1/sqrt(Lk), fp8 k_scale 1.1 / (max finite / 5); sm: sm_scale "
                "0.75/sqrt(Lk); kscale: fp8 k_scale 0.01 in both formats (v_scale stays 0.9 / "
                "(max finite / 5), k_scale under MLA)")
        .out_of_id_at_default()
        .add("o_offset_log2", "ooff", &P::o_offset_log2,
             "31: o's batch stride puts the last request's row past element 2^31 (byte 2^32); "
             "a sparse storage holds only that row, which alone is compared. contiguous only")
        .only({0, 31})
        .out_of_id_at_default()
        .add("q_offset_log2", "qoff", &P::q_offset_log2,
             "31: q's batch stride puts the last request's row past element 2^31 (byte 2^32); q, "
             "o and lse are sparse storages holding only the last request's rows, which alone are "
             "read on the host and compared (the other q rows are NaN poison). contiguous only")
        .only({0, 31})
        .out_of_id_at_default()
        .add("partials_log2", "plog", &P::partials_log2,
             "31: batch x heads x splits x (Lv + 1) put the split partials of the last requests "
             "(the kernel's fp32 workspace [B, Hq, S, Lv + 1], upstream's attn_logits) past "
             "element 2^31; requests before the last seven are 1 token long, and o holds (and "
             "compares) the last two requests' rows only (a sparse storage). contiguous only")
        .only({0, 31})
        .out_of_id_at_default();
    add_table_step(f, &P::table_step);
    values::add_field(f, &P::values);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.splits < 1 || p.heads < 1 || p.kv_heads < 1 || p.logit_cap < 0 || p.batch < 1)
      return "decode_attention: splits, heads, kv_heads, batch must be >= 1 and logit_cap >= 0";
    if (p.fp8_codes == Fp8Codes::special && !p.fp8())
      return "decode_attention: fp8_codes = special needs an fp8 kv_dtype";
    if (p.offset_log2 != 0 && p.layout != Layout::contiguous)
      return "decode_attention: offset_log2 needs the contiguous layout";
    if (auto why = values::unbuildable(p.values, p.fp8_codes == Fp8Codes::special, p.offset_log2))
      return "decode_attention: " + *why;
    if (p.o_offset_log2 != 0 && (p.layout != Layout::contiguous || p.batch < 2))
      return "decode_attention: o_offset_log2 needs the contiguous layout and batch >= 2";
    if (p.q_offset_log2 != 0 &&
        (p.layout != Layout::contiguous || p.batch < 2 || p.offset_log2 != 0 ||
         p.o_offset_log2 != 0 || p.partials_log2 != 0 || p.values != values::Values::typical ||
         p.fp8_codes != Fp8Codes::ordinary))
      return "decode_attention: q_offset_log2 needs the contiguous layout, batch >= 2, typical "
             "ordinary values and no other large offset";
    if (p.partials_log2 != 0) {
      if (p.layout != Layout::contiguous || p.offset_log2 != 0 || p.o_offset_log2 != 0)
        return "decode_attention: partials_log2 needs the contiguous layout, no offset_log2 and "
               "no o_offset_log2";
      if (p.first_far_request() + kFarRowsHeld > p.batch)
        return "decode_attention: partials_log2 = " + std::to_string(p.partials_log2) +
               " needs the last " + std::to_string(kFarRowsHeld) +
               " requests' partials past it: batch " + std::to_string(p.batch) + " < " +
               std::to_string(p.first_far_request() + kFarRowsHeld) +
               " at heads x splits x (Lv + 1) = " + std::to_string(p.partials_per_request());
    }
    return std::nullopt;
  }

  std::optional<std::string> invalid(const P& p) const override { return refusal(p); }

  // q, the held pages of the caches (a large-offset cache holds those only; cross_layer
  // interleaves two layers of rows D + 3 wide), o and lse with their gaps; every query head reads
  // every token of its request.
  CaseSize size(const P& p) const override {
    const double B = static_cast<double>(p.batch), hq = static_cast<double>(p.heads);
    const double lk = static_cast<double>(p.lk()), lv = static_cast<double>(p.lv());
    const double qs = static_cast<double>(dtype_size(p.dtype));
    const double ks = static_cast<double>(dtype_size(p.cache_dtype()));
    // partials_log2: every request but the last seven is one token long (make()).
    const int64_t long_requests = p.partials_log2 > 0 ? std::min<int64_t>(p.batch, 7) : p.batch;
    const int64_t short_requests = p.batch - long_requests;
    const double rows = (paged_blocks(long_requests, p.max_ctx, p.page_size) +
                         static_cast<double>(short_requests)) *
                        static_cast<double>(p.page_size) * static_cast<double>(p.kv_heads);
    const double layers = p.layout == Layout::cross_layer ? 2 * (lk + 3) / lk : 1;
    CaseSize s;
    s.input_bytes = B * hq * (lk + 48) * qs + rows * (lk + (p.is_mla ? 0 : lv)) * ks * layers +
                    paged_layout_bytes(p.batch, p.max_ctx, p.page_size);
    s.output_bytes = B * (hq + 5) * ((lv + 24) * qs + 4);
    s.work = 2 *
             (static_cast<double>(long_requests) * static_cast<double>(p.max_ctx) +
              static_cast<double>(short_requests)) *
             hq * (lk + lv);
    return s.count("batch", p.batch)
        .count("max_ctx", p.max_ctx)
        .count("heads", p.heads)
        .count("kv_heads", p.kv_heads)
        .count("page_size", p.page_size)
        .count("splits", p.splits);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t lk = p.lk(), lv = p.lv(), hq = p.heads, hkv = p.kv_heads, page_size = p.page_size;
    const int64_t B = p.batch;
    const DType qt = p.dtype, kt = p.cache_dtype();
    const auto u64 = static_cast<uint64_t>(p.seed);
    const bool strided = p.layout == Layout::strided;

    Problem prob;
    // partials_log2: only the last seven requests get the edge lengths and max_ctx.
    const int64_t long_from = p.partials_log2 > 0 ? std::max<int64_t>(0, B - 7) : 0;
    const auto pl = paged_layout(c.id, B, p.max_ctx, page_size, strided, p.seed,
                                 /*min_len=*/1, long_from,  // L = 0 is undefined upstream (0 / 0)
                                 p.table_step);
    // Large offsets: the pages in use are ids [first_page, first_page + num_blocks), the first
    // one starting past byte 2^offset_log2 of the larger cache (K's; V's is no larger).
    int64_t first_page = 0;
    if (p.offset_log2 > 0) {
      const int64_t page_bytes = page_size * hkv * lk * static_cast<int64_t>(dtype_size(kt));
      first_page = (int64_t{1} << p.offset_log2) / page_bytes + 1;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < pl.block_table.size(1); ++j) {
          auto& id = pl.block_table.at<int32_t>({b, j});
          if (id >= 0) id = static_cast<int32_t>(id + first_page);
        }
    }
    const int64_t pages = first_page + pl.num_blocks;

    const Tensor q = make_q(c, p);

    // Caches: every byte random (spare pages and the other layer too), so a read of the wrong
    // page, layer or head shows.
    const double kv_std = p.kv_std();
    auto cache = [&](const char* name, int64_t D) {
      Shape shape = page_size == 1 ? Shape{pages, hkv, D} : Shape{pages, page_size, hkv, D};
      if (first_page > 0) {
        const int64_t per_page = page_size * hkv * D;
        Tensor t = Tensor::sparse(kt, shape, first_page * per_page, pl.num_blocks * per_page);
        fill_normal(t.slice(0, first_page, pages), Rng(c.id, name, u64), 0.0, kv_std);
        return t;
      }
      if (p.layout != Layout::cross_layer) {
        Tensor t = Tensor::empty(kt, shape);
        fill_normal(t, Rng(c.id, name, u64), 0.0, kv_std);
        return t;
      }
      Shape wide = shape;
      wide.back() = D + 3;  // odd: rows lose 16-byte alignment (no vectorized-load assumption)
      wide.insert(wide.begin() + 1, 2);
      Tensor storage = Tensor::empty(kt, wide);
      fill_normal(storage, Rng(c.id, name, u64), 0.0, kv_std);
      return storage.select(1, 1).slice(-1, 0, D);
    };
    const Tensor k = cache("k_buffer", lk);
    const Tensor v = p.is_mla ? k.slice(-1, 0, std::min(lv, lk)) : cache("v_buffer", lv);
    shape_values(p, q.held_rows(), k, v);
    if (p.fp8_codes == Fp8Codes::special) {
      plant_fp8_specials(k, pl, page_size, first_page);
      if (!p.is_mla) plant_fp8_specials(v, pl, page_size, first_page);
    }

    const auto [o, lse] = make_outputs(p);

    prob.args = {{"q", q, Role::input},
                 {"k_buffer", k, Role::input},
                 {"v_buffer", v, Role::input},
                 {"req_to_token", pl.block_table, Role::input},
                 {"b_seq_len", pl.seq_lens, Role::input},
                 {"o", o, Role::output},
                 {"lse", lse, Role::output}};
    int64_t tokens = 0;
    for (int64_t b = 0; b < B; ++b) tokens += pl.seq_lens.at<int32_t>({b});
    const auto kv_row = static_cast<double>(hkv * (lk + (p.is_mla ? 0 : lv)) * dtype_size(kt));
    prob.flops = 2.0 * static_cast<double>(tokens * hq * (lk + lv));
    prob.bytes = static_cast<double>(tokens) * kv_row +
                 static_cast<double>(B * hq * (lk + lv) * dtype_size(qt));
    return prob;
  }

  // Graph replay: captured at half the lengths (min 1: L = 0 is undefined upstream) and another
  // page order, replayed with the case's own, so a bound or a page read on the host at capture
  // is stale.
  std::optional<GraphVariant> graph_variant(const Problem& prob) const override {
    return metadata_variant(prob, {halved("b_seq_len", 1), permuted_block_ids("req_to_token")});
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    nlohmann::json kp = {
        {"num_kv_splits", p.splits}, {"sm_scale", p.sm_scale()},
        {"page_size", p.page_size},  {"logit_cap", static_cast<double>(p.logit_cap)},
        {"k_scale", p.k_scale()},    {"v_scale", p.v_scale()},
        {"is_mla", p.is_mla}};
    if (p.fp8()) kp["fp8_format"] = p.kv_dtype == KvDtype::e4m3fn ? "e4m3fn" : "e4m3fnuz";
    return kp;
  }

  // Invariance (docs/verification.md "Invariance"): the requests in another order, the longest
  // alone, another split count (budgets of that count), the pages shuffled, the same cache at
  // page size 1 (the 3-D cache [pages * P, Hkv, D] and its token table).
  std::vector<Relation> relations(const Problem& prob) const override {
    const P& p = typed(prob);
    const BatchArgs batch{{"req_to_token", "b_seq_len", "q", "o", "lse"}, {}, ""};
    std::vector<Relation> out;
    const int64_t B = request_count(prob, batch);
    if (B > 1) {
      out.push_back(permuted_requests(prob, batch, derangement(B, static_cast<uint64_t>(p.seed))));
      out.push_back(request_alone(prob, batch, longest_request(prob.arg("b_seq_len"))));
    }
    P other = p;
    other.splits = p.splits == 1 ? 3 : 1;
    out.push_back(with_kernel_param(
        prob, "split count " + std::to_string(p.splits) + " -> " + std::to_string(other.splits),
        "num_kv_splits", other.splits, other));
    out.back().bitwise_under = {kSplitInvariant};
    if (auto shuffled = shuffled_pages(prob, {"k_buffer", "v_buffer"}, "req_to_token",
                                       static_cast<uint64_t>(p.seed)))
      out.push_back(std::move(*shuffled));
    if (auto repaged =
            at_page_size_one(prob, {"k_buffer", "v_buffer"}, "req_to_token", p.page_size, false)) {
      P one = p;
      one.page_size = 1;
      repaged->problem.params = one;
      repaged->problem.kernel_params["page_size"] = 1;
      out.push_back(std::move(*repaged));
    }
    return out;
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    auto r = ref::decode_attention(inputs_of(prob, p));
    if (p.q_offset_log2 > 0) return {{"o", r.o}, {"lse", r.lse}};  // the last request's rows
    return {{"o", held_rows_of(r.o, prob.arg("o"))}, {"lse", r.lse}};
  }

  // Error model (docs/ops/decode_attention.md), first order, per (request, head); u = 2^-24:
  //   ds  = gamma_Lk A + 2uA + 12u cap      score: fp32 dot over Lk, two scale products, tanh
  //   e_x = (2A + 4) u                      one exp(s - m): argument rounding + expf (2 ulp)
  //   e_b = ds + e_x + (3L + 2A + 12) u     one split's lse and its merge weight exp(lse_s - n)
  // Relative weight errors e move o by sum_n w_n e_n (v_n - o): (ds + e_x + e_b) W2. Rounding p
  // to the q dtype (grouped kernel only; l sums the unrounded p) moves it by u_p W1', W1' leaving
  // out the top token, whose p = exp(0) = 1 is exact (W1 when a near-tie could swap the top);
  // subnormal p add L h_sub max|v| (l >= 1). fp32 sums over L and S: (2L + 2S + 16) u W1.
  // Contracts (docs/verification.md "Arithmetic contracts"), u_in = u(q dtype):
  //   qk-products-in-input-type: each product q_i k_ni rounded to u_in first, so ds gains
  //     u_in A and the fp32 dot sums products up to (1 + u_in) times larger: gamma_Lk (1 + u_in) A;
  //     weight errors of that size need the exact factor expm1(2d) instead of 2d: the remainder
  //     (expm1(ds + e_x + e_b) - (ds + e_x + e_b)) W2 joins the o term;
  //   p-in-input-type: u_p = u_in in the MHA kernel too (the grouped kernel's model has it).
  std::vector<OutputCheck> contract_checks(const Problem& prob, const P& p, const TensorMap&,
                                           const Contract& contract) const override {
    return budgets(prob, p, contract);
  }

 private:
  static std::vector<OutputCheck> budgets(const Problem& prob, const P& p,
                                          const Contract& contract) {
    const auto in = inputs_of(prob, p);
    const auto t = ref::decode_error_terms(in);
    const DType qt = p.dtype;
    const int64_t lk = p.lk(), hq = p.heads, hkv = p.kv_heads;
    const auto S = static_cast<double>(p.splits);
    const double u = unit_roundoff(DType::f32);
    // The MHA kernel keeps p in fp32 unless its contract rounds it.
    const double up = hq / hkv > 1 ? unit_roundoff(qt) : probability_rounding(contract, qt);
    const double gamma_lk = gamma_n(lk, u);  // T3: worst case for head-dim sums
    const double growth = qk_rounded_products_growth(contract, qt);
    const bool contracted = !contract.is_default();
    double worst_o = 0, worst_lse = 0, worst_a = 0, worst_w1 = 0, worst_w2 = 0;
    double worst_product_term = 0, worst_remainder_term = 0;
    for (int64_t b = 0; b < in.q.size(0); ++b) {
      const auto L = static_cast<double>(in.seq_lens.at<int32_t>({b}));
      for (int64_t h = 0; h < hq; ++h) {
        const double A = t.score_abs.get({b, h}), W1 = t.weighted_abs_v.get({b, h});
        const double W2 = t.weighted_spread.get({b, h});
        const double product_term = qk_product_rounding_error(contract, qt, A);
        const double ds = gamma_lk * growth * A + product_term + 2 * u * A + 12 * u * in.logit_cap;
        const double ex = (2 * A + 4) * u;
        const double eb = ds + ex + (3 * L + 2 * A + 12) * u;
        const double w1_cast =
            t.score_gap.get({b, h}) > 2 * ds ? t.weighted_abs_v_rest.get({b, h}) : W1;
        const double sub = up > 0 ? L * subnormal_half_spacing(qt) * t.v_abs_max.get({b, h}) : 0;
        const double remainder =
            contracted ? softmax_weight_remainder((ds + ex + eb) / 2) * W2 : 0.0;
        const double e =
            up * w1_cast + (ds + ex + eb) * W2 + (2 * L + 2 * S + 16) * u * W1 + sub + remainder;
        worst_o = std::max(worst_o, e);
        worst_lse = std::max(worst_lse, ds + ex + eb + (L + 2 * S + 8) * u);
        worst_a = std::max(worst_a, A);
        worst_w1 = std::max(worst_w1, W1);
        worst_w2 = std::max(worst_w2, W2);
        worst_product_term = std::max(worst_product_term, product_term);
        worst_remainder_term = std::max(worst_remainder_term, remainder);
      }
    }
    const std::string data = "max A = sum|q k| sm_scale k_scale " + format_number(worst_a) +
                             ", W1 = sum w|v| " + format_number(worst_w1) + ", W2 = sum w|v - o| " +
                             format_number(worst_w2);
    // The contract's terms, named in both budgets' why (the remainder applies to o only).
    std::string score_terms, o_terms;
    if (contracted) {
      const std::string in_name(dtype_name(qt));
      const std::string u_in = "u(" + in_name + ") " + format_number(unit_roundoff(qt));
      score_terms = "; contract " + contract.name() + ":";
      if (contract.qk_products_in_input_type)
        score_terms += " each q.k product rounded to " + in_name + ", score error + " + u_in +
                       " A (max " + format_number(worst_product_term) +
                       ") and the fp32 dot over products up to (1 + u_in) A;";
      if (contract.p_in_input_type)
        score_terms += hq / hkv > 1
                           ? " p rounded to " + in_name + ": in the grouped kernel's model;"
                           : " p rounded to " + in_name + ": u_p = " + u_in + ";";
      o_terms = score_terms + " softmax weights to second order, (expm1(2d) - 2d) W2 (max " +
                format_number(worst_remainder_term) + ")";
      score_terms.pop_back();  // the lse budget ends with the score terms: no trailing ';'
    }
    const Budget o =
        BudgetBuilder("o")
            .output_rounding(qt)
            .absolute((1 + unit_roundoff(qt)) * worst_o,
                      "max over rows of u_p " + format_number(up) +
                          " W1' (p cast) + (score, exp, merge error) W2 + fp32 sums over L, S "
                          "+ subnormal p; " +
                          data + o_terms)
            .build();
    const Budget l = BudgetBuilder("lse")
                         .relative((S + 2) * u, "fp32 merge steps and store")
                         .absolute(worst_lse, "score, exp and merge errors; " + data + score_terms)
                         .build();
    return {{"o", o, {}, {}}, {"lse", l, {}, {}}};
  }
};

const OpRegistrar kRegister(std::make_unique<DecodeAttentionOp>());

}  // namespace
}  // namespace attncheck
