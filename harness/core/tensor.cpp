#include "tensor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "numeric.h"

namespace attncheck {

namespace {
// Integers: truncation toward zero (a C cast), but a value outside the type (or NaN) is an error,
// not undefined behaviour that silently writes garbage test data.
template <class I>
uint64_t encode_integer(double v, DType t) {
  constexpr int bits = static_cast<int>(sizeof(I) * 8);
  const double lo = std::is_signed_v<I> ? -std::ldexp(1.0, bits - 1) : 0.0;
  const double hi_excl = std::ldexp(1.0, std::is_signed_v<I> ? bits - 1 : bits);
  const double x = std::trunc(v);
  if (!(x >= lo && x < hi_excl)) {
    std::ostringstream os;
    os << v << " is not representable in " << dtype_name(t);
    throw std::out_of_range(os.str());
  }
  using U = std::make_unsigned_t<I>;
  return static_cast<U>(static_cast<I>(x));
}
}  // namespace

uint64_t encode_value(double v, DType t) {
  switch (t) {
    case DType::f64:
      return std::bit_cast<uint64_t>(v);
    case DType::f32:
      return std::bit_cast<uint32_t>(static_cast<float>(v));
    case DType::f16:
    case DType::bf16:
      return encode_minifloat(v, t, Saturation::nonsaturate);
    case DType::e4m3fn:
    case DType::e4m3fnuz:
    case DType::e5m2:
    case DType::e5m2fnuz:
      return encode_minifloat(v, t, Saturation::saturate);
    case DType::i8:
      return encode_integer<int8_t>(v, t);
    case DType::u8:
      return encode_integer<uint8_t>(v, t);
    case DType::i32:
      return encode_integer<int32_t>(v, t);
    case DType::i64:
      return encode_integer<int64_t>(v, t);
  }
  return 0;
}

double decode_value(uint64_t bits, DType t) {
  switch (t) {
    case DType::f64:
      return std::bit_cast<double>(bits);
    case DType::f32:
      return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case DType::bf16:
      return bf16_to_float(static_cast<uint16_t>(bits));
    case DType::f16:
    case DType::e4m3fn:
    case DType::e4m3fnuz:
    case DType::e5m2:
    case DType::e5m2fnuz:
      return decode_minifloat(static_cast<uint32_t>(bits), t);
    case DType::i8:
      return static_cast<int8_t>(bits);
    case DType::u8:
      return static_cast<uint8_t>(bits);
    case DType::i32:
      return static_cast<int32_t>(static_cast<uint32_t>(bits));
    case DType::i64:
      return static_cast<double>(static_cast<int64_t>(bits));
  }
  return 0;
}

Shape Tensor::contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

Tensor Tensor::unallocated(DType dtype, Shape shape) {
  for (auto d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in tensor shape");
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>();
  return t;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t = unallocated(dtype, std::move(shape));
  t.storage_->bytes.resize(static_cast<size_t>(t.numel()) * dtype_size(dtype));
  return t;
}

Tensor Tensor::sparse(DType dtype, Shape shape, int64_t window_first, int64_t window_count) {
  Tensor t = unallocated(dtype, std::move(shape));
  if (window_first < 0 || window_count < 0 || window_first + window_count > t.numel())
    throw std::invalid_argument("sparse tensor: window [" + std::to_string(window_first) + ", +" +
                                std::to_string(window_count) + ") outside " +
                                std::to_string(t.numel()) + " elements");
  const size_t es = dtype_size(dtype);
  t.storage_->extent = static_cast<uint64_t>(t.numel()) * es;
  t.storage_->window_begin = static_cast<uint64_t>(window_first) * es;
  t.storage_->bytes.resize(static_cast<size_t>(window_count) * es);
  return t;
}

Tensor Tensor::full(DType dtype, Shape shape, double value) {
  Tensor t = empty(dtype, std::move(shape));
  const uint64_t bits = encode_value(value, dtype);
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < t.storage_->bytes.size(); i += es)
    std::memcpy(&t.storage_->bytes[i], &bits, es);
  return t;
}

Tensor Tensor::filled_bytes(DType dtype, Shape shape, std::byte byte) {
  Tensor t = empty(dtype, std::move(shape));
  std::fill(t.storage_->bytes.begin(), t.storage_->bytes.end(), byte);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place (e.g. zero heads)
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype_) << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? "," : "") << shape_[i];
  os << "] strides [";
  for (size_t i = 0; i < strides_.size(); ++i) os << (i ? "," : "") << strides_[i];
  os << "] +" << offset_;
  return os.str();
}

int64_t Tensor::norm_dim(int64_t d) const {
  const int64_t n = ndim();
  if (d < 0) d += n;
  if (d < 0 || d >= n) throw std::out_of_range("dimension out of range");
  return d;
}

void Tensor::check_access(size_t bytes) const {
  if (bytes != element_size())
    throw std::invalid_argument("typed access of size " + std::to_string(bytes) + " to " +
                                std::string(dtype_name(dtype_)) + " tensor");
}

int64_t Tensor::element_offset(std::span<const int64_t> idx) const {
  if (static_cast<int64_t>(idx.size()) != ndim())
    throw std::invalid_argument("index has " + std::to_string(idx.size()) + " dims, tensor " +
                                std::to_string(ndim()));
  int64_t off = offset_;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= shape_[i])
      throw std::out_of_range("index " + std::to_string(idx[i]) + " out of range for dim " +
                              std::to_string(i) + " of size " + std::to_string(shape_[i]));
    off += idx[i] * strides_[i];
  }
  return off;
}

namespace {
// Host address of the byte at `byte` of the storage; a sparse storage holds only its window.
std::byte* host_byte(const Storage& s, int64_t byte, size_t len) {
  if (!s.sparse()) return const_cast<std::byte*>(s.bytes.data()) + byte;
  const auto begin = static_cast<int64_t>(s.window_begin);
  if (byte < begin ||
      byte + static_cast<int64_t>(len) > begin + static_cast<int64_t>(s.bytes.size()))
    throw std::out_of_range("byte " + std::to_string(byte) + " of a sparse storage lies outside " +
                            "its host window [" + std::to_string(begin) + ", " +
                            std::to_string(begin + static_cast<int64_t>(s.bytes.size())) + ")");
  return const_cast<std::byte*>(s.bytes.data()) + (byte - begin);
}
}  // namespace

std::byte* Tensor::data() const {
  return host_byte(*storage_, offset_ * static_cast<int64_t>(element_size()), 0);
}

std::byte* Tensor::element_ptr(std::span<const int64_t> idx) const {
  return host_byte(*storage_, element_offset(idx) * static_cast<int64_t>(element_size()),
                   element_size());
}

std::pair<int64_t, int64_t> Tensor::extent() const {
  if (numel() == 0) return {offset_, offset_};
  int64_t lo = offset_, hi = offset_;
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t span = (shape_[i] - 1) * strides_[i];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  return {lo, hi + 1};
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t stop, int64_t step) const {
  dim = norm_dim(dim);
  if (step <= 0) throw std::invalid_argument("slice step must be positive");
  const int64_t n = shape_[dim];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  Tensor t = *this;
  t.offset_ += start * strides_[dim];
  t.shape_[dim] = (stop - start + step - 1) / step;
  t.strides_[dim] *= step;
  return t;
}

Tensor Tensor::select(int64_t dim, int64_t i) const {
  dim = norm_dim(dim);
  if (i < 0) i += shape_[dim];
  if (i < 0 || i >= shape_[dim]) throw std::out_of_range("select index out of range");
  Tensor t = *this;
  t.offset_ += i * strides_[dim];
  t.shape_.erase(t.shape_.begin() + dim);
  t.strides_.erase(t.strides_.begin() + dim);
  return t;
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  if (static_cast<int64_t>(order.size()) != ndim())
    throw std::invalid_argument("permute: wrong rank");
  Tensor t = *this;
  std::vector<bool> seen(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t d = norm_dim(order[i]);
    if (seen[d]) throw std::invalid_argument("permute: repeated dimension");
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::as_strided(Shape shape, Shape strides, int64_t offset) const {
  if (shape.size() != strides.size()) throw std::invalid_argument("as_strided: rank mismatch");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.offset_ = offset;
  const auto [lo, hi] = t.extent();
  const int64_t cap = static_cast<int64_t>(storage_->size() / element_size());
  if (t.numel() > 0 && (lo < 0 || hi > cap))
    throw std::out_of_range("as_strided view " + t.describe() + " exceeds storage of " +
                            std::to_string(cap) + " elements");
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (!is_contiguous()) throw std::invalid_argument("reshape of a non-contiguous tensor");
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (n != numel()) throw std::invalid_argument("reshape changes the element count");
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  if (dim < 0) dim += ndim() + 1;
  Tensor t = *this;
  const int64_t st = dim < ndim() ? strides_[dim] * shape_[dim] : 1;
  t.shape_.insert(t.shape_.begin() + dim, 1);
  t.strides_.insert(t.strides_.begin() + dim, st);
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  if (!is_contiguous()) throw std::invalid_argument("view_as needs a contiguous tensor");
  const size_t from = element_size(), to = dtype_size(dtype);
  if (from == to) {
    Tensor t = *this;
    t.dtype_ = dtype;
    return t;
  }
  if (ndim() == 0 || (shape_.back() * static_cast<int64_t>(from)) % static_cast<int64_t>(to) != 0 ||
      (offset_ * static_cast<int64_t>(from)) % static_cast<int64_t>(to) != 0)
    throw std::invalid_argument("view_as: last dimension does not divide into the new dtype");
  Tensor t = *this;
  t.dtype_ = dtype;
  t.shape_.back() = shape_.back() * static_cast<int64_t>(from) / static_cast<int64_t>(to);
  t.offset_ = offset_ * static_cast<int64_t>(from) / static_cast<int64_t>(to);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::rebased(std::shared_ptr<Storage> storage) const {
  if (!storage || storage->bytes.size() != storage_->bytes.size() ||
      storage->extent != storage_->extent || storage->window_begin != storage_->window_begin)
    throw std::invalid_argument("rebased: storage size differs");
  Tensor t = *this;
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::held_rows() const {
  if (!storage_->sparse() || ndim() == 0 || numel() == 0) return *this;
  if (strides_[0] <= 0) throw std::invalid_argument("held_rows: dim 0 needs a positive stride");
  const auto es = static_cast<int64_t>(element_size());
  const auto win_lo = static_cast<int64_t>(storage_->window_begin) / es;
  const auto win_hi = win_lo + static_cast<int64_t>(storage_->bytes.size()) / es;
  const auto [lo, hi] = select(0, 0).extent();  // row i covers [lo, hi) + i * stride(0)
  const int64_t s0 = strides_[0];
  const int64_t first = win_lo <= lo ? 0 : (win_lo - lo + s0 - 1) / s0;
  const int64_t last = win_hi < hi ? 0 : (win_hi - hi) / s0 + 1;  // one past the last held row
  return slice(0, first, std::max(first, std::min(last, shape_[0])));
}

void Tensor::for_each_index(const std::function<void(const Index&, int64_t)>& fn) const {
  const int64_t n = numel();
  if (n == 0) return;
  Index idx(shape_.size(), 0);
  for (int64_t lin = 0; lin < n; ++lin) {
    fn(idx, lin);
    for (size_t d = shape_.size(); d-- > 0;) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
}

uint64_t Tensor::get_bits(std::span<const int64_t> idx) const {
  uint64_t bits = 0;
  std::memcpy(&bits, element_ptr(idx), element_size());
  return bits;
}

void Tensor::set_bits(std::span<const int64_t> idx, uint64_t bits) const {
  std::memcpy(element_ptr(idx), &bits, element_size());
}

double Tensor::get(std::span<const int64_t> idx) const {
  return decode_value(get_bits(idx), dtype_);
}
void Tensor::set(std::span<const int64_t> idx, double v) const {
  set_bits(idx, encode_value(v, dtype_));
}

Tensor Tensor::contiguous() const {
  Tensor t = empty(dtype_, shape_);
  const size_t es = element_size();
  for_each_index([&](const Index& idx, int64_t lin) {
    std::memcpy(t.storage_->bytes.data() + lin * static_cast<int64_t>(es), element_ptr(idx), es);
  });
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(dtype, shape_);
  t.copy_from(*this);
  return t;
}

const std::byte* Tensor::direct_bytes() const {
  if (!storage_ || storage_->sparse()) return nullptr;
  const auto [lo, hi] = extent();
  if (lo < 0 ||
      hi * static_cast<int64_t>(element_size()) > static_cast<int64_t>(storage_->bytes.size()))
    return nullptr;
  return storage_->bytes.data();
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_)
    throw std::invalid_argument("copy_from: shape mismatch " + src.describe() + " -> " +
                                describe());
  const bool same = src.dtype_ == dtype_;
  const std::byte* from = src.direct_bytes();
  auto* to = const_cast<std::byte*>(direct_bytes());
  const auto es = static_cast<int64_t>(element_size());
  src.for_each_offset_with(*this, [&](const Index& idx, int64_t, int64_t os, int64_t od) {
    const uint64_t bits = from ? src.bits_at(from, os) : src.get_bits(idx);
    const uint64_t out = same ? bits : encode_value(decode_value(bits, src.dtype_), dtype_);
    if (to)
      std::memcpy(to + od * es, &out, static_cast<size_t>(es));
    else
      set_bits(idx, out);
  });
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  const std::byte* bytes = direct_bytes();
  for_each_offset_with(*this, [&](const Index& idx, int64_t k, int64_t off, int64_t) {
    v[static_cast<size_t>(k)] = decode_value(bytes ? bits_at(bytes, off) : get_bits(idx), dtype_);
  });
  return v;
}

}  // namespace attncheck
