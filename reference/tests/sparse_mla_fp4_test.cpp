// The FP4 sparse-MLA record reference against a second formulation: element values from the bit
// definitions of e2m1, e4m3fn and e8m0 (exhaustive over the 16 codes x 256 scale bytes at every
// block of a record), byte offsets from the layout vLLM #57489 describes, and attention computed
// with a plain double softmax.
#include "reference/sparse_mla_fp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace attncheck::ref::fp4_record {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double e2m1_by_bits(unsigned code) {
  const unsigned e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::ldexp(1.0, static_cast<int>(e) - 1);
  return (code & 8) ? -mag : mag;
}
double e4m3fn_by_bits(unsigned b) {
  if ((b & 0x7F) == 0x7F) return kNaN;
  const int e = static_cast<int>((b >> 3) & 15);
  const double m = b & 7;
  const double mag =
      e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
double e8m0_by_bits(unsigned b) {
  return b == 0xFF ? kNaN : std::ldexp(1.0, static_cast<int>(b) - 127);
}

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// A cache of `pages` pages of P tokens, page stride page + 40 bytes, all bytes `fill`.
Tensor make_cache(Format f, int64_t pages, int64_t P, std::byte fill) {
  const int64_t rec = record_bytes(f), stride = P * rec + 40;
  return Tensor::filled_bytes(DType::u8, {pages * stride}, fill)
      .as_strided({pages, P, rec}, {stride, rec, 1}, 0);
}
uint8_t* page_ptr(const Tensor& c, int64_t page) {
  return reinterpret_cast<uint8_t*>(c.element_ptr(Index{page, 0, 0}));
}

class Fp4Record : public ::testing::TestWithParam<Format> {};

TEST_P(Fp4Record, EveryCodeTimesEveryScaleByteAtEveryBlock) {
  const Format f = GetParam();
  const int64_t P = 3, block = block_elems(f);
  const Tensor cache = make_cache(f, 2, P, std::byte{0x5A});
  uint8_t* base = page_ptr(cache, 1);
  std::vector<double> got(kDims), neighbour(kDims), neighbour_before(kDims);
  read_record(cache, f, 1, 2, neighbour_before.data());
  for (unsigned s = 0; s < 256; ++s) {
    for (int64_t c = 0; c < kDataBytes; ++c)  // element i holds code (i + s) % 16
      base[1 * kDataBytes + c] =
          static_cast<uint8_t>(((2 * c + s) % 16) | (((2 * c + 1 + s) % 16) << 4));
    for (int64_t b = 0; b < scale_bytes(f); ++b)
      base[P * kDataBytes + 1 * scale_bytes(f) + b] = static_cast<uint8_t>(s);
    read_record(cache, f, 1, 1, got.data());
    const double scale = f == Format::nvfp4 ? e4m3fn_by_bits(s) : e8m0_by_bits(s);
    for (int64_t i = 0; i < kDims; ++i) {
      const double want = e2m1_by_bits(static_cast<unsigned>((i + s) % 16)) * scale;
      ASSERT_TRUE(same(got[i], want))
          << format_name(f) << " scale byte " << s << " element " << i << " (block " << i / block
          << "): " << got[i] << " vs " << want;
    }
    read_record(cache, f, 1, 2, neighbour.data());  // the next token's bytes are its own
    for (int64_t i = 0; i < kDims; ++i) ASSERT_TRUE(same(neighbour[i], neighbour_before[i]));
  }
}

TEST_P(Fp4Record, WriterPutsBytesWhereTheLayoutSays) {
  const Format f = GetParam();
  const int64_t P = 4;
  const Tensor cache = make_cache(f, 3, P, std::byte{0xEE});
  std::vector<double> x(kDims);
  for (int64_t i = 0; i < kDims; ++i) x[i] = e2m1_by_bits(static_cast<unsigned>(i % 16));
  for (int64_t i = 7; i < kDims; i += 16) x[i] = 6.0;  // every block's amax is 6: scale 1
  write_record(cache, f, 2, 3, x.data());
  const uint8_t* base = page_ptr(cache, 2);
  const uint8_t one = f == Format::nvfp4 ? 0x38 : 127;
  for (int64_t c = 0; c < kDataBytes; ++c) {
    const auto lo = static_cast<unsigned>((2 * c) % 16),
               hi = static_cast<unsigned>((2 * c + 1) % 16);
    EXPECT_EQ(base[3 * kDataBytes + c], lo | (hi << 4)) << "data byte " << c;
  }
  for (int64_t s = 0; s < scale_bytes(f); ++s)
    EXPECT_EQ(base[P * kDataBytes + 3 * scale_bytes(f) + s], one) << "scale " << s;
  // Nothing else moved: tokens 0..2 of the page, the other pages and the padding keep 0xEE.
  const int64_t page = cache.stride(0);
  const auto* all = reinterpret_cast<const uint8_t*>(cache.data());
  for (int64_t b = 0; b < 3 * page; ++b) {
    const int64_t in_page = b % page;
    const bool data = b / page == 2 && in_page >= 3 * kDataBytes && in_page < 4 * kDataBytes;
    const int64_t s0 = P * kDataBytes + 3 * scale_bytes(f);
    const bool scale = b / page == 2 && in_page >= s0 && in_page < s0 + scale_bytes(f);
    if (!data && !scale) {
      ASSERT_EQ(all[b], 0xEE) << "byte " << b;
    }
  }
}

TEST_P(Fp4Record, RoundTripWithinHalfAnE2m1Step) {
  const Format f = GetParam();
  const Tensor cache = make_cache(f, 1, 1, std::byte{0});
  Rng rng("sparse_mla_fp4_test", "round_trip", 1);
  std::vector<double> x(kDims), y(kDims);
  for (int rep = 0; rep < 50; ++rep) {
    for (int64_t i = 0; i < kDims; ++i)
      x[i] = rng.normal() * std::ldexp(1.0, static_cast<int>(i / 64) * 3 - 12);
    write_record(cache, f, 0, 0, x.data());
    read_record(cache, f, 0, 0, y.data());
    const auto* base = page_ptr(cache, 0);
    for (int64_t i = 0; i < kDims; ++i) {
      const uint8_t sb = base[kDataBytes + i / block_elems(f)];
      const double scale = f == Format::nvfp4 ? e4m3fn_by_bits(sb) : e8m0_by_bits(sb);
      // Half the widest e2m1 gap around x / scale, or the saturation at 6 (an e4m3 subnormal
      // scale may round down by up to a third).
      const double bound =
          std::max({0.25 * scale, std::fabs(x[i]) / 4, std::fabs(x[i]) - 6 * scale});
      ASSERT_LE(std::fabs(x[i] - y[i]), bound * (1 + 1e-12))
          << "element " << i << " x " << x[i] << " scale " << scale;
    }
  }
}

TEST_P(Fp4Record, WriterFloorsAndSaturatesTheScale) {
  const Format f = GetParam();
  const Tensor cache = make_cache(f, 1, 1, std::byte{0xAA});
  std::vector<double> x(kDims, 0.0);
  for (int64_t i = block_elems(f); i < 2 * block_elems(f); ++i) x[i] = 1e-38;      // block 1: tiny
  for (int64_t i = 2 * block_elems(f); i < 3 * block_elems(f); ++i) x[i] = -3e38;  // block 2: huge
  // Block 3: amax / 6 = 1.0625, halfway between e4m3's 1 and 1.125 (ties to even: 1).
  x[3 * block_elems(f)] = 6.375;
  write_record(cache, f, 0, 0, x.data());
  const auto* base = page_ptr(cache, 0);
  const uint8_t* scales = base + kDataBytes;
  if (f == Format::nvfp4) {
    EXPECT_EQ(scales[0], 0x01);  // zero block: the 2^-9 floor
    EXPECT_EQ(scales[1], 0x01);
    EXPECT_EQ(scales[2], 0x7E);  // 448: saturated
    EXPECT_EQ(scales[3], 0x38);  // 1.0 (tie to even)
  } else {
    EXPECT_EQ(scales[0], 1);  // floor 6 x 2^-126: 2^-126
    EXPECT_EQ(scales[1], 1);
    EXPECT_EQ(scales[2], 127 + 126);  // ceil(log2(3e38 / 6)) = 126
  }
  for (int64_t c = 0; c < block_elems(f) / 2; ++c)
    EXPECT_EQ(base[c], 0) << "zero block, byte " << c;
  // Huge block: -3e38 / scale saturates or lands on -6 / -4: the sign nibble is set in every code.
  for (int64_t c = block_elems(f); c < 3 * block_elems(f) / 2; ++c)
    EXPECT_EQ(base[c] & 0x88, 0x88) << "huge block, byte " << c;
}

TEST_P(Fp4Record, AttentionMatchesADirectSoftmax) {
  const Format f = GetParam();
  const int64_t P = 16, pages = 3, T = 2, N = 16;
  const Tensor cache = make_cache(f, pages, P, std::byte{0xFF});
  Rng rng("sparse_mla_fp4_test", "attention", 2);
  std::vector<double> x(kDims);
  for (int64_t g = 0; g < pages; ++g)
    for (int64_t t = 0; t < P; ++t) {
      for (auto& v : x) v = rng.uniform() * 2 - 1;
      write_record(cache, f, g, t, x.data());
    }
  Tensor q = Tensor::empty(DType::f64, {T, N, kDims});
  for (int64_t i = 0; i < q.numel(); ++i) reinterpret_cast<double*>(q.data())[i] = rng.normal();
  const std::vector<std::vector<int32_t>> rows = {{5, 40, 17, 0}, {47}};
  RaggedIndices idx{Tensor::empty(DType::i32, {T + 1}), Tensor::empty(DType::i32, {5})};
  idx.indptr.at<int32_t>({0}) = 0;
  idx.indptr.at<int32_t>({1}) = 4;
  idx.indptr.at<int32_t>({2}) = 5;
  int64_t n = 0;
  for (const auto& r : rows)
    for (int32_t s : r) idx.indices.at<int32_t>({n++}) = s;
  const double scale = 0.05;
  const MlaResult r = sparse_mla_fp4(q, cache, f, idx, scale);
  std::vector<double> k(kDims);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < N; ++h) {
      std::vector<double> sc, out(kDims, 0.0);
      std::vector<std::vector<double>> keys;
      for (int32_t s : rows[t]) {
        read_record(cache, f, s / P, s % P, k.data());
        keys.push_back(k);
        double dot = 0;
        for (int64_t d = 0; d < kDims; ++d) dot += q.at<double>({t, h, d}) * k[d];
        sc.push_back(dot * scale);
      }
      double mx = -INFINITY, sum = 0;
      for (double s : sc) mx = std::max(mx, s);
      for (double s : sc) sum += std::exp(s - mx);
      EXPECT_NEAR(r.lse.at<double>({t, h}), mx + std::log(sum), 1e-12);
      for (size_t j = 0; j < sc.size(); ++j)
        for (int64_t d = 0; d < kDims; ++d) out[d] += std::exp(sc[j] - mx) / sum * keys[j][d];
      for (int64_t d = 0; d < kDims; ++d)
        ASSERT_NEAR(r.out.at<double>({t, h, d}), out[d], 1e-12) << t << " " << h << " " << d;
    }
}

TEST_P(Fp4Record, RefusesACacheOfAnotherRecordWidth) {
  const Format f = GetParam();
  const Format other = f == Format::nvfp4 ? Format::mxfp4 : Format::nvfp4;
  EXPECT_THROW(check_cache(make_cache(other, 2, 4, std::byte{0}), f), std::invalid_argument);
  EXPECT_NO_THROW(check_cache(make_cache(f, 2, 4, std::byte{0}), f));
  EXPECT_EQ(record_bytes(f), f == Format::nvfp4 ? 288 : 272);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp4Record, ::testing::Values(Format::nvfp4, Format::mxfp4),
                         [](const auto& param_info) {
                           return std::string(format_name(param_info.param));
                         });

}  // namespace
}  // namespace attncheck::ref::fp4_record
