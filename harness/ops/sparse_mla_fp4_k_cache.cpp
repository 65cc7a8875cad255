// sparse_mla_fp4_k_cache: the writer of DeepSeek-V4.1's FP4 compressed-KV records
// (docs/ops/sparse_mla_fp4.md, reference/sparse_mla_fp4.h): bf16 latent rows [T', 512] quantized
// into the slots of slot_mapping as 288-byte NVFP4 (e4m3 scales of 16, floor 2^-9) or 272-byte
// MXFP4 (e8m0 scales of 32, ceil rule) records, data rows then scale rows in each page. Judged
// bitwise over the whole cache, so bytes outside the written records must stay as they were.
// What it guards against: an e4m3 block scale truncated instead of rounded, the scale floor lost
// (a zero block divides by 0), nibble order, the scale of the wrong block, a record written as one
// run.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/rng.h"
#include "ops/paged.h"
#include "ops/typed_op.h"
#include "reference/sparse_mla_fp4.h"

namespace attncheck {
namespace {

namespace rec = ref::fp4_record;

enum class Values { model, extreme };

struct Fp4KCacheParams {
  int64_t block_size = 64;
  rec::Format kv_format = rec::Format::nvfp4;
  int64_t tokens = 41;
  Values values = Values::model;
  int64_t pad = 64;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  int64_t offset_log2 = 0;      // ops/paged.h
  bool far_rows = false;        // ops/storage_offset.h (place_far_token)
};

// bf16 rows: blocks of N(0, 1) times a non-power-of-two factor exp(2 N(0, 1)) per 16 elements.
void fill_rows(const Tensor& k, const Rng& rng) {
  std::vector<double> values(16);
  for (int64_t r = 0; r < k.size(0); ++r)
    for (int64_t b = 0; b < rec::kDims / 16; ++b) {
      const double factor =
          std::exp(2.0 * rng.normal_at(static_cast<uint64_t>((1 << 30) + r * 64 + b)));
      rng.normal_run(static_cast<uint64_t>(r * rec::kDims + b * 16), values);  // batched
      for (int64_t d = b * 16; d < b * 16 + 16; ++d)
        k.set({r, d}, factor * values[static_cast<size_t>(d - b * 16)]);
    }
}

// Row 0 zeros (the scale floors), row 1 tiny (1e-38: below every floor), row 2 near bf16's max
// (nvfp4 scale saturates at 448, elements at 6), row 4 blocks whose amax / 6 sits exactly halfway
// between two e4m3 numbers (ties to even decide) and on powers of two (the e8m0 ceil boundary).
void plant_extremes(const Tensor& k) {
  const int64_t rows = k.size(0);
  for (int64_t d = 0; d < rec::kDims; ++d) {
    if (rows > 0) k.set({0, d}, 0.0);
    if (rows > 1) k.set({1, d}, static_cast<double>(d % 3 - 1) * 1e-38);
    if (rows > 2) k.set({2, d}, (d % 2 ? -3e38 : 1e38));
  }
  // 6 x (1 + 1/16) x 2^j: between e4m3's 1 and 1.125; 6 x 2^j: an exact power-of-two scale.
  for (int64_t b = 0; rows > 4 && b < rec::kDims / 16; ++b)
    k.set({4, b * 16 + 3}, (b % 2 ? 6.375 : 6.0) * std::ldexp(1.0, static_cast<int>(b % 8) - 4));
}

class SparseMlaFp4KCacheOp final : public TypedOp<Fp4KCacheParams> {
 public:
  using P = Fp4KCacheParams;
  std::string name() const override { return "sparse_mla_fp4_k_cache"; }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add<int64_t>("block_size", "bs", &P::block_size, "cache page size (tokens)")
        .only({1, 16, 64})
        .choice<rec::Format>("kv_format", "", &P::kv_format,
                             {{rec::Format::nvfp4, "nvfp4"}, {rec::Format::mxfp4, "mxfp4"}},
                             "record: nvfp4 (288 bytes) or mxfp4 (272 bytes)")
        .add<int64_t>("tokens", "t", &P::tokens,
                      "slot_mapping entries (the rows tensor has 3 more); every 7th is -1; odd "
                      "counts leave partial pages")
        .bounds(0, 4096)
        .choice<Values>("values", "v", &P::values,
                        {{Values::model, "model"}, {Values::extreme, "extreme"}},
                        "extreme: zero, tiny and near-max rows, e4m3 ties and power-of-two "
                        "boundaries")
        .add<int64_t>("pad", "pad", &P::pad,
                      "bytes after each page (page stride = page + pad); > 0 also makes kv a "
                      "strided view and starts both views past their storage's start")
        .bounds(0, 4096)
        .add<int64_t>("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default()
        .add("far_rows", "far", &P::far_rows,
             "true: one token is written (the last; every other slot -1), its kv row past "
             "element 2^31 / byte 2^32 of a sparse storage holding that row only")
        .out_of_id_at_default();
    add_offset_log2(f, &P::offset_log2,
                    "31 / 32: every page starts past byte 2^31 / 2^32 of the cache; the host "
                    "holds and compares those pages only, the device poisons the rest");
    return f;
  }
  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.far_rows && p.tokens < 2) return "far_rows needs two or more tokens";
    return std::nullopt;
  }

  // The bf16 rows, the slots and the cache pages the tokens write.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.tokens), bs = static_cast<double>(p.block_size);
    const double pages = std::ceil(T / std::max(bs, 1.0)) + 2;
    CaseSize s;
    s.input_bytes = 2 * (T + 4) * (rec::kDims + 24) + 8 * T;
    s.output_bytes = pages * (bs * static_cast<double>(rec::record_bytes(p.kv_format)) +
                              static_cast<double>(p.pad)) +
                     64;
    s.work = T * rec::kDims;
    return s.count("tokens", p.tokens, /*min=*/0).count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t T = p.tokens, Pg = p.block_size, rb = rec::record_bytes(p.kv_format);
    const int64_t pages = (T + Pg - 1) / Pg + 2, stride = Pg * rb + p.pad;
    // Large offsets: page ids start at `first`, past byte 2^offset_log2; the host holds those.
    const int64_t first = first_block_past(p.offset_log2, stride);
    // Padded cases also pass kv as a strided view 8 elements into its storage and the cache view
    // 32 bytes into its storage.
    const bool padded = p.pad > 0;
    const int64_t row_stride = rec::kDims + (padded ? 24 : 0), k_offset = padded ? 8 : 0,
                  c_offset = padded ? 32 : 0;
    Tensor k = Tensor::full(DType::bf16, {(T + 3) * row_stride + k_offset}, 0.0)
                   .as_strided({T + 3, rec::kDims}, {row_stride, 1}, k_offset);
    fill_rows(k, Rng(c.id, "kv", static_cast<uint64_t>(p.seed)));
    if (p.values == Values::extreme) plant_extremes(k);
    Rng rng(c.id, "slots", static_cast<uint64_t>(p.seed));
    const std::vector<int64_t> order = permutation(pages * Pg, rng);
    Tensor slots = Tensor::empty(DType::i64, {T});
    for (int64_t i = 0; i < T; ++i) {
      const bool padding = p.far_rows ? i != T - 1 : i % 7 == 3;  // far_rows: the last alone
      slots.at<int64_t>({i}) = padding ? -1 : first * Pg + order[static_cast<size_t>(i)];
    }
    const int64_t total = first + pages;
    Tensor storage = paged_storage(first, pages, stride, c_offset);
    // Random old bytes, or 0xA5 with far_rows: one record is written, and a constant keeps the
    // compared pages of the largest token count within the golden budget (docs/goldens.md).
    const Tensor held =
        storage.slice(0, first > 0 ? first * stride + c_offset : 0, total * stride + c_offset);
    if (p.far_rows)
      std::fill(held.storage()->bytes.begin(), held.storage()->bytes.end(), std::byte{0xA5});
    else
      fill_uniform_int(held, Rng(c.id, "cache", static_cast<uint64_t>(p.seed)), 0, 255);
    Problem prob;
    prob.args = {
        {"kv", k, Role::input},
        {"slot_mapping", slots, Role::input},
        {"kv_cache", storage.as_strided({total, Pg, rb}, {stride, rb, 1}, c_offset), Role::inout}};
    if (p.far_rows) place_far_token(prob, {"kv"}, T - 1);
    prob.bytes = static_cast<double>(T) * static_cast<double>(2 * rec::kDims + rb + 8);
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"kv_format", std::string(rec::format_name(p.kv_format))}};
  }

  // A large-offset cache is compared over the pages the host holds (run/device.cpp), from
  // page `first`.
  TensorMap reference(const Problem& prob, const P& p) const override {
    const Tensor& full = prob.arg("kv_cache");
    const Tensor held = full.held_rows();
    const Tensor cache = held.clone();
    const Tensor& k = prob.arg("kv");
    const Tensor& slots = prob.arg("slot_mapping");
    const int64_t Pg = full.size(1), num_slots = full.size(0) * Pg;
    const int64_t first = first_held_row(full);
    std::vector<double> row(static_cast<size_t>(rec::kDims));
    for (int64_t i = 0; i < slots.size(0); ++i) {
      const int64_t s = slots.at<int64_t>({i});
      if (s < 0) continue;
      if (s >= num_slots || s < first * Pg)
        throw std::invalid_argument("slot_mapping[" + std::to_string(i) +
                                    "] = " + std::to_string(s) + " is outside the held pages");
      for (int64_t d = 0; d < rec::kDims; ++d) row[static_cast<size_t>(d)] = k.get({i, d});
      rec::write_record(cache, p.kv_format, s / Pg - first, s % Pg, row.data());
    }
    return {{"kv_cache", cache}};
  }

  std::vector<OutputCheck> checks(const Problem&, const P&, const TensorMap&) const override {
    return {{"kv_cache", exact_budget("quantized records and untouched bytes: bitwise"), {}, {}}};
  }
};

const OpRegistrar kRegister(std::make_unique<SparseMlaFp4KCacheOp>());

}  // namespace
}  // namespace attncheck
