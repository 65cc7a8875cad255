// Pairwise covering arrays under exclusion constraints, for the `pairwise` expansion of case files.
//
// A row gives every axis a value (by index). The generated rows cover every pair of values of any
// two axes that occurs together in at least one allowed row (and every single value), so a bug that
// needs two axis values together shows up in some case. Constraints are partial assignments that no
// row may contain (the `exclude` rules of a group).
//
// The generator is greedy and deterministic (AETG-like, one candidate per row): seed a row with the
// first uncovered pair, then give each remaining axis the value that covers the most uncovered
// pairs with the axes already set, among the values that still leave the row completable. Rows that
// end up covering nothing on their own are dropped at the end. Same input, same rows, on every
// machine.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace attncheck {

using CoverRow = std::vector<int>;  // value index per axis; -1 = not assigned (partial rows)
// Forbidden partial assignment: (axis, value index) pairs that must not all hold in one row.
using CoverConstraint = std::vector<std::pair<int, int>>;

// counts[a] = number of values of axis a (each >= 1).
std::vector<CoverRow> pairwise_rows(const std::vector<int>& counts,
                                    const std::vector<CoverConstraint>& constraints = {});

// Every allowed row, in lexicographic order (the `cartesian` expansion).
std::vector<CoverRow> cartesian_rows(const std::vector<int>& counts,
                                     const std::vector<CoverConstraint>& constraints = {});

// True when some complete row extending `partial` violates no constraint.
bool completable(const CoverRow& partial, const std::vector<int>& counts,
                 const std::vector<CoverConstraint>& constraints);

// Pairs (a, x, b, y), a < b, that some allowed row holds but none of `rows` does. Used by tests to
// prove coverage; empty for the output of pairwise_rows.
struct UncoveredPair {
  int axis_a, value_a, axis_b, value_b;
};
std::vector<UncoveredPair> uncovered_pairs(const std::vector<CoverRow>& rows,
                                           const std::vector<int>& counts,
                                           const std::vector<CoverConstraint>& constraints = {});

}  // namespace attncheck
