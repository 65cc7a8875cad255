"""Stand-in for the cache writers and the indexer gather of aiter/ops/cache.py
(csrc/kernels/cache_kernels.cu).

Each follows the addressing of its kernel: where the kernel derives an offset from a tensor's
*shape* (reshape_and_cache: the whole cache; reshape_and_cache_flash: slot, head and dim inside a
block; indexer_k_quant_and_cache: the page), the stand-in requires the layout that makes the shape
and the strides agree and raises otherwise, because emulating the kernel there would mean writing
outside the view it was given. fp8 stores are the platform's fp8 (opus::fp8_t: e4m3fnuz on
gfx942, e4m3fn on gfx950) of ``fp32(x) * (1 / scale)``, as the kernels compute them (a multiply by
the reciprocal), rounded to nearest even and saturated.
"""

import numpy as np

from .._standin import FP8, FP8_MAX, check, encode_fp8, platform_fp8


def _token_rows(x, name, T, H, D):
    check(x.ndim == 3 and x.shape[0] >= T and x.shape[1:] == (H, D), f"stand-in: {name} must be [T, {H}, {D}], got {x.shape}")
    # The kernels read token t's heads and dims as one run at t * stride(0).
    check(x.stride(2) == 1 and x.stride(1) == D, f"stand-in: {name} strides {x.stride()}: heads and dims must be one contiguous run")


def _quantized(x, scale, kv_cache_dtype, cache):
    """What a writer stores for x: a copy for "auto", else fp32(x) * fp32(1 / scale) into fp8."""
    if kv_cache_dtype == "auto":
        return x
    check(kv_cache_dtype in ("fp8", "fp8_e4m3"), f"Unsupported data type of kv cache: {kv_cache_dtype}")
    check(cache.dtype in FP8 or cache.dtype == "u8", f"stand-in: an fp8 cache must be fp8 or uint8, got {cache.dtype}")
    check(cache.dtype in ("u8", platform_fp8()), f"stand-in: the cache is {cache.dtype} but the kernel stores {platform_fp8()} (opus::fp8_t)")
    inv = np.float32(1.0) / np.float32(scale)
    return (x.astype(np.float32) * inv).astype(np.float64)


def _store(cache, index, values, kv_cache_dtype, src_dtype):
    if kv_cache_dtype == "auto":
        check(cache.dtype == src_dtype, f"stand-in: an auto cache must hold the key dtype {src_dtype}, got {cache.dtype}")
        cache.store(values, index)
        return
    cache.arr[index] = encode_fp8(values, platform_fp8())


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    T, H, D = key.shape[0], key.shape[1], key.shape[2]
    check(slot_mapping.size(0) >= T, "stand-in: one slot per key row")
    for name, x in (("key", key), ("value", value)):
        _token_rows(x, name, T, H, D)
    check(key_cache.stride(0) == value_cache.stride(0), "AITER_CHECK(key_cache.stride(0) == value_cache.stride(0))")
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        check(c.ndim == 4 and c.shape[2:] == (H, D), f"stand-in: {name} must be [nb, P, {H}, {D}], got {c.shape}")
        # block_idx * block_stride + block_offset * H * D + head * D + d
        check(c.stride(1) == H * D and c.stride(2) == D and c.stride(3) == 1, f"stand-in: {name} strides {c.stride()}: the kernel addresses slot, head and dim from the shape")
    check(slot_mapping.dtype in ("i32", "i64"), "stand-in: slot_mapping int32 or int64")
    P = key_cache.shape[1]
    slots = slot_mapping.arr.astype(np.int64)
    kv, vv = key.values(), value.values()
    ks = float(k_scale.values().reshape(-1)[0])
    vs = float(v_scale.values().reshape(-1)[0])
    for t in range(T):
        s = int(slots[t])
        if s < 0:
            continue
        blk, off = s // P, s % P
        check(blk < key_cache.shape[0], f"stand-in: slot {s} is past the cache")
        _store(key_cache, (blk, off), _quantized(kv[t], ks, kv_cache_dtype, key_cache), kv_cache_dtype, key.dtype)
        _store(value_cache, (blk, off), _quantized(vv[t], vs, kv_cache_dtype, value_cache), kv_cache_dtype, value.dtype)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale=None, v_scale=None, asm_layout=False):
    T, H, D = key.shape[0], key.shape[1], key.shape[2]
    check(slot_mapping.size(0) >= T, "stand-in: one slot per key row")
    for name, x in (("key", key), ("value", value)):
        _token_rows(x, name, T, H, D)
    check(key_cache.ndim == 5, f"stand-in: key_cache must be [nb, H, D/x, P, x], got {key_cache.shape}")
    P, x = key_cache.shape[3], key_cache.shape[4]
    nb = key_cache.shape[0]
    check(key_cache.shape == (nb, H, D // x, P, x), f"stand-in: key_cache must be [nb, {H}, {D}/x, P, x], got {key_cache.shape}")
    # Every offset comes from the shape: block * H * D * P + ..., so only a contiguous cache is
    # addressed where its view says.
    check(key_cache.is_contiguous(), f"stand-in: key_cache strides {key_cache.stride()}: reshape_and_cache addresses the cache from its shape")
    check(value_cache.is_contiguous(), f"stand-in: value_cache strides {value_cache.stride()}: reshape_and_cache addresses the cache from its shape")
    if asm_layout:
        check(value_cache.shape == (nb, H, P // x, D, x), f"stand-in: asm value_cache must be [nb, {H}, P/x, {D}, x], got {value_cache.shape}")
    else:
        check(value_cache.shape == (nb, H, D, P), f"stand-in: value_cache must be [nb, {H}, {D}, P], got {value_cache.shape}")
    slots = slot_mapping.arr.astype(np.int64)
    kv, vv = key.values(), value.values()
    ks = 1.0 if k_scale is None else float(k_scale.values().reshape(-1)[0])
    vs = 1.0 if v_scale is None else float(v_scale.values().reshape(-1)[0])
    d = np.arange(D)
    for t in range(T):
        s = int(slots[t])
        if s < 0:
            continue
        blk, off = s // P, s % P
        check(blk < nb, f"stand-in: slot {s} is past the cache")
        for h in range(H):
            kq = _quantized(kv[t, h], ks, kv_cache_dtype, key_cache)
            vq = _quantized(vv[t, h], vs, kv_cache_dtype, value_cache)
            _store(key_cache, (blk, h, d // x, off, d % x), kq, kv_cache_dtype, key.dtype)
            vidx = (blk, h, off // x, d, off % x) if asm_layout else (blk, h, d, off)
            _store(value_cache, vidx, vq, kv_cache_dtype, value.dtype)


def _paged_byte_offset(block_size, head_dim, t, d, preshuffle):
    """Byte of token t's value d inside a page (indexer cache): NORMAL t*D + d, or the MFMA
    16x16 tiles of the preshuffled layout."""
    if preshuffle:
        return (t // 16) * (16 * head_dim) + (d // 16) * 256 + (t % 16) * 16 + d % 16
    return t * head_dim + d


def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, preshuffle=False):
    T = min(k.size(0), slot_mapping.size(0))
    head_dim = k.size(1)
    check(head_dim % quant_block_size == 0, "head_dim must be divisible by quant_block_size")
    check(quant_block_size == head_dim, "stand-in: one scale per token (quant_block_size == head_dim)")
    nb, bs, cache_stride = kv_cache.shape
    if preshuffle:
        check(bs % 16 == 0, f"preshuffle requires cache_block_size to be a multiple of 16, got {bs}")
        check(head_dim % 16 == 0, f"preshuffle requires head_dim to be a multiple of 16, got {head_dim}")
    check(slot_mapping.dtype == "i64", "stand-in: the kernel reads slot_mapping as int64")
    # k is read as k[t * head_dim + d]; a page starts at block * block_size * cache_stride.
    check(k.stride(1) == 1 and k.stride(0) == head_dim, f"stand-in: k strides {k.stride()}: the kernel reads k as contiguous [num_tokens, head_dim] rows")
    check(kv_cache.is_contiguous(), f"stand-in: kv_cache strides {kv_cache.stride()}: pages are addressed as block * block_size * cache_stride")
    check(kv_cache.dtype in ("u8", platform_fp8()), f"stand-in: the cache is {kv_cache.dtype} but the kernel stores {platform_fp8()} (opus::fp8_t)")
    fmt = platform_fp8()
    fmax = np.float32(FP8_MAX[fmt])
    page = kv_cache.arr.reshape(nb, bs * cache_stride)
    kv = k.values()
    d = np.arange(head_dim)
    for t in range(T):
        s = int(slot_mapping.arr[t])
        if s < 0:
            continue
        blk, off = s // bs, s % bs
        check(blk < nb, f"stand-in: slot {s} is past the cache")
        x = kv[t].astype(np.float32)
        amax = np.float32(np.max(np.abs(x)))
        scale = np.float32(max(amax, np.float32(1e-4))) / fmax
        if scale_fmt == "ue8m0":
            scale = np.float32(np.exp2(np.ceil(np.log2(scale))))
        inv = np.float32(1.0) / scale
        codes = encode_fp8((x * inv).astype(np.float64), fmt)
        page[blk, _paged_byte_offset(bs, head_dim, off, d, preshuffle)] = codes
        so = bs * head_dim + off * 4
        page[blk, so : so + 4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)


def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens, preshuffle=False):
    batch = block_table.size(0)
    N, head_dim = dst_k.shape
    check(dst_scale.ndim == 2, f"stand-in: dst_scale must be [num_tokens, head_dim / quant_block_size * 4 bytes], got {dst_scale.shape}")
    qbs = head_dim // (dst_scale.size(1) * dst_scale.element_size() // 4)
    check(qbs == head_dim, "stand-in: one scale per token")
    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    if preshuffle:
        check(bs % 16 == 0, f"preshuffle requires cache_block_size to be a multiple of 16, got {bs}")
    # block_table[b * size(1) + i]; the scale of token i at (i * dst_k.stride(0)) * 4 / qbs bytes.
    check(block_table.stride(1) == 1 and (batch <= 1 or block_table.stride(0) == block_table.size(1)), f"stand-in: block_table strides {block_table.stride()}: the kernel indexes it as b * size(1) + i")
    check(dst_k.stride(1) == 1 and (N <= 1 or dst_k.stride(0) == head_dim), f"stand-in: dst_k strides {dst_k.stride()}: the scale of a token is addressed by dst_k's row stride")
    check(dst_scale.is_contiguous(), "stand-in: dst_scale contiguous")
    check(kv_cache.element_size() == 1 and kv_cache.stride(2) == 1, "stand-in: a byte cache with contiguous tokens")
    cu = cu_seq_lens.arr.astype(np.int64)
    table = block_table.arr
    d = np.arange(head_dim)
    for i in range(N):
        b = int(np.searchsorted(cu, i, side="right") - 1)
        check(0 <= b < batch and cu[b] <= i < cu[b + 1], f"stand-in: token {i} is in no request")
        p = i - cu[b]
        blk = int(table[b, p // bs])
        check(0 <= blk < nb, f"stand-in: block {blk} is outside the cache (the kernel would read out of bounds)")
        off = p % bs
        page = kv_cache.arr[blk].reshape(-1)  # one page, stride(0) apart from the next: its own view
        dst_k.arr[i] = page[_paged_byte_offset(bs, head_dim, off, d, preshuffle)]
        so = bs * head_dim + off * 4
        dst_scale.arr.reshape(-1).view(np.uint8)[i * 4 : i * 4 + 4] = page[so : so + 4]


def reshape_and_cache_with_pertoken_quant(key, value, key_cache, value_cache, k_dequant_scales, v_dequant_scales, slot_mapping, asm_layout):
    """One scale per (token, head): scale = fp32(amax / max of the cache type) (stored as is),
    codes = cast(fp32(x * fp32(1 / max(scale, 1e-12)))): fp8 round to nearest even, int8
    truncated toward zero (static_cast<int8_t>)."""
    T, H, D = key.shape
    check(D <= 512, f"reshape_and_cache_with_pertoken_quant Unsupported head_size: {D}")
    for name, x in (("key", key), ("value", value)):
        _token_rows(x, name, T, H, D)
    nb, _, _, P, x = key_cache.shape
    check(key_cache.shape == (nb, H, D // x, P, x), f"stand-in: key_cache must be [nb, {H}, {D}/x, P, x], got {key_cache.shape}")
    vshape = (nb, H, P // x, D, x) if asm_layout else (nb, H, D, P)
    sshape = (nb, H, P) if asm_layout else (H, k_dequant_scales.size(1))
    check(value_cache.shape == vshape, f"stand-in: value_cache must be {vshape}, got {value_cache.shape}")
    check(k_dequant_scales.shape == sshape and v_dequant_scales.shape == sshape, f"stand-in: dequant scales must be {sshape}")
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache), ("k_dequant_scales", k_dequant_scales), ("v_dequant_scales", v_dequant_scales)):
        check(c.is_contiguous(), f"stand-in: {name} strides {c.stride()}: addressed from its shape")
    if key_cache.dtype == "i8":
        fmt, dmax = None, np.float32(127.0)
    else:
        check(key_cache.dtype == platform_fp8() and value_cache.dtype == key_cache.dtype, f"stand-in: caches must be {platform_fp8()} (the dispatch wants AITER_DTYPE_fp8) or int8, got {key_cache.dtype}")
        fmt, dmax = platform_fp8(), np.float32(FP8_MAX[platform_fp8()])
    check(slot_mapping.dtype == "i64", "stand-in: slot_mapping is read as int64")
    max_kv_tokens = k_dequant_scales.size(1)
    kv, vv = key.values(), value.values()
    d = np.arange(D)

    def quant(row):
        r = row.astype(np.float32)
        scale = np.float32(np.max(np.abs(r))) / dmax
        inv = np.float32(1.0) / np.maximum(scale, np.float32(1e-12))
        q = (r * inv).astype(np.float32)
        codes = encode_fp8(q.astype(np.float64), fmt) if fmt else np.trunc(q).astype(np.int8)
        return np.float32(scale), codes

    for t in range(T):
        s = int(slot_mapping.arr[t])
        if s < 0:
            continue
        blk, off = s // P, s % P
        check(blk < nb, f"stand-in: slot {s} is past the cache")
        for h in range(H):
            ks, kq = quant(kv[t, h])
            vs, vq = quant(vv[t, h])
            sidx = (blk, h, off) if asm_layout else (h, s)
            if not asm_layout:
                check(s < max_kv_tokens, f"stand-in: slot {s} is past the scales")
            k_dequant_scales.arr[sidx] = ks
            v_dequant_scales.arr[sidx] = vs
            key_cache.arr[blk, h, d // x, off, d % x] = kq
            vidx = (blk, h, off // x, d, off % x) if asm_layout else (blk, h, d, off)
            value_cache.arr[vidx] = vq
