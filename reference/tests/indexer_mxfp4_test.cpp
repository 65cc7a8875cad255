// The MXFP4 indexer reference against a second formulation: the preshuffled page built with
// reshape/permute exactly as AITER's preshuffle_values / preshuffle_scales (mode 1) write it, and
// logits computed straight from the natural-order bytes with pow(2, s - 127) and a nibble table.
#include "reference/indexer_mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace attncheck::ref::mxfp4 {
namespace {

constexpr double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
double nibble_value(unsigned n) {
  return (n & 8) ? -kMag[n & 7] : kMag[n & 7];
}

// AITER's torch: x.reshape(rows/npt, npt, D/32, 16).permute(0, 2, 1, 3) for values and
// x.reshape(rows/npt, npt, s_hi, s_lo).permute(0, 3, 1, 2) for scales (one page).
Tensor shuffle_values(const Tensor& natural, int64_t npt) {
  const int64_t rows = natural.size(0), d = natural.size(1);
  return natural.reshape({rows / npt, npt, d / 16, 16}).permute({0, 2, 1, 3}).contiguous();
}
Tensor shuffle_scales(const Tensor& natural, int64_t npt) {
  const int64_t rows = natural.size(0), ns = natural.size(1), s_lo = 64 / npt;
  return natural.reshape({rows / npt, npt, ns / s_lo, s_lo}).permute({0, 3, 1, 2}).contiguous();
}

struct Geo {
  int64_t D, S, npt;
};
constexpr Geo kShuffled[] = {{128, 16, 16}, {128, 32, 32}, {128, 64, 16},
                             {128, 64, 32}, {64, 64, 32},  {256, 32, 16}};

TEST(Mxfp4Cache, OffsetsMatchAiterPreshuffleReshapes) {
  for (const Geo& geo : kShuffled) {
    const CacheGeometry g{geo.D, geo.S, geo.npt};
    check_geometry(g);
    Tensor values = Tensor::empty(DType::i32, {geo.S, geo.D / 2});
    Tensor scales = Tensor::empty(DType::i32, {geo.S, geo.D / 32});
    for (int64_t t = 0; t < geo.S; ++t) {
      for (int64_t c = 0; c < geo.D / 2; ++c)
        values.at<int32_t>({t, c}) = static_cast<int32_t>(t * 1000 + c);
      for (int64_t s = 0; s < geo.D / 32; ++s)
        scales.at<int32_t>({t, s}) = static_cast<int32_t>(t * 1000 + s);
    }
    const Tensor sv = shuffle_values(values, geo.npt), ss = shuffle_scales(scales, geo.npt);
    const auto* v = reinterpret_cast<const int32_t*>(sv.data());
    const auto* s = reinterpret_cast<const int32_t*>(ss.data());
    const int64_t base = geo.S * geo.D / 2;
    for (int64_t t = 0; t < geo.S; ++t) {
      for (int64_t c = 0; c < geo.D / 2; ++c)
        ASSERT_EQ(t * 1000 + c, v[value_offset(g, t, c)])
            << geo.D << "/" << geo.S << "/" << geo.npt;
      for (int64_t k = 0; k < geo.D / 32; ++k)
        ASSERT_EQ(t * 1000 + k, s[scale_offset(g, t, k) - base]) << geo.D << "/" << geo.npt;
    }
  }
}

TEST(Mxfp4Cache, GeometryRefusalsNameTheProblem) {
  EXPECT_THROW(check_geometry({48, 16, 0}), std::invalid_argument);
  EXPECT_THROW(check_geometry({128, 16, 32}), std::invalid_argument);  // page not whole tiles
  EXPECT_THROW(check_geometry({32, 32, 32}), std::invalid_argument);   // 1 scale < 64/32
  EXPECT_THROW(check_geometry({64, 16, 16}), std::invalid_argument);   // 2 scales < 64/16
  EXPECT_NO_THROW(check_geometry({32, 1, 0}));
}

// Random bytes in natural order (scales in [lo, hi]), laid out in the page order of `g`.
struct Page {
  std::vector<uint8_t> values, scales;  // natural [S, D/2], [S, D/32]
};
Tensor make_cache(const CacheGeometry& g, int64_t pages, int64_t pad, std::vector<Page>& natural,
                  Rng& rng) {
  const int64_t stride = g.page_bytes() + pad;
  Tensor storage = Tensor::empty(DType::u8, {pages * stride});
  for (int64_t i = 0; i < pages * stride; ++i)
    storage.at<uint8_t>({i}) = static_cast<uint8_t>(rng.uniform_int(0, 255));
  Tensor cache =
      storage.as_strided({pages, g.page_size, g.entry_bytes()}, {stride, g.entry_bytes(), 1}, 0);
  natural.assign(static_cast<size_t>(pages), {});
  for (int64_t p = 0; p < pages; ++p) {
    Tensor v = Tensor::empty(DType::u8, {g.page_size, g.value_bytes()});
    Tensor s = Tensor::empty(DType::u8, {g.page_size, g.scale_count()});
    for (int64_t i = 0; i < v.numel(); ++i)
      reinterpret_cast<uint8_t*>(v.data())[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
    for (int64_t i = 0; i < s.numel(); ++i)
      reinterpret_cast<uint8_t*>(s.data())[i] = static_cast<uint8_t>(rng.uniform_int(110, 135));
    natural[p].values.assign(reinterpret_cast<uint8_t*>(v.data()),
                             reinterpret_cast<uint8_t*>(v.data()) + v.numel());
    natural[p].scales.assign(reinterpret_cast<uint8_t*>(s.data()),
                             reinterpret_cast<uint8_t*>(s.data()) + s.numel());
    const Tensor sv = g.n_per_tile ? shuffle_values(v, g.n_per_tile) : v;
    const Tensor ss = g.n_per_tile ? shuffle_scales(s, g.n_per_tile) : s;
    auto* page = reinterpret_cast<uint8_t*>(cache.element_ptr(Index{p, 0, 0}));
    std::memcpy(page, sv.data(), static_cast<size_t>(sv.numel()));
    std::memcpy(page + g.page_size * g.value_bytes(), ss.data(), static_cast<size_t>(ss.numel()));
  }
  return cache;
}

double natural_key(const CacheGeometry& g, const Page& page, int64_t t, int64_t d) {
  const uint8_t byte = page.values[t * g.value_bytes() + d / 2];
  const unsigned nib = d % 2 == 0 ? (byte & 15u) : (byte >> 4);
  return nibble_value(nib) * std::pow(2.0, page.scales[t * g.scale_count() + d / 32] - 127.0);
}

TEST(Mxfp4Logits, MatchABruteForceSumOverNaturalBytes) {
  for (const CacheGeometry g : {CacheGeometry{128, 64, 16}, CacheGeometry{64, 16, 0},
                                CacheGeometry{32, 1, 0}, CacheGeometry{128, 32, 32}}) {
    Rng rng("mxfp4_logits", "all", static_cast<uint64_t>(g.head_dim + g.page_size));
    const int64_t B = 3, NN = 2, H = 4, pages = 24, W = 8;
    std::vector<Page> nat;
    const Tensor cache = make_cache(g, pages, 16, nat, rng);
    Tensor q = Tensor::empty(DType::u8, {B, NN, H, g.value_bytes()});
    Tensor qs = Tensor::empty(DType::u8, {B, NN, H, g.scale_count()});
    for (int64_t i = 0; i < q.numel(); ++i)
      reinterpret_cast<uint8_t*>(q.data())[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
    for (int64_t i = 0; i < qs.numel(); ++i)
      reinterpret_cast<uint8_t*>(qs.data())[i] = static_cast<uint8_t>(rng.uniform_int(120, 130));
    Tensor w = Tensor::empty(DType::f32, {B * NN, H});
    fill_normal(w, rng);
    const int64_t width = std::min<int64_t>(W * g.page_size, 150);
    Tensor lens = Tensor::empty(DType::i32, {B});
    Tensor table = Tensor::empty(DType::i32, {B, W});
    const std::vector<int64_t> perm = permutation(pages, rng);
    for (int64_t b = 0; b < B; ++b) {
      lens.at<int32_t>({b}) = static_cast<int32_t>(b == 0 ? 1 : rng.uniform_int(2, width));
      for (int64_t j = 0; j < W; ++j)
        table.at<int32_t>({b, j}) = static_cast<int32_t>(perm[(b * W + j) % pages]);
    }
    const Tensor got = paged_logits(q, qs, cache, g, w, lens, table, width);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < NN; ++n) {
        const int64_t r = b * NN + n, end = lens.at<int32_t>({b}) - NN + n + 1;
        for (int64_t p = 0; p < width; ++p) {
          if (p >= end) {
            ASSERT_EQ(-std::numeric_limits<float>::infinity(), got.at<float>({r, p}));
            continue;
          }
          const Page& page = nat[table.at<int32_t>({b, p / g.page_size})];
          double expected = 0;
          for (int64_t h = 0; h < H; ++h) {
            double dot = 0;
            for (int64_t d = 0; d < g.head_dim; ++d) {
              const uint8_t byte = q.at<uint8_t>({b, n, h, d / 2});
              const double qv = nibble_value(d % 2 == 0 ? (byte & 15u) : (byte >> 4)) *
                                std::pow(2.0, qs.at<uint8_t>({b, n, h, d / 32}) - 127.0);
              dot += qv * natural_key(g, page, p % g.page_size, d);
            }
            expected += w.at<float>({r, h}) * std::max(dot, 0.0);
          }
          ASSERT_NEAR(expected, got.at<float>({r, p}), 1e-6 * std::fabs(expected) + 1e-30)
              << "D " << g.head_dim << " S " << g.page_size << " row " << r << " pos " << p;
        }
      }
  }
}

TEST(Mxfp4Cache, WriterQuantizesIntoTheSlotAndLeavesEverythingElse) {
  const CacheGeometry g{128, 32, 32};
  Rng rng("mxfp4_writer", "all");
  std::vector<Page> nat;
  const Tensor cache = make_cache(g, 4, 8, nat, rng);
  Tensor k = Tensor::empty(DType::bf16, {5, 128});
  fill_normal(k, rng, 0.0, 3.0);
  Tensor slots = Tensor::empty(DType::i64, {4});
  const int64_t want[] = {33, -1, 127, 0};
  for (int i = 0; i < 4; ++i) slots.at<int64_t>({i}) = want[i];
  const Tensor out = write_k_cache(cache, k, slots, g, fp4::MxScaleRule::ceil);
  // Independently: bytes of untouched entries and the page padding equal the input's.
  const auto* before = reinterpret_cast<const uint8_t*>(cache.storage()->bytes.data());
  const auto* after = reinterpret_cast<const uint8_t*>(out.storage()->bytes.data());
  const int64_t stride = g.page_bytes() + 8;
  for (int64_t i = 0; i < 4 * stride; ++i) {
    const int64_t page = i / stride, off = i % stride;
    bool written = false;
    for (int64_t slot : {33, 127, 0})
      if (slot / 32 == page && off < g.page_bytes()) {
        const int64_t t = slot % 32;
        for (int64_t c = 0; c < 64; ++c) written |= value_offset(g, t, c) == off;
        for (int64_t s = 0; s < 4; ++s) written |= scale_offset(g, t, s) == off;
      }
    if (!written) {
      ASSERT_EQ(before[i], after[i]) << "byte " << i;
    }
  }
  // Written entries decode to k within the e2m1 grid of the ceil scale: |x - q| <= half a step.
  for (int row : {0, 2, 3}) {
    std::vector<double> dec(128);
    read_key(out, g, want[row] / 32, want[row] % 32, dec.data());
    for (int b = 0; b < 4; ++b) {
      double amax = 0;
      for (int d = 0; d < 32; ++d) amax = std::max(amax, std::fabs(k.get({row, b * 32 + d})));
      const double scale = std::pow(2.0, std::ceil(std::log2(amax / 6)));
      for (int d = b * 32; d < b * 32 + 32; ++d)
        ASSERT_LE(std::fabs(dec[d] - k.get({row, d})), scale * 1.0 + 1e-30) << "row " << row;
    }
  }
}

// e4m3fn by its bit fields (bias 7, subnormals m * 2^-9), for bytes 0..0x7E.
double e4m3_by_fields(unsigned byte) {
  const unsigned e = byte >> 3, m = byte & 7;
  return e == 0 ? m * std::ldexp(1.0, -9)
                : (1 + m / 8.0) * std::ldexp(1.0, static_cast<int>(e) - 7);
}

// NVFP4 keys, checked against a second formulation: the page's value bytes at t * D/2 + c, then
// its scales at S * D/2 + t * D/16 + s; each scale byte the e4m3 value nearest amax / (6 * global)
// (ties to the even byte, 448 at most) found by search; each element e2m1 * e4m3 * global.
TEST(Nvfp4Cache, WriterAndReaderFollowTheFormatDefinition) {
  const float global = 0.0371f;
  const CacheGeometry g{64, 16, 0, KeyFormat::nvfp4, global};
  EXPECT_EQ(g.entry_bytes(), 32 + 4);
  const Tensor cache = Tensor::filled_bytes(DType::u8, {2, 16, 36}, std::byte{0xFF});
  Rng rng("nvfp4_writer", "all");
  Tensor k = Tensor::empty(DType::bf16, {3, 64});
  fill_normal(k, rng, 0.0, 3.0);
  for (int d = 0; d < 16; ++d) k.set({1, d}, 0.0);              // a zero block: byte 0, zero codes
  for (int d = 16; d < 32; ++d) k.set({1, d}, 1e4 * (d - 20));  // saturates at 448
  Tensor slots = Tensor::empty(DType::i64, {3});
  const int64_t want[] = {5, 17, 31};
  for (int i = 0; i < 3; ++i) slots.at<int64_t>({i}) = want[i];
  const Tensor out = write_k_cache(cache, k, slots, g, fp4::MxScaleRule::ceil);
  const auto* bytes = reinterpret_cast<const uint8_t*>(out.storage()->bytes.data());
  for (int row = 0; row < 3; ++row) {
    const int64_t page = want[row] / 16, t = want[row] % 16;
    const uint8_t* base = bytes + page * 16 * 36;
    std::vector<double> dec(64);
    read_key(out, g, page, t, dec.data());
    for (int b = 0; b < 4; ++b) {
      double amax = 0;
      for (int d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(k.get({row, b * 16 + d})));
      const double target = amax / (6.0 * global);
      unsigned best = 0;
      for (unsigned c = 1; c <= 0x7E; ++c) {
        const double dc = std::fabs(e4m3_by_fields(c) - target),
                     db = std::fabs(e4m3_by_fields(best) - target);
        if (dc < db || (dc == db && c % 2 == 0)) best = c;
      }
      const uint8_t sb = base[16 * 32 + t * 4 + b];
      ASSERT_EQ(sb, best) << "row " << row << " block " << b;
      for (int d = b * 16; d < b * 16 + 16; ++d) {
        const uint8_t byte = base[t * 32 + d / 2];
        const double v = nibble_value(d % 2 ? byte >> 4 : byte & 15) * e4m3_by_fields(sb) * global;
        ASSERT_EQ(dec[d], v) << "row " << row << " element " << d;
      }
    }
  }
  EXPECT_EQ(bytes[16 * 32 + 6 * 4], 0xFF);  // slot 6 (page 0) is nobody's: untouched
}

}  // namespace
}  // namespace attncheck::ref::mxfp4
