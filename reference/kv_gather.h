// Paged K/V gather (cp_mha_gather_cache, docs/ops/kv_gather.md): cached context
// tokens of chunked-prefill requests copied into contiguous [total_tokens, Hkv, D] workspaces.
// The reference walks the 5-step procedure through the caches' real strides, so hybrid
// [K0][V0][K1][V1]... caches, padded caches and SHUFFLE tiles all read the right bytes.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace attncheck::ref {

enum class KvLayout {
  nhd,      // K and V [nb, P, Hkv, D]
  shuffle,  // K [nb, Hkv, D/x, P, x], V [nb, Hkv, P/x, D, x], x = 16 / element size
};

// Where the two caches live inside their single storage.
enum class KvStrides {
  contiguous,  // (2, nb, P, Hkv, D) contiguous: K blocks then V blocks
  hybrid,      // the attention+Mamba re-striding: [K0][V0][K1][V1]..., block stride 2H
  padded,      // every stride padded by one 16-byte line (K region, then V region)
  separate,    // K and V in two storages, each contiguous
  packed,      // NHD only: one (nb, Hkv, P, 2D) tensor; K = [..., :D], V = [..., D:] of its
               // (1, 2) transpose, so neither view is contiguous within a block (vLLM #44455)
};

// SHUFFLE tile width: elements per 16 bytes of the cache dtype.
int64_t shuffle_x(DType cache_dtype);

// Block count, block size, KV heads, head size and tile width (1 for NHD) of a K/V cache pair
// shaped for `layout`; throws std::invalid_argument prefixed with `op` when the two disagree.
struct KvCacheGeometry {
  int64_t nb, P, Hkv, D, x;
};
KvCacheGeometry kv_cache_geometry(const Tensor& key_cache, const Tensor& value_cache,
                                  KvLayout layout, const std::string& op);

struct KvCacheViews {
  Tensor key_cache;
  Tensor value_cache;  // shares key_cache's storage, except with KvStrides::separate
};

// Both caches as views of one storage (two with `separate`), every storage element NaN before the
// caller fills the views (so a read of padding shows up). Throws std::invalid_argument for SHUFFLE
// shapes that do not tile (P or D not a multiple of x) and for a packed SHUFFLE cache.
// first_block > 0 (large offsets): the views have first_block + num_blocks blocks on sparse
// storages whose host windows hold blocks [first_block, first_block + num_blocks) only (the
// device poisons the rest, docs/abi.md); only hybrid, separate and packed caches keep those blocks
// in one window per storage (contiguous and padded ones put all K blocks before all V blocks).
KvCacheViews make_kv_cache(DType dtype, KvLayout layout, KvStrides strides, int64_t num_blocks,
                           int64_t block_size, int64_t kv_heads, int64_t head_dim,
                           int64_t first_block = 0);

// (blk, token-in-block s, head h, dim d) as an index of a cache view of the given layout.
Index kv_cache_index(KvLayout layout, bool is_value, int64_t x, int64_t blk, int64_t s, int64_t h,
                     int64_t d);

// Gather metadata for one pass over the context (vLLM's chunked-context builder).
struct KvGatherMeta {
  Tensor cu_seqlens_kv;   // [B + 1] int32
  Tensor token_to_batch;  // [total_tokens + pad] int32; the pad holds B, as the builder's cumsum
  Tensor seq_starts;      // [B] int32
  int64_t total_tokens = 0;
};
// Requests of context lengths `context_lens` ([B] int32) gathered from `seq_starts[r]` for
// `count[r]` tokens; token_to_batch is built as the builder builds it (cumulative sum of
// t == cu[r+1] indicators), so zero-length requests are skipped.
KvGatherMeta gather_meta(const Tensor& context_lens, const std::vector<int64_t>& seq_starts,
                         const std::vector<int64_t>& counts, int64_t token_to_batch_pad);
// Chunk `chunk_index` of size `chunk` of every context: start c*chunk, length clamped at >= 0.
KvGatherMeta chunk_meta(const Tensor& context_lens, int64_t chunk, int64_t chunk_index,
                        int64_t token_to_batch_pad);
// Sliding window: the last min(ctx, window) tokens of every request (seq_starts vary per request).
KvGatherMeta window_meta(const Tensor& context_lens, int64_t window, int64_t token_to_batch_pad);

struct KvDequant {
  float k_scale = 1.0f;  // per-tensor scales (k_scales[0], v_scales[0])
  float v_scale = 1.0f;
};

struct KvGatherArgs {
  Tensor key_cache, value_cache;  // layout-shaped views, any strides, same dtype
  Tensor block_tables;            // [B, W] int32, any strides
  Tensor cu_seqlens_kv;           // [B + 1] int32
  Tensor token_to_batch;          // [>= total_tokens] int32
  Tensor seq_starts;              // [B] int32
  KvLayout layout = KvLayout::nhd;
  int64_t total_tokens = 0;
  std::optional<KvDequant> dequant;  // required for fp8 caches, refused for others
  DType out_dtype = DType::bf16;     // must equal the cache dtype without dequant
};

struct KvGathered {
  Tensor key;    // [total_tokens, Hkv, D] contiguous, out_dtype
  Tensor value;  // same
};

// Without dequant the result is a bitwise copy. With dequant: out = RNE_out(float(code) * scale),
// the product in fp32 (the kernel's arithmetic; one correctly rounded product, one rounding).
KvGathered kv_gather(const KvGatherArgs& a);

}  // namespace attncheck::ref
