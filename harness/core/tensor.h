// Host tensor: dtype, shape, strides (in elements) and an element offset into shared storage.
// Views (slice, select, permute, as_strided) share storage, so a test can build exactly the strided
// or interleaved layout a kernel receives. No HIP, no Eigen here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include "dtype.h"

namespace attncheck {

using Shape = std::vector<int64_t>;
using Index = std::vector<int64_t>;

struct Storage {
  std::vector<std::byte> bytes;
  // A sparse storage (large-offset cases, docs/abi.md "Sparse storages"): the host holds only
  // bytes [window_begin, window_begin + bytes.size()) of an extent of `extent` bytes; the rest
  // exists only on the device, filled with NaN poison, and no host code may read it.
  // extent == 0: dense, the host holds every byte.
  uint64_t window_begin = 0;
  uint64_t extent = 0;
  bool sparse() const { return extent != 0; }
  uint64_t size() const { return sparse() ? extent : bytes.size(); }  // bytes on the device
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape) { return empty(dtype, std::move(shape)); }
  static Tensor full(DType dtype, Shape shape, double value);
  // Fills every storage byte (not only the view) with `byte`: sentinels, poison for raw buffers.
  static Tensor filled_bytes(DType dtype, Shape shape, std::byte byte);
  static Shape contiguous_strides(const Shape& shape);
  // A contiguous tensor on a sparse storage whose host bytes hold only elements
  // [window_first, window_first + window_count) (in storage order); those start zeroed.
  static Tensor sparse(DType dtype, Shape shape, int64_t window_first, int64_t window_count);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const { return shape_.at(norm_dim(dim)); }
  int64_t stride(int64_t dim) const { return strides_.at(norm_dim(dim)); }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[4,16,576] strides [9216,576,1] +0"

  // Storage access. data() points at element (0,...,0) of the view.
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::byte* data() const;
  std::byte* element_ptr(std::span<const int64_t> idx) const;
  int64_t element_offset(std::span<const int64_t> idx) const;  // in elements, from storage start
  // Smallest and one-past-largest element offset the view touches (for device copies).
  std::pair<int64_t, int64_t> extent() const;

  // Views.
  Tensor slice(int64_t dim, int64_t start, int64_t stop, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t i) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor as_strided(Shape shape, Shape strides, int64_t offset) const;
  Tensor reshape(Shape shape) const;  // contiguous tensors only: a view with new shape
  Tensor unsqueeze(int64_t dim) const;
  // Reinterprets the bytes of a contiguous tensor as another dtype (last dim rescaled).
  Tensor view_as(DType dtype) const;
  // The same view over another storage of the same size (e.g. bytes read back from a device).
  Tensor rebased(std::shared_ptr<Storage> storage) const;
  // On a sparse storage: the rows of dim 0 whose every element lies inside the host window (what
  // host code can read, compare and store); on a dense storage: the view itself.
  Tensor held_rows() const;

  // Copies.
  Tensor contiguous() const;  // same dtype, new contiguous storage
  Tensor clone() const { return contiguous(); }
  Tensor to(DType dtype) const;       // converting copy, round to nearest even
  void copy_from(const Tensor& src);  // element-wise, converting, same shape

  // Element access by multi-index, converting through double.
  double get(std::span<const int64_t> idx) const;
  void set(std::span<const int64_t> idx, double v) const;
  double get(std::initializer_list<int64_t> idx) const {
    return get(std::span(idx.begin(), idx.size()));
  }
  void set(std::initializer_list<int64_t> idx, double v) const {
    set(std::span(idx.begin(), idx.size()), v);
  }
  // Raw bits of an element (fp8: 1 byte, bf16: 2 bytes ...), zero-extended.
  uint64_t get_bits(std::span<const int64_t> idx) const;
  void set_bits(std::span<const int64_t> idx, uint64_t bits) const;
  uint64_t get_bits(std::initializer_list<int64_t> idx) const {
    return get_bits(std::span(idx.begin(), idx.size()));
  }
  void set_bits(std::initializer_list<int64_t> idx, uint64_t bits) const {
    set_bits(std::span(idx.begin(), idx.size()), bits);
  }

  template <class T>
  T& at(std::span<const int64_t> idx) const {
    check_access(sizeof(T));
    return *reinterpret_cast<T*>(element_ptr(idx));
  }
  template <class T>
  T& at(std::initializer_list<int64_t> idx) const {
    return at<T>(std::span(idx.begin(), idx.size()));
  }

  // Calls fn(index, linear_position) for every element in row-major logical order.
  void for_each_index(const std::function<void(const Index&, int64_t)>& fn) const;
  // Calls fn(element offset from the storage's start, linear_position) for every element in
  // row-major logical order, walking the offsets incrementally: no per-element index checks, for
  // the hot loops (input generators, the device runner's map of writable bytes) that need only
  // offsets. The caller checks the view against its storage (extent()).
  template <class Fn>
  void for_each_offset(Fn&& fn) const {
    const int64_t n = numel();
    if (n == 0) return;
    const size_t nd = shape_.size();
    Index idx(nd, 0);
    int64_t off = offset_;
    for (int64_t k = 0; k < n; ++k) {
      fn(off, k);
      for (size_t d = nd; d-- > 0;) {
        off += strides_[d];
        if (++idx[d] < shape_[d]) break;
        off -= idx[d] * strides_[d];
        idx[d] = 0;
      }
    }
  }
  // Calls fn(idx, k, this element's offset, other's element's offset) for every element in
  // row-major logical order, the two views (one shape) walked by incremental offsets.
  template <class Fn>
  void for_each_offset_with(const Tensor& other, Fn&& fn) const {
    const int64_t n = numel();
    if (n == 0) return;
    if (other.shape_ != shape_)
      throw std::invalid_argument("for_each_offset_with: shape mismatch " + describe() + " vs " +
                                  other.describe());
    const size_t nd = shape_.size();
    Index idx(nd, 0);
    int64_t oa = offset_, ob = other.offset_;
    for (int64_t k = 0; k < n; ++k) {
      fn(static_cast<const Index&>(idx), k, oa, ob);
      for (size_t d = nd; d-- > 0;) {
        oa += strides_[d];
        ob += other.strides_[d];
        if (++idx[d] < shape_[d]) break;
        oa -= idx[d] * strides_[d];
        ob -= idx[d] * other.strides_[d];
        idx[d] = 0;
      }
    }
  }
  // Calls fn(idx, k, this element's bits, other's element's bits) for every element, in the
  // order above, reading the bits straight from the storages' bytes: the compares, which
  // per-element get_bits (index checks, a function per element) made a large part of a case's
  // time. A view on a sparse storage, or one reaching outside its bytes, goes through get_bits,
  // which checks and throws as before.
  template <class Fn>
  void for_each_bits_with(const Tensor& other, Fn&& fn) const {
    const std::byte* a = direct_bytes();
    const std::byte* b = other.direct_bytes();
    for_each_offset_with(other, [&](const Index& idx, int64_t k, int64_t oa, int64_t ob) {
      fn(idx, k, a ? bits_at(a, oa) : get_bits(idx),
         b ? other.bits_at(b, ob) : other.get_bits(idx));
    });
  }
  // All elements as doubles, row-major logical order.
  std::vector<double> to_vector() const;

 private:
  // Contiguous strides over `shape` (no negative dimension) and an empty dense storage.
  static Tensor unallocated(DType dtype, Shape shape);
  int64_t norm_dim(int64_t d) const;
  // The storage's bytes when every element of this view lies in them (a dense storage), else
  // nullptr (sparse, or a view past its storage: the checked per-element path).
  const std::byte* direct_bytes() const;
  // The bits of the element at `offset` of direct_bytes() `bytes`.
  uint64_t bits_at(const std::byte* bytes, int64_t offset) const {
    uint64_t bits = 0;
    const size_t es = element_size();
    std::memcpy(&bits, bytes + offset * static_cast<int64_t>(es), es);
    return bits;
  }
  void check_access(size_t bytes) const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
};

// Encode a double into the bits of `t` (round to nearest even; fp8 saturates, like the quantizers
// the kernels use; f16/bf16 follow IEEE overflow to inf).
uint64_t encode_value(double v, DType t);
double decode_value(uint64_t bits, DType t);

}  // namespace attncheck
