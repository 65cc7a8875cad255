#include "ops/graph_variant.h"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>

namespace attncheck {

Problem with_own_storages(const Problem& p, const std::vector<std::string>& names) {
  Problem q = p;
  std::map<const Storage*, std::shared_ptr<Storage>> copies;
  for (const auto& name : names) {
    if (!p.has_arg(name))
      throw std::invalid_argument("graph variant: the problem has no argument '" + name + "'");
    const auto& storage = p.arg(name).storage();
    if (!copies.count(storage.get())) copies[storage.get()] = std::make_shared<Storage>(*storage);
  }
  for (auto& a : q.args) {
    const auto it = copies.find(a.tensor.storage().get());
    if (it != copies.end()) a.tensor = a.tensor.rebased(it->second);
  }
  return q;
}

bool halve_lengths(const Tensor& lens, int64_t min_len) {
  if (lens.ndim() != 1 || lens.dtype() != DType::i32)
    throw std::invalid_argument("graph variant: lengths must be a 1-D int32 tensor, got " +
                                lens.describe());
  bool changed = false;
  for (int64_t b = 0; b < lens.size(0); ++b) {
    auto& len = lens.at<int32_t>({b});
    const auto halved = static_cast<int32_t>(std::max<int64_t>(min_len, len / 2));
    if (halved < len) {
      len = halved;
      changed = true;
    }
  }
  return changed;
}

bool permute_block_ids(const Tensor& table) {
  if (table.ndim() != 2 || table.dtype() != DType::i32)
    throw std::invalid_argument("graph variant: a block table must be 2-D int32, got " +
                                table.describe());
  std::vector<int32_t> used;
  table.for_each_index([&](const Index& idx, int64_t) {
    const auto id = table.at<int32_t>(idx);
    if (id >= 0) used.push_back(id);
  });
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  std::map<int32_t, int32_t> to;
  for (size_t i = 0; i < used.size(); ++i) to[used[i]] = used[(i + 1) % used.size()];
  bool changed = false;
  table.for_each_index([&](const Index& idx, int64_t) {
    auto& id = table.at<int32_t>(idx);
    if (id < 0) return;
    changed = changed || to.at(id) != id;
    id = to.at(id);
  });
  return changed;
}

bool reverse_elements(const Tensor& t) {
  if (t.ndim() != 1)
    throw std::invalid_argument("graph variant: reversal needs a 1-D tensor, got " + t.describe());
  const int64_t n = t.size(0);
  bool changed = false;
  for (int64_t i = 0; i < n / 2; ++i) {
    const uint64_t a = t.get_bits({i}), b = t.get_bits({n - 1 - i});
    if (a == b) continue;
    t.set_bits({i}, b);
    t.set_bits({n - 1 - i}, a);
    changed = true;
  }
  return changed;
}

bool drop_second_half(const Tensor& indices) {
  if (indices.ndim() != 2 || indices.dtype() != DType::i32)
    throw std::invalid_argument("graph variant: an index table must be 2-D int32, got " +
                                indices.describe());
  bool changed = false;
  for (int64_t r = 0; r < indices.size(0); ++r) {
    int64_t valid = 0;
    for (int64_t j = 0; j < indices.size(1); ++j) valid += indices.at<int32_t>({r, j}) >= 0;
    int64_t keep = (valid + 1) / 2;
    for (int64_t j = 0; j < indices.size(1); ++j) {
      auto& id = indices.at<int32_t>({r, j});
      if (id < 0) continue;
      if (keep > 0) {
        --keep;
        continue;
      }
      id = -1;
      changed = true;
    }
  }
  return changed;
}

std::optional<GraphVariant> metadata_variant(const Problem& p,
                                             const std::vector<MetadataChange>& changes) {
  // An argument on a sparse storage (a large-offset case) holds only a window on the host: its
  // metadata cannot be rewritten there, so it keeps the case's values.
  std::vector<MetadataChange> held;
  for (const auto& c : changes)
    if (!p.arg(c.arg).storage()->sparse()) held.push_back(c);
  std::vector<std::string> names;
  for (const auto& c : held) names.push_back(c.arg);
  GraphVariant v;
  v.capture = with_own_storages(p, names);
  for (const auto& c : held) {
    if (!c.apply(v.capture.arg(c.arg))) continue;
    v.changed.push_back(c.arg);
    v.how += (v.how.empty() ? "" : ", ") + c.arg + " " + c.what;
  }
  if (v.changed.empty()) return std::nullopt;
  return v;
}

MetadataChange halved(const std::string& lens, int64_t min_len) {
  return {lens, "halved", [min_len](const Tensor& t) { return halve_lengths(t, min_len); }};
}
MetadataChange permuted_block_ids(const std::string& table) {
  return {table, "with its block ids permuted", permute_block_ids};
}
MetadataChange reversed(const std::string& arg) {
  return {arg, "reversed", reverse_elements};
}
MetadataChange second_half_dropped(const std::string& indices) {
  return {indices, "with the second half of each row's indices -1", drop_second_half};
}

namespace {
bool same_elements(const Tensor& a, const Tensor& b) {
  bool same = true;
  a.held_rows().for_each_index([&](const Index& idx, int64_t) {
    if (same && a.get_bits(idx) != b.get_bits(idx)) same = false;
  });
  return same;
}
}  // namespace

VariantDifference variant_difference(const Problem& p, const Problem& variant) {
  VariantDifference d;
  auto structure = [&](const std::string& what) {
    if (d.structure.empty()) d.structure = what;
  };
  if (p.kernel != variant.kernel) structure("kernel entry " + p.kernel + " vs " + variant.kernel);
  if (p.kernel_params != variant.kernel_params)
    structure("kernel parameters " + p.kernel_params.dump() + " vs " +
              variant.kernel_params.dump());
  if (p.args.size() != variant.args.size()) {
    structure("argument count " + std::to_string(p.args.size()) + " vs " +
              std::to_string(variant.args.size()));
    return d;
  }
  for (size_t i = 0; i < p.args.size(); ++i) {
    const auto &a = p.args[i], &b = variant.args[i];
    if (a.name != b.name || a.role != b.role || a.tensor.dtype() != b.tensor.dtype() ||
        a.tensor.shape() != b.tensor.shape() || a.tensor.strides() != b.tensor.strides() ||
        a.tensor.offset() != b.tensor.offset() ||
        a.tensor.storage()->size() != b.tensor.storage()->size()) {
      structure("argument '" + a.name + "': " + a.tensor.describe() + " vs '" + b.name +
                "': " + b.tensor.describe());
      continue;
    }
    if (a.tensor.storage() != b.tensor.storage() && !same_elements(a.tensor, b.tensor))
      d.contents.push_back(a.name);
  }
  return d;
}

}  // namespace attncheck
