// What the indexer ops (harness/ops/indexer*.cpp) share: their parameter structs and fields, the
// make() preambles of the paged readers and the prefill windows, and the input generators
// (quantizer-edge bf16 rows, paged fp8 caches written through the reference writer, logits
// budgets).
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/compare.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "reference/indexer.h"

namespace attncheck::indexer_ops {

namespace ix = ref::indexer;

// ---- parameters ----
enum class QuantMax { vllm, aiter };
enum class Table { contiguous, strided };
enum class Fp8Codes { ordinary, special };
enum class Mask { causal, random };
enum class TopkData { random, ties };

// Each op's P derives from the bases whose fields it has; a P whose default differs from the
// base's sets it in its constructor.
struct SeedParams {
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  bool pad_strides = false;     // ops/storage_offset.h
  bool compact = false;         // ops/storage_offset.h
  bool far_rows = false;        // ops/storage_offset.h
};
struct Fp8Params : SeedParams {
  DType fp8 = DType::e4m3fn;
};
// The quantizers (indexer_k_cache, indexer_q_quant).
struct QuantParams : Fp8Params {
  QuantMax quant_max = QuantMax::vllm;
};
// The paged cache readers (indexer_gather, indexer_logits_decode).
struct PagedReadParams : Fp8Params {
  int64_t block_size = 64;
  int64_t batch = 4;
  int64_t max_ctx = 300;
  int64_t pad = 0;
  Table table = Table::contiguous;
  Fp8Codes fp8_codes = Fp8Codes::ordinary;
  int64_t offset_log2 = 0;
  int64_t table_step = 1;  // ops/paged.h
};
// Prefill chunks (indexer_logits_prefill, indexer_topk_prefill).
struct WindowParams {
  int64_t batch = 2;
  int64_t max_ctx = 160;
  int64_t qlen = 24;
  Mask mask = Mask::causal;
};

// `&P::m` of a member P inherits is a `T Base::*`; Fields<P> takes a `T P::*`.
template <class P, class T, class Base>
T P::*member(T Base::*m) {
  return m;
}

// The fp8 formats by their names in case files and in the kernel's "fp8_format".
const std::vector<std::pair<DType, std::string>>& fp8_formats();
std::string fp8_format_name(DType fp8);
float quant_max_of(DType fp8, QuantMax variant);

// Fields more than one op has, with their help text where every op words it the same.
template <class P>
void add_fp8(Fields<P>& f) {
  f.choice("fp8", "", member<P>(&P::fp8), fp8_formats(), "fp8 format of q and the K cache");
}
template <class P>
void add_quant_max(Fields<P>& f) {
  f.choice("quant_max", "m", member<P>(&P::quant_max),
           {{QuantMax::vllm, "vllm"}, {QuantMax::aiter, "aiter"}},
           "amax divisor on e4m3fnuz: vllm 224, aiter 240 (e4m3fn: 448 either way)");
}
template <class P>
void add_seed(Fields<P>& f) {
  f.add("seed", "s", member<P>(&P::seed), "input seed");
  add_storage_offset(f, member<P>(&P::storage_offset));
  add_pad_strides(f, member<P>(&P::pad_strides));
  add_compact(f, member<P>(&P::compact));
  add_far_rows(f, member<P>(&P::far_rows));
}
// The help texts of fields every op that has them words its own way.
struct LayoutHelp {
  std::string block_size, batch, max_ctx;
};
struct WindowHelp {
  std::string batch, max_ctx, qlen, mask;
};
// The prefill ops' windows: batch, max_ctx, qlen, mask.
template <class P>
void add_windows(Fields<P>& f, WindowHelp help) {
  f.add("batch", "b", member<P>(&P::batch), std::move(help.batch))
      .add("max_ctx", "ctx", member<P>(&P::max_ctx), std::move(help.max_ctx))
      .add("qlen", "q", member<P>(&P::qlen), std::move(help.qlen))
      .choice("mask", "", member<P>(&P::mask), {{Mask::causal, "causal"}, {Mask::random, "random"}},
              std::move(help.mask));
}
// The paged readers' layout: block_size, batch, max_ctx.
template <class P>
void add_paged_layout(Fields<P>& f, LayoutHelp help) {
  f.add("block_size", "bs", member<P>(&P::block_size), std::move(help.block_size))
      .add("batch", "b", member<P>(&P::batch), std::move(help.batch))
      .add("max_ctx", "ctx", member<P>(&P::max_ctx), std::move(help.max_ctx));
}
template <class P>
void add_topk_data(Fields<P>& f) {
  f.choice("data", "", member<P>(&P::data),
           {{TopkData::random, "random"}, {TopkData::ties, "ties"}}, "ties: few distinct values");
}
// offset_log2 and fp8_codes: name, prefix, values and id rule as paged.h declares them.
template <class P>
void add_offset_log2(Fields<P>& f, const std::string& help) {
  const Axis a = offset_log2_axis(help);
  f.add(a.name, a.prefix, member<P>(&P::offset_log2), a.help).only(a.allowed);
  if (!a.in_id_at_default) f.out_of_id_at_default();
}
template <class P>
void add_fp8_codes(Fields<P>& f, const std::string& help) {
  const Axis a = fp8_codes_axis(help);
  f.choice(a.name, a.prefix, member<P>(&P::fp8_codes),
           {{Fp8Codes::ordinary, "ordinary"}, {Fp8Codes::special, "special"}}, a.help);
  if (!a.in_id_at_default) f.out_of_id_at_default();
}
// The paged readers' fields after their layout's (and any of the op's own): fp8, pad, table, seed,
// fp8_codes, offset_log2.
template <class P>
void add_paged_read_tail(Fields<P>& f, const std::string& fp8_codes_help) {
  add_fp8(f);
  f.add("pad", "pad", member<P>(&P::pad), "bytes of padding after each page");
  f.choice("table", "", member<P>(&P::table),
           {{Table::contiguous, "contiguous"}, {Table::strided, "strided"}},
           "strided: table row stride > W");
  add_seed(f);
  add_fp8_codes(f, fp8_codes_help);
  add_offset_log2(f,
                  "31 / 32: every page a request reads starts past byte 2^31 / 2^32 of the "
                  "cache; the host holds only those pages");
  add_table_step(f, &P::table_step);
}

// ---- validity ----
std::optional<std::string> block_size_problem(int64_t block_size);  // 1 or a multiple of 16
std::optional<std::string> page_stride_problem(int64_t pad);        // of the paged readers

// ---- inputs ----

// How generated q / K rows are spread. `edges`: every 16 rows, rows on the quantizer's edges (all
// zero: the amax floor; a peak of exactly M * 2^e; the next bf16 above it; a geometric sweep into
// fp8 subnormals and underflow), the rest at magnitudes 2^-18 .. 2^6 (quantization ops, compared
// bitwise). `model`: rows of comparable size, N(0,1) * 2^{-2..2}, every 16th all zero (logits
// ops: a budget relative to the largest terms stays tight for every element).
enum class RowMix { edges, model };
void fill_quant_rows(const Tensor& rows, const std::string& case_id, const std::string& name,
                     int64_t seed, float quant_max, RowMix mix);

// fp8 special codes in the value bytes of a paged cache (docs/formats.md):
//   ordinary: what the writer wrote;
//   decoded (logits): the tokens written carry the saturation codes and, in e4m3fn, -0
//     (fp8_special_code, element k = position + dim); every other value byte of the held pages
//     holds a NaN code, which a kernel must never read;
//   copied (gather): the tokens written carry those and NaN codes too (k % 11 == 3): a byte copy
//     keeps every code, a copy through float does not.
enum class CacheCodes { ordinary, decoded, copied };

// A paged indexer cache u8 [first_block + num_blocks, BS, 132] with page stride BS*132 + pad:
// random bytes everywhere (stale memory), then every position < seq_lens[r] of every request
// written by the reference writer in the layout the block size selects (the table's ids already
// shifted by first_block). Invalid block sizes get random bytes only. first_block > 0 (large
// offsets): a sparse storage whose host window holds pages [first_block, first_block + num_blocks).
Tensor paged_cache(const std::string& case_id, const PagedLayout& layout, int64_t block_size,
                   int64_t pad, DType fp8, int64_t seed, RowMix mix, int64_t first_block = 0,
                   CacheCodes codes = CacheCodes::ordinary);

// The paged readers' make() preamble: the layout (block ids past the offset p.offset_log2 asks
// for) and the cache it indexes; with fp8_codes = special, the cache carries `special_codes`.
struct PagedInputs {
  PagedLayout layout;
  Tensor cache;
};
PagedInputs paged_inputs(const std::string& case_id, const PagedReadParams& p, RowMix mix,
                         CacheCodes special_codes);

// fp8_codes = special for a contiguous fp8 tensor whose every element is read (q, prefill k):
// element i holds fp8_special_code(i) where it has one.
void plant_fp8_specials(const Tensor& fp8_values);

// Prefill requests (vLLM BuildPrefillChunkMetadata): request r has L_r keys and q_r = min(qlen,
// L_r) queries; query i of r sees keys [cu[r], cu[r] + L_r - q_r + 1 + i) ("causal"), or a random
// window of [0, N] including empty and full ones ("random").
struct PrefillWindows {
  int64_t M = 0, N = 0;
  Tensor ks, ke;  // i32 [M]
};
PrefillWindows prefill_windows(const std::string& case_id, const WindowParams& p, int64_t seed);
// The prefill ops' case-file errors (sizes below 1).
std::optional<std::string> windows_unbuildable(const WindowParams& p);

// A tensor of `shape` inside a larger storage whose rows are `row_stride` long (row-major), so
// writes past the end of a row land outside the view.
Tensor padded_rows(DType dtype, const Shape& shape, int64_t row_stride);
int64_t padded_stride(int64_t width);  // round up to 16, plus 16 columns nobody may write

// Budget of fp32 indexer logits (docs/ops/indexer.md): per q.k, fp32 accumulation of 128 exact
// products in any order (tensor cores may truncate: 2 gamma_128), then the weight product and
// the H-head sum (gamma_{H+1}), and the fp32 stores. Terms are bounded by R_i * C_j with
// R_i = sum_h |w_ih| sum_d |q_ihd| and C_j = k_scale_j max_d |k_jd|; atol uses their maxima.
Budget logits_budget(const Tensor& q, const Tensor& weights, double max_key_factor);
// max_j k_scale[j] * max_d |k[j, d]| over fp8 rows.
double key_factor(const Tensor& k_fp8, const Tensor& k_scale);

Tensor i32_tensor(const std::vector<int64_t>& v);

}  // namespace attncheck::indexer_ops
