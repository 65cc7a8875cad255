// What the two MLA op families (mla_decode, sparse_mla) share: their parameters' base struct and
// axes, the inputs their make() builds alike, layouts and budgets.
//
// What the generated data is built to expose:
//   - cache slots no query may read (blocks nobody owns, tails of last blocks) hold NaN: a kernel
//     that reads one, even behind a zero softmax weight, produces NaN;
//   - q, out and lse live in larger storages (an extra token row, gaps between heads, odd element
//     offsets, head-major layouts): writes outside the views and stride mistakes show up;
//   - outputs start as NaN everywhere (poison), so unwritten rows fail.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "core/policy.h"
#include "core/rng.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "ops/values.h"
#include "reference/mla_decode.h"

namespace attncheck::mla {

inline const std::vector<nlohmann::json> kHeadValues = {1,  2,   4, 8, 16, 32, 48,
                                                        64, 128, 3, 5, 12, 24, 40};

enum class KvDtype { same_as_query, e4m3fn, e4m3fnuz };  // axis kv_dtype: "auto", fp8 formats
enum class Layout { contiguous, strided, transposed };
enum class Dims { d576x512, d96x64 };  // Lk x Lv: DeepSeek's latent + rope, and a small one
enum class Scale { lk, yarn };
enum class Fp8Codes { ordinary, special };

// A per-tensor fp8 dequantization scale that is not a power of two (so a kernel that drops or
// doubles it is caught) and is exactly an fp32 number (the kernel's copy of it is exact). Cache
// codes reach `code_max` (4 ordinarily; the format's max finite with special codes, so the
// saturation code is no outlier): the scaled values stay below 0.76 either way.
inline double fp8_kv_scale(int64_t seed, double code_max = 4.0) {
  const double s = (0.19 + 0.013 * static_cast<double>(seed % 7)) * 4.0 / code_max;
  return static_cast<double>(static_cast<float>(s));
}

// The axes both MLA ops have (the P base of mla_decode and sparse_mla). Defaults are
// mla_decode's; sparse_mla's parameters change two of them.
struct CommonParams {
  int64_t heads = 16;
  int64_t block_size = 16;
  int64_t qlen = 1;
  DType dtype = DType::bf16;
  KvDtype kv_dtype = KvDtype::same_as_query;
  int64_t batch = 3;
  int64_t ctx = 65;
  Layout layout = Layout::contiguous;
  Dims dims = Dims::d576x512;
  Scale scale = Scale::lk;
  int64_t seed = 0;
  Fp8Codes fp8_codes = Fp8Codes::ordinary;
  int64_t offset_log2 = 0;
  values::Values values = values::Values::typical;
  int64_t table_step = 1;    // ops/paged.h
  bool pad_strides = false;  // ops/storage_offset.h: kv_cache only, which the ABI refuses

  int64_t lk() const { return dims == Dims::d576x512 ? 576 : 96; }
  int64_t lv() const { return dims == Dims::d576x512 ? 512 : 64; }
  bool special_codes() const { return fp8_codes == Fp8Codes::special; }
  // kv_dtype "auto" = the query dtype (vLLM's cache dtype "auto"), else an fp8 format.
  DType cache_dtype() const {
    return kv_dtype == KvDtype::same_as_query ? dtype
           : kv_dtype == KvDtype::e4m3fn      ? DType::e4m3fn
                                              : DType::e4m3fnuz;
  }
  // "lk": 1/sqrt(Lk), what aiter's and vLLM's tests use. "yarn": DeepSeek-V3's production scale,
  // qk_head_dim^-0.5 * mscale^2 with qk_head_dim = 192 and mscale = 0.1 ln(40) + 1 (factor 40,
  // mscale_all_dim 1). The kernel receives the scale as a parameter and must not recompute it.
  double softmax_scale() const {
    if (scale == Scale::lk) return 1.0 / std::sqrt(static_cast<double>(lk()));
    const double mscale = 0.1 * std::log(40.0) + 1.0;
    return mscale * mscale / std::sqrt(192.0);
  }
  // The cache's dequantization scale: 1 for 16-bit caches.
  double kv_scale() const {
    const DType kv = cache_dtype();
    if (!is_fp8(kv)) return 1.0;
    return fp8_kv_scale(seed, special_codes() ? max_finite(kv) : 4.0);
  }
};

// What the two ops' shared axes say differently: their help, and the qlen values they serve.
struct AxisTexts {
  std::string block_size, qlen, batch, layout, dims, scale, fp8_codes, offset_log2;
  std::vector<nlohmann::json> qlen_values;
};

// The shared axes before the op's own (heads .. ctx), in case-id order. P derives from
// CommonParams (the members are CommonParams', hence the explicit member types).
template <class P>
void add_shape_fields(Fields<P>& f, const AxisTexts& t) {
  f.template add<int64_t>("heads", "h", &P::heads,
                          "query heads; 3, 5, 12, 24, 40 break the 16-head rule and must be "
                          "refused")
      .only(kHeadValues)
      .template add<int64_t>("block_size", "bs", &P::block_size, t.block_size)
      .only({1, 16, 64})
      .template add<int64_t>("qlen", "q", &P::qlen, t.qlen)
      .only(t.qlen_values)
      .template add<DType>("dtype", "", &P::dtype, "query and output dtype")
      .only({"bf16", "f16"})
      .template choice<KvDtype>("kv_dtype", "kv", &P::kv_dtype,
                                {{KvDtype::same_as_query, "auto"},
                                 {KvDtype::e4m3fn, "e4m3fn"},
                                 {KvDtype::e4m3fnuz, "e4m3fnuz"}},
                                "cache dtype (auto = dtype)")
      .template add<int64_t>("batch", "b", &P::batch, t.batch)
      .template add<int64_t>("ctx", "ctx", &P::ctx,
                             "longest kv length; others ragged with block-edge lengths");
}

// The shared axes after the op's own (layout .. offset_log2).
template <class P>
void add_input_fields(Fields<P>& f, const AxisTexts& t) {
  f.template choice<Layout>("layout", "", &P::layout,
                            {{Layout::contiguous, "contiguous"},
                             {Layout::strided, "strided"},
                             {Layout::transposed, "transposed"}},
                            t.layout)
      .template choice<Dims>("dims", "d", &P::dims,
                             {{Dims::d576x512, "576x512"}, {Dims::d96x64, "96x64"}}, t.dims)
      .template choice<Scale>("scale", "sc", &P::scale, {{Scale::lk, "lk"}, {Scale::yarn, "yarn"}},
                              t.scale)
      .template add<int64_t>("seed", "s", &P::seed, "input seed")
      .template choice<Fp8Codes>("fp8_codes", "fp8", &P::fp8_codes,
                                 {{Fp8Codes::ordinary, "ordinary"}, {Fp8Codes::special, "special"}},
                                 t.fp8_codes)
      .out_of_id_at_default()
      .template add<int64_t>("offset_log2", "offlog", &P::offset_log2, t.offset_log2)
      .only({0, 31, 32})
      .out_of_id_at_default();
  add_table_step(f, &P::table_step);
  f.template add<bool>("pad_strides", "pstr", &P::pad_strides,
                       "true: kv_cache's block stride 16 bytes longer; the ABI requires it "
                       "contiguous, so the kernel must refuse")
      .out_of_id_at_default();
  values::add_field<P>(f, &P::values);
}

// A case file's error shared by both ops (special codes are fp8 codes).
inline std::optional<std::string> unbuildable(const CommonParams& p) {
  if (p.special_codes() && !is_fp8(p.cache_dtype()))
    return "fp8_codes = special needs an fp8 kv_dtype";
  if (p.pad_strides && p.offset_log2 != 0)
    return "pad_strides needs offset_log2 = 0 (a sparse cache is not padded)";
  return values::unbuildable(p.values, p.special_codes(), p.offset_log2);
}

// Both ops' refusal: aiter's 16-head rule.
inline std::optional<std::string> invalid(const CommonParams& p) {
  if (!ref::mla_num_heads_valid(p.heads)) return ref::mla_num_heads_message(p.heads);
  if (p.pad_strides)
    return "kv_cache must be contiguous in its last three dims ([num_blocks, P, Lk]: all of "
           "them); its block stride is 16 bytes longer";
  return std::nullopt;
}

// The kernel parameters both ops pass (mla_decode adds max_seqlen_q).
inline nlohmann::json common_kernel_params(const CommonParams& p) {
  nlohmann::json kp = {{"scale", p.softmax_scale()},
                       {"kv_scale", p.kv_scale()},
                       {"kernel_block_size", p.block_size},
                       {"lv", p.lv()}};
  if (is_fp8(p.cache_dtype()))
    kp["fp8_format"] = p.kv_dtype == KvDtype::e4m3fn ? "e4m3fn" : "e4m3fnuz";
  return kp;
}

// The latent cache [first_block + num_blocks, P, Lk]: uniform values in [-1, 1] (bf16/f16) or fp8
// codes of magnitude <= 4 in blocks [first_block, first_block + num_blocks); every slot not flagged
// in `readable` (indexed from first_block's slot 0) holds NaN. first_block > 0 (large offsets): a
// sparse storage whose host window is those blocks (the device poisons the rest).
// special_codes (fp8 only, docs/formats.md): codes span the format; the readable slots carry the
// saturation codes and -0 (fp8_special_code, element k = slot + d), the others NaN codes.
inline Tensor make_cache(const std::string& case_id, DType dtype, int64_t num_blocks, int64_t P,
                         int64_t lk, const std::vector<bool>& readable, int64_t seed,
                         int64_t first_block = 0, bool special_codes = false) {
  const int64_t total = first_block + num_blocks, per_block = P * lk;
  Tensor cache = first_block > 0 ? Tensor::sparse(dtype, {total, P, lk}, first_block * per_block,
                                                  num_blocks * per_block)
                                 : Tensor::empty(dtype, {total, P, lk});
  const Tensor held = cache.slice(0, first_block, total);
  const Rng rng(case_id, "kv_cache", static_cast<uint64_t>(seed));
  if (is_fp8(dtype))
    fill_fp8_codes(held, rng, special_codes ? max_finite(dtype) : 4.0);
  else
    fill_uniform(held, rng, -1.0, 1.0);
  const uint64_t nan = nan_bits(dtype);
  for (int64_t s = 0; s < num_blocks * P; ++s) {
    const bool read = readable[static_cast<size_t>(s)];
    if (read && !special_codes) continue;
    for (int64_t d = 0; d < lk; ++d) {
      const Index at = {s / P, s % P, d};
      if (!read) {
        held.set_bits(at, special_codes ? fp8_nan_code(s + d, dtype) : nan);
      } else if (const auto code = fp8_special_code(s + d, dtype)) {
        held.set_bits(at, *code);
      }
    }
  }
  return cache;
}

// A [T, N, L] view for a layout, over a NaN-filled storage that is larger than the view:
//   contiguous: [T + 1, N, L] storage, the view is its first T rows;
//   strided:    head stride L + 40, token stride N (L + 40) + 24, element offset 3 (not aligned);
//   transposed: head-major [N, T + 1, L] storage, permuted to [T, N, L].
inline Tensor make_token_head_view(Layout layout, DType dtype, int64_t T, int64_t N, int64_t L) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (layout) {
    case Layout::contiguous:
      return Tensor::full(dtype, {T + 1, N, L}, nan).slice(0, 0, T);
    case Layout::strided: {
      const int64_t hs = L + 40, ts = N * hs + 24;
      return Tensor::full(dtype, {T * ts + 3 + 64}, nan).as_strided({T, N, L}, {ts, hs, 1}, 3);
    }
    case Layout::transposed:
      break;
  }
  return Tensor::full(dtype, {N, T + 1, L}, nan).slice(1, 0, T).permute({1, 0, 2});
}

// lse [T, N] f32 for a layout (same ideas: spare row, wider rows, head-major).
inline Tensor make_lse_view(Layout layout, int64_t T, int64_t N) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (layout) {
    case Layout::contiguous:
      return Tensor::full(DType::f32, {T + 1, N}, nan).slice(0, 0, T);
    case Layout::strided:
      return Tensor::full(DType::f32, {T, N + 3}, nan).slice(1, 0, N);
    case Layout::transposed:
      break;
  }
  return Tensor::full(DType::f32, {N, T + 1}, nan).slice(1, 0, T).permute({1, 0});
}

// Queries: N(0, 3^2) in the query dtype. With cache values in [-1, 1] and scale 1/sqrt(Lk) the
// scores have a standard deviation near 1.7 (a softmax neither flat nor one-hot); the "yarn"
// scale makes them about 3x sharper.
inline Tensor make_query(const std::string& case_id, Layout layout, DType dtype, int64_t T,
                         int64_t N, int64_t lk, int64_t seed) {
  Tensor q = make_token_head_view(layout, dtype, T, N, lk);
  fill_normal(q, Rng(case_id, "q", static_cast<uint64_t>(seed)), 0.0, 3.0);
  return q;
}

// What both ops' make() build alike: the paged layout (block ids moved past 2^offset_log2 bytes),
// the cache whose slots outside every request's context are NaN (or NaN codes), the queries and
// the poisoned out / lse views.
struct Inputs {
  PagedLayout pages;
  Tensor cache, q, out, lse;
  int64_t tokens = 0;  // T = batch * qlen query rows
};

// What make_inputs holds (CaseSize, ops/op.h; the op adds its own arguments and its work): q,
// the held blocks of the cache (with the readable flags), out and lse, with the gaps of their
// layouts.
inline CaseSize common_size(const CommonParams& p) {
  const double T = static_cast<double>(p.batch * p.qlen), N = static_cast<double>(p.heads);
  const double lk = static_cast<double>(p.lk()), lv = static_cast<double>(p.lv());
  const double qs = static_cast<double>(dtype_size(p.dtype));
  const double slots =
      paged_blocks(p.batch, p.ctx, p.block_size) * static_cast<double>(p.block_size);
  CaseSize s;
  s.input_bytes = ((T + 1) * N * lk + 128) * qs +
                  slots * (lk * static_cast<double>(dtype_size(p.cache_dtype())) + 1) +
                  paged_layout_bytes(p.batch, p.ctx, p.block_size) + 4 * (T + 2);
  s.output_bytes = ((T + 1) * N * lv + 128) * qs + 4 * (T + 1) * (N + 3);
  return s.count("batch", p.batch)
      .count("ctx", p.ctx)
      .count("heads", p.heads)
      .count("qlen", p.qlen)
      .count("block_size", p.block_size);
}

inline Inputs make_inputs(const std::string& case_id, const CommonParams& p) {
  const int64_t P = p.block_size, lk = p.lk();
  const DType kvd = p.cache_dtype();
  Inputs in;
  in.pages = paged_layout(case_id, p.batch, p.ctx, P, p.layout == Layout::strided, p.seed, p.qlen,
                          /*long_from=*/0, p.table_step);
  in.tokens = p.batch * p.qlen;
  const PagedLayout& pl = in.pages;
  std::vector<bool> readable(static_cast<size_t>(pl.num_blocks * P), false);
  for (int64_t r = 0; r < p.batch; ++r)
    for (int64_t t = 0; t < pl.seq_lens.at<int32_t>({r}); ++t)
      readable[static_cast<size_t>(pl.block_table.at<int32_t>({r, t / P}) * P + t % P)] = true;
  const int64_t first =
      first_block_past(p.offset_log2, P * lk * static_cast<int64_t>(dtype_size(kvd)));
  shift_block_ids(pl, first);
  in.cache =
      make_cache(case_id, kvd, pl.num_blocks, P, lk, readable, p.seed, first, p.special_codes());
  in.q = make_query(case_id, p.layout, p.dtype, in.tokens, p.heads, lk, p.seed);
  // values (harness/ops/values.h): q N(0, 3^2), cache U(-1, 1) or fp8 codes up to 4 (times
  // kv_scale). V is the cache's first Lv dims, so ties share only the rope dims past Lv.
  values::Magnitudes m;
  m.scale = p.softmax_scale() * p.kv_scale();
  m.q = 3.0;
  m.k = is_fp8(kvd) ? 2.0 : 0.5;
  m.tie_from = p.lv();
  const Tensor held = in.cache.slice(0, first, first + pl.num_blocks);
  values::shape_queries(p.values, in.q, held, m);
  values::shape_keys(p.values, held, m);
  in.out = make_token_head_view(p.layout, p.dtype, in.tokens, p.heads, p.lv());
  in.lse = make_lse_view(p.layout, in.tokens, p.heads);
  return in;
}

// Comparison budgets, derived in docs/ops/mla_decode.md. Kernel model: scores accumulated in fp32
// from exact products of the 16-bit inputs (fp8 rows decode exactly into them); online softmax in
// fp32; probabilities rounded to the query dtype before P.V; P.V, row sums and the split-KV LSE
// merge in fp32; output rounded once to the output dtype.
//   u_in, u_out: unit roundoff of the query and output dtypes; u_acc = 2^-23 (one fp32 ulp, so
//   truncating MMA adders are covered); lambda = 6 (probabilistic bound for fp32 sums,
//   Higham & Mary 2019: |error| <= lambda sqrt(n) u sum|x_i|).
//   sigma   = scale * max||q|| * max||kv_scale c||     (>= scale * sum_d |q_d c_d| of any score)
//   eps_s   = (lambda sqrt(Lk) + 2) u_acc sigma         (absolute score error)
//   eps_sum = (lambda sqrt(n_keys) + 4) u_acc           (relative error of row sums, P.V, merge)
//   out: rtol = u_out; atol = (1 + u_out) max|v| (u_in + 2 eps_s + 2 eps_sum)
//        (a score error e moves softmax weights by at most a factor exp(+-2e); rounding p to u_in
//        moves sum_t p_t v_t by at most u_in sum_t p_t |v_t| <= u_in max|v|)
//        calc_diff <= 1e-5 (u_out / 2^-8)^2: aiter's bf16 threshold, scaled for f16 by u^2.
//   lse: atol = eps_s + eps_sum, rtol = 2 u_acc.
// Contracts (docs/verification.md "Arithmetic contracts"):
//   qk-products-in-input-type: each product q_d c_d rounded to u_in before the fp32 sum adds
//     u_in A to eps_s, A = max over scores of scale * sum_d |q_d kv_scale c_d| (computed, not the
//     sigma bound), and the fp32 sum runs over products up to (1 + u_in) larger: sigma (1 + u_in);
//     weight factors exp(+-2 eps_s) are then taken exactly: out adds max|v| (expm1(2 eps_s) -
//     2 eps_s); calc_diff, which grows with the square of the error, is multiplied by the square
//     of the contract's atol over the default's;
//   p-in-input-type: already this model's (P cast to the query dtype); no term changes.
inline std::vector<OutputCheck> budgets(const ref::MlaInputScales& s, DType q_dtype,
                                        DType out_dtype, int64_t lk, double scale,
                                        const Contract& contract = {}, double abs_score_max = 0) {
  const double u_in = unit_roundoff(q_dtype), u_out = unit_roundoff(out_dtype);
  const double u_acc = std::ldexp(1.0, -23), lambda = 6.0;
  const double sigma = scale * s.q_norm_max * s.kv_norm_max;
  const double product_term = qk_product_rounding_error(contract, q_dtype, abs_score_max);
  const double eps_s = (lambda * std::sqrt(static_cast<double>(lk)) + 2.0) * u_acc * sigma *
                           qk_rounded_products_growth(contract, q_dtype) +
                       product_term;
  const double eps_sum =
      (lambda * std::sqrt(static_cast<double>(std::max<int64_t>(s.keys_max, 1))) + 4.0) * u_acc;
  const double remainder = contract.is_default() ? 0.0 : softmax_weight_remainder(eps_s);
  Budget out;
  out.rtol = u_out;
  out.atol = (1.0 + u_out) * s.v_abs_max * (u_in + 2.0 * eps_s + 2.0 * eps_sum + remainder);
  out.max_calc_diff = 1e-5 * std::pow(u_out / std::ldexp(1.0, -8), 2.0);
  // calc_diff grows with the square of the error (the u_out^2 scaling above): under a contract,
  // by the square of its atol over the default's.
  double calc_diff_growth = 1.0;
  if (!contract.is_default()) {
    const double eps_s_default =
        (lambda * std::sqrt(static_cast<double>(lk)) + 2.0) * u_acc * sigma;
    const double atol_default =
        (1.0 + u_out) * s.v_abs_max * (u_in + 2.0 * eps_s_default + 2.0 * eps_sum);
    if (atol_default > 0) calc_diff_growth = std::pow(out.atol / atol_default, 2.0);
    out.max_calc_diff *= calc_diff_growth;
  }
  char why[640];
  std::snprintf(why, sizeof why,
                "rtol = u_out (%s output rounding) = %.3g; atol = max|v| %.3g x (u_in %.3g "
                "[P cast to %s] + 2 eps_s %.3g [fp32 scores over Lk=%lld, sigma %.3g] + 2 eps_sum "
                "%.3g [fp32 sums over %lld keys]); calc_diff <= %.3g (aiter bf16 1e-5 scaled by "
                "u_out^2)",
                std::string(dtype_name(out_dtype)).c_str(), u_out, s.v_abs_max, u_in,
                std::string(dtype_name(q_dtype)).c_str(), eps_s, static_cast<long long>(lk), sigma,
                eps_sum, static_cast<long long>(s.keys_max), out.max_calc_diff);
  out.why = why;
  // The contract's terms, in both budgets' why (the remainder applies to out only).
  std::string score_terms;
  if (!contract.is_default()) {
    const std::string in_name(dtype_name(q_dtype));
    score_terms = "; contract " + contract.name() + ":";
    if (contract.qk_products_in_input_type)
      score_terms += " each q.c product rounded to " + in_name +
                     ", eps_s includes u_in A = " + format_number(product_term) +
                     " (A = max scale sum|q kv_scale c| " + format_number(abs_score_max) +
                     ") and sigma (1 + u_in);";
    if (contract.p_in_input_type) score_terms += " p rounded to " + in_name + ": in this model;";
    out.why += score_terms +
               " softmax weights to second order, max|v| (expm1(2 eps_s) - 2 eps_s) " +
               format_number(s.v_abs_max * remainder) +
               "; calc_diff x (atol / default atol)^2 = x" + format_number(calc_diff_growth);
  }
  Budget lse;
  lse.atol = eps_s + eps_sum;
  lse.rtol = 2.0 * u_acc;
  std::snprintf(why, sizeof why,
                "natural log; atol = eps_s %.3g (fp32 scores, sigma %.3g) + eps_sum %.3g (fp32 row "
                "sum over %lld keys); rtol = 2 u_fp32; -inf (no key) must match exactly",
                eps_s, sigma, eps_sum, static_cast<long long>(s.keys_max));
  lse.why = why + score_terms;
  return {{"out", out, {}, {}}, {"lse", lse, {}, {}}};
}

// Outputs in the output dtype's subnormal range (tiny inputs, tiny FP4 scales) round with an
// absolute error of up to delta = half its smallest subnormal, which rtol = u_out (normal numbers
// only) does not cover: atol gains delta, and calc_diff = ||a - e||^2 / (||a||^2 + ||e||^2) <=
// (sqrt(c) + sqrt(n delta^2 / ||e||^2))^2 for the old bound c. Negligible for ordinary
// magnitudes (delta is 2^-25 in f16, 2^-134 in bf16).
inline void widen_for_output_underflow(Budget& b, const Tensor& expected_out, DType out_dtype) {
  const double delta = subnormal_half_spacing(out_dtype);
  double energy = 0;
  for (const double v : expected_out.to_vector()) energy += v * v;
  b.atol += delta;
  b.why += "; output underflow: atol + " + format_number(delta) + " (half the smallest subnormal)";
  if (energy <= 0 || b.max_calc_diff < 0) return;
  const double extra = static_cast<double>(expected_out.numel()) * delta * delta / energy;
  b.max_calc_diff = std::pow(std::sqrt(b.max_calc_diff) + std::sqrt(extra), 2.0);
  b.why += ", calc_diff bound widened by n delta^2 / ||e||^2 = " + format_number(extra);
}

// The cache slots each query row reads: row t reads slots[begin[t], end[t]).
struct RowSlots {
  std::vector<int64_t> slots;
  std::vector<int64_t> begin, end;
};

// A = max over query rows t, heads h and the slots row t reads of
// scale * sum_d |q[t,h,d] kv_scale c[slot,d]|: the largest sum of |products| behind any score.
inline double max_abs_score_products(const Problem& p, const CommonParams& prm,
                                     const RowSlots& rows) {
  const Tensor& q = p.arg("q");
  const int64_t T = q.size(0), N = q.size(1), lk = q.size(2);
  std::vector<int64_t> distinct = rows.slots;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const std::vector<double> c =
      ref::gather_latent_rows({p.arg("kv_cache"), prm.kv_scale()}, distinct).to_vector();
  const std::vector<double> qv = q.to_vector();
  const double scale = std::fabs(prm.softmax_scale());
  double best = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = rows.begin[static_cast<size_t>(t)]; i < rows.end[static_cast<size_t>(t)];
         ++i) {
      const auto r =
          std::lower_bound(distinct.begin(), distinct.end(), rows.slots[static_cast<size_t>(i)]) -
          distinct.begin();
      const double* crow = c.data() + r * lk;
      for (int64_t h = 0; h < N; ++h) {
        const double* qrow = qv.data() + (t * N + h) * lk;
        double sum = 0;
        for (int64_t d = 0; d < lk; ++d) sum += std::fabs(qrow[d] * crow[d]);
        best = std::max(best, sum);
      }
    }
  return scale * best;
}

// The checks of an MLA problem (mla_decode or sparse_mla) under `contract`: budgets from the
// inputs it reads, i.e. the cache slots of every query row and the longest key list of any row.
inline std::vector<OutputCheck> problem_checks(const Problem& p, const CommonParams& prm,
                                               const RowSlots& rows, int64_t keys_max,
                                               const Contract& contract = {}) {
  const Tensor& q = p.arg("q");
  const auto s =
      ref::mla_input_scales(q, {p.arg("kv_cache"), prm.kv_scale()}, rows.slots, prm.lv(), keys_max);
  const double abs_score_max =
      contract.qk_products_in_input_type ? max_abs_score_products(p, prm, rows) : 0.0;
  return budgets(s, q.dtype(), p.arg("out").dtype(), q.size(2), prm.softmax_scale(), contract,
                 abs_score_max);
}

// Invariance (docs/verification.md "Invariance"): the same logical cache at block size 1
// (ops/relation.h at_page_size_one): [nb, P, Lk] viewed as [nb * P, 1, Lk], the kernel's block
// size 1, the block table expanded.
template <class P>
std::optional<Relation> at_block_size_one(const Problem& prob, const P& p) {
  auto rel = at_page_size_one(prob, {"kv_cache"}, "block_table", p.block_size, true);
  if (!rel) return std::nullopt;
  P one = p;
  one.block_size = 1;
  rel->problem.params = one;
  rel->problem.kernel_params["kernel_block_size"] = 1;
  rel->name = "the same cache at block size 1 (" + std::to_string(p.block_size) +
              " tokens per block -> 1, block_table expanded)";
  return rel;
}

}  // namespace attncheck::mla
