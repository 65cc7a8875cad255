// The paged indexer cache: the layout formulas against the spec's worked example and as
// bijections, NORMAL vs SHUFFLE writes read back through their own readers, the 0xFF sentinel test
// of the gfx950 seed bug (shown to catch the seed bug's write pattern), padded pages, skipped
// slots, gather.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "core/numeric.h"
#include "core/rng.h"
#include "reference/indexer.h"

namespace attncheck::ref::indexer {
namespace {

Tensor sentinel_cache(int64_t blocks, int64_t bs, int64_t pad = 0) {
  const int64_t stride = bs * kTokenBytes + pad;
  Tensor storage = Tensor::filled_bytes(DType::u8, {blocks * stride}, std::byte{0xFF});
  return storage.as_strided({blocks, bs, kTokenBytes}, {stride, kTokenBytes, 1}, 0);
}

Tensor random_k(int64_t rows, const char* name) {
  Tensor k = Tensor::empty(DType::bf16, {rows, kHeadDim});
  fill_normal(k, Rng("indexer_cache_test", name), 0.0, 2.0);
  return k;
}

Tensor slots(std::initializer_list<int64_t> v) {
  Tensor t = Tensor::empty(DType::i64, {static_cast<int64_t>(v.size())});
  int64_t i = 0;
  for (auto s : v) t.at<int64_t>({i++}) = s;
  return t;
}

const uint8_t* bytes_of(const Tensor& cache) {
  return reinterpret_cast<const uint8_t*>(cache.storage()->bytes.data());
}

TEST(IndexerCache, WorkedExample) {
  // The worked example of docs/ops/indexer.md (Cache pages): BS=64, t=17, d=35.
  EXPECT_EQ(value_offset(CacheLayout::shuffle, 64, 17, 35), 2579);
  EXPECT_EQ(value_offset(CacheLayout::normal, 64, 17, 35), 2211);
  EXPECT_EQ(scale_offset(64, 17), 8260);
  EXPECT_EQ(64 * kTokenBytes, 8448);
}

TEST(IndexerCache, LayoutsAreBijectionsOntoTheValueRegion) {
  for (int64_t bs : {16, 32, 64, 128})
    for (auto layout : {CacheLayout::normal, CacheLayout::shuffle}) {
      std::set<int64_t> seen;
      for (int64_t t = 0; t < bs; ++t)
        for (int64_t d = 0; d < kHeadDim; ++d) {
          const int64_t off = value_offset(layout, bs, t, d);
          ASSERT_GE(off, 0);
          ASSERT_LT(off, bs * kHeadDim);
          seen.insert(off);
        }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), bs * kHeadDim) << layout_name(layout) << bs;
    }
  // SHUFFLE: every token's 16-dim chunk is 16 contiguous bytes (the MFMA k_width=16 operand).
  EXPECT_EQ(value_offset(CacheLayout::shuffle, 64, 5, 16) + 15,
            value_offset(CacheLayout::shuffle, 64, 5, 31));
}

TEST(IndexerCache, LayoutChoiceFollowsBlockSize) {
  EXPECT_EQ(layout_for_block_size(1), CacheLayout::normal);
  EXPECT_EQ(layout_for_block_size(16), CacheLayout::shuffle);
  EXPECT_EQ(layout_for_block_size(64), CacheLayout::shuffle);
  for (int64_t bad : {0, 8, 24, 65}) {
    try {
      layout_for_block_size(bad);
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), ("indexer cache block size must be 1 or a multiple of 16, got " +
                              std::to_string(bad))
                                 .c_str());
    }
  }
}

TEST(IndexerCache, NormalAndShuffleReadBackIdenticallyAndDifferBytewise) {
  const int64_t bs = 64;
  const Tensor k = random_k(40, "layouts");
  Tensor slot = Tensor::empty(DType::i64, {40});
  for (int64_t i = 0; i < 40; ++i) slot.at<int64_t>({i}) = 64 + (i * 7) % 64;  // block 1
  const Tensor normal =
      write_k_cache(sentinel_cache(3, bs), k, slot, CacheLayout::normal, DType::e4m3fn, 448.0f);
  const Tensor shuffle =
      write_k_cache(sentinel_cache(3, bs), k, slot, CacheLayout::shuffle, DType::e4m3fn, 448.0f);
  const auto q = quantize_k(k, DType::e4m3fn, 448.0f);
  for (int64_t i = 0; i < 40; ++i) {
    const int64_t t = (i * 7) % 64;
    uint8_t a[kHeadDim], b[kHeadDim];
    float sa = 0, sb = 0;
    read_token({normal, bs, CacheLayout::normal}, 1, t, a, &sa);
    read_token({shuffle, bs, CacheLayout::shuffle}, 1, t, b, &sb);
    ASSERT_EQ(std::memcmp(a, b, kHeadDim), 0) << "token " << t;
    ASSERT_EQ(
        std::memcmp(a, reinterpret_cast<const uint8_t*>(q.values.data()) + i * kHeadDim, kHeadDim),
        0);
    EXPECT_EQ(sa, sb);
    EXPECT_EQ(sa, q.scales.at<float>({i}));
  }
  // Token 17 (i = 39: 39 * 7 % 64 == 17), d = 35: bytes sit where the worked example says.
  const int64_t base = 1 * bs * kTokenBytes;
  const uint8_t v = static_cast<uint8_t>(q.values.get_bits(Index{39, 35}));
  EXPECT_EQ(bytes_of(normal)[base + 2211], v);
  EXPECT_EQ(bytes_of(shuffle)[base + 2579], v);
  float s = 0;
  std::memcpy(&s, bytes_of(shuffle) + base + 8260, 4);
  EXPECT_EQ(s, q.scales.at<float>({39}));
  // The value regions hold the same multiset of bytes in a different order.
  EXPECT_NE(std::memcmp(bytes_of(normal) + base, bytes_of(shuffle) + base, bs * kHeadDim), 0);
  // Reading a SHUFFLE page row-major (the Preshuffle=False reader) gets other tokens' bytes.
  uint8_t wrong[kHeadDim];
  float ws = 0;
  read_token({shuffle, bs, CacheLayout::normal}, 1, 17, wrong, &ws);
  EXPECT_NE(std::memcmp(wrong, reinterpret_cast<const uint8_t*>(q.values.data()) + 39 * kHeadDim,
                        kHeadDim),
            0);
}

TEST(IndexerCache, SentinelPagesStayUntouched) {
  // The gfx950 seed bug's test: BS=1, tokens to pages {3, 0} only; all other pages stay 0xFF.
  const int64_t pages = 20;
  const Tensor k = random_k(2, "sentinel");
  const Tensor out = write_k_cache(sentinel_cache(pages, 1), k, slots({3, 0}), CacheLayout::normal,
                                   DType::e4m3fn, 448.0f);
  auto untouched = [&](const uint8_t* bytes, int64_t page) {
    for (int64_t i = 0; i < kTokenBytes; ++i)
      if (bytes[page * kTokenBytes + i] != 0xFF) return false;
    return true;
  };
  for (int64_t p = 0; p < pages; ++p)
    EXPECT_EQ(untouched(bytes_of(out), p), p != 0 && p != 3) << "page " << p;
  // The seed bug (SHUFFLE offsets at BS=1) writes d >= 16 into pages b+1 .. b+13: the same check
  // sees it. Simulated on a plain byte array that is large enough.
  std::vector<uint8_t> buggy(static_cast<size_t>(pages * kTokenBytes), 0xFF);
  for (int64_t page : {3, 0})
    for (int64_t d = 0; d < kHeadDim; ++d)
      buggy[static_cast<size_t>(page * kTokenBytes + value_offset(CacheLayout::shuffle, 1, 0, d))] =
          0x11;
  for (int64_t p : {1, 2, 4, 5, 13, 16}) EXPECT_FALSE(untouched(buggy.data(), p)) << "page " << p;
  EXPECT_TRUE(untouched(buggy.data(), 17));
}

TEST(IndexerCache, BytesOfOneTokenAreRowMajorInItsOwnPage) {
  // The gfx950 seed bug's byte-layout test: exactly representable values peaking at M (scale 1).
  std::vector<float> row(kHeadDim);
  Tensor k = Tensor::empty(DType::bf16, {1, kHeadDim});
  for (int64_t d = 0; d < kHeadDim; ++d) {
    row[d] = d == 0 ? 448.0f : static_cast<float>(d % 15) * 0.5f - 3.0f;
    k.set({0, d}, row[d]);
  }
  const Tensor out = write_k_cache(sentinel_cache(4, 1), k, slots({2}), CacheLayout::normal,
                                   DType::e4m3fn, 448.0f);
  const uint8_t* page = bytes_of(out) + 2 * kTokenBytes;
  for (int64_t d = 0; d < kHeadDim; ++d) ASSERT_EQ(fp8_decode(page[d], DType::e4m3fn), row[d]) << d;
  float s = 0;
  std::memcpy(&s, page + kHeadDim, 4);
  EXPECT_EQ(s, 1.0f);
}

TEST(IndexerCache, SkippedSlotsAndPagePaddingAreNotWritten) {
  const int64_t bs = 16, pad = 20;
  const Tensor k = random_k(4, "pad");
  const Tensor cache = sentinel_cache(3, bs, pad);
  const Tensor out = write_k_cache(cache, k, slots({-1, 17, -5, 47}), CacheLayout::shuffle,
                                   DType::e4m3fnuz, 240.0f);
  const int64_t stride = bs * kTokenBytes + pad;
  const uint8_t* b = bytes_of(out);
  int64_t changed = 0;
  for (int64_t page = 0; page < 3; ++page) {
    for (int64_t i = bs * kTokenBytes; i < stride; ++i) EXPECT_EQ(b[page * stride + i], 0xFF);
    for (int64_t i = 0; i < bs * kTokenBytes; ++i) changed += b[page * stride + i] != 0xFF;
  }
  // Two tokens (slots 17 and 47) and their scales, nothing else (a value byte may equal 0xFF).
  EXPECT_LE(changed, 2 * kTokenBytes);
  EXPECT_GE(changed, 2 * 4);
  uint8_t v[kHeadDim];
  float s = 0;
  read_token({out, bs, CacheLayout::shuffle}, 2, 15, v, &s);
  EXPECT_EQ(s, quantize_k(k, DType::e4m3fnuz, 240.0f).scales.at<float>({3}));
}

TEST(IndexerCache, GatherRoundTripsThroughTheBlockTable) {
  for (int64_t bs : {1, 16, 64}) {
    const CacheLayout layout = layout_for_block_size(bs);
    // Two requests of 37 and 70 tokens in permuted pages; the table row stride is wider than W.
    const int64_t lens[2] = {37, 70};
    const int64_t W = (70 + bs - 1) / bs;
    const int64_t blocks = 2 * W + 3;
    Tensor table_storage = Tensor::full(DType::i32, {2, W + 3}, -7);
    Tensor table = table_storage.slice(1, 0, W);
    int64_t next = blocks - 1;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = 0; j < (lens[r] + bs - 1) / bs; ++j)
        table.at<int32_t>({r, j}) = static_cast<int32_t>(next--);
    const Tensor k = random_k(107, "gather");
    Tensor slot = Tensor::empty(DType::i64, {107});
    Tensor cu = Tensor::empty(DType::i32, {3});
    cu.at<int32_t>({0}) = 0;
    cu.at<int32_t>({1}) = 37;
    cu.at<int32_t>({2}) = 107;
    for (int64_t i = 0; i < 107; ++i) {
      const int64_t r = i < 37 ? 0 : 1, p = i - (r ? 37 : 0);
      slot.at<int64_t>({i}) = table.at<int32_t>({r, p / bs}) * bs + p % bs;
    }
    const Tensor cache =
        write_k_cache(sentinel_cache(blocks, bs), k, slot, layout, DType::e4m3fn, 448.0f);
    const auto g = gather_k_cache({cache, bs, layout}, table, cu, DType::e4m3fn);
    const auto q = quantize_k(k, DType::e4m3fn, 448.0f);
    EXPECT_EQ(g.values.storage()->bytes, q.values.storage()->bytes) << "bs " << bs;
    EXPECT_EQ(g.scales.storage()->bytes, q.scales.storage()->bytes) << "bs " << bs;
  }
}

}  // namespace
}  // namespace attncheck::ref::indexer
