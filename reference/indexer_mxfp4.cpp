// The MXFP4 indexer reference (indexer_mxfp4.h): cache geometry, the K cache writer and the paged
// MQA logits, decoding every byte by the format definition (core/fp4.h).
#include "indexer_mxfp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace attncheck::ref::mxfp4 {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("mxfp4 indexer reference: " + what);
}
void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}
void expect_dtype(const Tensor& t, DType d, const char* name) {
  expect(t.dtype() == d,
         std::string(name) + " must be " + std::string(dtype_name(d)) + ", got " + t.describe());
}

const uint8_t* page_ptr(const Tensor& cache, const CacheGeometry& g, int64_t page) {
  expect(page >= 0 && page < cache.size(0),
         "page " + std::to_string(page) + " outside the cache of " + std::to_string(cache.size(0)));
  // Touch the last byte first: a sparse cache throws for a page it does not hold.
  (void)cache.element_ptr(Index{page, g.page_size - 1, g.entry_bytes() - 1});
  return reinterpret_cast<const uint8_t*>(cache.element_ptr(Index{page, 0, 0}));
}

// Decoded q rows: [rows * H, D].
std::vector<double> decode_q(const Tensor& q, const Tensor& q_scale, int64_t D) {
  const int64_t n = q.numel() / (D / 2);
  std::vector<double> out(static_cast<size_t>(n * D));
  const Tensor qd = q.contiguous(), sd = q_scale.contiguous();
  const auto* qb = reinterpret_cast<const uint8_t*>(qd.data());
  const auto* sb = reinterpret_cast<const uint8_t*>(sd.data());
  fp4::mxfp4_dequantize(std::span(qb, static_cast<size_t>(n * D / 2)),
                        std::span(sb, static_cast<size_t>(n * D / fp4::kMxfp4Block)),
                        fp4::NibbleOrder::low_first, out);
  return out;
}

struct LogitsShape {
  int64_t B, NN, H, D;
};
LogitsShape check_logits_args(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                              const CacheGeometry& g, const Tensor& weights,
                              const Tensor& context_lens, const Tensor& block_table) {
  check_cache(cache, g);
  expect_dtype(q, DType::u8, "q");
  expect_dtype(q_scale, DType::u8, "q_scale");
  expect_dtype(weights, DType::f32, "weights");
  expect_dtype(context_lens, DType::i32, "context_lens");
  expect_dtype(block_table, DType::i32, "block_table");
  expect(q.ndim() == 4 && q.size(3) == g.value_bytes(),
         "q must be [B, next_n, H, D/2], got " + q.describe());
  const LogitsShape s{q.size(0), q.size(1), q.size(2), g.head_dim};
  expect(q_scale.ndim() == 4 && q_scale.size(0) == s.B && q_scale.size(1) == s.NN &&
             q_scale.size(2) == s.H && q_scale.size(3) == g.head_dim / fp4::kMxfp4Block,
         "q_scale must be [B, next_n, H, D/32], got " + q_scale.describe());
  expect(weights.ndim() == 2 && weights.size(0) == s.B * s.NN && weights.size(1) == s.H,
         "weights must be [B*next_n, H], got " + weights.describe());
  expect(context_lens.ndim() == 1 && context_lens.size(0) == s.B, "context_lens must be [B]");
  expect(block_table.ndim() == 2 && block_table.size(0) == s.B, "block_table must be [B, W]");
  return s;
}

// Decoded keys of request b at positions [0, len): [len, D].
std::vector<double> decode_keys(const Tensor& cache, const CacheGeometry& g,
                                const Tensor& block_table, int64_t b, int64_t len) {
  const int64_t S = g.page_size, D = g.head_dim;
  expect((len + S - 1) / S <= block_table.size(1),
         "request " + std::to_string(b) + " needs more pages than the table has");
  std::vector<double> k(static_cast<size_t>(len * D));
  for (int64_t p = 0; p < len; ++p)
    read_key(cache, g, block_table.at<int32_t>({b, p / S}), p % S, k.data() + p * D);
  return k;
}

// One request's logits rows (or their |term| sums) through `visit(row, position, value)`.
template <class Visit>
void request_rows(const LogitsShape& s, const std::vector<double>& q, const Tensor& weights,
                  const std::vector<double>& k, int64_t b, int64_t L, int64_t width, bool magnitude,
                  Visit visit) {
  for (int64_t n = 0; n < s.NN; ++n) {
    const int64_t r = b * s.NN + n, end = decode_row_end(L, s.NN, n, width);
    std::vector<double> w(static_cast<size_t>(s.H));
    for (int64_t h = 0; h < s.H; ++h) w[h] = weights.at<float>({r, h});
    std::vector<double> row(static_cast<size_t>(end));
#pragma omp parallel for
    for (int64_t p = 0; p < end; ++p) {
      double acc = 0;
      for (int64_t h = 0; h < s.H; ++h) {
        const double* qh = q.data() + (r * s.H + h) * s.D;
        const double* kp = k.data() + p * s.D;
        double dot = 0;
        for (int64_t d = 0; d < s.D; ++d)
          dot += magnitude ? std::fabs(qh[d] * kp[d]) : qh[d] * kp[d];
        acc += magnitude ? std::fabs(w[h]) * dot : w[h] * std::max(dot, 0.0);
      }
      row[p] = acc;
    }
    for (int64_t p = 0; p < end; ++p) visit(r, p, row[p]);
  }
}

template <class Visit>
void for_each_logit(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                    const CacheGeometry& g, const Tensor& weights, const Tensor& context_lens,
                    const Tensor& block_table, int64_t width, bool magnitude, Visit visit) {
  const LogitsShape s = check_logits_args(q, q_scale, cache, g, weights, context_lens, block_table);
  const std::vector<double> qd = decode_q(q, q_scale, s.D);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t L = context_lens.at<int32_t>({b});
    expect(L >= 0, "negative context length of request " + std::to_string(b));
    const int64_t len = decode_row_end(L, s.NN, s.NN - 1, width);  // the last row sees most
    if (len == 0) continue;
    const std::vector<double> k = decode_keys(cache, g, block_table, b, len);
    request_rows(s, qd, weights, k, b, L, width, magnitude, visit);
  }
}

}  // namespace

void check_geometry(const CacheGeometry& g) {
  expect(g.head_dim > 0 && g.head_dim % fp4::kMxfp4Block == 0,
         "head_dim must be a positive multiple of 32, got " + std::to_string(g.head_dim));
  expect(g.page_size >= 1, "page_size must be >= 1");
  if (g.format == KeyFormat::nvfp4) {
    expect(std::isfinite(g.global_scale) && g.global_scale > 0,
           "the nvfp4 global scale must be finite and > 0, got " + std::to_string(g.global_scale));
    expect(g.n_per_tile == 0, "nvfp4 pages are in natural order (AITER's preshuffle is MXFP4's)");
  }
  if (g.n_per_tile == 0) return;
  expect(g.n_per_tile == 16 || g.n_per_tile == 32,
         "n_per_tile must be 0 (natural), 16 or 32, got " + std::to_string(g.n_per_tile));
  expect(g.page_size % g.n_per_tile == 0, "a preshuffled page of " + std::to_string(g.page_size) +
                                              " entries must be a multiple of n_per_tile " +
                                              std::to_string(g.n_per_tile));
  expect(g.scale_count() >= kWarp / g.n_per_tile,
         "the wide scale order needs D/32 >= 64 / n_per_tile (" +
             std::to_string(kWarp / g.n_per_tile) + "), head_dim " + std::to_string(g.head_dim) +
             " has " + std::to_string(g.scale_count()));
}

int64_t value_offset(const CacheGeometry& g, int64_t t, int64_t c) {
  if (g.n_per_tile == 0) return t * g.value_bytes() + c;
  // AITER preshuffle_values: [page/npt, npt, D/32, 16] -> [page/npt, D/32, npt, 16]
  const int64_t npt = g.n_per_tile, groups = g.value_bytes() / kShuffleWidth;
  return (((t / npt) * groups + c / kShuffleWidth) * npt + t % npt) * kShuffleWidth +
         c % kShuffleWidth;
}

int64_t scale_offset(const CacheGeometry& g, int64_t t, int64_t s) {
  const int64_t base = g.page_size * g.value_bytes(), ns = g.scale_count();
  if (g.n_per_tile == 0) return base + t * ns + s;
  // AITER preshuffle_scales, mode 1: [page/npt, npt, s_hi, s_lo] -> [page/npt, s_lo, npt, s_hi]
  const int64_t npt = g.n_per_tile, s_lo = kWarp / npt, s_hi = ns / s_lo;
  return base + (((t / npt) * s_lo + s % s_lo) * npt + t % npt) * s_hi + s / s_lo;
}

void check_cache(const Tensor& cache, const CacheGeometry& g) {
  check_geometry(g);
  expect_dtype(cache, DType::u8, "kv_cache");
  expect(cache.ndim() == 3 && cache.size(1) == g.page_size && cache.size(2) == g.entry_bytes(),
         "kv_cache must be [num_pages, " + std::to_string(g.page_size) + ", " +
             std::to_string(g.entry_bytes()) + "], got " + cache.describe());
  expect(cache.stride(2) == 1 && cache.stride(1) == g.entry_bytes() &&
             cache.stride(0) >= g.page_bytes(),
         "kv_cache pages must be contiguous with stride(0) >= the page, got " + cache.describe());
}

Tensor write_k_cache(const Tensor& cache, const Tensor& k, const Tensor& slot_mapping,
                     const CacheGeometry& g, fp4::MxScaleRule rule) {
  check_cache(cache, g);
  expect_dtype(k, DType::bf16, "k");
  expect_dtype(slot_mapping, DType::i64, "slot_mapping");
  const int64_t T = slot_mapping.numel(), D = g.head_dim;
  expect(slot_mapping.ndim() == 1 && k.ndim() == 2 && k.size(1) == D && k.size(0) >= T,
         "k must be [>= T, " + std::to_string(D) + "], got " + k.describe());
  auto storage = std::make_shared<Storage>(*cache.storage());
  Tensor out = cache.rebased(storage);
  const int64_t capacity = cache.size(0) * g.page_size;
  std::vector<double> row(static_cast<size_t>(D));
  std::vector<uint8_t> packed(static_cast<size_t>(D / 2)),
      scales(static_cast<size_t>(g.scale_count()));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t slot = slot_mapping.at<int64_t>({i});
    if (slot < 0) continue;  // padding token: nothing is written
    expect(slot < capacity, "slot " + std::to_string(slot) + " past the cache");
    for (int64_t d = 0; d < D; ++d) row[d] = k.get({i, d});
    if (g.format == KeyFormat::nvfp4)
      fp4::nvfp4_quantize(row, g.global_scale, fp4::E2m1Rounding::nearest_even,
                          fp4::NibbleOrder::low_first, packed, scales);
    else
      fp4::mxfp4_quantize(row, rule, fp4::E2m1Rounding::nearest_even, fp4::NibbleOrder::low_first,
                          packed, scales);
    const int64_t page = slot / g.page_size, t = slot % g.page_size;
    auto* base = const_cast<uint8_t*>(page_ptr(out, g, page));
    for (int64_t c = 0; c < D / 2; ++c) base[value_offset(g, t, c)] = packed[c];
    for (int64_t s = 0; s < g.scale_count(); ++s) base[scale_offset(g, t, s)] = scales[s];
  }
  return out;
}

void read_key(const Tensor& cache, const CacheGeometry& g, int64_t page, int64_t t, double* out) {
  expect(t >= 0 && t < g.page_size, "entry " + std::to_string(t) + " outside the page");
  const uint8_t* base = page_ptr(cache, g, page);
  for (int64_t c = 0; c < g.value_bytes(); ++c) {
    const uint8_t byte = base[value_offset(g, t, c)];
    const uint8_t sb = base[scale_offset(g, t, (2 * c) / g.block())];
    for (int i = 0; i < 2; ++i) {
      const uint8_t code = fp4::unpack_nibble(byte, i);
      out[2 * c + i] = g.format == KeyFormat::nvfp4 ? fp4::nvfp4_decode(code, sb, g.global_scale)
                                                    : fp4::e2m1_decode(code) * fp4::e8m0_decode(sb);
    }
  }
}

int64_t decode_row_end(int64_t context_len, int64_t next_n, int64_t n, int64_t width) {
  return std::clamp<int64_t>(context_len - next_n + n + 1, 0, width);
}

Tensor paged_logits(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                    const CacheGeometry& g, const Tensor& weights, const Tensor& context_lens,
                    const Tensor& block_table, int64_t max_model_len) {
  Tensor out = Tensor::full(DType::f32, {q.size(0) * q.size(1), max_model_len},
                            -std::numeric_limits<double>::infinity());
  for_each_logit(q, q_scale, cache, g, weights, context_lens, block_table, max_model_len, false,
                 [&](int64_t r, int64_t p, double v) {
                   out.at<float>({r, p}) = static_cast<float>(v);
                 });
  return out;
}

double max_logit_terms(const Tensor& q, const Tensor& q_scale, const Tensor& cache,
                       const CacheGeometry& g, const Tensor& weights, const Tensor& context_lens,
                       const Tensor& block_table, int64_t max_model_len) {
  double best = 0;
  for_each_logit(q, q_scale, cache, g, weights, context_lens, block_table, max_model_len, true,
                 [&](int64_t, int64_t, double v) { best = std::max(best, v); });
  return best;
}

}  // namespace attncheck::ref::mxfp4
