#include "covering.h"

#include <stdexcept>

namespace attncheck {

namespace {

bool violates(const CoverRow& row, const std::vector<CoverConstraint>& constraints) {
  for (const auto& c : constraints) {
    bool all = !c.empty();
    for (const auto& [axis, value] : c) all = all && row[static_cast<size_t>(axis)] == value;
    if (all) return true;
  }
  return false;
}

// Pairs of values of axes a < b, numbered densely.
class PairIndex {
 public:
  explicit PairIndex(const std::vector<int>& counts) : counts_(counts) {
    const size_t n = counts.size();
    base_.assign(n * n, 0);
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b) {
        base_[a * n + b] = total_;
        total_ += static_cast<size_t>(counts[a]) * static_cast<size_t>(counts[b]);
      }
  }
  size_t total() const { return total_; }
  size_t of(int a, int x, int b, int y) const {
    if (a > b) return of(b, y, a, x);
    const size_t n = counts_.size();
    return base_[static_cast<size_t>(a) * n + static_cast<size_t>(b)] +
           static_cast<size_t>(x) * static_cast<size_t>(counts_[static_cast<size_t>(b)]) +
           static_cast<size_t>(y);
  }
  // The pair (a, x, b, y) of `index`, the inverse of of(): found in O(axes^2), not by visiting
  // every pair (once per row, that made expansion quadratic in the pairs).
  template <class Fn>
  void at(size_t index, Fn fn) const {  // fn(a, x, b, y)
    const int n = static_cast<int>(counts_.size());
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        const size_t base = base_[static_cast<size_t>(a) * counts_.size() + static_cast<size_t>(b)];
        const auto cb = static_cast<size_t>(counts_[static_cast<size_t>(b)]);
        const size_t size = static_cast<size_t>(counts_[static_cast<size_t>(a)]) * cb;
        if (index < base || index >= base + size) continue;
        fn(a, static_cast<int>((index - base) / cb), b, static_cast<int>((index - base) % cb));
        return;
      }
  }
  template <class Fn>
  void for_each(Fn fn) const {  // fn(a, x, b, y, index)
    const int n = static_cast<int>(counts_.size());
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        for (int x = 0; x < counts_[static_cast<size_t>(a)]; ++x)
          for (int y = 0; y < counts_[static_cast<size_t>(b)]; ++y) fn(a, x, b, y, of(a, x, b, y));
  }

 private:
  std::vector<int> counts_;
  std::vector<size_t> base_;
  size_t total_ = 0;
};

void check_inputs(const std::vector<int>& counts, const std::vector<CoverConstraint>& constraints) {
  for (int c : counts)
    if (c < 1) throw std::invalid_argument("covering array: every axis needs at least one value");
  for (const auto& c : constraints)
    for (const auto& [axis, value] : c)
      if (axis < 0 || axis >= static_cast<int>(counts.size()) || value < 0 ||
          value >= counts[static_cast<size_t>(axis)])
        throw std::invalid_argument("covering array: constraint names a value out of range");
}

}  // namespace

bool completable(const CoverRow& partial, const std::vector<int>& counts,
                 const std::vector<CoverConstraint>& constraints) {
  if (violates(partial, constraints)) return false;
  // Only unassigned axes that some constraint mentions can make completion impossible.
  for (const auto& c : constraints)
    for (const auto& [axis, value] : c) {
      (void)value;
      if (partial[static_cast<size_t>(axis)] != -1) continue;
      CoverRow row = partial;
      for (int v = 0; v < counts[static_cast<size_t>(axis)]; ++v) {
        row[static_cast<size_t>(axis)] = v;
        if (completable(row, counts, constraints)) return true;
      }
      return false;
    }
  return true;
}

std::vector<CoverRow> cartesian_rows(const std::vector<int>& counts,
                                     const std::vector<CoverConstraint>& constraints) {
  check_inputs(counts, constraints);
  std::vector<CoverRow> rows;
  CoverRow row(counts.size(), 0);
  while (true) {
    if (!violates(row, constraints)) rows.push_back(row);
    size_t d = counts.size();
    while (d > 0) {  // odometer, last axis fastest
      --d;
      if (++row[d] < counts[d]) break;
      row[d] = 0;
      if (d == 0) return rows;
    }
    if (counts.empty()) return rows;
  }
}

std::vector<CoverRow> pairwise_rows(const std::vector<int>& counts,
                                    const std::vector<CoverConstraint>& constraints) {
  check_inputs(counts, constraints);
  const int n = static_cast<int>(counts.size());
  if (n <= 1) return cartesian_rows(counts, constraints);  // no pairs: every allowed value once

  const PairIndex pairs(counts);
  // covered[p]: already in a row, or not required (no allowed row holds it).
  std::vector<char> covered(pairs.total(), 1);
  size_t uncovered = 0;
  pairs.for_each([&](int a, int x, int b, int y, size_t p) {
    CoverRow partial(counts.size(), -1);
    partial[static_cast<size_t>(a)] = x;
    partial[static_cast<size_t>(b)] = y;
    if (completable(partial, counts, constraints)) {
      covered[p] = 0;
      ++uncovered;
    }
  });

  std::vector<CoverRow> rows;
  size_t next_seed = 0;
  while (uncovered > 0) {
    while (covered[next_seed]) ++next_seed;
    CoverRow row(counts.size(), -1);
    pairs.at(next_seed, [&](int a, int x, int b, int y) {
      row[static_cast<size_t>(a)] = x;
      row[static_cast<size_t>(b)] = y;
    });
    for (int c = 0; c < n; ++c) {
      const auto cu = static_cast<size_t>(c);
      if (row[cu] != -1) continue;
      int best = -1, best_score = -1;
      for (int v = 0; v < counts[cu]; ++v) {
        row[cu] = v;
        if (!completable(row, counts, constraints)) continue;
        int score = 0;
        for (int d = 0; d < n; ++d) {
          const int w = row[static_cast<size_t>(d)];
          if (d != c && w != -1 && !covered[pairs.of(c, v, d, w)]) ++score;
        }
        if (score > best_score) {
          best_score = score;
          best = v;
        }
      }
      row[cu] = best;  // exists: the row was completable before this axis
    }
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        const size_t p = pairs.of(a, row[static_cast<size_t>(a)], b, row[static_cast<size_t>(b)]);
        if (!covered[p]) {
          covered[p] = 1;
          --uncovered;
        }
      }
    rows.push_back(std::move(row));
  }

  // Drop rows whose every pair another row also covers (last rows first: they were the greediest
  // leftovers).
  std::vector<int> times(pairs.total(), 0);
  for (const auto& r : rows)
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        ++times[pairs.of(a, r[static_cast<size_t>(a)], b, r[static_cast<size_t>(b)])];
  for (size_t i = rows.size(); i-- > 0;) {
    bool redundant = true;
    for (int a = 0; a < n && redundant; ++a)
      for (int b = a + 1; b < n && redundant; ++b)
        redundant = times[pairs.of(a, rows[i][static_cast<size_t>(a)], b,
                                   rows[i][static_cast<size_t>(b)])] >= 2;
    if (!redundant) continue;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        --times[pairs.of(a, rows[i][static_cast<size_t>(a)], b, rows[i][static_cast<size_t>(b)])];
    rows.erase(rows.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return rows;
}

std::vector<UncoveredPair> uncovered_pairs(const std::vector<CoverRow>& rows,
                                           const std::vector<int>& counts,
                                           const std::vector<CoverConstraint>& constraints) {
  check_inputs(counts, constraints);
  std::vector<UncoveredPair> out;
  const PairIndex pairs(counts);
  std::vector<char> held(pairs.total(), 0);
  const int n = static_cast<int>(counts.size());
  for (const auto& r : rows)
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        held[pairs.of(a, r[static_cast<size_t>(a)], b, r[static_cast<size_t>(b)])] = 1;
  pairs.for_each([&](int a, int x, int b, int y, size_t p) {
    if (held[p]) return;
    CoverRow partial(counts.size(), -1);
    partial[static_cast<size_t>(a)] = x;
    partial[static_cast<size_t>(b)] = y;
    if (completable(partial, counts, constraints)) out.push_back({a, x, b, y});
  });
  return out;
}

}  // namespace attncheck
