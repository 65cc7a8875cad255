// Graph replay's view of an op (docs/verification.md "Graph replay"): which inputs are metadata
// whose contents change between replays of a captured launch, and a second problem with the same
// arguments, shapes, strides and kernel parameters but other metadata contents. The harness
// captures the kernel's launch with the variant's contents, uploads the case's own contents into
// the same buffers, replays, and judges the outputs against the case's expected outputs: a kernel
// or wrapper that read metadata on the host at capture time replays stale values and fails.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/case.h"

namespace attncheck {

struct GraphVariant {
  Problem capture;                   // the problem the launch is captured with
  std::vector<std::string> changed;  // the inputs whose contents differ from the case's
  std::string how;                   // in words: "b_seq_len halved (within the same pages)"
};

// A copy of `p` whose named arguments own copies of their storages (the others share p's), so
// that their contents can change without touching `p`. Throws std::invalid_argument for a name p
// does not have.
Problem with_own_storages(const Problem& p, const std::vector<std::string>& names);

// Each length L of a 1-D int32 tensor becomes max(min_len, L / 2): still within the pages the
// case allocated for L. Returns whether any length changed.
bool halve_lengths(const Tensor& lens, int64_t min_len);

// Each block id >= 0 of a 2-D int32 table becomes another id the table uses (the used ids
// sorted, each to the next larger, the largest to the smallest): still blocks of the cache, each
// used as often as before, every one moved when there are two or more. Negative fillers stay.
// Returns whether any entry changed.
bool permute_block_ids(const Tensor& table);

// Reverses the order of a 1-D tensor's elements (positions, slot mappings): the same values, each
// at another index. Returns whether any element changed.
bool reverse_elements(const Tensor& t);

// In each row of a 2-D int32 table of indices (-1 = no index), the valid entries past the first
// half of them (rounded up) become -1: every row keeps its first indices and no row grows, so
// the longest row shrinks (a maximum read on the host at capture is stale). Returns whether any
// entry changed.
bool drop_second_half(const Tensor& indices);

// One change of a metadata input: the argument, the change in words, and the change itself
// (applied to the variant's own copy; returns whether anything changed).
struct MetadataChange {
  std::string arg;
  std::string what;  // "halved", "block ids permuted", "reversed"
  std::function<bool(const Tensor&)> apply;
};

// The variant with `changes` applied to own copies of their arguments, declaring those that
// changed; nullopt when none did.
std::optional<GraphVariant> metadata_variant(const Problem& p,
                                             const std::vector<MetadataChange>& changes);

// The common changes.
MetadataChange halved(const std::string& lens, int64_t min_len);
MetadataChange permuted_block_ids(const std::string& table);
MetadataChange reversed(const std::string& arg);
MetadataChange second_half_dropped(const std::string& indices);

// Which arguments of `variant` differ in contents from `p` (bitwise, over each view's elements),
// and what else differs in words: argument names, shapes, strides, dtypes, roles, the kernel
// entry or its parameters. The harness refuses a variant whose `structure` is not empty or whose
// differing arguments are not the declared ones.
struct VariantDifference {
  std::vector<std::string> contents;  // arguments whose elements differ
  std::string structure;              // "" when only contents differ
};
VariantDifference variant_difference(const Problem& p, const Problem& variant);

}  // namespace attncheck
