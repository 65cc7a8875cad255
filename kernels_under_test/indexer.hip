// Indexer kernels that touch the paged fp8 K cache (docs/ops/indexer.md): the K quantize +
// cache writer, the prefill gather, and the paged decode logits. The page layout is chosen by the
// block size, as the fixed vLLM does it: NORMAL iff BS == 1, SHUFFLE (MFMA 16x16 tiles) otherwise;
// the decode reader uses the Preshuffle formula iff BS > 1.
//
// Mutants (indexer.mutants) re-create the seed bugs:
//   AC_MUTANT_INDEXER_SHUFFLE_AT_BS1: writer and gather hard-coded SHUFFLE (gfx950, #43781);
//   AC_MUTANT_INDEXER_PRESHUFFLE_ONLY_BS64: decode Preshuffle only when BS == 64;
//   AC_MUTANT_INDEXER_CHUNKQ_UNCLAMPED: ChunkQ = 64 whatever the head count (aiter #2891);
//   AC_MUTANT_INDEXER_FP8_ORDINARY_ONLY: decode's fp8 table wrong at the top of the format;
//   AC_MUTANT_INDEXER_PAGE_OFFSET_INT32: page byte offsets in int32 (issue 14).
//   AC_MUTANT_INDEXER_K_OFFSET_INT32: the K writer's k row offset in int32 (issue 37).
#include <string>
#include <vector>

#include "indexer_common.h"

namespace {

using idx::kHeadDim;

bool page_is_shuffled(int block_size) {
#if defined(AC_MUTANT_INDEXER_SHUFFLE_AT_BS1)
  (void)block_size;
  return true;
#else
  return block_size > 1;
#endif
}

// The first byte of page `block`: 64-bit, since a cache may pass 2^31 bytes (issue 14).
AC_DEVICE const uint8_t* page_at(const uint8_t* cache, int64_t block, int64_t block_stride) {
#if defined(AC_MUTANT_INDEXER_PAGE_OFFSET_INT32)
  // Seed bug: block * block_stride in int32, which wraps once the cache passes 2^31 bytes.
  return cache +
         static_cast<int32_t>(static_cast<uint32_t>(block) * static_cast<uint32_t>(block_stride));
#else
  return cache + block * block_stride;
#endif
}

// The decode kernel's fp8 -> bf16 table (idx::load_lut), or, in the mutant, a table exact on
// every ordinary code but one short of the top: the saturation codes (448 e4m3fn, 240 e4m3fnuz)
// read as the next smaller value, fnuz's NaN 0x80 as -0.
AC_DEVICE void load_decode_lut(idx::ScoreSmem& sm, AcFp8 fmt) {
#if defined(AC_MUTANT_INDEXER_FP8_ORDINARY_ONLY)
  const uint8_t top = fmt == AcFp8::e4m3fn ? 0x7E : 0x7F;
  for (int c = threadIdx.x; c < 256; c += blockDim.x) {
    uint8_t b = static_cast<uint8_t>(c);
    if ((b & 0x7F) >= top) b = static_cast<uint8_t>((b & 0x80) | (top - 1));
    const float v = fmt == AcFp8::e4m3fnuz && c == 0x80 ? -0.0f : ac_fp8_to_float(b, fmt);
    sm.lut[c] = ac_float_to_bf16(v);
  }
#else
  idx::load_lut(sm, fmt);
#endif
}

// ---------------------------------------------------------------------------------------------
// K quantize + cache write: one warp per slot_mapping entry; the per-token amax is a warp max.
__global__ void indexer_k_quant_and_cache(const uint16_t* k, int64_t k_row_stride,
                                          const int64_t* slots, int64_t slot_stride, int tokens,
                                          uint8_t* cache, int64_t block_stride, int block_size,
                                          int64_t capacity, bool shuffle, AcFp8 fmt,
                                          float quant_max) {
  const int warps = static_cast<int>(blockDim.x) / ac_warp_size();
  const int token =
      static_cast<int>(blockIdx.x) * warps + static_cast<int>(threadIdx.x) / ac_warp_size();
  if (token >= tokens) return;  // whole warps leave together
  const int64_t slot = slots[token * slot_stride];
  if (slot < 0 || slot >= capacity) return;  // padding token (or no such slot): nothing written
  const int lane = ac_lane();
#if defined(AC_MUTANT_INDEXER_K_OFFSET_INT32)
  // Seed bug: the token's row offset in int32, which wraps once k's row passes element 2^31.
  const uint16_t* row =
      k + static_cast<int32_t>(static_cast<uint32_t>(token) * static_cast<uint32_t>(k_row_stride));
#else
  const uint16_t* row = k + token * k_row_stride;  // 64-bit: a row may lie past element 2^31
#endif
  float amax = 0.0f;
  for (int d = lane; d < kHeadDim; d += ac_warp_size())
    amax = fmaxf(amax, fabsf(ac_bf16_to_float(row[d])));
  amax = ac_warp_max(amax);
  const float scale = idx::ue8m0_scale(amax, 1e-4f, quant_max);
  uint8_t* page = const_cast<uint8_t*>(page_at(cache, slot / block_size, block_stride));
  const int64_t t = slot % block_size;
  for (int d = lane; d < kHeadDim; d += ac_warp_size())
    page[idx::value_offset(shuffle, t, d)] = ac_float_to_fp8(ac_bf16_to_float(row[d]) / scale, fmt);
  if (lane == 0) *reinterpret_cast<float*>(page + idx::scale_offset(block_size, t)) = scale;
}

void run_k_cache(const ack::KParams& p, const ack::KArgs& a) {
  const auto& k = a.get("k");
  const auto& slots = a.get("slot_mapping");
  const auto& cache = a.get("kv_cache");
  ack::expect_dtype(k, "k", kDLBfloat, 16);
  ack::expect_ndim(k, "k", 2);
  ack::expect_contiguous_last(k, "k");
  ack::expect_dtype(slots, "slot_mapping", kDLInt, 64);
  ack::expect_ndim(slots, "slot_mapping", 1);
  if (k.size(1) != kHeadDim)
    throw ack::Refusal("k must be [T, 128], got last dim " + std::to_string(k.size(1)));
  if (k.size(0) < slots.size(0)) throw ack::Refusal("k has fewer rows than slot_mapping");
  const auto geo = idx::cache_geometry(cache);
  const AcFp8 fmt = idx::fp8_format(p);
  const float qmax = idx::quant_max(p, fmt);
  const int tokens = static_cast<int>(slots.size(0));
  if (tokens == 0) return;
  const int ws = idx::warp_size_of_device(), warps = 4;
  hipLaunchKernelGGL(indexer_k_quant_and_cache, dim3((tokens + warps - 1) / warps),
                     dim3(warps * ws), 0, 0, k.ptr<uint16_t>(), k.stride(0), slots.ptr<int64_t>(),
                     slots.stride(0), tokens, cache.ptr<uint8_t>(), geo.block_stride,
                     geo.block_size, geo.num_blocks * geo.block_size,
                     page_is_shuffled(geo.block_size), fmt, qmax);
  idx::check_launch("indexer_k_quant_and_cache");
}

// ---------------------------------------------------------------------------------------------
// Gather: 32 threads per output row, 4 bytes each (a 4-dim run is contiguous in both layouts).
__global__ void indexer_gather_k(const uint8_t* cache, int64_t block_stride, int block_size,
                                 int64_t num_blocks, bool shuffle, const int32_t* table,
                                 int64_t table_rs, int64_t table_cs, int64_t table_w,
                                 const int32_t* cu, int64_t cu_stride, int requests, uint8_t* out,
                                 int64_t out_rs, float* scales, int64_t scale_stride,
                                 int64_t rows) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (i >= rows) return;
  int lo = 0, hi = requests - 1;  // the request r with cu[r] <= i < cu[r + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid * cu_stride] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t pos = i - cu[lo * cu_stride], col = pos / block_size;
  const int64_t block = col < table_w ? table[lo * table_rs + col * table_cs] : -1;
  if (block < 0 || block >= num_blocks) {  // no such page: scale 0, values left alone (vLLM)
    if (lane == 0) scales[i * scale_stride] = 0.0f;
    return;
  }
  const uint8_t* page = page_at(cache, block, block_stride);
  const int64_t t = pos % block_size;
  const int d0 = 4 * lane;
#if defined(AC_MUTANT_INDEXER_GATHER_CONTIGUOUS_OUT)
  // Seed bug: a contiguous-only path, k_fp8 rows taken as 128 bytes apart (its row stride dropped).
  out_rs = kHeadDim;
#endif
  *reinterpret_cast<uint32_t*>(out + i * out_rs + d0) =
      *reinterpret_cast<const uint32_t*>(page + idx::value_offset(shuffle, t, d0));
  if (lane == 0)
    scales[i * scale_stride] =
        *reinterpret_cast<const float*>(page + idx::scale_offset(block_size, t));
}

void run_gather(const ack::KParams&, const ack::KArgs& a) {
  const auto& cache = a.get("kv_cache");
  const auto& table = a.get("block_table");
  const auto& cu = a.get("cu_seq_lens");
  const auto& out = a.get("k_fp8");
  const auto& scales = a.get("k_scale");
  const auto geo = idx::cache_geometry(cache);
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  ack::expect_dtype(cu, "cu_seq_lens", kDLInt, 32);
  ack::expect_ndim(cu, "cu_seq_lens", 1);
  ack::expect_dtype(out, "k_fp8", kDLUInt, 8);
  ack::expect_ndim(out, "k_fp8", 2);
  ack::expect_dtype(scales, "k_scale", kDLFloat, 32);
  ack::expect_ndim(scales, "k_scale", 1);
  if (out.size(1) != kHeadDim || out.stride(1) != 1 || out.stride(0) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(out.data) % 4 != 0)
    throw ack::Refusal("k_fp8 must be [N, 128] with 4-byte aligned contiguous rows");
  if (cu.size(0) != table.size(0) + 1)
    throw ack::Refusal("cu_seq_lens must have block_table rows + 1 entries");
  if (scales.size(0) != out.size(0))
    throw ack::Refusal("k_scale and k_fp8 must have the same rows");
  const int64_t rows = out.size(0);
  if (rows == 0 || table.size(0) == 0) return;
  const int threads = 256;
  hipLaunchKernelGGL(
      indexer_gather_k, dim3(static_cast<unsigned>((rows * 32 + threads - 1) / threads)),
      dim3(threads), 0, 0, cache.ptr<uint8_t>(), geo.block_stride, geo.block_size, geo.num_blocks,
      page_is_shuffled(geo.block_size), table.ptr<int32_t>(), table.stride(0), table.stride(1),
      table.size(1), cu.ptr<int32_t>(), cu.stride(0), static_cast<int>(table.size(0)),
      out.ptr<uint8_t>(), out.stride(0), scales.ptr<float>(), scales.stride(0), rows);
  idx::check_launch("indexer_gather_k");
}

// ---------------------------------------------------------------------------------------------
// Paged decode logits. Program (row r = b*next_n + n, key split, head chunk): ChunkQ heads of row r
// against kSplit key positions, through the matrix units 64 heads x 32 positions at a time. One
// head chunk writes the logits directly; several write fp32 partials that a second kernel sums in
// chunk order (AITER's stage1 + head sum), so the result is deterministic.
struct DecodeArgs {
  const uint8_t* q;
  int64_t q_sb, q_sn, q_sh;  // byte strides of q [B, next_n, H, 128]
  const float* w;
  int64_t w_sr, w_sh;
  const int32_t* context_lens;
  int64_t ctx_stride;
  const int32_t* table;
  int64_t table_rs, table_cs, table_w;
  const uint8_t* cache;
  int64_t block_stride, num_blocks;
  int block_size;
  bool preshuffle;
  int next_n, chunk_q;
  int64_t width;  // max_model_len
  float* out;     // logits (one chunk) or partials [chunks][rows][width]
  int64_t out_rs;
  int64_t chunk_stride;  // partials: rows * width; 0 when writing logits directly
  bool direct;
  AcFp8 fmt;
};

__device__ __forceinline__ int64_t decode_row_end(int64_t L, int next_n, int n, int64_t width) {
  const int64_t e = L - next_n + n + 1;
  return e < 0 ? 0 : (e > width ? width : e);
}

__global__ void indexer_paged_logits(DecodeArgs a) {
  __shared__ __align__(32) idx::ScoreSmem sm;
  const int r = static_cast<int>(blockIdx.x), b = r / a.next_n, n = r % a.next_n;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * idx::kSplit;
  const int64_t c1 =
      c0 + idx::kSplit < a.width ? c0 + idx::kSplit : a.width;  // never past max_model_len
  const int h0 = static_cast<int>(blockIdx.z) * a.chunk_q;
  const int64_t row_end = decode_row_end(a.context_lens[b * a.ctx_stride], a.next_n, n, a.width);
  const int64_t hi = row_end < c1 ? row_end : c1;
  load_decode_lut(sm, a.fmt);
  for (int i = threadIdx.x; i < idx::kSplit; i += blockDim.x) sm.acc[i] = 0.0f;
  for (int hs = 0; hs < a.chunk_q && c0 < hi; hs += idx::kTileHeads) {
    const int nh = a.chunk_q - hs < idx::kTileHeads ? a.chunk_q - hs : idx::kTileHeads;
    __syncthreads();
    idx::load_q(sm, a.q + b * a.q_sb + n * a.q_sn + (h0 + hs) * a.q_sh, a.q_sh,
                a.w + r * a.w_sr + (h0 + hs) * a.w_sh, a.w_sh, nh);
    for (int64_t p0 = c0; p0 < hi; p0 += idx::kTilePos) {
      for (int i = threadIdx.x; i < idx::kTilePos * 32; i += blockDim.x) {
        const int pl = i / 32, d0 = 4 * (i % 32);
        const int64_t p = p0 + pl;
        uint32_t bits = 0;
        float ks = 0.0f;
        const int64_t col = p / a.block_size;
        const int64_t block =
            p < hi && col < a.table_w ? a.table[b * a.table_rs + col * a.table_cs] : -1;
        if (block >= 0 &&
            block < a.num_blocks) {  // a bad table entry reads as zero, never out of bounds
          const uint8_t* page = page_at(a.cache, block, a.block_stride);
          const int64_t t = p % a.block_size;
          bits = *reinterpret_cast<const uint32_t*>(page + idx::value_offset(a.preshuffle, t, d0));
          ks = *reinterpret_cast<const float*>(page + idx::scale_offset(a.block_size, t));
        }
        idx::put_k(sm, pl, d0, bits);
        if (d0 == 0) sm.k_scale[pl] = ks;
      }
      idx::score_tile(sm, nh, static_cast<int>(p0 - c0));
    }
  }
  __syncthreads();
  float* out = a.out + blockIdx.z * a.chunk_stride + r * a.out_rs;
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
    if (c < row_end)
      out[c] = sm.acc[c - c0];
    else if (a.direct)
      out[c] = neg_inf;
  }
}

__global__ void indexer_sum_head_chunks(const float* partial, int chunks, int64_t chunk_stride,
                                        int64_t width, const int32_t* context_lens,
                                        int64_t ctx_stride, int next_n, float* out,
                                        int64_t out_rs) {
  const int r = static_cast<int>(blockIdx.x);
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const int64_t row_end =
      decode_row_end(context_lens[(r / next_n) * ctx_stride], next_n, r % next_n, width);
  float v = -__int_as_float(0x7f800000);
  if (c < row_end) {
    v = 0.0f;
    for (int ch = 0; ch < chunks; ++ch) v += partial[ch * chunk_stride + r * width + c];
  }
  out[r * out_rs + c] = v;
}

// Per-head-chunk partial logits: grown on demand and kept between calls (a per-launch allocation
// would need a synchronous free, which a graph capture cannot hold); never grown while capturing
// (the runtime's warm-up run allocates first).
float* head_chunk_workspace(size_t floats) {
  static float* buf = nullptr;
  static size_t cap = 0;
  if (floats <= cap) return buf;
  if (ack::capturing())
    throw std::runtime_error("indexer_logits_decode: the workspace would grow during a capture");
  if (buf) {
    (void)hipDeviceSynchronize();  // earlier launches may still use it
    (void)hipFree(buf);
    buf = nullptr;
    cap = 0;
  }
  if (hipMalloc(reinterpret_cast<void**>(&buf), floats * sizeof(float)) != hipSuccess)
    throw std::runtime_error("indexer_logits_decode: workspace allocation failed");
  cap = floats;
  return buf;
}

void run_paged_logits(const ack::KParams& p, const ack::KArgs& args) {
  const auto& q = args.get("q");
  const auto& cache = args.get("kv_cache");
  const auto& w = args.get("weights");
  const auto& lens = args.get("context_lens");
  const auto& table = args.get("block_table");
  const auto& out = args.get("logits");
  const auto geo = idx::cache_geometry(cache);
  const AcFp8 fmt = idx::fp8_format(p);
  ack::expect_dtype(q, "q", kDLUInt, 8);
  ack::expect_ndim(q, "q", 4);
  ack::expect_contiguous_last(q, "q");
  ack::expect_dtype(w, "weights", kDLFloat, 32);
  ack::expect_ndim(w, "weights", 2);
  ack::expect_dtype(lens, "context_lens", kDLInt, 32);
  ack::expect_ndim(lens, "context_lens", 1);
  ack::expect_dtype(table, "block_table", kDLInt, 32);
  ack::expect_ndim(table, "block_table", 2);
  ack::expect_dtype(out, "logits", kDLFloat, 32);
  ack::expect_ndim(out, "logits", 2);
  ack::expect_contiguous_last(out, "logits");
  const int64_t B = q.size(0), NN = q.size(1), H = q.size(2);
  if (q.size(3) != kHeadDim)
    throw ack::Refusal("q head dim must be 128, got " + std::to_string(q.size(3)));
  if (H < 1 || H > idx::kMaxHeads)
    throw ack::Refusal("heads " + std::to_string(H) + " outside [1, " +
                       std::to_string(idx::kMaxHeads) + "]");
  if (NN < 1) throw ack::Refusal("next_n must be >= 1");
  if (w.size(0) != B * NN || w.size(1) != H) throw ack::Refusal("weights must be [B*next_n, H]");
  if (lens.size(0) != B || table.size(0) != B)
    throw ack::Refusal("context_lens and block_table need B rows");
  if (out.size(0) != B * NN) throw ack::Refusal("logits must have B*next_n rows");
  const int64_t requested = p.i("chunk_q");
#if defined(AC_MUTANT_INDEXER_CHUNKQ_UNCLAMPED)
  // Seed (AITER stage1): ChunkQ stays at its default 64 whatever the head count; a max(1, .)
  // keeps the launch alive, so the tile reads heads that do not exist.
  const int64_t chunk = requested;
  if (chunk < 1) throw ack::Refusal("chunk_q must be >= 1, got " + std::to_string(chunk));
  const int64_t chunks = H / chunk > 0 ? H / chunk : 1;
#else
  if (requested < 1) throw ack::Refusal("chunk_q must be >= 1, got " + std::to_string(requested));
  const int64_t chunk = requested < H ? requested : H;  // ChunkQ clamped to the head count
  if (H % chunk != 0)
    throw ack::Refusal("heads " + std::to_string(H) + " is not a multiple of ChunkQ " +
                       std::to_string(chunk));
  const int64_t chunks = H / chunk;
#endif
#if defined(AC_MUTANT_INDEXER_DECODE_BATCH8)
  // Seed bug: the launch sized for a batch of 8 (a captured graph's padded batch) whatever B is.
  const int64_t rows = 8 * NN, width = out.size(1);
#else
  const int64_t rows = B * NN, width = out.size(1);
#endif
  if (rows == 0 || width == 0) return;
  DecodeArgs a{};
  a.q = q.ptr<uint8_t>();
  a.q_sb = q.stride(0);
  a.q_sn = q.stride(1);
  a.q_sh = q.stride(2);
  a.w = w.ptr<float>();
  a.w_sr = w.stride(0);
  a.w_sh = w.stride(1);
  a.context_lens = lens.ptr<int32_t>();
  a.ctx_stride = lens.stride(0);
  a.table = table.ptr<int32_t>();
  a.table_rs = table.stride(0);
  a.table_cs = table.stride(1);
  a.table_w = table.size(1);
  a.cache = cache.ptr<uint8_t>();
  a.block_stride = geo.block_stride;
  a.num_blocks = geo.num_blocks;
  a.block_size = geo.block_size;
#if defined(AC_MUTANT_INDEXER_PRESHUFFLE_ONLY_BS64)
  a.preshuffle = geo.block_size == 64;  // seed: Preshuffle=(block_size == 64)
#else
  a.preshuffle = geo.block_size > 1;
#endif
  a.next_n = static_cast<int>(NN);
  a.chunk_q = static_cast<int>(chunk);
  a.width = width;
  a.fmt = fmt;
  float* partial = nullptr;
  if (chunks == 1) {
    a.out = out.ptr<float>();
    a.out_rs = out.stride(0);
    a.chunk_stride = 0;
    a.direct = true;
  } else {
    partial = head_chunk_workspace(static_cast<size_t>(chunks * rows * width));
    a.out = partial;
    a.out_rs = width;
    a.chunk_stride = rows * width;
    a.direct = false;
  }
  const int ws = idx::warp_size_of_device();
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((width + idx::kSplit - 1) / idx::kSplit),
                  static_cast<unsigned>(chunks));
  const auto stream = static_cast<hipStream_t>(ack::launch_stream());
  hipLaunchKernelGGL(indexer_paged_logits, grid, dim3(4 * ws), 0, stream, a);
  const hipError_t e = hipGetLastError();
  if (e == hipSuccess && partial) {
    hipLaunchKernelGGL(
        indexer_sum_head_chunks,
        dim3(static_cast<unsigned>(rows), static_cast<unsigned>((width + 255) / 256)), dim3(256), 0,
        stream, partial, static_cast<int>(chunks), rows * width, width, lens.ptr<int32_t>(),
        lens.stride(0), static_cast<int>(NN), out.ptr<float>(), out.stride(0));
  }
  if (e != hipSuccess)
    throw std::runtime_error(std::string("indexer_paged_logits: ") + hipGetErrorString(e));
  idx::check_launch("indexer_sum_head_chunks");
}

const ack::KernelRegistrar kRegisterKCache("indexer_k_cache", run_k_cache);
const ack::KernelRegistrar kRegisterGather("indexer_gather", run_gather);
const ack::KernelRegistrar kRegisterDecode("indexer_logits_decode", run_paged_logits,
                                           ack::kGraphSafe);

}  // namespace
