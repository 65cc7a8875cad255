"""Stand-in for the cached-positions RoPE of aiter/ops/rope.py
(csrc/kernels/rope/general_2c_cached_positions_fwd_kernels.cu, rope_common.h).

Two channels x and y in "sbhd" layout, any s/b/h strides, unit d stride (AITER_CHECK);
``positions [s, b]`` (int64 in AITER's default build) index ``cos``/``sin [max_pos, 1, 1, f]``
read as rows of f contiguous values; with ``reuse_freqs_front_part`` the rotated width is 2f, the
rest of d is copied (out of place) or left alone (in place). rotate_style 0 = NeoX pairs
(i, i + f), 1 = GPT-J pairs (2i, 2i + 1); a' = a c - b s, b' = b c + a s in fp32, rounded once.
A position outside [0, max_pos) skips its token.
"""

import numpy as np

from .._standin import check


def _rotate(out, inp, cos_rows, sin_rows, positions, rotate_style, nope_first):
    s, b, h, d = inp.shape
    f = cos_rows.shape[1]
    rot = 2 * f
    check(rot <= d, f"stand-in: rotated width {rot} > head dim {d}")
    x = inp.values()
    res = x.copy()
    lo = d - rot if nope_first else 0
    for i in range(s):
        for j in range(b):
            p = int(positions[i, j])
            if p < 0 or p >= cos_rows.shape[0]:
                continue
            c = cos_rows[p].astype(np.float32)
            sn = sin_rows[p].astype(np.float32)
            seg = x[i, j, :, lo : lo + rot].astype(np.float32)
            if rotate_style == 0:
                a, bb = seg[:, :f], seg[:, f:]
            else:
                a, bb = seg[:, 0::2], seg[:, 1::2]
            na = a * c - bb * sn
            nb = bb * c + a * sn
            if rotate_style == 0:
                res[i, j, :, lo : lo + f], res[i, j, :, lo + f : lo + rot] = na, nb
            else:
                res[i, j, :, lo : lo + rot : 2], res[i, j, :, lo + 1 : lo + rot : 2] = na, nb
            out.store(res[i, j], (i, j))


def rope_cached_positions_2c_fwd_impl(output_x, output_y, input_x, input_y, cos, sin, positions, rotate_style, reuse_freqs_front_part, nope_first):
    for t in (output_x, output_y, input_x, input_y):
        check(t.ndim == 4, f"stand-in: sbhd tensors, got {t.shape}")
        check(t.stride(3) == 1, "rope_cached_positions_2c_fwd_impl requires all stride_d to be 1")
    check(input_x.dtype == input_y.dtype and output_x.dtype == input_x.dtype and output_y.dtype == input_y.dtype, "stand-in: x and y of one dtype")
    check(input_x.size(3) == input_y.size(3), "stand-in: x and y of one head dim")
    check(output_x.shape == input_x.shape and output_y.shape == input_y.shape, "stand-in: outputs shaped like the inputs")
    check(reuse_freqs_front_part, "stand-in: reuse_freqs_front_part (cos/sin [max_pos, 1, 1, d // 2])")
    check(positions.dtype == "i64", f"rope_cached_positions_2c_fwd_impl does not support positions dtype {positions.dtype} (built with int64 positions)")
    check(positions.ndim == 2 and positions.stride(1) == 1, "assert(1 == positions.stride(1) && 2 == positions.dim())")
    check(cos.ndim == 4 and cos.shape[1:3] == (1, 1) and cos.is_contiguous(), f"stand-in: cos [max_pos, 1, 1, f] contiguous (read at pos * f), got {cos}")
    check(sin.shape == cos.shape and sin.is_contiguous(), "stand-in: sin like cos")
    check(cos.dtype in ("f32", "f16", "bf16") and input_x.dtype in ("f32", "f16", "bf16"), "stand-in: fp32/fp16/bf16")
    s = min(input_x.size(0), positions.size(0))
    b = min(input_x.size(1), positions.size(1))
    check((s, b) == tuple(input_x.shape[:2]), "stand-in: positions cover every token")
    cos_rows = cos.values()[:, 0, 0, :]
    sin_rows = sin.values()[:, 0, 0, :]
    pos = positions.arr
    # Read both inputs before writing: in place, output and input are the same memory.
    _rotate(output_x, input_x, cos_rows, sin_rows, pos, rotate_style, nope_first)
    _rotate(output_y, input_y, cos_rows, sin_rows, pos, rotate_style, nope_first)


def rope_cached_positions_2c_fwd_inplace(input_x, input_y, cos, sin, positions, rotate_style, reuse_freqs_front_part, nope_first):
    rope_cached_positions_2c_fwd_impl(input_x, input_y, input_x, input_y, cos, sin, positions, rotate_style, reuse_freqs_front_part, nope_first)
