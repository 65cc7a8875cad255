// The batched generators (core/rng.cpp) against their per-element definitions (rng_definition.h),
// bit for bit, under each Philox kernel this CPU can run: goldens and every case's inputs are keyed
// by these bytes, so a kernel may be faster but never different.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/rng.h"
#include "core/tests/rng_definition.h"
#include "core/tests/test_util.h"

namespace attncheck {
namespace {

namespace def = rng_definition;

class PhiloxKernels : public ::testing::TestWithParam<PhiloxKernel> {
 protected:
  void SetUp() override {
    if (!philox_kernel_available(GetParam())) GTEST_SKIP() << "this CPU lacks the kernel";
    set_philox_kernel(GetParam());
    ASSERT_EQ(philox_kernel(), GetParam());
  }
  void TearDown() override { reset_philox_kernel(); }
};

std::string kernel_name(const ::testing::TestParamInfo<PhiloxKernel>& info) {
  return info.param == PhiloxKernel::avx2 ? "avx2" : "portable";
}

INSTANTIATE_TEST_SUITE_P(Rng, PhiloxKernels,
                         ::testing::Values(PhiloxKernel::portable, PhiloxKernel::avx2),
                         kernel_name);

// Keys of different cases and tensors, plus the extremes of the 64-bit key.
std::vector<Rng> keys() {
  std::vector<Rng> out;
  for (int c = 0; c < 24; ++c)
    out.emplace_back("rng_batch_test/case" + std::to_string(c), c % 2 ? "q" : "kv", c / 3);
  out.emplace_back(uint64_t{0});
  out.emplace_back(~uint64_t{0});
  out.emplace_back(uint64_t{0xFFFFFFFF});
  return out;
}

// First counters: 0, unaligned starts, and the elements whose counters (k for blocks, 3k .. 3k+2
// for normals) carry into the high 32-bit word, or wrap at 2^64.
const uint64_t kFirsts[] = {0,
                            1,
                            7,
                            61,
                            1000003,
                            0xFFFFFFFFull - 40,
                            0xFFFFFFFFull / 3 - 37,
                            0x1FFFFFFFFull / 3 - 5,
                            0x123456789ABull,
                            ~uint64_t{0} - 50,
                            ~uint64_t{0} / 3 - 30};
// Counts: below one lane group, around the group (8) and chunk (64) sizes, several chunks.
const size_t kCounts[] = {0, 1, 3, 7, 8, 9, 31, 63, 64, 65, 127, 129, 200};

TEST_P(PhiloxKernels, RunsEqualThePerElementValues) {
  for (const Rng& rng : keys())
    for (uint64_t first : kFirsts)
      for (size_t n : kCounts) {
        std::vector<double> normal(n), uniform(n);
        rng.normal_run(first, normal);
        rng.uniform_run(first, uniform);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(normal[i], rng.normal_at(first + i))
              << "key " << rng.key() << " element " << first + i;
          ASSERT_EQ(uniform[i], rng.uniform_at(first + i))
              << "key " << rng.key() << " element " << first + i;
        }
      }
}

// A fill under test and its definition, run on two copies of the same layout.
using Fill = std::function<void(const Tensor&)>;

struct Layout {
  std::string name;
  Shape storage_shape;
  std::function<Tensor(const Tensor&)> view;  // of a storage of storage_shape
};

// Contiguous tensors with tails of every size, and views: offsets that misalign the first element,
// steps, transposes, selected columns (one element per row), broadcast (stride 0) and overlapping
// rows (later elements overwrite earlier ones, in logical order).
std::vector<Layout> layouts() {
  auto same = [](const Tensor& t) { return t; };
  std::vector<Layout> out;
  for (int64_t n : {1, 5, 8, 63, 64, 65, 130, 1000, 4099})
    out.push_back({"contiguous[" + std::to_string(n) + "]", {n}, same});
  out.push_back({"contiguous[3,5,7]", {3, 5, 7}, same});
  out.push_back({"rank0", {}, same});
  out.push_back({"empty", {4, 0, 3}, same});
  out.push_back({"offset", {301}, [](const Tensor& t) { return t.slice(0, 3, 300); }});
  out.push_back(
      {"inner slice", {9, 70}, [](const Tensor& t) { return t.slice(0, 1, 8).slice(1, 5, 66); }});
  out.push_back({"step", {1000}, [](const Tensor& t) { return t.slice(0, 1, 999, 3); }});
  out.push_back({"column", {77, 5}, [](const Tensor& t) { return t.select(1, 3); }});
  out.push_back({"transpose", {37, 29}, [](const Tensor& t) { return t.permute({1, 0}); }});
  out.push_back({"permuted 3d", {6, 11, 13}, [](const Tensor& t) { return t.permute({2, 0, 1}); }});
  out.push_back(
      {"merged dims", {4, 6, 10}, [](const Tensor& t) { return t.slice(2, 0, 7).unsqueeze(1); }});
  out.push_back(
      {"one run", {4, 6, 10}, [](const Tensor& t) { return t.slice(0, 1, 3).unsqueeze(1); }});
  out.push_back({"broadcast", {40}, [](const Tensor& t) {
                   return t.as_strided({5, 3, 8}, {8, 0, 1}, 0);
                 }});
  out.push_back({"overlapping rows", {200}, [](const Tensor& t) {
                   return t.as_strided({20, 30}, {7, 1}, 2);
                 }});
  out.push_back({"sliding windows", {80}, [](const Tensor& t) {
                   return t.as_strided({9, 70}, {1, 1}, 0);
                 }});
  out.push_back({"zero stride row", {30}, [](const Tensor& t) {
                   return t.as_strided({9, 70}, {3, 0}, 1);
                 }});
  return out;
}

// Both fills over fresh storages full of 0xA5 (bytes outside the view must stay so), compared
// byte for byte over the whole storage.
void expect_same_bytes(DType dt, const Layout& layout, const Fill& batched, const Fill& definition,
                       const std::string& what) {
  const Tensor want_base = Tensor::filled_bytes(dt, layout.storage_shape, std::byte{0xA5});
  const Tensor got_base = Tensor::filled_bytes(dt, layout.storage_shape, std::byte{0xA5});
  definition(layout.view(want_base));
  batched(layout.view(got_base));
  const auto& want = want_base.storage()->bytes;
  const auto& got = got_base.storage()->bytes;
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(want[i], got[i]) << what << ", " << dtype_name(dt) << ", " << layout.name
                               << ": storage byte " << i;
}

const DType kFloatTypes[] = {DType::f64,    DType::f32,      DType::f16,  DType::bf16,
                             DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz};

// (mean, stddev): the usual ones, scales that reach the formats' subnormals and zero, overflow
// (inf for f16/bf16, saturation for fp8), and exact zeros.
const std::pair<double, double> kMoments[] = {{0.0, 1.0},   {0.5, 2.0}, {-3.0, 0.25}, {0.0, 1e-6},
                                              {0.0, 3e-41}, {0.0, 1e5}, {1.0, 0.0},   {-0.0, 0.0}};

TEST_P(PhiloxKernels, FillNormalEqualsTheDefinitionForEveryFloatType) {
  const auto all = layouts();
  for (DType dt : kFloatTypes)
    for (const auto& moments : kMoments)
      for (const Layout& layout : all) {
        const double mean = moments.first, stddev = moments.second;  // lambdas capture these
        const Rng rng("rng_batch_test/normal", layout.name + std::to_string(stddev));
        expect_same_bytes(
            dt, layout, [&](const Tensor& t) { fill_normal(t, rng, mean, stddev); },
            [&](const Tensor& t) { def::fill_normal(t, rng, mean, stddev); },
            "fill_normal(" + std::to_string(mean) + ", " + std::to_string(stddev) + ")");
      }
}

TEST_P(PhiloxKernels, FillNormalEqualsTheDefinitionForIntegerTypes) {
  for (DType dt : {DType::i8, DType::u8, DType::i32, DType::i64})
    for (const Layout& layout : layouts()) {
      const Rng rng("rng_batch_test/normal_int", layout.name);
      expect_same_bytes(
          dt, layout, [&](const Tensor& t) { fill_normal(t, rng, 20.0, 3.0); },
          [&](const Tensor& t) { def::fill_normal(t, rng, 20.0, 3.0); }, "fill_normal");
    }
}

TEST_P(PhiloxKernels, FillNormalOverManyKeys) {
  const Layout layout{"contiguous[2,300]", {2, 300}, [](const Tensor& t) { return t; }};
  for (const Rng& rng : keys())
    for (DType dt : {DType::bf16, DType::f16, DType::e4m3fn, DType::f32})
      expect_same_bytes(
          dt, layout, [&](const Tensor& t) { fill_normal(t, rng); },
          [&](const Tensor& t) { def::fill_normal(t, rng); },
          "fill_normal, key " + std::to_string(rng.key()));
}

TEST_P(PhiloxKernels, OtherFillsEqualTheirDefinitions) {
  for (const Layout& layout : layouts()) {
    const Rng rng("rng_batch_test/others", layout.name);
    for (DType dt : kFloatTypes)
      expect_same_bytes(
          dt, layout, [&](const Tensor& t) { fill_uniform(t, rng, -1.5, 2.0); },
          [&](const Tensor& t) { def::fill_uniform(t, rng, -1.5, 2.0); }, "fill_uniform");
    for (DType dt : {DType::i32, DType::i64, DType::u8, DType::f32, DType::bf16})
      expect_same_bytes(
          dt, layout, [&](const Tensor& t) { fill_uniform_int(t, rng, 3, 200); },
          [&](const Tensor& t) { def::fill_uniform_int(t, rng, 3, 200); }, "fill_uniform_int");
    expect_same_bytes(
        DType::i64, layout, [&](const Tensor& t) { fill_uniform_int(t, rng, -(1ll << 40), 7); },
        [&](const Tensor& t) { def::fill_uniform_int(t, rng, -(1ll << 40), 7); },
        "fill_uniform_int wide");
    for (DType dt : {DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz})
      for (double max_abs : {0.0, 0.5, 8.0, 1e9})
        expect_same_bytes(
            dt, layout, [&](const Tensor& t) { fill_fp8_codes(t, rng, max_abs); },
            [&](const Tensor& t) { def::fill_fp8_codes(t, rng, max_abs); }, "fill_fp8_codes");
  }
}

// A sparse storage: its held rows are written from the host window; a view reaching outside the
// window throws for the first such element, after writing those before it, as defined.
TEST_P(PhiloxKernels, SparseStoragesEqualTheDefinition) {
  for (DType dt : {DType::bf16, DType::e4m3fn, DType::f32}) {
    const Rng rng("rng_batch_test/sparse", "k");
    auto make = [&] { return Tensor::sparse(dt, {100, 24}, 24 * 30 + 5, 24 * 41 - 2); };
    const Tensor want = make(), got = make();
    ASSERT_EQ(got.held_rows().size(0), 40);  // rows 31 .. 70 of the window [725, 1707)
    def::fill_normal(want.held_rows(), rng);
    fill_normal(got.held_rows(), rng);
    EXPECT_EQ(want.storage()->bytes, got.storage()->bytes) << dtype_name(dt) << " held rows";

    const Tensor want_all = make(), got_all = make();
    const std::string want_error = testing_util::error_of<std::out_of_range>(
        [&] { def::fill_normal(want_all.slice(0, 31, 100), rng); });
    const std::string got_error = testing_util::error_of<std::out_of_range>(
        [&] { fill_normal(got_all.slice(0, 31, 100), rng); });
    EXPECT_EQ(want_error, got_error);
    EXPECT_TRUE(testing_util::Contains(got_error, "outside its host window"));
    EXPECT_EQ(want_all.storage()->bytes, got_all.storage()->bytes)
        << dtype_name(dt) << " up to the first element outside the window";
  }
}

// A value an integer dtype cannot hold throws, every element before it written, as defined.
TEST_P(PhiloxKernels, UnencodableValuesThrowAfterTheElementsBeforeThem) {
  for (const Layout& layout : layouts()) {
    if (layout.storage_shape.empty() || layout.storage_shape[0] < 60) continue;
    const Rng rng("rng_batch_test/throw", layout.name);
    const Tensor want = Tensor::filled_bytes(DType::i8, layout.storage_shape, std::byte{0xA5});
    const Tensor got = Tensor::filled_bytes(DType::i8, layout.storage_shape, std::byte{0xA5});
    const std::string want_error = testing_util::error_of<std::out_of_range>(
        [&] { def::fill_normal(layout.view(want), rng, 110.0, 12.0); });
    const std::string got_error = testing_util::error_of<std::out_of_range>(
        [&] { fill_normal(layout.view(got), rng, 110.0, 12.0); });
    EXPECT_EQ(want_error, got_error) << layout.name;
    EXPECT_TRUE(testing_util::Contains(got_error, "is not representable in i8"));
    EXPECT_EQ(want.storage()->bytes, got.storage()->bytes) << layout.name;
  }
}

TEST(FillFp8Codes, NoAdmissibleCodeIsAnError) {
  const Tensor t = Tensor::empty(DType::e4m3fn, {4});
  EXPECT_TRUE(testing_util::Contains(
      testing_util::error_of<std::invalid_argument>([&] { fill_fp8_codes(t, Rng(1), -1.0); }),
      "no finite fp8_e4m3fn value"));
}

// The kernel switch itself: the fastest is the default, and the portable one is always there.
TEST(PhiloxKernelChoice, DefaultsToTheFastestAvailable) {
  reset_philox_kernel();
  EXPECT_TRUE(philox_kernel_available(PhiloxKernel::portable));
  EXPECT_EQ(philox_kernel(), philox_kernel_available(PhiloxKernel::avx2) ? PhiloxKernel::avx2
                                                                         : PhiloxKernel::portable);
  set_philox_kernel(PhiloxKernel::portable);
  EXPECT_EQ(philox_kernel(), PhiloxKernel::portable);
  reset_philox_kernel();
  if (!philox_kernel_available(PhiloxKernel::avx2)) {
    EXPECT_THROW(set_philox_kernel(PhiloxKernel::avx2), std::invalid_argument);
  }
}

// The chunked minifloat encoder against encode_minifloat over values that take its fast path and
// those that do not (zeros, subnormals, overflow, inf, NaN, rounding ties at every binade).
TEST(EncodeMinifloats, EqualsEncodeMinifloatValueByValue) {
  std::vector<double> xs = {0.0,
                            -0.0,
                            1.0,
                            -1.0,
                            1e-300,
                            -1e-300,
                            1e300,
                            -1e300,
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  const Rng rng("rng_batch_test/encode", "x");
  for (uint64_t k = 0; k < 20000; ++k) {
    const double u = rng.uniform_at(k);
    const int e = static_cast<int>(k % 80) - 40;
    xs.push_back(std::ldexp(u + 1.0, e) * (k % 2 ? -1 : 1));
    // Ties: the mantissa bits right after a format's precision exactly one half.
    xs.push_back(std::ldexp(1.0 + std::ldexp(static_cast<double>(k % 64) + 0.5, -6), e));
  }
  for (DType dt :
       {DType::f16, DType::bf16, DType::e4m3fn, DType::e4m3fnuz, DType::e5m2, DType::e5m2fnuz})
    for (Saturation sat : {Saturation::saturate, Saturation::nonsaturate}) {
      const size_t width = dtype_size(dt);
      std::vector<std::byte> out(xs.size() * width);
      encode_minifloats(xs, dt, sat, out.data());
      for (size_t i = 0; i < xs.size(); ++i) {
        uint32_t code = 0;
        std::memcpy(&code, out.data() + i * width, width);
        ASSERT_EQ(code, encode_minifloat(xs[i], dt, sat))
            << dtype_name(dt) << " of " << xs[i] << (sat == Saturation::saturate ? " sat" : "");
      }
    }
  EXPECT_THROW(encode_minifloats(xs, DType::f32, Saturation::saturate, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace attncheck
