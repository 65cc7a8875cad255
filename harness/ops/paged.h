// Paged-cache metadata shared by the paged ops (MLA decode, decode attention, indexer, KV gather):
// ragged sequence lengths with block-edge cases, and block tables of permuted, non-contiguous ids.
// Also the two detection axes those ops share (issue 14): caches whose blocks lie past byte 2^31 /
// 2^32 (sparse storages, docs/abi.md), and fp8 special codes in the inputs (docs/formats.md).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/tensor.h"
#include "ops/op.h"
#include "ops/typed_op.h"

namespace attncheck {

struct PagedLayout {
  Tensor seq_lens;     // [B] int32: includes 0, 1, K-1, K, K+1 and max_ctx where the batch allows
  Tensor block_table;  // [B, W] int32 view; W = ceil(max_ctx / K) + 1; unused entries hold -7
                       // (a kernel that reads them gets an invalid block id)
  int64_t num_blocks;  // size of the block pool; ids are a random permutation of [0, num_blocks)
};

// strided_table: the table is a view into rows of width W + 5 (row stride != W).
// long_from: requests before it are min_len (at least 1) tokens long, and the edge lengths start
// there (a large batch whose only purpose is its size stays cheap to generate and to check).
// column_step: the table's innermost stride (2: the columns interleave with entries holding a spare
// block id nobody owns, so a kernel that assumes a unit innermost stride reads a wrong page).
PagedLayout paged_layout(const std::string& case_id, int64_t batch, int64_t max_ctx,
                         int64_t block_size, bool strided_table, int64_t seed, int64_t min_len = 0,
                         int64_t long_from = 0, int64_t column_step = 1);

// table_step in {1, 2} (issue 37), out of case ids at 1: paged_layout's column_step.
template <class P>
void add_table_step(Fields<P>& f, std::type_identity_t<int64_t P::*> member) {
  f.add("table_step", "tstep", member,
        "the block table's innermost stride; 2: its columns interleave with a spare block id "
        "nobody owns (docs/ops allow any table strides)")
      .only({1, 2})
      .out_of_id_at_default();
}

// Upper estimates for the ops' size() (CaseSize, ops/op.h), from the axes alone: the blocks of
// the pool (those the requests own and the spares; a large-offset cache holds these only), and
// the host bytes of the table (a strided table's wider rows included) and the lengths.
inline double paged_blocks(int64_t batch, int64_t max_ctx, int64_t K) {
  const double k = static_cast<double>(std::max<int64_t>(K, 1));
  return static_cast<double>(batch) * std::ceil(static_cast<double>(max_ctx) / k) + 3;
}
inline double paged_layout_bytes(int64_t batch, int64_t max_ctx, int64_t K) {
  const double k = static_cast<double>(std::max<int64_t>(K, 1));
  return 4 * static_cast<double>(batch) * (std::ceil(static_cast<double>(max_ctx) / k) + 8);
}

// ---- large offsets ----
// offset_log2 in {0, 31, 32}, out of case ids at 0; `help` says what lies past the offset.
Axis offset_log2_axis(const std::string& help);
// The first block id whose byte offset (id * block_bytes) lies past 2^offset_log2: block ids from
// there on make every cache offset exceed 2^31 (2^32). 0 for offset_log2 = 0.
int64_t first_block_past(int64_t offset_log2, int64_t block_bytes);
// The u8 storage of a byte-paged cache: `offset` bytes, then `first` pages no case reads, then
// `pages` pages of `stride` bytes. Dense (zeroed) when first is 0; else sparse (large offsets),
// the host holding the `pages` pages only.
Tensor paged_storage(int64_t first, int64_t pages, int64_t stride, int64_t offset = 0);
// Adds `first` (which may be negative) to every block id the table holds (the -7 fillers stay):
// the pool becomes ids [first, first + num_blocks), the blocks a sparse cache storage holds on the
// host. Throws when a moved id is not a non-negative int32.
void shift_block_ids(const PagedLayout& layout, int64_t first);

// The typed field (ops/typed_op.h) of the same axis: an int64_t member whose P{} value is 0.
// `member` may be one of a base of P (type_identity: not deduced, so it converts).
template <class P>
void add_offset_log2(Fields<P>& f, std::type_identity_t<int64_t P::*> member,
                     const std::string& help) {
  const Axis a = offset_log2_axis(help);
  f.add(a.name, a.prefix, member, a.help).only(a.allowed).out_of_id_at_default();
  if (f.list().back().axis.default_value != a.default_value)
    throw std::logic_error("offset_log2: P{} must hold the axis default 0");
}

// ---- fp8 special codes ----
// fp8_codes in {ordinary, special}, out of case ids at "ordinary".
Axis fp8_codes_axis(const std::string& help);
enum class Fp8Codes { ordinary, special };
// The typed field of the same axis: a Fp8Codes member whose P{} value is ordinary.
template <class P>
void add_fp8_codes(Fields<P>& f, std::type_identity_t<Fp8Codes P::*> member,
                   const std::string& help) {
  const Axis a = fp8_codes_axis(help);
  f.choice(a.name, a.prefix, member,
           {{Fp8Codes::ordinary, "ordinary"}, {Fp8Codes::special, "special"}}, a.help)
      .out_of_id_at_default();
  if (f.list().back().axis.default_value != a.default_value ||
      f.list().back().axis.allowed != a.allowed)
    throw std::logic_error("fp8_codes: the typed field must match fp8_codes_axis");
}
// Element k (a running count over the elements a kernel reads) of special inputs: every 11th the
// saturation code +-max finite (sign alternating), in e4m3fn the one 5 after it -0 (0x80);
// nullopt for the others, which keep their ordinary codes.
std::optional<uint8_t> fp8_special_code(int64_t k, DType fp8);
// The format's NaN code for element i of a slot no kernel reads: e4m3fn 0x7F / 0xFF alternating,
// e4m3fnuz 0x80 (its only NaN).
uint8_t fp8_nan_code(int64_t i, DType fp8);

}  // namespace attncheck
