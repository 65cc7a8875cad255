// rope: NeoX / GPT-J rotary embedding of the last dim of strided [T, H, rot] views, in place
// ("rope_inplace": q and k mutated, nothing returned) or out of place ("rope_out_of_place": q_out,
// k_out written, q and k untouched), and the indexer's composite ("indexer_qk_rope": q [T, H, D]
// and k [T, D] after RoPE on dims [0, rot)) by either of vLLM's two paths. One workgroup per
// token; lanes walk (head, pair); cos/sin come from the cache row of the token's position and the
// rotation is evaluated in fp32, rounded once to the tensor dtype.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu_compat.h"
#include "kernel_api.h"

namespace {

enum CacheKind : int { kCacheF32 = 0, kCacheBf16 = 1, kCacheF16 = 2 };

// A [T, H, W] view of 16-bit elements (2-d [T, W] tensors get H = 1).
struct View3 {
  uint16_t* data;
  int64_t T, H, W;
  int64_t st_t, st_h, st_w;
};

AC_DEVICE float load16(const uint16_t* p, int is_bf16) {
  return is_bf16 ? ac_bf16_to_float(*p) : ac_f16_to_float(*p);
}
AC_DEVICE uint16_t round16(float v, int is_bf16) {
  return is_bf16 ? ac_float_to_bf16(v) : ac_float_to_f16(v);
}
AC_DEVICE float load_cache(const void* cache, int64_t off, int kind) {
  if (kind == kCacheF32) return static_cast<const float*>(cache)[off];
  return load16(static_cast<const uint16_t*>(cache) + off, kind == kCacheBf16);
}

template <bool NEOX>
__global__ void rope_rotate(View3 in, View3 out, const void* positions, int pos_is_i64,
                            const void* cache, int64_t cache_row_stride, int64_t cache_col_stride,
                            int cache_kind, int is_bf16) {
  const int64_t t = blockIdx.x;
  const int64_t pos = pos_is_i64 ? static_cast<const int64_t*>(positions)[t]
                                 : static_cast<const int32_t*>(positions)[t];
  const int64_t half = in.W / 2;
  const int64_t cache_base = pos * cache_row_stride;
  for (int64_t w = threadIdx.x; w < in.H * half; w += blockDim.x) {
    const int64_t h = w / half, i = w % half;
    const float c = load_cache(cache, cache_base + i * cache_col_stride, cache_kind);
    const float s = load_cache(cache, cache_base + (half + i) * cache_col_stride, cache_kind);
    const int64_t ia = NEOX ? i : 2 * i;
    const int64_t ib = NEOX ? i + half : 2 * i + 1;
#if defined(AC_MUTANT_ROPE_TOKEN_OFFSET_INT32)
    // Seed bug: the input token row's offset in int32, which wraps once q / k reach past 2^31.
    const uint16_t* src =
        in.data + static_cast<int32_t>(static_cast<uint32_t>(t * in.st_t + h * in.st_h));
#else
    const uint16_t* src = in.data + t * in.st_t + h * in.st_h;
#endif
    const float a = load16(src + ia * in.st_w, is_bf16);
    const float b = load16(src + ib * in.st_w, is_bf16);
    uint16_t* dst = out.data + t * out.st_t + h * out.st_h;
    // Both inputs are read before either output is written: in == out is the in-place contract.
    dst[ia * out.st_w] = round16(a * c - b * s, is_bf16);
    dst[ib * out.st_w] = round16(b * c + a * s, is_bf16);
  }
}

__global__ void copy3(View3 dst, View3 src) {
  const int64_t n = src.T * src.H * src.W;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = e % src.W, h = (e / src.W) % src.H, t = e / (src.W * src.H);
    dst.data[t * dst.st_t + h * dst.st_h + w * dst.st_w] =
        src.data[t * src.st_t + h * src.st_h + w * src.st_w];
  }
}

void check_launch(const char* what) {
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess) throw std::runtime_error(std::string(what) + ": " + hipGetErrorString(e));
}

bool is16(const ack::KTensor& t) {
  return (t.dtype.code == kDLBfloat || t.dtype.code == kDLFloat) && t.dtype.bits == 16;
}

View3 view3(const ack::KTensor& t, const char* name) {
  if (!is16(t)) throw ack::Refusal(std::string("tensor '") + name + "' must be bf16 or f16");
  if (t.ndim == 2)
    return {static_cast<uint16_t*>(t.data), t.size(0), 1, t.size(1), t.stride(0), 0, t.stride(1)};
  if (t.ndim == 3)
    return {static_cast<uint16_t*>(t.data),
            t.size(0),
            t.size(1),
            t.size(2),
            t.stride(0),
            t.stride(1),
            t.stride(2)};
  throw ack::Refusal(std::string("tensor '") + name + "' must be [T, H, rot] or [T, rot]");
}

View3 slice_w(View3 v, int64_t lo, int64_t hi) {
  v.data += lo * v.st_w;
  v.W = hi - lo;
  return v;
}

View3 contiguous_view(uint16_t* data, int64_t T, int64_t H, int64_t W) {
  return {data, T, H, W, H * W, W, 1};
}

// Device scratch for the paths that need copies; freed after the work queued on it completes.
struct Scratch {
  uint16_t* data = nullptr;
  explicit Scratch(int64_t elems) {
    if (hipMalloc(reinterpret_cast<void**>(&data),
                  static_cast<size_t>(std::max<int64_t>(elems, 1)) * 2) != hipSuccess)
      throw std::runtime_error("rope: hipMalloc of scratch failed");
  }
  ~Scratch() {
    (void)hipDeviceSynchronize();
    (void)hipFree(data);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

struct RopeSetup {
  const void* positions;
  int pos_is_i64;
  const void* cache;
  int64_t cache_rows, cache_row_stride, cache_col_stride;
  int cache_kind;
  int64_t rot;
  bool neox;
  int is_bf16;
  int64_t T;
};

RopeSetup rope_setup(const ack::KParams& p, const ack::KArgs& a, const ack::KTensor& q) {
  const auto& pos = a.get("positions");
  const auto& cache = a.get("cos_sin_cache");
  RopeSetup s{};
  if (pos.ndim != 1 || pos.dtype.code != kDLInt || (pos.dtype.bits != 32 && pos.dtype.bits != 64))
    throw ack::Refusal("positions must be a 1-d int32 or int64 tensor");
  if (pos.stride(0) != 1 && pos.size(0) > 1) throw ack::Refusal("positions must be contiguous");
  ack::expect_ndim(cache, "cos_sin_cache", 2);
  if (cache.dtype.code == kDLFloat && cache.dtype.bits == 32)
    s.cache_kind = kCacheF32;
  else if (cache.dtype.code == kDLBfloat && cache.dtype.bits == 16)
    s.cache_kind = kCacheBf16;
  else if (cache.dtype.code == kDLFloat && cache.dtype.bits == 16)
    s.cache_kind = kCacheF16;
  else
    throw ack::Refusal("cos_sin_cache must be f32, bf16 or f16");
  s.rot = cache.size(1);
  if (s.rot < 2 || s.rot % 2 != 0)
    throw ack::Refusal("cos_sin_cache must be [max_pos, even rot], got rot = " +
                       std::to_string(s.rot));
  s.positions = pos.data;
  s.pos_is_i64 = pos.dtype.bits == 64;
  s.cache = cache.data;
  s.cache_rows = cache.size(0);
  s.cache_row_stride = cache.stride(0);
  s.cache_col_stride = cache.stride(1);
  s.neox = p.b("is_neox");
  s.is_bf16 = q.dtype.code == kDLBfloat;
  s.T = pos.size(0);
  return s;
}

void rotate(const RopeSetup& s, const View3& in, const View3& out) {
  if (in.T != s.T || out.T != s.T || in.W != s.rot || out.W != s.rot || out.H != in.H)
    throw ack::Refusal("rope: views must be [T=" + std::to_string(s.T) +
                       ", H, rot=" + std::to_string(s.rot) + "] and agree");
  if (s.T == 0 || in.H == 0) return;
  const int lanes = static_cast<int>(std::min<int64_t>(256, in.H * (s.rot / 2)));
  const dim3 grid(static_cast<unsigned>(s.T));
  if (s.neox)
    hipLaunchKernelGGL(rope_rotate<true>, grid, dim3(lanes), 0,
                       static_cast<hipStream_t>(ack::launch_stream()), in, out, s.positions,
                       s.pos_is_i64, s.cache, s.cache_row_stride, s.cache_col_stride, s.cache_kind,
                       s.is_bf16);
  else
    hipLaunchKernelGGL(rope_rotate<false>, grid, dim3(lanes), 0,
                       static_cast<hipStream_t>(ack::launch_stream()), in, out, s.positions,
                       s.pos_is_i64, s.cache, s.cache_row_stride, s.cache_col_stride, s.cache_kind,
                       s.is_bf16);
  check_launch("rope_rotate launch");
}

void copy(const View3& dst, const View3& src) {
  const int64_t n = src.T * src.H * src.W;
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1024));
  hipLaunchKernelGGL(copy3, dim3(blocks), dim3(256), 0,
                     static_cast<hipStream_t>(ack::launch_stream()), dst, src);
  check_launch("copy3 launch");
}

void same_dtypes(const ack::KTensor& a, const char* an, const ack::KTensor& b, const char* bn) {
  if (a.dtype.code != b.dtype.code || a.dtype.bits != b.dtype.bits)
    throw ack::Refusal(std::string("'") + an + "' and '" + bn + "' dtypes differ");
}

void run_rope_inplace(const ack::KParams& p, const ack::KArgs& a) {
  const auto& q = a.get("q");
  const auto& k = a.get("k");
  same_dtypes(q, "q", k, "k");
  const RopeSetup s = rope_setup(p, a, q);
  const View3 qv = view3(q, "q"), kv = view3(k, "k");
  rotate(s, qv, qv);
  rotate(s, kv, kv);
}

void run_rope_out_of_place(const ack::KParams& p, const ack::KArgs& a) {
  const auto& q = a.get("q");
  const auto& k = a.get("k");
  const auto& q_out = a.get("q_out");
  const auto& k_out = a.get("k_out");
  same_dtypes(q, "q", k, "k");
  same_dtypes(q, "q", q_out, "q_out");
  same_dtypes(k, "k", k_out, "k_out");
  const RopeSetup s = rope_setup(p, a, q);
  rotate(s, view3(q, "q"), view3(q_out, "q_out"));
  rotate(s, view3(k, "k"), view3(k_out, "k_out"));
}

// vLLM's indexer: the generic path splits [pe | nope], rotates pe out of place and concatenates;
// the ROCm fast path rotates q[..., :rot] and k[..., :rot] in place and relies on the mutation.
void run_indexer_qk_rope(const ack::KParams& p, const ack::KArgs& a) {
  const auto& q = a.get("q");
  const auto& k = a.get("k");
  same_dtypes(q, "q", k, "k");
  ack::expect_ndim(q, "q", 3);
  ack::expect_ndim(k, "k", 2);
  const RopeSetup s = rope_setup(p, a, q);
  const View3 qv = view3(q, "q"), kv = view3(k, "k");
  const int64_t T = qv.T, D = qv.W, rot = s.rot;
  if (kv.W != D || kv.T != T) throw ack::Refusal("k must be [T, D] with q's T and D");
  if (rot > D)
    throw ack::Refusal("rope dim " + std::to_string(rot) + " exceeds head dim " +
                       std::to_string(D));
  const std::string path = p.s("path");
  if (path == "fast") {
#ifdef AC_MUTANT_ROPE_DISCARD_OUT_OF_PLACE
    // Seed bug (vLLM #27373 / #43781): the RoPE that ran was out of place; its result is dropped
    // and q, k stay unrotated.
    Scratch q_tmp(T * qv.H * rot), k_tmp(T * rot);
    rotate(s, slice_w(qv, 0, rot), contiguous_view(q_tmp.data, T, qv.H, rot));
    rotate(s, slice_w(kv, 0, rot), contiguous_view(k_tmp.data, T, 1, rot));
#else
    rotate(s, slice_w(qv, 0, rot), slice_w(qv, 0, rot));
    rotate(s, slice_w(kv, 0, rot), slice_w(kv, 0, rot));
#endif
    return;
  }
  if (path != "generic") throw ack::Refusal("path must be generic or fast, got '" + path + "'");
  for (const View3* x : {&qv, &kv}) {
    const int64_t heads = x->H;
    Scratch pe(T * heads * rot), pe_rot(T * heads * rot), nope(T * heads * (D - rot)),
        cat(T * heads * D);
    const View3 pe_v = contiguous_view(pe.data, T, heads, rot);
    const View3 pe_rot_v = contiguous_view(pe_rot.data, T, heads, rot);
    const View3 nope_v = contiguous_view(nope.data, T, heads, D - rot);
    const View3 cat_v = contiguous_view(cat.data, T, heads, D);
    copy(pe_v, slice_w(*x, 0, rot));
    copy(nope_v, slice_w(*x, rot, D));
    rotate(s, pe_v, pe_rot_v);
    copy(slice_w(cat_v, 0, rot), pe_rot_v);
    copy(slice_w(cat_v, rot, D), nope_v);
    copy(*x, cat_v);  // the caller's q / k now hold the concatenation
  }
}

const ack::KernelRegistrar kRegisterInplace("rope_inplace", run_rope_inplace, ack::kGraphSafe);
const ack::KernelRegistrar kRegisterOutOfPlace("rope_out_of_place", run_rope_out_of_place,
                                               ack::kGraphSafe);
const ack::KernelRegistrar kRegisterIndexer("indexer_qk_rope", run_indexer_qk_rope);

}  // namespace
