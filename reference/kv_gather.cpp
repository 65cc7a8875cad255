#include "kv_gather.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/numeric.h"
#include "core/rng.h"

namespace attncheck::ref {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

int32_t i32(const Tensor& t, int64_t i) {
  return t.at<int32_t>({i});
}

Shape cache_shape(KvLayout layout, bool is_value, int64_t nb, int64_t P, int64_t Hkv, int64_t D,
                  int64_t x) {
  if (layout == KvLayout::nhd) return {nb, P, Hkv, D};
  return is_value ? Shape{nb, Hkv, P / x, D, x} : Shape{nb, Hkv, D / x, P, x};
}

// Row-major strides with `pad` extra elements after every row of every dimension but the last.
Shape padded_strides(const Shape& shape, int64_t pad) {
  Shape s(shape.size(), 1);
  for (size_t i = shape.size() - 1; i-- > 0;) s[i] = s[i + 1] * shape[i + 1] + pad;
  return s;
}

}  // namespace

KvCacheGeometry kv_cache_geometry(const Tensor& K, const Tensor& V, KvLayout layout,
                                  const std::string& op) {
  if (K.dtype() != V.dtype())
    throw std::invalid_argument(op + ": key_cache and value_cache dtypes differ");
  if (layout == KvLayout::nhd) {
    if (K.ndim() != 4 || K.shape() != V.shape())
      throw std::invalid_argument(op + ": NHD caches must both be [nb, P, Hkv, D], got " +
                                  K.describe() + " and " + V.describe());
    return {K.size(0), K.size(1), K.size(2), K.size(3), 1};
  }
  const int64_t x = shuffle_x(K.dtype());
  if (K.ndim() != 5 || V.ndim() != 5 || K.size(4) != x || V.size(4) != x)
    throw std::invalid_argument(op + ": SHUFFLE caches must be 5-d with x = " + str(x) + ", got " +
                                K.describe() + " and " + V.describe());
  const KvCacheGeometry g{K.size(0), K.size(3), K.size(1), K.size(2) * x, x};
  if (V.shape() != cache_shape(KvLayout::shuffle, true, g.nb, g.P, g.Hkv, g.D, x))
    throw std::invalid_argument(op + ": SHUFFLE value_cache " + V.describe() +
                                " does not match key_cache " + K.describe());
  return g;
}

int64_t shuffle_x(DType cache_dtype) {
  return 16 / static_cast<int64_t>(dtype_size(cache_dtype));
}

Index kv_cache_index(KvLayout layout, bool is_value, int64_t x, int64_t blk, int64_t s, int64_t h,
                     int64_t d) {
  if (layout == KvLayout::nhd) return {blk, s, h, d};
  if (is_value) return {blk, h, s / x, d, s % x};
  return {blk, h, d / x, s, d % x};
}

KvCacheViews make_kv_cache(DType dtype, KvLayout layout, KvStrides strides, int64_t nb_held,
                           int64_t P, int64_t Hkv, int64_t D, int64_t first) {
  if (nb_held < 1 || P < 1 || Hkv < 1 || D < 1 || first < 0)
    throw std::invalid_argument("make_kv_cache: every dimension must be >= 1");
  const int64_t x = layout == KvLayout::shuffle ? shuffle_x(dtype) : 1;
  if (layout == KvLayout::shuffle && (P % x != 0 || D % x != 0))
    throw std::invalid_argument("SHUFFLE needs block_size and head_dim multiples of x = " + str(x) +
                                ", got P = " + str(P) + ", D = " + str(D));
  if (layout == KvLayout::shuffle && strides == KvStrides::packed)
    throw std::invalid_argument("the packed (nb, Hkv, P, 2D) cache is an NHD layout, not SHUFFLE");
  if (first > 0 && (strides == KvStrides::contiguous || strides == KvStrides::padded))
    throw std::invalid_argument(
        "large offsets need hybrid, separate or packed strides (blocks in one window)");
  const int64_t nb = first + nb_held;
  const Shape k_shape = cache_shape(layout, false, nb, P, Hkv, D, x);
  const Shape v_shape = cache_shape(layout, true, nb, P, Hkv, D, x);
  const int64_t H = P * Hkv * D;  // elements of one block of one cache
  // A storage of `blocks_per_id` x H elements per block id, holding ids [first, nb) on the host.
  auto storage_of = [&](Shape shape, int64_t blocks_per_id) {
    const int64_t per_id = blocks_per_id * H;
    Tensor t = first > 0 ? Tensor::sparse(dtype, std::move(shape), first * per_id, nb_held * per_id)
                         : Tensor::empty(dtype, std::move(shape));
    poison(t);
    return t;
  };
  if (strides == KvStrides::separate) return {storage_of(k_shape, 1), storage_of(v_shape, 1)};
  if (strides == KvStrides::packed) {
    // (nb, Hkv, P, 2D) contiguous, seen as [nb, P, Hkv, 2D] and split along the last dim.
    Tensor storage = storage_of({nb, Hkv, P, 2 * D}, 2);
    const Shape s = {Hkv * P * 2 * D, 2 * D, P * 2 * D, 1};
    return {storage.as_strided(k_shape, s, 0), storage.as_strided(v_shape, s, D)};
  }
  Shape k_strides = Tensor::contiguous_strides(k_shape);
  Shape v_strides = Tensor::contiguous_strides(v_shape);
  int64_t total = 2 * nb * H, k_offset = 0, v_offset = nb * H;
  if (strides == KvStrides::hybrid) {
    k_strides[0] = v_strides[0] = 2 * H;
    v_offset = H;
  } else if (strides == KvStrides::padded) {
    const int64_t pad = 16 / static_cast<int64_t>(dtype_size(dtype));
    k_strides = padded_strides(k_shape, pad);
    v_strides = padded_strides(v_shape, pad);
    // K's region; V's is the same for NHD and for SHUFFLE no larger while head_dim >= block_size
    // (as_strided refuses a V view past the storage). The goldens' input digests pin this size.
    const int64_t region = k_strides[0] * nb + pad;
    k_offset = pad;
    v_offset = pad + region;
    total = 2 * region + 2 * pad;
  }
  Tensor storage = storage_of({total}, 2);  // hybrid [K_b][V_b]: 2H per id (others: first = 0)
  return {storage.as_strided(k_shape, k_strides, k_offset),
          storage.as_strided(v_shape, v_strides, v_offset)};
}

KvGatherMeta gather_meta(const Tensor& context_lens, const std::vector<int64_t>& starts,
                         const std::vector<int64_t>& counts, int64_t pad) {
  const int64_t B = context_lens.size(0);
  if (static_cast<int64_t>(starts.size()) != B || static_cast<int64_t>(counts.size()) != B)
    throw std::invalid_argument("gather_meta: one start and one count per request");
  KvGatherMeta m;
  m.cu_seqlens_kv = Tensor::empty(DType::i32, {B + 1});
  m.seq_starts = Tensor::empty(DType::i32, {B});
  m.cu_seqlens_kv.at<int32_t>({0}) = 0;
  for (int64_t r = 0; r < B; ++r) {
    if (starts[r] < 0 || counts[r] < 0 ||
        (counts[r] > 0 && starts[r] + counts[r] > i32(context_lens, r)))
      throw std::invalid_argument("gather_meta: request " + str(r) + " range [" + str(starts[r]) +
                                  ", +" + str(counts[r]) + ") outside its context");
    m.seq_starts.at<int32_t>({r}) = static_cast<int32_t>(starts[r]);
    m.cu_seqlens_kv.at<int32_t>({r + 1}) =
        static_cast<int32_t>(i32(m.cu_seqlens_kv, r) + counts[r]);
  }
  m.total_tokens = i32(m.cu_seqlens_kv, B);
  m.token_to_batch = Tensor::empty(DType::i32, {m.total_tokens + pad});
  // Cumulative sum of (t == cu[r+1]) indicators, as the builder computes it: several requests
  // ending at the same t (zero-length ones) add several indicators, so they are skipped.
  int32_t batch = 0;
  for (int64_t t = 0; t < m.total_tokens + pad; ++t) {
    for (int64_t r = 0; r < B; ++r) batch += i32(m.cu_seqlens_kv, r + 1) == t ? 1 : 0;
    m.token_to_batch.at<int32_t>({t}) = batch;
  }
  return m;
}

KvGatherMeta chunk_meta(const Tensor& context_lens, int64_t chunk, int64_t chunk_index,
                        int64_t pad) {
  if (chunk < 1 || chunk_index < 0)
    throw std::invalid_argument("chunk_meta: chunk must be >= 1 and chunk_index >= 0");
  const int64_t B = context_lens.size(0);
  std::vector<int64_t> starts(B), counts(B);
  for (int64_t r = 0; r < B; ++r) {
    starts[r] = chunk * chunk_index;
    counts[r] = std::max<int64_t>(
        std::min<int64_t>(i32(context_lens, r), starts[r] + chunk) - starts[r], 0);
  }
  return gather_meta(context_lens, starts, counts, pad);
}

KvGatherMeta window_meta(const Tensor& context_lens, int64_t window, int64_t pad) {
  if (window < 1) throw std::invalid_argument("window_meta: window must be >= 1");
  const int64_t B = context_lens.size(0);
  std::vector<int64_t> starts(B), counts(B);
  for (int64_t r = 0; r < B; ++r) {
    counts[r] = std::min<int64_t>(i32(context_lens, r), window);
    starts[r] = i32(context_lens, r) - counts[r];
  }
  return gather_meta(context_lens, starts, counts, pad);
}

KvGathered kv_gather(const KvGatherArgs& a) {
  const KvCacheGeometry g = kv_cache_geometry(a.key_cache, a.value_cache, a.layout, "kv_gather");
  const DType cache_dtype = a.key_cache.dtype();
  if (is_fp8(cache_dtype) != a.dequant.has_value())
    throw std::invalid_argument(is_fp8(cache_dtype)
                                    ? "kv_gather: fp8 caches need dequant (scales)"
                                    : "kv_gather: dequant requested for a non-fp8 cache");
  if (!a.dequant && a.out_dtype != cache_dtype)
    throw std::invalid_argument("kv_gather: without dequant the output dtype must be the cache's");
  if (a.dequant && a.out_dtype != DType::bf16 && a.out_dtype != DType::f16)
    throw std::invalid_argument("kv_gather: dequantized output must be bf16 or f16");
  const int64_t B = a.seq_starts.size(0);
  const int64_t W = a.block_tables.size(1);
  if (a.block_tables.size(0) != B || a.cu_seqlens_kv.size(0) != B + 1)
    throw std::invalid_argument(
        "kv_gather: block_tables rows and cu_seqlens_kv must match seq_starts");
  if (a.token_to_batch.size(0) < a.total_tokens)
    throw std::invalid_argument("kv_gather: token_to_batch shorter than total_tokens");

  KvGathered out{Tensor::empty(a.out_dtype, {a.total_tokens, g.Hkv, g.D}),
                 Tensor::empty(a.out_dtype, {a.total_tokens, g.Hkv, g.D})};
  for (int64_t t = 0; t < a.total_tokens; ++t) {
    // Steps 1-2: owning request, logical position, physical block and slot.
    const int64_t b = i32(a.token_to_batch, t);
    if (b < 0 || b >= B)
      throw std::invalid_argument("kv_gather: token_to_batch[" + str(t) + "] = " + str(b));
    const int64_t pos = t - i32(a.cu_seqlens_kv, b) + i32(a.seq_starts, b);
    if (pos < 0 || pos / g.P >= W)
      throw std::invalid_argument("kv_gather: token " + str(t) + " position " + str(pos) +
                                  " outside the block table");
    const int64_t blk = a.block_tables.at<int32_t>({b, pos / g.P});
    if (blk < 0 || blk >= g.nb)
      throw std::invalid_argument("kv_gather: block id " + str(blk) + " of request " + str(b) +
                                  " outside the cache");
    const int64_t s = pos % g.P;
    // Steps 3-5: read through the views' strides, dequantize, store.
    for (int v = 0; v < 2; ++v) {
      const Tensor& cache = v ? a.value_cache : a.key_cache;
      const Tensor& dst = v ? out.value : out.key;
      for (int64_t h = 0; h < g.Hkv; ++h)
        for (int64_t d = 0; d < g.D; ++d) {
          const Index src = kv_cache_index(a.layout, v == 1, g.x, blk, s, h, d);
          const Index to = {t, h, d};
          if (!a.dequant) {
            dst.set_bits(to, cache.get_bits(src));
            continue;
          }
          const float scale = v ? a.dequant->v_scale : a.dequant->k_scale;
          const auto code = static_cast<uint8_t>(cache.get_bits(src));
          const float value = static_cast<float>(fp8_decode(code, cache_dtype)) * scale;
          dst.set(to, static_cast<double>(value));
        }
    }
  }
  return out;
}

}  // namespace attncheck::ref
