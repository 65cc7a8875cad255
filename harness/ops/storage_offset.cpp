#include "ops/storage_offset.h"

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

namespace attncheck {

void shift_storages(Problem& prob, int64_t bytes) {
  if (bytes <= 0 || bytes % 16 != 0)
    throw std::invalid_argument("shift_storages: " + std::to_string(bytes) +
                                " bytes is not a positive multiple of 16");
  std::map<const Storage*, Tensor> moved;  // old storage -> the new one, as a flat u8 tensor
  for (auto& a : prob.args) {
    const auto& old = a.tensor.storage();
    if (!old || old->sparse()) continue;
    auto it = moved.find(old.get());
    if (it == moved.end()) {
      const auto size = static_cast<int64_t>(old->bytes.size());
      Tensor flat = Tensor::filled_bytes(DType::u8, {bytes + size}, std::byte{0xFF});
      if (size > 0) std::memcpy(flat.data() + bytes, old->bytes.data(), old->bytes.size());
      it = moved.emplace(old.get(), flat).first;
    }
    const auto es = static_cast<int64_t>(a.tensor.element_size());
    const Tensor& flat = it->second;
    if (flat.numel() % es != 0)
      throw std::logic_error("shift_storages: storage of '" + a.name +
                             "' is not a whole number of its elements");
    const Tensor typed = flat.view_as(a.tensor.dtype());
    a.tensor =
        typed.as_strided(a.tensor.shape(), a.tensor.strides(), a.tensor.offset() + bytes / es);
  }
}

Tensor far_last_row(DType dtype, const Shape& shape, int64_t log2) {
  const int64_t rows = shape.at(0);
  if (rows < 2) throw std::invalid_argument("far_last_row: needs at least two rows");
  Shape strides = Tensor::contiguous_strides(shape);
  const int64_t row = strides[0];
  // The smallest dim-0 stride that puts row rows - 1 at or past element 2^log2, and no row overlap.
  strides[0] = ((int64_t{1} << log2) + rows - 2) / (rows - 1) + row;
  const int64_t last = (rows - 1) * strides[0];
  const Tensor storage = Tensor::sparse(dtype, {last + row}, last, row);
  return storage.as_strided(shape, strides, 0);
}

Tensor held_rows_of(const Tensor& expected, const Tensor& out) {
  const Tensor held = out.held_rows();
  if (held.size(0) == out.size(0)) return expected;
  const int64_t first = (held.offset() - out.offset()) / out.stride(0);
  return expected.slice(0, first, first + held.size(0)).contiguous();
}

}  // namespace attncheck
