// Sparse MLA decode over an FP4 KV cache read directly (docs/ops/sparse_mla_fp4.md): the
// DeepSeek-V4.1 compressed-KV record of vLLM #57489 / #57463, one 512-dim latent row per token
// (the whole post-RoPE row quantized, K = V), 16- or 32-element blocks:
//   nvfp4: 256 bytes of e2m1 pairs + 32 e4m3fn block scales = 288 bytes per token (no tensor
//          scale: the record is self-describing, the global scale is 1);
//   mxfp4: 256 bytes of e2m1 pairs + 16 e8m0 block scales   = 272 bytes per token.
// Element 2i sits in the low nibble of byte i. A page of P tokens holds the P data rows first
// (token t at byte t * 256) and then the P scale rows (token t at byte P * 256 + t * scale_bytes).
//
// The reference decodes every record by the format definition (core/fp4.h, exact in double) and
// then runs the sparse MLA reference (sparse_mla.h) over the decoded rows.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "sparse_mla.h"

namespace attncheck::ref::fp4_record {

inline constexpr int64_t kDims = 512;       // latent dims per record (K = V)
inline constexpr int64_t kDataBytes = 256;  // kDims / 2

enum class Format : uint8_t { nvfp4, mxfp4 };
std::string_view format_name(Format f);  // "nvfp4", "mxfp4"
int64_t block_elems(Format f);           // 16, 32
int64_t scale_bytes(Format f);           // 32, 16
int64_t record_bytes(Format f);          // 288, 272

// Byte offsets inside a page of `page_size` tokens: data byte c (elements 2c, 2c + 1) and scale
// byte s of token t.
int64_t data_offset(int64_t t, int64_t c);
int64_t scale_offset(Format f, int64_t page_size, int64_t t, int64_t s);

// The cache: u8 [num_pages, page_size, record_bytes] (vLLM's per-token width), each page's bytes
// contiguous (stride(1) = record_bytes, stride(2) = 1), any page stride >= the page. Throws
// std::invalid_argument naming what does not fit.
void check_cache(const Tensor& cache, Format f);

// The 512 values of token t of page `page`: e2m1(code) * scale, scale e4m3fn (nvfp4) or e8m0
// (mxfp4); a NaN scale byte gives NaN for its block.
void read_record(const Tensor& cache, Format f, int64_t page, int64_t t, double* out);
// All records: f64 [num_pages, page_size, 512] (a LatentCache with kv_scale 1).
Tensor decode_cache(const Tensor& cache, Format f);

// Quantizes 512 values into token t of page `page` as the V4.1 writers do: nvfp4 block scale
// e4m3(max(amax, 6 * 2^-9) / 6) (round to nearest even, saturating at 448), mxfp4 scale byte
// ceil(log2(max(amax, 6 * 2^-126) / 6)) + 127 (the ceil rule of core/fp4.h with the packers'
// floor); elements x / scale rounded to nearest even e2m1 (saturating at 6). Values must be
// finite.
void write_record(const Tensor& cache, Format f, int64_t page, int64_t t, const double* values);

// Sparse MLA over the decoded cache (sparse_mla.h: out f64 [T, N, 512], lse f64 [T, N]).
MlaResult sparse_mla_fp4(const Tensor& q, const Tensor& cache, Format f,
                         const RaggedIndices& indices, double scale);

}  // namespace attncheck::ref::fp4_record
