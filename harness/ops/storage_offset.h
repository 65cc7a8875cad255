// The storage_offset axis (issue 21): every dense storage of a problem moved 256 bytes into a
// larger one, so every argument reaches the kernel at a nonzero DLPack byte_offset. A kernel or
// adapter that drops byte_offset (takes `data` for element 0) then reads the leading bytes, 0xFF
// (NaN in every float dtype, -1 in integers), or writes there, which the runner reports (bytes
// outside every view must stay untouched, docs/abi.md).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

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

// The rows of a reference output that the kernel's output `out` holds: all of them unless it
// lies on a sparse storage.
Tensor held_rows_of(const Tensor& expected, const Tensor& out);

// The typed field (Fields<P>, ops/typed_op.h, which applies it: TypedOp::make): a bool member
// whose P{} value is false, out of case ids at false ("-soff1" when true). `member` may be one
// of a base of P.
template <class P, template <class> class Fields>
void add_storage_offset(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("storage_offset", "soff", member, kStorageOffsetHelp).out_of_id_at_default();
}

}  // namespace attncheck
