// Rotary position embedding on the last dimension of a (possibly strided) view
// (docs/ops/rope.md): the indexer rotates dims 0..63 of its 128-dim heads, MLA rotates the
// last 64 dims of its q/k heads; the kernels see the rotated slice as a view of the full heads.
#pragma once
#include "core/tensor.h"

namespace attncheck::ref {

enum class RopeStyle {
  neox,  // pairs (i, i + rot/2): DeepSeek-V3.2 indexer
  gptj,  // pairs (2i, 2i + 1), "interleaved": GLM-5 indexer, MLA
};

// [max_pos, rot]: row p = [cos(p θ_0) .. cos(p θ_{rot/2-1}) | sin(p θ_0) .. sin(p θ_{rot/2-1})],
// θ_i = base^(-2i/rot), evaluated in double and rounded to `dtype`.
Tensor rope_cos_sin_cache(int64_t max_pos, int64_t rot, double base, DType dtype);

// The same table for angle -p (sin negated): applying it after `cache` undoes the rotation.
Tensor rope_inverse_cache(const Tensor& cos_sin_cache);

// x: [T, ..., rot], any strides; positions [T] (i32 or i64); cos_sin_cache [max_pos, rot].
// Returns a new contiguous tensor of x's dtype: for every pair (a, b) of the style,
//   a' = a cos - b sin,  b' = b cos + a sin,
// evaluated in double from the exact input and cache values and rounded once to x's dtype.
Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& cos_sin_cache, RopeStyle style);

// The in-place contract: writes rope(x) through x's own view; storage outside the view is
// untouched.
void rope_inplace(const Tensor& x, const Tensor& positions, const Tensor& cos_sin_cache,
                  RopeStyle style);

struct RotatedQK {
  Tensor q;  // [T, H, head_dim] contiguous
  Tensor k;  // [T, head_dim] contiguous
};
// The indexer's RoPE step (indexer_qk_rope in docs/ops/rope.md): dims [0, rot) of every q head and
// of k rotated, rot = cos_sin_cache.size(1); dims [rot, head_dim) copied bit for bit.
RotatedQK indexer_qk_rope(const Tensor& q, const Tensor& k, const Tensor& positions,
                          const Tensor& cos_sin_cache, RopeStyle style);

}  // namespace attncheck::ref
