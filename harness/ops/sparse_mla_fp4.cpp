// sparse_mla_fp4: sparse MLA decode reading the DeepSeek-V4.1 FP4 compressed-KV record directly
// (docs/ops/sparse_mla_fp4.md; reference/sparse_mla_fp4.h has the layout and its sources):
// 288-byte NVFP4 or 272-byte MXFP4 records, paged with the data rows of a page first and its scale
// rows after them. Index conversion, ragged packing, 16-head rule, empty rows (out 0, lse -inf)
// and budgets are sparse_mla's; only the cache differs.
// What the generated data exposes: every cache byte no query may read is 0xFF (a NaN scale in both
// formats, a -6 element), so reading another token's record, another block's scale or the wrong
// half of a page gives NaN or a wrong value; "tiny" scales put every block on the e8m0 bytes 0..3
// (byte 0 = 2^-127, an fp32 subnormal) or the e4m3 subnormal bytes 0x00..0x07; "special" scales
// give every record a zero scale byte, the saturating byte (448 / 2^127, over zero codes) and the
// smallest nonzero byte.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/fp4.h"
#include "core/rng.h"
#include "ops/mla_inputs.h"
#include "ops/paged.h"
#include "reference/sparse_mla_fp4.h"

namespace attncheck {
namespace {

namespace rec = ref::fp4_record;

enum class Scales { model, tiny, special };
enum class Pattern { random, holes };

struct SparseMlaFp4Params {
  int64_t heads = 16;
  int64_t block_size = 64;
  rec::Format kv_format = rec::Format::nvfp4;
  int64_t qlen = 1;
  DType dtype = DType::bf16;
  int64_t batch = 2;
  int64_t ctx = 97;
  int64_t topk = 64;
  Pattern pattern = Pattern::random;
  Scales scales = Scales::model;
  mla::Layout layout = mla::Layout::contiguous;
  mla::Scale scale = mla::Scale::yarn;
  int64_t seed = 0;
  bool storage_offset = false;  // ops/storage_offset.h
  int64_t table_step = 1;       // ops/paged.h
  int64_t offset_log2 = 0;      // ops/paged.h
  bool far_rows = false;        // ops/storage_offset.h
  // "yarn": DeepSeek-V3's production softmax scale (mla_inputs.h); "lk": 1/sqrt(512).
  double softmax_scale() const {
    if (scale == mla::Scale::lk) return 1.0 / std::sqrt(static_cast<double>(rec::kDims));
    const double mscale = 0.1 * std::log(40.0) + 1.0;
    return mscale * mscale / std::sqrt(192.0);
  }
};

// Request-local top-k rows [T, topk]: a random subset of the token's visible positions, -1 padded
// at the end; "holes" also puts invalid entries (-1, other negatives, positions past the table)
// inside a quarter of each row and makes token 0's row entirely invalid.
Tensor make_topk(const std::string& case_id, const SparseMlaFp4Params& p, const Tensor& seq_lens,
                 int64_t table_positions) {
  const int64_t T = p.batch * p.qlen;
  // Views as sparse_mla's: a wider row (strided) or a column-major storage (transposed).
  Tensor topk = p.layout == mla::Layout::contiguous ? Tensor::full(DType::i32, {T, p.topk}, -9)
                : p.layout == mla::Layout::strided
                    ? Tensor::full(DType::i32, {T, p.topk + 5}, -9).slice(1, 0, p.topk)
                    : Tensor::full(DType::i32, {p.topk, T}, -9).permute({1, 0});
  Rng rng(case_id, "topk_indices", static_cast<uint64_t>(p.seed));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = seq_lens.at<int32_t>({t / p.qlen}) - p.qlen + t % p.qlen + 1;
    const auto order = permutation(visible, rng);
    for (int64_t j = 0; j < p.topk; ++j) {
      int64_t v = j < visible ? order[static_cast<size_t>(j)] : -1;
      if (p.pattern == Pattern::holes && (t == 0 || rng.uniform() < 0.25)) {
        const int64_t kind = rng.uniform_int(0, 2);
        v = kind == 0 ? -1 : kind == 1 ? -rng.uniform_int(2, 1000) : table_positions + j;
      }
      topk.at<int32_t>({t, j}) = static_cast<int32_t>(v);
    }
  }
  return topk;
}

// The 512 values of one record, before quantization: blocks of U(-1, 1) times a per-block factor
// exp(N(0, 1)) (non-power-of-two block scales).
std::vector<double> record_values(const Rng& rng, int64_t slot, rec::Format f) {
  std::vector<double> x(static_cast<size_t>(rec::kDims));
  const int64_t block = rec::block_elems(f);
  std::vector<double> u(static_cast<size_t>(rec::kDims));
  rng.uniform_run(static_cast<uint64_t>(slot * rec::kDims), u);  // uniform_at, batched
  for (int64_t b = 0; b < rec::kDims / block; ++b) {
    const double factor = std::exp(rng.normal_at(static_cast<uint64_t>((1 << 30) + slot * 64 + b)));
    for (int64_t i = b * block; i < (b + 1) * block; ++i)
      x[static_cast<size_t>(i)] = factor * (2.0 * u[static_cast<size_t>(i)] - 1.0);
  }
  return x;
}

// Rewrites the scale bytes of a written record for the "tiny" and "special" scales.
void plant_scales(const Tensor& cache, const SparseMlaFp4Params& p, int64_t page, int64_t t,
                  int64_t slot) {
  const rec::Format f = p.kv_format;
  const int64_t P = p.block_size, blocks = rec::scale_bytes(f);
  auto* base = reinterpret_cast<uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
  auto scale = [&](int64_t b) -> uint8_t& { return base[rec::scale_offset(f, P, t, b)]; };
  if (p.scales == Scales::tiny) {
    // e8m0 bytes 0..3 (2^-127 .. 2^-124) / e4m3 subnormals 0x00..0x07 (0, 2^-9 .. 7 x 2^-9).
    const int64_t top = f == rec::Format::mxfp4 ? 4 : 8;
    for (int64_t b = 0; b < blocks; ++b) scale(b) = static_cast<uint8_t>((slot + b) % top);
    return;
  }
  const int64_t zero = slot % blocks, saturated = (slot + 1) % blocks,
                smallest = (slot + 2) % blocks;
  scale(zero) = 0x00;
  scale(saturated) = f == rec::Format::mxfp4 ? 0xFE : 0x7E;
  scale(smallest) = 0x01;
  const int64_t block = rec::block_elems(f);
  for (int64_t i = saturated * block; i < (saturated + 1) * block; i += 2)  // +-0 codes only
    base[rec::data_offset(t, i / 2)] = static_cast<uint8_t>(((slot + i) % 2) * 0x08 | 0x80);
}

class SparseMlaFp4Op final : public TypedOp<SparseMlaFp4Params> {
 public:
  using P = SparseMlaFp4Params;
  std::string name() const override { return "sparse_mla_fp4"; }
  // far_rows: each query token reads its own top-k records (req_id_per_token names its table
  // row); q, its indices and its output row past element 2^31.
  FarRows far_rows_args(const P&) const override {
    return {{"q", "topk_indices", "out"}, {"lse"}, {"req_id_per_token"}};
  }
  Fields<P> fields() const override {
    Fields<P> f;
    f.add<int64_t>("heads", "h", &P::heads,
                   "query heads; 3, 5, 12, 24, 40 break the 16-head rule and must be refused")
        .only(mla::kHeadValues)
        .add<int64_t>("block_size", "bs", &P::block_size, "cache page size (tokens)")
        .only({1, 16, 64})
        .choice<rec::Format>("kv_format", "", &P::kv_format,
                             {{rec::Format::nvfp4, "nvfp4"}, {rec::Format::mxfp4, "mxfp4"}},
                             "record: nvfp4 (288 bytes, e4m3 scales of 16) or mxfp4 (272 bytes, "
                             "e8m0 scales of 32)")
        .add<int64_t>("qlen", "q", &P::qlen, "query tokens per request")
        .only({1, 2, 4})
        .add<DType>("dtype", "", &P::dtype, "query and output dtype")
        .only({"bf16", "f16"})
        .add<int64_t>("batch", "b", &P::batch, "requests")
        .bounds(1, 64)
        .add<int64_t>("ctx", "ctx", &P::ctx,
                      "longest kv length; others ragged with block-edge lengths")
        .bounds(4, 65536)
        .add<int64_t>("topk", "k", &P::topk, "indices per token")
        .bounds(1, 2048)
        .choice<Pattern>("pattern", "", &P::pattern,
                         {{Pattern::random, "random"}, {Pattern::holes, "holes"}}, "index pattern")
        .choice<Scales>(
            "scales", "sc", &P::scales,
            {{Scales::model, "model"}, {Scales::tiny, "tiny"}, {Scales::special, "special"}},
            "block scale bytes: the writer's, tiny (e8m0 0..3 / e4m3 subnormals) or "
            "special (a zero, a saturating and the smallest byte in every record)")
        .choice<mla::Layout>("layout", "", &P::layout,
                             {{mla::Layout::contiguous, "contiguous"},
                              {mla::Layout::strided, "strided"},
                              {mla::Layout::transposed, "transposed"}},
                             "q/out/lse/topk views as in mla_decode; strided also a strided block "
                             "table and a cache view 64 bytes into its storage")
        .choice<mla::Scale>("scale", "sc", &P::scale,
                            {{mla::Scale::yarn, "yarn"}, {mla::Scale::lk, "lk"}},
                            "softmax scale: DeepSeek-V3's yarn scale or 1/sqrt(512)")
        .add<int64_t>("seed", "s", &P::seed, "input seed")
        .add("storage_offset", "soff", &P::storage_offset, kStorageOffsetHelp)
        .out_of_id_at_default();
    add_table_step(f, &P::table_step);
    add_offset_log2(f, &P::offset_log2,
                    "31 / 32: every page of every request starts past byte 2^31 / 2^32 of the "
                    "record cache; the host holds only those pages, the device poisons the rest");
    add_far_rows(f, &P::far_rows);
    return f;
  }

  std::optional<std::string> unbuildable(const P& p) const override {
    if (p.ctx < p.qlen) return "ctx must be >= qlen";
    if (p.far_rows && (p.layout != mla::Layout::contiguous || p.batch * p.qlen < 2))
      return "far_rows needs the contiguous layout and two or more tokens";
    if (p.scales == Scales::tiny && p.kv_format == rec::Format::mxfp4 && p.dtype != DType::bf16)
      return "scales = tiny with kv_format = mxfp4 needs dtype bf16 (outputs near 2^-125 are "
             "zero in f16, which would pass any kernel)";
    return std::nullopt;
  }
  std::optional<std::string> invalid(const P& p) const override {
    if (!ref::mla_num_heads_valid(p.heads)) return ref::mla_num_heads_message(p.heads);
    return std::nullopt;
  }

  // q, the held pages of packed records, the top-k indices and the output; every query row
  // reads topk records.
  CaseSize size(const P& p) const override {
    const double T = static_cast<double>(p.batch * p.qlen), H = static_cast<double>(p.heads);
    const double k = static_cast<double>(p.topk), qs = static_cast<double>(dtype_size(p.dtype));
    const double record = static_cast<double>(rec::record_bytes(p.kv_format));
    CaseSize s;
    s.input_bytes = (T + 1) * (H + 1) * 576 * qs +
                    paged_blocks(p.batch, p.ctx, p.block_size) *
                        (static_cast<double>(p.block_size) * record + 64) +
                    4 * (T + 1) * (k + 5) + 4 * T +
                    paged_layout_bytes(p.batch, p.ctx, p.block_size);
    s.output_bytes = (T + 1) * (H + 3) * (512 * qs + 4);
    s.work = 2 * T * k * H * (576 + 512);
    return s.count("batch", p.batch)
        .count("ctx", p.ctx)
        .count("heads", p.heads)
        .count("qlen", p.qlen)
        .count("topk", p.topk)
        .count("block_size", p.block_size);
  }

  Problem make(const Case& c, const P& p) const override {
    const int64_t Pg = p.block_size, T = p.batch * p.qlen,
                  rec_bytes = rec::record_bytes(p.kv_format);
    const bool strided = p.layout == mla::Layout::strided;
    const PagedLayout pages =
        paged_layout(c.id, p.batch, p.ctx, Pg, strided, p.seed, p.qlen, 0, p.table_step);
    // Unread bytes 0xFF, pages 64 bytes apart (the kernel must use the page stride); the strided
    // layout starts the view 64 bytes into its storage. Large offsets: page ids start at `first`,
    // past byte 2^offset_log2, and the host holds those pages only.
    const int64_t stride = Pg * rec_bytes + 64, offset = strided ? 64 : 0;
    const int64_t first = first_block_past(p.offset_log2, stride);
    shift_block_ids(pages, first);
    const int64_t total = first + pages.num_blocks;
    Tensor storage = paged_storage(first, pages.num_blocks, stride, offset);
    std::fill(storage.storage()->bytes.begin(), storage.storage()->bytes.end(), std::byte{0xFF});
    Tensor cache = storage.as_strided({total, Pg, rec_bytes}, {stride, rec_bytes, 1}, offset);
    const Rng values(c.id, "kv_cache", static_cast<uint64_t>(p.seed));
    for (int64_t r = 0; r < p.batch; ++r)
      for (int64_t t = 0; t < pages.seq_lens.at<int32_t>({r}); ++t) {
        const int64_t page = pages.block_table.at<int32_t>({r, t / Pg});
        const int64_t slot = page * Pg + t % Pg;
        const auto x = record_values(values, slot, p.kv_format);
        rec::write_record(cache, p.kv_format, page, t % Pg, x.data());
        if (p.scales != Scales::model) plant_scales(cache, p, page, t % Pg, slot);
      }
    Tensor q = mla::make_token_head_view(p.layout, p.dtype, T, p.heads, rec::kDims);
    fill_normal(q, Rng(c.id, "q", static_cast<uint64_t>(p.seed)), 0.0, 3.0);
    Tensor req = Tensor::empty(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) req.at<int32_t>({t}) = static_cast<int32_t>(t / p.qlen);
    const Tensor topk = make_topk(c.id, p, pages.seq_lens, pages.block_table.size(1) * Pg);
    Problem prob;
    prob.args = {
        {"q", q, Role::input},
        {"kv_cache", cache, Role::input},
        {"block_table", pages.block_table, Role::input},
        {"req_id_per_token", req, Role::input},
        {"topk_indices", topk, Role::input},
        {"out", mla::make_token_head_view(p.layout, p.dtype, T, p.heads, rec::kDims), Role::output},
        {"lse", mla::make_lse_view(p.layout, T, p.heads), Role::output}};
    const double keys = static_cast<double>(T * p.topk);
    prob.flops = 4.0 * keys * static_cast<double>(p.heads * rec::kDims);
    prob.bytes = keys * static_cast<double>(rec_bytes) +
                 static_cast<double>(2 * T * p.heads * rec::kDims * 2);
    return prob;
  }

  nlohmann::json kernel_params(const P& p, const Problem&) const override {
    return {{"scale", p.softmax_scale()},
            {"kernel_block_size", p.block_size},
            {"kv_format", std::string(rec::format_name(p.kv_format))}};
  }

  TensorMap reference(const Problem& prob, const P& p) const override {
    const HeldRecords held = held_records(prob, p);
    if (prob.arg("q").size(2) != rec::kDims)
      throw std::invalid_argument("q must be [T, N, 512] for an FP4 record cache");
    const auto r = ref::sparse_mla(prob.arg("q"), {held.decoded, 1.0}, held.indices,
                                   p.softmax_scale(), rec::kDims);
    return {{"out", r.out}, {"lse", r.lse}};
  }

  // sparse_mla's budgets (mla_inputs.h) over the decoded rows each token reads: the decoded
  // values are exact in fp32 (an e2m1 code times a power of two or an e4m3 number), so the
  // kernel model of the 16-bit caches applies unchanged.
  std::vector<OutputCheck> checks(const Problem& prob, const P& p,
                                  const TensorMap& expected) const override {
    const HeldRecords held = held_records(prob, p);
    const auto& idx = held.indices;
    std::vector<int64_t> slots(static_cast<size_t>(idx.indices.numel()));
    for (size_t i = 0; i < slots.size(); ++i)
      slots[i] = idx.indices.at<int32_t>({static_cast<int64_t>(i)});
    int64_t keys_max = 0;
    for (int64_t t = 0; t + 1 < idx.indptr.numel(); ++t)
      keys_max = std::max<int64_t>(keys_max,
                                   idx.indptr.at<int32_t>({t + 1}) - idx.indptr.at<int32_t>({t}));
    const auto s =
        ref::mla_input_scales(prob.arg("q"), {held.decoded, 1.0}, slots, rec::kDims, keys_max);
    auto checks = mla::budgets(s, p.dtype, p.dtype, rec::kDims, p.softmax_scale());
    mla::widen_for_output_underflow(checks.at(0).budget, expected.at("out"), p.dtype);
    return checks;
  }

 private:
  // The decoded records of the pages the host holds (from page `first` on: a large-offset cache
  // holds no other) and the packed slots made relative to them.
  struct HeldRecords {
    Tensor decoded;
    ref::RaggedIndices indices;
  };
  static HeldRecords held_records(const Problem& prob, const P& p) {
    const Tensor& cache = prob.arg("kv_cache");
    const int64_t first = first_block_past(p.offset_log2, cache.stride(0));
    HeldRecords h{rec::decode_cache(cache.slice(0, first, cache.size(0)), p.kv_format),
                  ref::sparse_mla_pack(ref::sparse_mla_global_indices(
                      prob.arg("topk_indices"), prob.arg("req_id_per_token"),
                      prob.arg("block_table"), p.block_size))};
    const int64_t shift = first * p.block_size;
    for (int64_t i = 0; i < h.indices.indices.numel(); ++i) {
      auto& slot = h.indices.indices.at<int32_t>({i});
      if (slot < shift)
        throw std::out_of_range("sparse_mla_fp4: slot " + std::to_string(slot) +
                                " lies before the held pages");
      slot = static_cast<int32_t>(slot - shift);
    }
    return h;
  }
};

const OpRegistrar kRegister(std::make_unique<SparseMlaFp4Op>());

}  // namespace
}  // namespace attncheck
