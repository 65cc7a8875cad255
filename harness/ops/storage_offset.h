// The storage_offset axis (issue 21): every dense storage of a problem moved 256 bytes into a
// larger one, so every argument reaches the kernel at a nonzero DLPack byte_offset. A kernel or
// adapter that drops byte_offset (takes `data` for element 0) then reads the leading bytes, 0xFF
// (NaN in every float dtype, -1 in integers), or writes there, which the runner reports (bytes
// outside every view must stay untouched, docs/abi.md).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/op.h"

namespace attncheck {

// The axis's help; each op adds the field beside its seed ("soff", out of case ids at false).
inline constexpr const char* kStorageOffsetHelp =
    "true: every argument is a view 256 bytes into its storage (a nonzero DLPack byte_offset; "
    "the bytes before it hold 0xFF and must stay untouched)";

// Multiple of every element size and of 16 bytes: views keep their alignment.
inline constexpr int64_t kStorageOffsetBytes = 256;

// Moves every dense storage the problem's arguments view `bytes` (a multiple of 16) further into
// a new storage whose first `bytes` hold 0xFF; views keep their shapes, strides and aliasing.
// Sparse storages (docs/abi.md) stay as they are: their views already start far from element 0.
void shift_storages(Problem& prob, int64_t bytes = kStorageOffsetBytes);

// An output whose last row (along dim 0) starts past element 2^log2 of a sparse storage
// (docs/abi.md "Sparse storages"), rows `rows - 1` apart by the dim-0 stride: the host holds that
// row only, and only it is compared (Tensor::held_rows). Needs shape[0] >= 2. (issue 21 item 3:
// 32-bit offset arithmetic on outputs.)
Tensor far_last_row(DType dtype, const Shape& shape, int64_t log2);
// The same with row `row` (>= 1) as the one past element 2^log2 and the only one the host holds:
// for writers whose inputs have rows past the last one they read (padding tokens).
Tensor far_row(DType dtype, const Shape& shape, int64_t row, int64_t log2);
// far_rows on writers (issue 37): each named argument moves to a far_row storage whose row `row`
// (one token, its values kept) lies past element 2^31 and byte 2^32; the caller makes that token
// the only one the op reads (slot -1 elsewhere), so the reference reads that row alone.
void place_far_token(Problem& prob, const std::vector<std::string>& names, int64_t row);

// The rows of a reference output that the kernel's output `out` holds: all of them unless it
// lies on a sparse storage.
Tensor held_rows_of(const Tensor& expected, const Tensor& out);
// The dim-0 index of the first row of `t` the host holds (Tensor::held_rows): 0 when it holds
// every row or none.
int64_t first_held_row(const Tensor& t);

// The pad_strides axis (issue 37): each named argument moves to a storage of its own whose
// dim-0 stride is 16 bytes (at least one element) longer, its other strides and its values kept,
// the gaps 0xFF: a contiguous argument becomes strided, so a kernel that assumes a contiguous
// layout (or drops a stride) reads the gap's NaN / -1 or writes there (the runner reports it).
// Skipped: sparse storages, storages another argument shares (aliasing is part of a case), and
// tensors with fewer than two rows. Throws when a name is not an argument.
void pad_outer_strides(Problem& prob, const std::vector<std::string>& names);
// The far_rows axis (issue 37): 32-bit offset arithmetic on inputs and outputs of ops whose rows
// (dim 0: tokens) are independent. `far` arguments move to far_last_row storages whose last row
// lies past element 2^31 and byte 2^32 (2^32 elements of a 1-byte dtype), holding that row only
// (its values kept; the other rows are device poison); `held` outputs likewise, with the last
// row just past element 2^16 (only compared rows must be held, not far); `sliced` arguments
// stay dense. The reference and the budgets see the last row alone (last_rows_view).
struct FarRows {
  std::vector<std::string> far, held, sliced;
};
void place_far_rows(Problem& prob, const FarRows& rows);
// The problem the reference sees: every far, held and sliced argument cut to its last row.
Problem last_rows_view(const Problem& prob, const FarRows& rows);
inline constexpr const char* kFarRowsHelp =
    "true: the arguments the op lists put their last row (token) past element 2^31 / byte 2^32 "
    "of a sparse storage holding only that row; only it is read on the host and compared";

// The interleave axis (issue 37): each named argument alone on its storage moves to one where
// every stride is doubled (innermost 2: its elements interleave with 0xFF), for the arguments
// whose innermost stride the contract leaves free. Skipped as pad_outer_strides skips.
void interleave_args(Problem& prob, const std::vector<std::string>& names);
inline constexpr const char* kInterleaveHelp =
    "true: the arguments whose innermost stride the contract leaves free (the op lists them) get "
    "every stride doubled, their elements interleaved with 0xFF";

// The compact axis (issue 37), the other way round: each named argument that is not contiguous
// moves to a contiguous storage of its own (same values), for the arguments an op always builds
// strided (padded rows, a slice of a fused output). Skipped: sparse or shared storages.
void compact_args(Problem& prob, const std::vector<std::string>& names);
inline constexpr const char* kCompactHelp =
    "true: the arguments the op otherwise builds strided (it lists them) are contiguous";
inline constexpr const char* kPadStridesHelp =
    "true: the arguments whose outer strides the contract leaves free (the op lists them) get a "
    "dim-0 stride 16 bytes longer on a storage of their own, the gaps 0xFF";

// The typed field (Fields<P>, ops/typed_op.h, which applies it: TypedOp::make): a bool member
// whose P{} value is false, out of case ids at false ("-soff1" when true). `member` may be one
// of a base of P.
template <class P, template <class> class Fields>
void add_storage_offset(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("storage_offset", "soff", member, kStorageOffsetHelp).out_of_id_at_default();
}
template <class P, template <class> class Fields>
void add_interleave(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("interleave", "ilv", member, kInterleaveHelp).out_of_id_at_default();
}
template <class P, template <class> class Fields>
void add_far_rows(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("far_rows", "far", member, kFarRowsHelp).out_of_id_at_default();
}
template <class P, template <class> class Fields>
void add_compact(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("compact", "cmp", member, kCompactHelp).out_of_id_at_default();
}
// The same for pad_strides ("pstr1" when true; the op overrides TypedOp::padded_args).
template <class P, template <class> class Fields>
void add_pad_strides(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("pad_strides", "pstr", member, kPadStridesHelp).out_of_id_at_default();
}

}  // namespace attncheck
