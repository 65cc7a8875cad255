#include "ops/relation.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "core/rng.h"

namespace attncheck {

namespace {

using Rows = std::pair<int64_t, int64_t>;  // [begin, end) along dim 0

// The rows of each request in the per_token args.
std::vector<Rows> token_rows(const Problem& p, const BatchArgs& args, int64_t requests) {
  std::vector<Rows> rows;
  for (int64_t r = 0; r < requests; ++r) {
    if (args.token_starts.empty()) {
      const int64_t n = args.tokens_per_request;
      rows.emplace_back(r * n, (r + 1) * n);
    } else {
      const Tensor& s = p.arg(args.token_starts);
      rows.emplace_back(s.at<int32_t>({r}), s.at<int32_t>({r + 1}));
    }
  }
  return rows;
}

// Whether `t` is rows of contiguous elements, each row stride(0) apart (padded or not).
bool padded_rows_layout(const Tensor& t) {
  if (t.ndim() < 2 || t.size(0) < 1) return false;
  const Tensor row = t.select(0, 0);
  return row.is_contiguous() && t.stride(0) >= std::max<int64_t>(row.numel(), 1);
}

// An empty tensor of `rows` rows laid out as `t`'s: padded rows keep their row stride (the
// layout the kernel accepted in the case's launch; the gaps hold the byte `t` starts with),
// anything else contiguous.
Tensor rows_like(const Tensor& t, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  if (t.storage()->sparse() || !padded_rows_layout(t) || t.stride(0) == t.select(0, 0).numel())
    return Tensor::empty(t.dtype(), shape);
  Shape strides = Tensor::contiguous_strides(shape);
  strides[0] = t.stride(0);
  const std::byte gap = *t.data();
  return Tensor::filled_bytes(t.dtype(), {std::max<int64_t>(rows, 1) * t.stride(0)}, gap)
      .as_strided(shape, strides, 0);
}

// A tensor of `t`'s rows `picked`, in that order, laid out as `t` (rows_like).
Tensor gather_rows(const Tensor& t, const std::vector<Rows>& picked) {
  int64_t rows = 0;
  for (const auto& [b, e] : picked) rows += e - b;
  Tensor out = rows_like(t, rows);
  int64_t at = 0;
  for (const auto& [b, e] : picked) {
    if (e > b) out.slice(0, at, at + e - b).copy_from(t.slice(0, b, e));
    at += e - b;
  }
  return out;
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The requests `picked` (original indices, in their new order) as a batch of their own. The
// outputs map back into a copy of the first launch's, each request's rows at their old place.
Relation select_requests(const Problem& p, const BatchArgs& args,
                         const std::vector<int64_t>& picked) {
  const int64_t requests = request_count(p, args);
  const auto rows = token_rows(p, args, requests);
  std::vector<Rows> by_request, by_token;
  for (const int64_t r : picked) {
    if (r < 0 || r >= requests) throw std::logic_error("relation: request index out of range");
    by_request.emplace_back(r, r + 1);
    by_token.push_back(rows[static_cast<size_t>(r)]);
  }
  Relation rel;
  rel.problem = p;
  for (auto& a : rel.problem.args) {
    if (listed(args.per_request, a.name))
      a.tensor = gather_rows(a.tensor, by_request);
    else if (listed(args.per_token, a.name))
      a.tensor = gather_rows(a.tensor, by_token);
  }
  if (!args.token_starts.empty()) {
    Tensor starts = Tensor::empty(DType::i32, {static_cast<int64_t>(picked.size()) + 1});
    int64_t at = 0;
    starts.at<int32_t>({0}) = 0;
    for (size_t i = 0; i < by_token.size(); ++i) {
      at += by_token[i].second - by_token[i].first;
      starts.at<int32_t>({static_cast<int64_t>(i) + 1}) = static_cast<int32_t>(at);
    }
    rel.problem.arg(args.token_starts) = starts;
  }
  // Output rows: request picked[i]'s rows came from by_token[i] / by_request[i].
  std::vector<std::string> outputs;
  for (const auto& a : p.args)
    if (a.role != Role::input) outputs.push_back(a.name);
  rel.back = [args, by_request, by_token, outputs](const TensorMap& got, const TensorMap& first) {
    TensorMap out;
    for (const auto& name : outputs) {
      const auto f = first.find(name);
      const auto g = got.find(name);
      if (f == first.end() || g == got.end()) continue;
      if (listed(args.whole, name)) {
        out.emplace(name, g->second);
        continue;
      }
      Tensor merged = f->second.clone();
      const bool per_request = listed(args.per_request, name);
      if (per_request || listed(args.per_token, name)) {
        const auto& src = per_request ? by_request : by_token;
        int64_t at = 0;
        for (const auto& [b, e] : src) {
          if (e > b) merged.slice(0, b, e).copy_from(g->second.slice(0, at, at + e - b));
          at += e - b;
        }
      }
      out.emplace(name, merged);
    }
    return out;
  };
  return rel;
}

// One page's elements; its bytes at once when both views are contiguous (the usual cache).
void copy_page(Tensor to, const Tensor& from) {
  if (to.is_contiguous() && from.is_contiguous() && to.dtype() == from.dtype())
    std::memcpy(to.data(), from.data(), static_cast<size_t>(from.numel()) * from.element_size());
  else
    to.copy_from(from);
}

}  // namespace

std::vector<std::string> known_properties() {
  return {kBatchInvariant, kBatchOrderInvariant, kSplitInvariant, kPageOrderInvariant};
}

Relation requests_alone(const Problem& p, const BatchArgs& args, int64_t begin, int64_t end) {
  const int64_t n = request_count(p, args);
  if (begin < 0 || end > n || begin >= end)
    throw std::logic_error("relation: chunk [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") is not inside [0, " + std::to_string(n) + ")");
  std::vector<int64_t> picked(static_cast<size_t>(end - begin));
  std::iota(picked.begin(), picked.end(), begin);
  Relation rel = select_requests(p, args, picked);
  rel.name = args.unit + "s [" + std::to_string(begin) + ", " + std::to_string(end) +
             ") alone vs the whole " + std::to_string(n) + " (chunked)";
  rel.bitwise_under = {kBatchInvariant};
  return rel;
}

std::vector<Relation> permuted_and_alone(const Problem& p, const BatchArgs& args, int64_t alone,
                                         uint64_t seed) {
  const int64_t n = request_count(p, args);
  if (n < 2) return {};
  return {permuted_requests(p, args, derangement(n, seed)), request_alone(p, args, alone)};
}

std::vector<Relation> permuted_and_chunked(const Problem& p, const BatchArgs& args, uint64_t seed) {
  const int64_t n = request_count(p, args);
  if (n < 2) return {};
  return {permuted_requests(p, args, derangement(n, seed)), requests_alone(p, args, n / 2, n)};
}

std::optional<Relation> chunked_write(const Problem& p, const BatchArgs& tokens,
                                      const std::function<TensorMap(const Problem&)>& write_first) {
  const int64_t n = request_count(p, tokens);
  std::vector<std::string> written;
  for (const auto& name : tokens.whole) {
    if (!p.has_arg(name)) continue;
    if (p.arg(name).storage()->sparse()) return std::nullopt;
    written.push_back(name);
  }
  if (n < 2 || written.empty()) return std::nullopt;
  Relation rel = requests_alone(p, tokens, n / 2, n);
  const TensorMap before = write_first(requests_alone(p, tokens, 0, n / 2).problem);
  // Own copies of the outputs' storages (K and V caches may share one), their views then
  // overwritten element by element: bytes outside the views stay the case's.
  std::map<const Storage*, std::shared_ptr<Storage>> copies;
  for (const auto& name : written) {
    const auto& s = p.arg(name).storage();
    if (!copies.count(s.get())) copies[s.get()] = std::make_shared<Storage>(*s);
  }
  for (auto& a : rel.problem.args) {
    const auto it = copies.find(a.tensor.storage().get());
    if (it != copies.end()) a.tensor = a.tensor.rebased(it->second);
  }
  for (const auto& name : written) rel.problem.arg(name).copy_from(before.at(name));
  rel.name +=
      ", into the outputs as " + tokens.unit + "s [0, " + std::to_string(n / 2) + ") leave them";
  return rel;
}

int64_t request_count(const Problem& p, const BatchArgs& args) {
  if (args.per_request.empty()) throw std::logic_error("relation: no per-request argument");
  return p.arg(args.per_request.front()).size(0);
}

int64_t longest_request(const Tensor& seq_lens) {
  int64_t best = 0;
  for (int64_t r = 1; r < seq_lens.size(0); ++r)
    if (seq_lens.at<int32_t>({r}) > seq_lens.at<int32_t>({best})) best = r;
  return best;
}

std::string format_order(const std::vector<int64_t>& order) {
  std::string s = "[";
  for (size_t i = 0; i < order.size(); ++i) s += (i ? "," : "") + std::to_string(order[i]);
  return s + "]";
}

std::vector<int64_t> derangement(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), 0);
  if (n < 2) return order;
  Rng rng(seed);
  const auto shuffled = permutation(n, rng);
  // Rotating a permutation by one moves every element: order[i] = shuffled[(k + 1) % n] where
  // shuffled[k] = i.
  std::vector<int64_t> position(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    position[static_cast<size_t>(shuffled[static_cast<size_t>(k)])] = k;
  for (int64_t i = 0; i < n; ++i)
    order[static_cast<size_t>(i)] =
        shuffled[static_cast<size_t>((position[static_cast<size_t>(i)] + 1) % n)];
  return order;
}

Relation permuted_requests(const Problem& p, const BatchArgs& args, std::vector<int64_t> order) {
  Relation rel = select_requests(p, args, order);
  rel.name = (args.unit == "request" ? "batch permutation " : args.unit + " permutation ") +
             format_order(order);
  rel.bitwise_under = {kBatchInvariant, kBatchOrderInvariant};
  return rel;
}

Relation request_alone(const Problem& p, const BatchArgs& args, int64_t r) {
  Relation rel = select_requests(p, args, {r});
  rel.name = args.unit + " " + std::to_string(r) + " alone vs in the batch of " +
             std::to_string(request_count(p, args));
  rel.bitwise_under = {kBatchInvariant};
  return rel;
}

std::optional<Relation> shuffled_pages(const Problem& p, const std::vector<std::string>& caches,
                                       const std::string& table, uint64_t seed) {
  Relation rel;
  rel.problem = p;
  // One private copy per storage the caches live in (V may be a view of K's storage).
  std::map<const Storage*, std::shared_ptr<Storage>> copies;
  for (const auto& name : caches) {
    const auto& s = p.arg(name).storage();
    if (s->sparse()) return std::nullopt;
    if (!copies.count(s.get())) copies[s.get()] = std::make_shared<Storage>(*s);
  }
  for (auto& a : rel.problem.args) {
    const auto it = copies.find(a.tensor.storage().get());
    if (it != copies.end()) a.tensor = a.tensor.rebased(it->second);
  }
  const int64_t pages = p.arg(caches.front()).size(0);
  Rng rng(seed);
  const std::vector<int64_t> to = permutation(pages, rng);  // page i moves to to[i]
  std::map<const Storage*, bool> moved;
  for (const auto& name : caches) {
    const Tensor& old_view = p.arg(name);
    if (moved[old_view.storage().get()]) continue;  // a view of a storage already moved
    moved[old_view.storage().get()] = true;
    const Tensor new_view = rel.problem.arg(name);
    for (int64_t i = 0; i < pages; ++i)
      copy_page(new_view.select(0, to[static_cast<size_t>(i)]), old_view.select(0, i));
  }
  Tensor ids = p.arg(table).clone();
  ids.for_each_index([&](const Index& idx, int64_t) {
    const int32_t id = ids.at<int32_t>(idx);
    if (id >= 0 && id < pages)
      ids.at<int32_t>(idx) = static_cast<int32_t>(to[static_cast<size_t>(id)]);
  });
  rel.problem.arg(table) = ids;
  rel.name =
      "shuffled physical page order (" + std::to_string(pages) + " pages, " + table + " rewritten)";
  rel.bitwise_under = {kPageOrderInvariant};
  rel.back = [](const TensorMap& got, const TensorMap&) { return got; };
  return rel;
}

std::optional<Relation> at_page_size_one(const Problem& p, const std::vector<std::string>& caches,
                                         const std::string& table, int64_t P, bool keep_token_dim) {
  if (P <= 1) return std::nullopt;
  Relation rel;
  rel.problem = p;
  for (const auto& name : caches) {
    const Tensor& cache = p.arg(name);
    if (cache.storage()->sparse() || cache.ndim() < 3 || cache.size(1) != P ||
        cache.stride(0) != P * cache.stride(1))
      return std::nullopt;
    Shape shape{cache.size(0) * P}, strides{cache.stride(1)};
    if (keep_token_dim) {
      shape.push_back(1);
      strides.push_back(cache.stride(1));
    }
    for (int64_t d = 2; d < cache.ndim(); ++d) {
      shape.push_back(cache.size(d));
      strides.push_back(cache.stride(d));
    }
    rel.problem.arg(name) = cache.as_strided(shape, strides, cache.offset());
  }
  const Tensor& ids = p.arg(table);
  const int64_t rows = ids.size(0), W = ids.size(1);
  Tensor expanded = Tensor::empty(DType::i32, {rows, W * P});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < W; ++j) {
      const int64_t id = ids.at<int32_t>({r, j});
      if (id >= 0 && (id + 1) * P > std::numeric_limits<int32_t>::max()) return std::nullopt;
      for (int64_t t = 0; t < P; ++t)
        expanded.at<int32_t>({r, j * P + t}) = static_cast<int32_t>(id < 0 ? id : id * P + t);
    }
  rel.problem.arg(table) = expanded;
  rel.name = "the same cache at page size 1 (" + std::to_string(P) + " tokens per page -> 1, " +
             table + " expanded)";
  rel.back = [](const TensorMap& got, const TensorMap&) { return got; };
  return rel;
}

Relation with_kernel_param(const Problem& p, std::string name, const std::string& key,
                           const nlohmann::json& value, std::any params) {
  Relation rel;
  rel.name = std::move(name);
  rel.problem = p;
  rel.problem.kernel_params[key] = value;
  rel.problem.params = std::move(params);
  rel.back = [](const TensorMap& got, const TensorMap&) { return got; };
  rel.own_budgets = true;
  return rel;
}

}  // namespace attncheck
