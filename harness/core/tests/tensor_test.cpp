#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "test_util.h"

namespace attncheck {
namespace {

using testing_util::Contains;
using testing_util::error_of;

// [rows, cols] f32 tensor holding value 100 * r + c at (r, c).
Tensor iota2d(int64_t rows, int64_t cols, DType t = DType::f32) {
  Tensor x = Tensor::empty(t, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.set({r, c}, static_cast<double>(100 * r + c));
  return x;
}

TEST(Tensor, EmptyHasContiguousStridesAndZeroedStorage) {
  const Tensor t = Tensor::empty(DType::bf16, {2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.storage()->bytes.size(), 48u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "bf16[2,3,4] strides [12,4,1] +0");
  EXPECT_EQ(t.get({1, 2, 3}), 0.0);
  EXPECT_EQ(Tensor::empty(DType::f32, {}).numel(), 1);  // 0-d: one element
  EXPECT_EQ(Tensor::empty(DType::f32, {3, 0}).numel(), 0);
  EXPECT_TRUE(Contains(error_of([] { Tensor::empty(DType::f32, {2, -1}); }), "negative"));
}

TEST(Tensor, SliceWithStepSharesStorage) {
  const Tensor x = iota2d(4, 10);
  const Tensor s = x.slice(1, 1, 9, 3);  // columns 1, 4, 7
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.strides(), (Shape{10, 3}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.get({2, 0}), 201.0);
  EXPECT_EQ(s.get({2, 2}), 207.0);
  s.set({3, 1}, -5.0);  // writes through to the base
  EXPECT_EQ(x.get({3, 4}), -5.0);
  EXPECT_EQ(x.slice(1, -3, 10).get({0, 0}), 7.0);  // negative start counts from the end
  EXPECT_EQ(x.slice(1, 8, 100).shape()[1], 2);     // stop is clamped
  EXPECT_EQ(x.slice(0, 3, 1).shape()[0], 0);       // empty, not negative
  EXPECT_EQ(x.slice(1, 0, 10, 4).shape()[1], 3);   // 0, 4, 8
  EXPECT_TRUE(Contains(error_of([&] { x.slice(1, 0, 5, 0); }), "step must be positive"));
  EXPECT_TRUE(Contains(error_of([&] { x.slice(2, 0, 1); }), "dimension out of range"));
}

TEST(Tensor, SelectDropsTheDimension) {
  const Tensor x = iota2d(4, 10);
  const Tensor row = x.select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{10}));
  EXPECT_EQ(row.get({7}), 207.0);
  const Tensor col = x.select(1, -1);  // last column
  EXPECT_EQ(col.shape(), (Shape{4}));
  EXPECT_EQ(col.strides(), (Shape{10}));
  EXPECT_EQ(col.get({3}), 309.0);
  EXPECT_TRUE(Contains(error_of([&] { x.select(0, 4); }), "out of range"));
}

TEST(Tensor, PermuteSwapsShapeAndStrides) {
  const Tensor x = iota2d(3, 5);
  const Tensor t = x.permute({1, 0});
  EXPECT_EQ(t.shape(), (Shape{5, 3}));
  EXPECT_EQ(t.strides(), (Shape{1, 5}));
  EXPECT_EQ(t.get({4, 2}), 204.0);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(x.permute({-1, 0}).shape(), (Shape{5, 3}));
  EXPECT_TRUE(Contains(error_of([&] { x.permute({0, 0}); }), "repeated dimension"));
  EXPECT_TRUE(Contains(error_of([&] { x.permute({0}); }), "wrong rank"));
}

TEST(Tensor, AsStridedChecksTheStorageBounds) {
  const Tensor x = Tensor::empty(DType::f32, {4, 8});  // 32 elements
  const Tensor v = x.as_strided({4, 4}, {8, 2}, 1);    // last element at 1 + 24 + 6 = 31
  EXPECT_EQ(v.extent(), (std::pair<int64_t, int64_t>{1, 32}));
  const std::string msg = error_of<std::out_of_range>([&] { x.as_strided({4, 4}, {8, 2}, 2); });
  EXPECT_TRUE(Contains(msg, "exceeds storage of 32 elements"));
  EXPECT_TRUE(Contains(msg, "f32[4,4] strides [8,2] +2"));
  EXPECT_TRUE(Contains(error_of([&] { x.as_strided({4, 4}, {8}, 0); }), "rank mismatch"));
  // A negative stride walking below element 0 is out of bounds too.
  EXPECT_TRUE(Contains(error_of<std::out_of_range>([&] { x.as_strided({2}, {-1}, 0); }),
                       "exceeds storage"));
  EXPECT_EQ(x.as_strided({2}, {-1}, 1).extent(), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(x.as_strided({0, 4}, {100, 100}, 31).numel(), 0);  // empty views never exceed
}

TEST(Tensor, ExtentCoversEveryTouchedElement) {
  const Tensor x = Tensor::empty(DType::bf16, {6, 16});
  EXPECT_EQ(x.extent(), (std::pair<int64_t, int64_t>{0, 96}));
  const Tensor v = x.slice(0, 2, 5).slice(1, 3, 11, 2);          // rows 2..4, cols 3,5,7,9
  EXPECT_EQ(v.extent(), (std::pair<int64_t, int64_t>{35, 74}));  // 2*16+3 .. 4*16+9
  EXPECT_EQ(x.slice(0, 6, 6).extent().first, x.slice(0, 6, 6).extent().second);
}

TEST(Tensor, ReshapeNeedsContiguousAndSameCount) {
  const Tensor x = iota2d(4, 6);
  const Tensor r = x.reshape({2, 12});
  EXPECT_EQ(r.get({1, 1}), 201.0);  // element 13 = (2, 1)
  EXPECT_EQ(r.storage(), x.storage());
  EXPECT_TRUE(Contains(error_of([&] { x.permute({1, 0}).reshape({24}); }), "non-contiguous"));
  EXPECT_TRUE(Contains(error_of([&] { x.reshape({5, 5}); }), "element count"));
  // A contiguous view with an offset reshapes in place.
  const Tensor tail = x.slice(0, 2, 4).reshape({12});
  EXPECT_EQ(tail.offset(), 12);
  EXPECT_EQ(tail.get({0}), 200.0);
}

TEST(Tensor, UnsqueezeInsertsASizeOneDim) {
  const Tensor x = iota2d(3, 4);
  EXPECT_EQ(x.unsqueeze(0).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(x.unsqueeze(1).get({2, 0, 3}), 203.0);
  EXPECT_TRUE(x.unsqueeze(1).is_contiguous());
}

TEST(Tensor, ViewAsReinterpretsBytes) {
  Tensor x = Tensor::empty(DType::f32, {2, 4});
  x.set({0, 1}, 1.0);  // 0x3F800000 little-endian: bytes 00 00 80 3F
  const Tensor bytes = x.view_as(DType::u8);
  EXPECT_EQ(bytes.shape(), (Shape{2, 16}));
  EXPECT_EQ(bytes.get({0, 6}), 128.0);
  EXPECT_EQ(bytes.get({0, 7}), 63.0);
  const Tensor back = bytes.view_as(DType::f32);
  EXPECT_EQ(back.get({0, 1}), 1.0);
  const Tensor bits = x.view_as(DType::i32);  // same size: shape kept
  EXPECT_EQ(bits.get({0, 1}), 1065353216.0);
  const Tensor u8 = Tensor::empty(DType::u8, {3, 6});
  EXPECT_TRUE(Contains(error_of([&] { u8.view_as(DType::f32); }), "does not divide"));
  EXPECT_TRUE(Contains(error_of([&] { x.permute({1, 0}).view_as(DType::u8); }), "contiguous"));
}

TEST(Tensor, ContiguousCopyOfAnInterleavedView) {
  // [K0][V0][K1][V1]: K is every other block of a combined buffer (hybrid re-striding).
  const Tensor combined = iota2d(8, 4, DType::f16);  // 2-byte elements, values exact
  const Tensor k = combined.as_strided({4, 4}, {8, 1}, 0);
  const Tensor v = combined.as_strided({4, 4}, {8, 1}, 4);
  const Tensor kc = k.contiguous(), vc = v.contiguous();
  EXPECT_TRUE(kc.is_contiguous());
  EXPECT_NE(kc.storage(), combined.storage());
  EXPECT_EQ(kc.storage()->bytes.size(), 32u);
  EXPECT_EQ(kc.get({1, 3}), 203.0);  // row 2 of combined
  EXPECT_EQ(vc.get({1, 3}), 303.0);  // row 3 of combined
  kc.set({0, 0}, 9.0);               // the copy is independent
  EXPECT_EQ(combined.get({0, 0}), 0.0);
  EXPECT_EQ(k.clone().get({3, 2}), 602.0);
}

TEST(Tensor, ConvertingCopies) {
  // 1 + 3 * 2^-8: the midpoint of bf16 0x3F81 and 0x3F82.
  const Tensor x = Tensor::full(DType::f32, {2, 2}, 1.0 + 3 * 0x1p-8);
  const Tensor b = x.to(DType::bf16);
  EXPECT_EQ(b.get_bits({0, 0}), 0x3F82u);  // round to nearest even
  Tensor dst = Tensor::empty(DType::f64, {2, 2});
  dst.copy_from(x.permute({1, 0}));
  EXPECT_EQ(dst.get({1, 0}), 1.0 + 3 * 0x1p-8);
  EXPECT_TRUE(
      Contains(error_of([&] { dst.copy_from(Tensor::empty(DType::f32, {4})); }), "shape mismatch"));
  // Same dtype copies bits: NaN payloads survive.
  Tensor nan_src = Tensor::empty(DType::bf16, {1});
  nan_src.set_bits({0}, 0x7FC1u);
  Tensor nan_dst = Tensor::empty(DType::bf16, {1});
  nan_dst.copy_from(nan_src);
  EXPECT_EQ(nan_dst.get_bits({0}), 0x7FC1u);
}

TEST(Tensor, FullAndFilledBytesCoverTheWholeStorage) {
  const Tensor f = Tensor::full(DType::e4m3fn, {3}, 448.0);
  for (auto b : f.storage()->bytes) EXPECT_EQ(std::to_integer<int>(b), 0x7E);
  const Tensor p = Tensor::filled_bytes(DType::i32, {2}, std::byte{0xAB});
  EXPECT_EQ(p.get_bits({1}), 0xABABABABu);
}

TEST(Tensor, TypedAccessChecksTheElementSize) {
  const Tensor x = Tensor::empty(DType::i32, {2, 2});
  x.at<int32_t>({1, 1}) = 42;
  EXPECT_EQ(x.get({1, 1}), 42.0);
  EXPECT_EQ(x.permute({1, 0}).at<int32_t>({1, 1}), 42);
  EXPECT_TRUE(Contains(error_of([&] { x.at<int64_t>({0, 0}); }), "typed access of size 8"));
  EXPECT_TRUE(Contains(error_of<std::out_of_range>([&] {
                         x.get({2, 0});
                       }),
                       "index 2 out of range for dim 0 of size 2"));
  EXPECT_TRUE(Contains(error_of([&] { x.get({0}); }), "index has 1 dims, tensor 2"));
}

TEST(Tensor, ForEachIndexIsRowMajorOverTheView) {
  const Tensor t = iota2d(2, 3).permute({1, 0});
  std::vector<double> seen;
  t.for_each_index([&](const Index& idx, int64_t lin) {
    EXPECT_EQ(lin, static_cast<int64_t>(seen.size()));
    seen.push_back(t.get(idx));
  });
  EXPECT_EQ(seen, (std::vector<double>{0, 100, 1, 101, 2, 102}));
  EXPECT_EQ(t.to_vector(), seen);
}

TEST(Tensor, RebasedViewReadsAnotherStorage) {
  const Tensor x = iota2d(2, 4);
  const Tensor view = x.slice(1, 1, 3);
  auto other = std::make_shared<Storage>(*x.storage());
  const Tensor moved = view.rebased(other);
  x.set({1, 2}, -1.0);
  EXPECT_EQ(moved.get({1, 1}), 102.0);  // unaffected by writes to the original
  EXPECT_TRUE(Contains(error_of([&] { view.rebased(std::make_shared<Storage>()); }),
                       "storage size differs"));
}

TEST(Tensor, IntegerEncodingRejectsUnrepresentableValues) {
  const Tensor i8 = Tensor::empty(DType::i8, {1});
  i8.set({0}, -128.0);
  EXPECT_EQ(i8.get_bits({0}), 0x80u);
  const Tensor u8 = Tensor::empty(DType::u8, {1});
  u8.set({0}, 255.0);
  EXPECT_EQ(u8.get({0}), 255.0);
  EXPECT_TRUE(Contains(error_of<std::out_of_range>([&] { u8.set({0}, -1.0); }),
                       "-1 is not representable in u8"));
  EXPECT_TRUE(Contains(error_of<std::out_of_range>([&] { i8.set({0}, 128.0); }), "i8"));
  const Tensor i32 = Tensor::empty(DType::i32, {1});
  EXPECT_TRUE(Contains(
      error_of<std::out_of_range>([&] { i32.set({0}, std::numeric_limits<double>::quiet_NaN()); }),
      "nan is not representable in i32"));
  i32.set({0}, -2147483648.0);
  EXPECT_EQ(i32.get({0}), -2147483648.0);
  i32.set({0}, 2.9);  // truncation toward zero, like a C cast
  EXPECT_EQ(i32.get({0}), 2.0);
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

TEST(Tensor, ZeroSizedTensorsAreContiguous) {
  // Every dimension order of an empty tensor is "contiguous": there is no element out of place.
  EXPECT_TRUE(Tensor::empty(DType::f32, {128, 0}).is_contiguous());
  EXPECT_TRUE(Tensor::empty(DType::f32, {0, 128}).is_contiguous());
  EXPECT_TRUE(Tensor::empty(DType::bf16, {4, 0, 16}).reshape({0, 64}).is_contiguous());
  // A non-empty strided view still is not.
  EXPECT_FALSE(Tensor::empty(DType::f32, {4, 8}).slice(1, 0, 8, 2).is_contiguous());
}

// A sparse storage holds only its window on the host: views and element access inside it work
// with offsets into the whole extent; anything outside it throws instead of reading garbage.
TEST(SparseTensor, WindowAccessAndExtent) {
  // 1000 rows of 8 bf16, the host holds rows [600, 610).
  Tensor t = Tensor::sparse(DType::bf16, {1000, 8}, 600 * 8, 10 * 8);
  EXPECT_TRUE(t.storage()->sparse());
  EXPECT_EQ(t.storage()->size(), 1000u * 8 * 2);
  EXPECT_EQ(t.storage()->bytes.size(), 10u * 8 * 2);
  EXPECT_EQ(t.storage()->window_begin, 600u * 8 * 2);
  const Tensor rows = t.slice(0, 600, 610);
  rows.set({3, 5}, 1.5);
  EXPECT_EQ(t.get({603, 5}), 1.5);
  EXPECT_EQ(rows.to(DType::f32).get({3, 5}), 1.5);
  EXPECT_THROW(t.get({599, 7}), std::out_of_range);
  EXPECT_THROW(t.get({610, 0}), std::out_of_range);
  EXPECT_THROW((void)t.to(DType::f32), std::out_of_range);  // reads every row
  // Views may span the whole extent (device offsets), not only the window.
  EXPECT_NO_THROW((void)t.as_strided({1000, 8}, {8, 1}, 0));
  EXPECT_THROW((void)t.as_strided({1001, 8}, {8, 1}, 0), std::out_of_range);
  EXPECT_THROW((void)Tensor::sparse(DType::f32, {4, 4}, 10, 7), std::invalid_argument);
}

// held_rows: the rows of dim 0 a host can read, for views whose rows are wider or narrower than
// the window's granularity; a dense tensor is its own held rows.
TEST(SparseTensor, HeldRowsAreTheRowsInsideTheWindow) {
  const Tensor t = Tensor::sparse(DType::f32, {1000, 8}, 600 * 8, 10 * 8);
  const Tensor held = t.held_rows();
  EXPECT_EQ(held.shape(), (Shape{10, 8}));
  EXPECT_EQ(held.offset(), 600 * 8);
  EXPECT_NO_THROW((void)held.contiguous());
  // Rows of 3 elements with a stride of 8 (a padded view): rows 600..609 are held.
  EXPECT_EQ(t.as_strided({1000, 3}, {8, 1}, 0).held_rows().shape(), (Shape{10, 3}));
  // Rows offset by 6 elements: a row starting at 599*8 + 6 ends past 600*8, outside the window.
  const Tensor shifted = t.as_strided({999, 4}, {8, 1}, 6).held_rows();
  EXPECT_EQ(shifted.shape(), (Shape{9, 4}));
  EXPECT_EQ(shifted.offset(), 600 * 8 + 6);
  EXPECT_NO_THROW((void)shifted.contiguous());
  const Tensor dense = Tensor::empty(DType::f32, {4, 4});
  EXPECT_EQ(dense.held_rows().shape(), dense.shape());
}

}  // namespace
}  // namespace attncheck
