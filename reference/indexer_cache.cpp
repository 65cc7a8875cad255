// The indexer's paged fp8 K cache (docs/ops/indexer.md, Cache pages): block-flat pages of BS*128
// value bytes followed by BS fp32 scales; values row-major per token (NORMAL, block size 1) or in
// 16x16 MFMA tiles (SHUFFLE, block sizes that are multiples of 16).
#include <cstring>
#include <string>
#include <vector>

#include "indexer.h"
#include "indexer_internal.h"

namespace attncheck::ref::indexer {

using detail::expect;

const char* layout_name(CacheLayout layout) {
  return layout == CacheLayout::normal ? "NORMAL" : "SHUFFLE";
}

CacheLayout layout_for_block_size(int64_t block_size) {
  if (block_size == 1) return CacheLayout::normal;
  if (block_size > 1 && block_size % kTile == 0) return CacheLayout::shuffle;
  throw std::invalid_argument("indexer cache block size must be 1 or a multiple of 16, got " +
                              std::to_string(block_size));
}

int64_t value_offset(CacheLayout layout, int64_t block_size, int64_t t, int64_t d) {
  (void)block_size;  // both formulas are independent of BS inside the value region
  if (layout == CacheLayout::normal) return t * kHeadDim + d;
  return (t / kTile) * (kTile * kHeadDim) + (d / kTile) * (kTile * kTile) + (t % kTile) * kTile +
         d % kTile;
}

int64_t scale_offset(int64_t block_size, int64_t t) {
  return block_size * kHeadDim + 4 * t;
}

namespace {
// The first byte of page `block`; the whole page must be on the host (a sparse cache of a
// large-offset case holds only the pages requests use: any other page throws).
uint8_t* page_bytes(const Tensor& cache, int64_t block) {
  (void)cache.element_ptr(Index{block, cache.size(1) - 1, kTokenBytes - 1});
  return reinterpret_cast<uint8_t*>(cache.element_ptr(Index{block, 0, 0}));
}

// Checks the cache tensor and returns its block stride in bytes.
int64_t check_cache(const Tensor& cache, int64_t block_size) {
  detail::expect_dtype(cache, DType::u8, "kv_cache");
  expect(cache.ndim() == 3 && cache.size(1) == block_size && cache.size(2) == kTokenBytes,
         "kv_cache must be [num_blocks, " + std::to_string(block_size) + ", 132], got " +
             cache.describe());
  expect(cache.stride(2) == 1 && cache.stride(1) == kTokenBytes &&
             cache.stride(0) >= block_size * kTokenBytes,
         "kv_cache blocks must be contiguous with stride(0) >= BS*132, got " + cache.describe());
  return cache.stride(0);
}
}  // namespace

Tensor write_k_cache(const Tensor& cache, const Tensor& k, const Tensor& slot_mapping,
                     CacheLayout layout, DType fp8, float qmax) {
  const int64_t BS = cache.size(1);
  // A SHUFFLE page holds whole 16-token tiles; NORMAL fits any block size.
  expect(layout == CacheLayout::normal || (BS > 0 && BS % kTile == 0),
         "a SHUFFLE page needs a block size that is a multiple of 16, got " + std::to_string(BS));
  (void)check_cache(cache, BS);
  detail::expect_dtype(slot_mapping, DType::i64, "slot_mapping");
  expect(slot_mapping.ndim() == 1 && k.ndim() == 2 && k.size(0) >= slot_mapping.size(0),
         "k must have at least as many rows as slot_mapping");
  // The same storage bytes, so padding between pages and everything around the view is kept.
  auto storage = std::make_shared<Storage>(*cache.storage());
  Tensor out = cache.rebased(storage);
  const int64_t T = slot_mapping.size(0);
  const QuantizedK q = quantize_k(k.slice(0, 0, T), fp8, qmax);
  const auto* qbytes = detail::raw<uint8_t>(q.values);
  const int64_t capacity = cache.size(0) * BS;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t slot = slot_mapping.at<int64_t>({i});
    if (slot < 0) continue;  // padding token: nothing is written
    if (slot >= capacity) detail::fail("slot " + std::to_string(slot) + " past the cache");
    uint8_t* page = page_bytes(out, slot / BS);
    const int64_t t = slot % BS;
    for (int64_t d = 0; d < kHeadDim; ++d)
      page[value_offset(layout, BS, t, d)] = qbytes[i * kHeadDim + d];
    const float s = q.scales.at<float>({i});
    std::memcpy(page + scale_offset(BS, t), &s, sizeof s);
  }
  return out;
}

void read_token(const CacheView& c, int64_t block, int64_t t, uint8_t* values, float* scale) {
  if (c.layout == CacheLayout::shuffle && c.block_size % kTile != 0)
    detail::fail("a SHUFFLE page needs a block size that is a multiple of 16");
  if (!(block >= 0 && block < c.cache.size(0) && t >= 0 && t < c.block_size))
    detail::fail("token (" + std::to_string(block) + ", " + std::to_string(t) +
                 ") outside the cache");
  const uint8_t* page = page_bytes(c.cache, block);
  // 16 consecutive dims of a token are 16 contiguous bytes in both layouts.
  for (int64_t d = 0; d < kHeadDim; d += kTile)
    std::memcpy(values + d, page + value_offset(c.layout, c.block_size, t, d), kTile);
  *scale = detail::load_f32(page + scale_offset(c.block_size, t));
}

GatheredK gather_k_cache(const CacheView& c, const Tensor& block_table, const Tensor& cu_seq_lens,
                         DType fp8) {
  check_cache(c.cache, c.block_size);
  detail::expect_dtype(block_table, DType::i32, "block_table");
  detail::expect_dtype(cu_seq_lens, DType::i32, "cu_seq_lens");
  const int64_t R = block_table.size(0);
  expect(cu_seq_lens.ndim() == 1 && cu_seq_lens.size(0) == R + 1, "cu_seq_lens must be [R + 1]");
  const int64_t N = cu_seq_lens.at<int32_t>({R});
  GatheredK out{Tensor::empty(fp8, {N, kHeadDim}), Tensor::empty(DType::f32, {N})};
  auto* dst = reinterpret_cast<uint8_t*>(out.values.data());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t begin = cu_seq_lens.at<int32_t>({r}), end = cu_seq_lens.at<int32_t>({r + 1});
    expect(begin <= end && end <= N, "cu_seq_lens must be non-decreasing");
    for (int64_t i = begin; i < end; ++i) {
      const int64_t pos = i - begin, col = pos / c.block_size;
      if (col >= block_table.size(1))
        detail::fail("request " + std::to_string(r) + " needs more blocks than the table has");
      const int64_t block = block_table.at<int32_t>({r, col});
      read_token(c, block, pos % c.block_size, dst + i * kHeadDim, &out.scales.at<float>({i}));
    }
  }
  return out;
}

}  // namespace attncheck::ref::indexer
