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

// The typed field (Fields<P>, ops/typed_op.h, which applies it: TypedOp::make): a bool member
// whose P{} value is false, out of case ids at false ("-soff1" when true). `member` may be one
// of a base of P.
template <class P, template <class> class Fields>
void add_storage_offset(Fields<P>& f, std::type_identity_t<bool P::*> member) {
  f.add("storage_offset", "soff", member, kStorageOffsetHelp).out_of_id_at_default();
}

}  // namespace attncheck
