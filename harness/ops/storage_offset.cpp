#include "ops/storage_offset.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <functional>
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

namespace {

// Moves each named argument that is alone on its dense storage to a storage of its own with the
// strides `restride` gives (same values; the gaps 0xFF). Skipped: sparse or shared storages, and
// tensors `restride` leaves alone (returns nothing for).
void move_args(Problem& prob, const std::vector<std::string>& names, const char* what,
               const std::function<std::optional<Shape>(const Tensor&)>& restride) {
  std::map<const Storage*, int> users;
  for (const auto& a : prob.args)
    if (a.tensor.storage()) ++users[a.tensor.storage().get()];
  for (const std::string& name : names) {
    auto it = std::find_if(prob.args.begin(), prob.args.end(),
                           [&](const Arg& a) { return a.name == name; });
    if (it == prob.args.end())
      throw std::logic_error(std::string(what) + ": '" + name + "' is not an argument");
    Tensor& t = it->tensor;
    const auto& storage = t.storage();
    if (!storage || storage->sparse() || users[storage.get()] > 1 || t.numel() == 0) continue;
    for (int64_t s : t.strides())
      if (s < 0)
        throw std::logic_error(std::string(what) + ": '" + name + "' has a negative stride");
    const auto strides = restride(t);
    if (!strides) continue;
    int64_t extent = 1;
    for (int64_t i = 0; i < t.ndim(); ++i) extent += (t.size(i) - 1) * (*strides)[i];
    const Tensor moved = Tensor::filled_bytes(t.dtype(), {extent}, std::byte{0xFF})
                             .as_strided(t.shape(), *strides, 0);
    t.for_each_index([&](const Index& i, int64_t) { moved.set_bits(i, t.get_bits(i)); });
    t = moved;
  }
}

}  // namespace

void pad_outer_strides(Problem& prob, const std::vector<std::string>& names) {
  move_args(prob, names, "pad_outer_strides", [](const Tensor& t) -> std::optional<Shape> {
    if (t.ndim() < 2 || t.size(0) < 2) return std::nullopt;
    Shape strides = t.strides();
    strides[0] += std::max<int64_t>(1, 16 / static_cast<int64_t>(t.element_size()));
    return strides;
  });
}

void interleave_args(Problem& prob, const std::vector<std::string>& names) {
  move_args(prob, names, "interleave_args", [](const Tensor& t) -> std::optional<Shape> {
    if (t.ndim() < 1 || t.size(-1) < 2) return std::nullopt;
    Shape strides = t.strides();
    for (int64_t& s : strides) s *= 2;
    return strides;
  });
}

void compact_args(Problem& prob, const std::vector<std::string>& names) {
  std::map<const Storage*, int> users;
  for (const auto& a : prob.args)
    if (a.tensor.storage()) ++users[a.tensor.storage().get()];
  for (const std::string& name : names) {
    auto it = std::find_if(prob.args.begin(), prob.args.end(),
                           [&](const Arg& a) { return a.name == name; });
    if (it == prob.args.end())
      throw std::logic_error("compact_args: '" + name + "' is not an argument");
    Tensor& t = it->tensor;
    const auto& storage = t.storage();
    if (!storage || storage->sparse() || users[storage.get()] > 1) continue;
    t = t.contiguous();
  }
}

namespace {

Arg& arg_named(Problem& prob, const std::string& name, const char* what) {
  auto it = std::find_if(prob.args.begin(), prob.args.end(),
                         [&](const Arg& a) { return a.name == name; });
  if (it == prob.args.end())
    throw std::logic_error(std::string(what) + ": '" + name + "' is not an argument");
  return *it;
}

void copy_last_row(const Tensor& from, const Tensor& to) {
  const int64_t n = from.size(0);
  const Tensor src = from.slice(0, n - 1, n), dst = to.slice(0, n - 1, n);
  src.for_each_index([&](const Index& i, int64_t) { dst.set_bits(i, src.get_bits(i)); });
}

}  // namespace

void place_far_rows(Problem& prob, const FarRows& rows) {
  auto place = [&](const std::string& name, bool far) {
    Tensor& t = arg_named(prob, name, "place_far_rows").tensor;
    if (t.ndim() < 1 || t.size(0) < 2 || t.storage()->sparse())
      throw std::logic_error("place_far_rows: '" + name + "' needs two rows on a dense storage");
    const int64_t log2 = !far ? 16 : t.element_size() == 1 ? 32 : 31;
    const Tensor moved = far_last_row(t.dtype(), t.shape(), log2);
    copy_last_row(t, moved);
    t = moved;
  };
  for (const auto& name : rows.far) place(name, true);
  for (const auto& name : rows.held) place(name, false);
}

Problem last_rows_view(const Problem& prob, const FarRows& rows) {
  Problem view = prob;
  for (const auto* names : {&rows.far, &rows.held, &rows.sliced})
    for (const auto& name : *names) {
      Tensor& t = arg_named(view, name, "last_rows_view").tensor;
      const int64_t n = t.size(0);
      t = t.slice(0, n - 1, n);
    }
  return view;
}

Tensor far_last_row(DType dtype, const Shape& shape, int64_t log2) {
  if (shape.at(0) < 2) throw std::invalid_argument("far_last_row: needs at least two rows");
  return far_row(dtype, shape, shape.at(0) - 1, log2);
}

Tensor far_row(DType dtype, const Shape& shape, int64_t row, int64_t log2) {
  const int64_t rows = shape.at(0);
  if (row < 1 || row >= rows)
    throw std::invalid_argument("far_row: row " + std::to_string(row) + " of " +
                                std::to_string(rows) + " is not past row 0");
  Shape strides = Tensor::contiguous_strides(shape);
  const int64_t width = strides[0];
  // The smallest dim-0 stride that puts `row` at or past element 2^log2, and no row overlap,
  // rounded up to 16 elements: contracts may ask rows to be aligned (indexer_gather's k_fp8 rows
  // are 4-byte aligned, docs/ops/indexer.md), as a real caller's rows are.
  strides[0] = ((int64_t{1} << log2) + row - 1) / row + width;
  strides[0] = (strides[0] + 15) / 16 * 16;
  const int64_t at = row * strides[0];
  const Tensor storage = Tensor::sparse(dtype, {(rows - 1) * strides[0] + width}, at, width);
  return storage.as_strided(shape, strides, 0);
}

void place_far_token(Problem& prob, const std::vector<std::string>& names, int64_t row) {
  for (const auto& name : names) {
    Tensor& t = arg_named(prob, name, "place_far_token").tensor;
    if (t.ndim() < 1 || row < 1 || row >= t.size(0) || t.storage()->sparse())
      throw std::logic_error("place_far_token: '" + name + "' has no row " + std::to_string(row) +
                             " past row 0 on a dense storage");
    const int64_t log2 = t.element_size() == 1 ? 32 : 31;
    const Tensor moved = far_row(t.dtype(), t.shape(), row, log2);
    const Tensor src = t.slice(0, row, row + 1), dst = moved.slice(0, row, row + 1);
    src.for_each_index([&](const Index& i, int64_t) { dst.set_bits(i, src.get_bits(i)); });
    t = moved;
  }
}

int64_t first_held_row(const Tensor& t) {
  const Tensor held = t.held_rows();
  if (held.size(0) == 0 || held.size(0) == t.size(0)) return 0;
  return (held.offset() - t.offset()) / t.stride(0);
}

Tensor held_rows_of(const Tensor& expected, const Tensor& out) {
  const int64_t held = out.held_rows().size(0);
  if (held == out.size(0)) return expected;
  const int64_t first = first_held_row(out);
  return expected.slice(0, first, first + held).contiguous();
}

}  // namespace attncheck
