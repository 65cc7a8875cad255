#include "rng.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>

#include "numeric.h"

// The AVX2 kernel is compiled for x86 with GCC or Clang (a function-level target attribute) and
// chosen at run time when the CPU has AVX2; the portable kernel serves everywhere else.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ATTNCHECK_AVX2_KERNEL 1
#include <immintrin.h>
#else
#define ATTNCHECK_AVX2_KERNEL 0
#endif

namespace attncheck {

namespace {
// Philox4x32's multipliers and Weyl key increments (Salmon et al., SC'11).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kPhiloxW0;
    k[1] += kPhiloxW1;
  }
  return c;
}

uint64_t fnv1a64(std::string_view s, uint64_t h) {
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

Rng::Rng(std::string_view case_id, std::string_view tensor_name, uint64_t seed) {
  uint64_t h = fnv1a64(case_id);
  h = fnv1a64("\x1f", h);
  h = fnv1a64(tensor_name, h);
  h ^= seed * 0x9E3779B97F4A7C15ull;
  key_ = h;
}

std::array<uint32_t, 4> Rng::block(uint64_t k) const {
  return philox4x32_10({static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), 0u, 0u},
                       {static_cast<uint32_t>(key_), static_cast<uint32_t>(key_ >> 32)});
}

uint32_t Rng::next_u32() {
  if (buf_left_ == 0) {
    // Stream counters live in the upper word 1 so they never meet element counters.
    buf_ = philox4x32_10(
        {static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32), 1u, 0u},
        {static_cast<uint32_t>(key_), static_cast<uint32_t>(key_ >> 32)});
    ++stream_;
    buf_left_ = 4;
  }
  return buf_[4 - buf_left_--];
}

uint64_t Rng::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}
double Rng::uniform(double lo, double hi) {
  return lo + (hi - lo) * uniform();
}

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  if (hi < lo) throw std::invalid_argument("uniform_int: empty range");
  const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;  // 0 means the full 2^64
  if (range == 0) return static_cast<int64_t>(next_u64());
  // Rejection sampling: no modulo bias.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % range);
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return lo + static_cast<int64_t>(x % range);
}

namespace {
double irwin_hall(const std::array<uint32_t, 4>& a, const std::array<uint32_t, 4>& b,
                  const std::array<uint32_t, 4>& c) {
  // Twelve 24-bit uniforms; each sum term is k * 2^-24, so the sum is exact in double.
  double s = 0;
  for (const auto* blk : {&a, &b, &c})
    for (uint32_t w : *blk) s += static_cast<double>(w >> 8) * 0x1.0p-24;
  return s - 6.0;
}
}  // namespace

double Rng::normal() {
  std::array<uint32_t, 4> a, b, c;
  for (auto* blk : {&a, &b, &c})
    for (auto& w : *blk) w = next_u32();
  return irwin_hall(a, b, c);
}

double Rng::uniform_at(uint64_t k) const {
  const auto r = block(k);
  const uint64_t v = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<double>(v >> 11) * 0x1.0p-53;
}

double Rng::normal_at(uint64_t k) const {
  // Three blocks per element: counters 3k, 3k+1, 3k+2 in a space of their own (word 2 = 2).
  auto blk = [&](uint64_t c) {
    return philox4x32_10({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 2u, 0u},
                         {static_cast<uint32_t>(key_), static_cast<uint32_t>(key_ >> 32)});
  };
  return irwin_hall(blk(3 * k), blk(3 * k + 1), blk(3 * k + 2));
}

namespace {
// ---- Batched Philox: runs of lanes side by side (structure of arrays). ----

// Elements per batch; a normal value takes three Philox blocks.
constexpr size_t kChunk = 64;
constexpr size_t kMaxLanes = 3 * kChunk;
// Lane counts are padded to this (one AVX2 vector); padding lanes compute unused blocks.
constexpr size_t kLaneGroup = 8;

struct PhiloxLanes {
  // w[j][i]: word j of lane i, the counter before a kernel runs and its random bits after.
  alignas(32) uint32_t w[4][kMaxLanes];
};

size_t padded(size_t n) {
  return (n + kLaneGroup - 1) / kLaneGroup * kLaneGroup;
}

// The rounds of philox4x32_10 over lanes [0, lanes), a group of kLaneGroup at a time.
void philox_lanes_portable(PhiloxLanes& l, size_t lanes, uint64_t key) {
  for (size_t g = 0; g < lanes; g += kLaneGroup) {
    auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      for (size_t i = g; i < g + kLaneGroup; ++i) {
        const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * l.w[0][i];
        const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * l.w[2][i];
        l.w[0][i] = static_cast<uint32_t>(p1 >> 32) ^ l.w[1][i] ^ k0;
        l.w[1][i] = static_cast<uint32_t>(p1);
        l.w[2][i] = static_cast<uint32_t>(p0 >> 32) ^ l.w[3][i] ^ k1;
        l.w[3][i] = static_cast<uint32_t>(p0);
      }
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
  }
}

#if ATTNCHECK_AVX2_KERNEL
#define ATTNCHECK_TARGET_AVX2 __attribute__((target("avx2")))
// The 32x32 -> 64-bit products of the eight lanes of `a` with m (a constant in every 64-bit lane):
// high and low halves, each lane in place.
ATTNCHECK_TARGET_AVX2 inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// Philox4x32-10 on V vectors of eight lanes each; several in flight hide the multiplies' latency.
template <int V>
ATTNCHECK_TARGET_AVX2 inline void philox_rounds_avx2(__m256i (&c)[4][V], uint64_t key) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0), m1 = _mm256_set1_epi64x(kPhiloxM1);
  auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
    const __m256i key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < V; ++v) {
      __m256i hi0, lo0, hi1, lo1;
      mul_hi_lo(c[0][v], m0, hi0, lo0);
      mul_hi_lo(c[2][v], m1, hi1, lo1);
      c[0][v] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1][v]), key0);
      c[1][v] = lo1;
      c[2][v] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3][v]), key1);
      c[3][v] = lo0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// Lanes first .. first + 8V - 1 of l, in place.
template <int V>
ATTNCHECK_TARGET_AVX2 void philox_vectors_avx2(PhiloxLanes& l, size_t first, uint64_t key) {
  __m256i c[4][V];
  for (int j = 0; j < 4; ++j)
    for (int v = 0; v < V; ++v)
      c[j][v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&l.w[j][first + 8 * v]));
  philox_rounds_avx2<V>(c, key);
  for (int j = 0; j < 4; ++j)
    for (int v = 0; v < V; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(&l.w[j][first + 8 * v]), c[j][v]);
}

ATTNCHECK_TARGET_AVX2 void philox_lanes_avx2(PhiloxLanes& l, size_t lanes, uint64_t key) {
  size_t i = 0;
  for (; i + 24 <= lanes; i += 24) philox_vectors_avx2<3>(l, i, key);
  for (; i < lanes; i += 8) philox_vectors_avx2<1>(l, i, key);
}

// normal_sums (below) with the counters made and the words summed in registers: elements
// first + g .. first + g + 7 per step, their three blocks as three vectors in flight.
ATTNCHECK_TARGET_AVX2 void normal_sums_avx2(uint64_t key, uint64_t first, size_t n,
                                            uint32_t* sums) {
  const __m256i three_i = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i sign = _mm256_set1_epi32(INT32_MIN);
  for (size_t g = 0; g < n; g += 8) {
    __m256i c[4][3];
    for (int j = 0; j < 3; ++j) {
      // Counter 3 (first + g + i) + j = base + 3i over 64 bits: the low word wraps, carrying one
      // into the high word where it ends below base's low word.
      const uint64_t base = 3 * (first + g) + static_cast<uint64_t>(j);
      const __m256i base_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base)));
      const __m256i lo = _mm256_add_epi32(base_lo, three_i);
      const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(base_lo, sign),
                                               _mm256_xor_si256(lo, sign));  // -1 or 0
      c[0][j] = lo;
      c[1][j] = _mm256_sub_epi32(
          _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))), carry);
      c[2][j] = _mm256_set1_epi32(2);
      c[3][j] = _mm256_setzero_si256();
    }
    philox_rounds_avx2<3>(c, key);
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 3; ++j)
      for (int w = 0; w < 4; ++w) sum = _mm256_add_epi32(sum, _mm256_srli_epi32(c[w][j], 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + g), sum);
  }
}

// encode_minifloat of each value into the packed codes of encode_minifloats, four at a time: values
// in the format's normal range below its top binade round by integers (numeric.cpp's fast path,
// the same arithmetic on 64-bit lanes); any other value (zero, subnormal, huge, inf, NaN) goes
// through encode_minifloat itself.
ATTNCHECK_TARGET_AVX2 void encode_minifloats_avx2(std::span<const double> x, DType t,
                                                  Saturation sat, std::byte* out) {
  const MiniFloat f = minifloat_format(t);
  const size_t width = dtype_size(t);
  const int shift = 52 - f.man_bits;
  const __m128i shift_n = _mm_cvtsi32_si128(shift);
  const __m128i man_n = _mm_cvtsi32_si128(f.man_bits);
  const __m128i sign_n = _mm_cvtsi32_si128(f.exp_bits + f.man_bits);
  // Biased double exponents of the fast path: 1023 + (1 - bias) .. 1023 + (top - 2 - bias).
  const __m256i exp_below = _mm256_set1_epi64x(1023 + 1 - f.bias - 1);
  const __m256i exp_above = _mm256_set1_epi64x(1023 + (1 << f.exp_bits) - 3 - f.bias + 1);
  const __m256i exp_mask = _mm256_set1_epi64x(0x7FF);
  const __m256i man52 = _mm256_set1_epi64x((int64_t{1} << 52) - 1);
  const __m256i implicit = _mm256_set1_epi64x(int64_t{1} << 52);
  const __m256i rem_mask = _mm256_set1_epi64x((int64_t{1} << shift) - 1);
  const __m256i half = _mm256_set1_epi64x(int64_t{1} << (shift - 1));
  const __m256i one = _mm256_set1_epi64x(1);
  const __m256i rebias = _mm256_set1_epi64x(1023 - f.bias);
  const __m256i hidden = _mm256_set1_epi64x(int64_t{1} << f.man_bits);
  const __m256i low_words = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  size_t i = 0;
  for (; i + 4 <= x.size(); i += 4) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.data() + i));
    const __m256i e = _mm256_and_si256(_mm256_srli_epi64(bits, 52), exp_mask);
    const __m256i fast =
        _mm256_and_si256(_mm256_cmpgt_epi64(e, exp_below), _mm256_cmpgt_epi64(exp_above, e));
    const __m256i sig = _mm256_or_si256(_mm256_and_si256(bits, man52), implicit);
    __m256i r = _mm256_srl_epi64(sig, shift_n);
    const __m256i rem = _mm256_and_si256(sig, rem_mask);
    const __m256i odd = _mm256_cmpeq_epi64(_mm256_and_si256(r, one), one);
    const __m256i up = _mm256_or_si256(_mm256_cmpgt_epi64(rem, half),
                                       _mm256_and_si256(_mm256_cmpeq_epi64(rem, half), odd));
    r = _mm256_sub_epi64(r, up);  // up is -1 where the value rounds up
    const __m256i field = _mm256_sll_epi64(_mm256_sub_epi64(e, rebias), man_n);
    const __m256i code = _mm256_or_si256(_mm256_add_epi64(field, _mm256_sub_epi64(r, hidden)),
                                         _mm256_sll_epi64(_mm256_srli_epi64(bits, 63), sign_n));
    const __m128i code32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(code, low_words));
    const __m128i code16 = _mm_packus_epi32(code32, code32);  // fast lanes' codes fit
    if (width == 2) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 2 * i), code16);
    } else {
      const auto code8 = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(code16, code16)));
      std::memcpy(out + i, &code8, 4);
    }
    const int fast_lanes = _mm256_movemask_pd(_mm256_castsi256_pd(fast));
    if (fast_lanes == 0xF) continue;
    for (size_t lane = 0; lane < 4; ++lane) {
      if (fast_lanes & (1 << lane)) continue;
      const uint32_t slow = encode_minifloat(x[i + lane], t, sat);
      std::memcpy(out + (i + lane) * width, &slow, width);
    }
  }
  for (; i < x.size(); ++i) {
    const uint32_t code = encode_minifloat(x[i], t, sat);
    std::memcpy(out + i * width, &code, width);
  }
}
#endif

bool cpu_has_avx2() {
#if ATTNCHECK_AVX2_KERNEL
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

PhiloxKernel fastest_kernel() {
  static const PhiloxKernel k = cpu_has_avx2() ? PhiloxKernel::avx2 : PhiloxKernel::portable;
  return k;
}

std::atomic<int> g_chosen_kernel{-1};  // -1: the fastest available

void philox_lanes(PhiloxLanes& l, size_t lanes, uint64_t key) {
#if ATTNCHECK_AVX2_KERNEL
  if (philox_kernel() == PhiloxKernel::avx2) return philox_lanes_avx2(l, lanes, key);
#endif
  philox_lanes_portable(l, lanes, key);
}

void set_lane(PhiloxLanes& l, size_t i, uint64_t counter, uint32_t space) {
  l.w[0][i] = static_cast<uint32_t>(counter);
  l.w[1][i] = static_cast<uint32_t>(counter >> 32);
  l.w[2][i] = space;
  l.w[3][i] = 0;
}

// Rng::block(k) for k = first .. first + n - 1: lane i holds block(first + i).
void blocks(PhiloxLanes& l, uint64_t key, uint64_t first, size_t n) {
  const size_t lanes = padded(n);
  for (size_t i = 0; i < lanes; ++i) set_lane(l, i, first + i, 0);
  philox_lanes(l, lanes, key);
}

// normal_at(first + i) = sums[i] * 2^-24 - 6 for i < n: the twelve 24-bit uniforms of
// Rng::normal_at summed as integers (below 2^28, so the double of the definition holds it exactly).
void normal_sums_portable(uint64_t key, uint64_t first, size_t n, uint32_t* sums) {
  PhiloxLanes l;
  const size_t stride = padded(n);  // lane j * stride + i: block j of element first + i
  for (size_t j = 0; j < 3; ++j)
    for (size_t i = 0; i < stride; ++i) set_lane(l, j * stride + i, 3 * (first + i) + j, 2);
  philox_lanes(l, 3 * stride, key);
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = 0;
    for (size_t j = 0; j < 3; ++j)
      for (const auto& word : l.w) s += word[j * stride + i] >> 8;
    sums[i] = s;
  }
}

// normal_sums(key, first, n, sums) for n <= kChunk; sums has room for n rounded up to a lane group.
void normal_sums(uint64_t key, uint64_t first, size_t n, uint32_t* sums) {
#if ATTNCHECK_AVX2_KERNEL
  if (philox_kernel() == PhiloxKernel::avx2) return normal_sums_avx2(key, first, n, sums);
#endif
  normal_sums_portable(key, first, n, sums);
}

// ---- Encoding and storing a chunk. ----

void encode_minifloat_chunk(std::span<const double> v, DType dt, Saturation sat, std::byte* out) {
#if ATTNCHECK_AVX2_KERNEL
  if (philox_kernel() == PhiloxKernel::avx2) return encode_minifloats_avx2(v, dt, sat, out);
#endif
  encode_minifloats(v, dt, sat, out);
}

// encode_value (tensor.cpp) of each value, written packed at out: f16/bf16 overflow to inf, fp8
// saturates, exactly as there.
void encode_chunk(std::span<const double> v, DType dt, std::byte* out) {
  switch (dt) {
    case DType::f64:
      std::memcpy(out, v.data(), v.size_bytes());
      return;
    case DType::f32:
      for (size_t i = 0; i < v.size(); ++i) {
        const auto f = static_cast<float>(v[i]);
        std::memcpy(out + 4 * i, &f, 4);
      }
      return;
    case DType::f16:
    case DType::bf16:
      return encode_minifloat_chunk(v, dt, Saturation::nonsaturate, out);
    case DType::e4m3fn:
    case DType::e4m3fnuz:
    case DType::e5m2:
    case DType::e5m2fnuz:
      return encode_minifloat_chunk(v, dt, Saturation::saturate, out);
    default: {
      const size_t es = dtype_size(dt);
      for (size_t i = 0; i < v.size(); ++i) {
        const uint64_t bits = encode_value(v[i], dt);
        std::memcpy(out + i * es, &bits, es);
      }
    }
  }
}

// The storage offsets of a view's elements in logical row-major order, as runs along the innermost
// dimension after merging the dimensions that continue each other (a contiguous view is one run),
// so that a chunk of consecutive elements lands in one or a few strided runs.
class RunCursor {
 public:
  struct Run {
    int64_t offset, stride, length;
  };
  explicit RunCursor(const Tensor& t) : row_offset_(t.offset()) {
    for (size_t d = 0; d < t.shape().size(); ++d) {
      const int64_t size = t.shape()[d], stride = t.strides()[d];
      if (size == 1) continue;
      if (!sizes_.empty() && strides_.back() == stride * size) {
        sizes_.back() *= size;
        strides_.back() = stride;
      } else {
        sizes_.push_back(size);
        strides_.push_back(stride);
      }
    }
    if (sizes_.empty()) {
      sizes_.push_back(1);
      strides_.push_back(1);
    }
    idx_.assign(sizes_.size() - 1, 0);
  }
  // The next at most `max` (>= 1) elements that lie in the current row.
  Run next(int64_t max) {
    const int64_t len = std::min(max, sizes_.back() - pos_);
    const Run run{row_offset_ + pos_ * strides_.back(), strides_.back(), len};
    pos_ += len;
    if (pos_ == sizes_.back()) next_row();
    return run;
  }

 private:
  void next_row() {
    pos_ = 0;
    for (size_t d = idx_.size(); d-- > 0;) {
      row_offset_ += strides_[d];
      if (++idx_[d] < sizes_[d]) return;
      row_offset_ -= idx_[d] * strides_[d];
      idx_[d] = 0;
    }
  }
  std::vector<int64_t> sizes_, strides_;  // merged dimensions, the innermost (the rows) last
  Index idx_;                             // index into the outer dimensions
  int64_t row_offset_;
  int64_t pos_ = 0;
};

template <size_t kSize>
void scatter(std::byte* dst, int64_t stride_bytes, const std::byte* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * stride_bytes, src + i * kSize, kSize);
}

void store_run(std::byte* dst, int64_t stride_bytes, const std::byte* src, int64_t n, size_t es) {
  if (stride_bytes == static_cast<int64_t>(es)) {
    std::memcpy(dst, src, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 1:
      return scatter<1>(dst, stride_bytes, src, n);
    case 2:
      return scatter<2>(dst, stride_bytes, src, n);
    case 4:
      return scatter<4>(dst, stride_bytes, src, n);
    default:
      return scatter<8>(dst, stride_bytes, src, n);
  }
}

// produce(first, n, out) (below); where some element cannot be encoded (a value outside an
// integer dtype) the elements before it one by one: how many are ready, and the error to throw
// once they are stored, as the per-element generators stored every element before the one that
// threw.
template <class Produce>
std::pair<int64_t, std::exception_ptr> produce_chunk(Produce& produce, int64_t first, int64_t n,
                                                     std::byte* out, int64_t es) {
  try {
    produce(first, static_cast<size_t>(n), out);
    return {n, nullptr};
  } catch (...) {
  }
  for (int64_t i = 0; i < n; ++i) {
    try {
      produce(first + i, 1, out + i * es);
    } catch (...) {
      return {i, std::current_exception()};
    }
  }
  return {n, nullptr};
}

// Writes every element of `t`, element k (logical row-major order) taking the k-th value:
// produce(first, n, out) writes the encoded elements first .. first + n - 1 (n <= kChunk) packed
// at out. A view whose bytes all lie in the host's bytes (a dense storage, or a sparse one's
// window) is written by runs of offsets; any other element by element through Tensor::element_ptr,
// which throws for the first one outside a sparse window, as the per-element generators did.
template <class Produce>
void fill_chunks(const Tensor& t, Produce&& produce) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const auto es = static_cast<int64_t>(t.element_size());
  const Storage& s = *t.storage();
  const auto begin = static_cast<int64_t>(s.sparse() ? s.window_begin : 0);
  const auto held = static_cast<int64_t>(s.bytes.size());
  const auto [lo, hi] = t.extent();
  const auto chunk = static_cast<int64_t>(kChunk);
  alignas(32) std::byte staging[kChunk * 8];
  int64_t ready = 0;
  std::exception_ptr error;
  if (lo * es < begin || hi * es > begin + held) {
    int64_t first = -1;
    t.for_each_index([&](const Index& idx, int64_t k) {
      if (first < 0 || k >= first + chunk) {
        first = k;
        std::tie(ready, error) = produce_chunk(produce, k, std::min(chunk, n - k), staging, es);
      }
      std::byte* p = t.element_ptr(idx);
      if (k - first >= ready) std::rethrow_exception(error);
      std::memcpy(p, staging + (k - first) * es, static_cast<size_t>(es));
    });
    return;
  }
  auto* host = const_cast<std::byte*>(s.bytes.data());
  RunCursor cursor(t);
  for (int64_t first = 0; first < n; first += chunk) {
    std::tie(ready, error) = produce_chunk(produce, first, std::min(chunk, n - first), staging, es);
    for (int64_t i = 0; i < ready;) {
      const auto run = cursor.next(ready - i);
      store_run(host + (run.offset * es - begin), run.stride * es, staging + i * es, run.length,
                static_cast<size_t>(es));
      i += run.length;
    }
    if (error) std::rethrow_exception(error);
  }
}

#if defined(__GNUC__) || defined(__clang__)
__extension__ typedef unsigned __int128 Uint128;
#endif

// a % d for 32-bit a and d > 0, exact, by multiplications where the compiler has 128-bit integers
// (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019): a division per element
// would cost more than its Philox block.
class Mod32 {
 public:
  explicit Mod32(uint32_t d) : d_(d), m_(~uint64_t{0} / d + 1) {}
  uint32_t operator()(uint32_t a) const {
#if defined(__GNUC__) || defined(__clang__)
    return static_cast<uint32_t>((static_cast<Uint128>(m_ * a) * d_) >> 64);
#else
    return a % d_;
#endif
  }

 private:
  uint64_t d_, m_;
};

double uniform_of(const PhiloxLanes& l, size_t i) {
  const uint64_t v = (static_cast<uint64_t>(l.w[0][i]) << 32) | l.w[1][i];
  return static_cast<double>(v >> 11) * 0x1.0p-53;  // Rng::uniform_at
}
}  // namespace

void Rng::uniform_run(uint64_t first, std::span<double> out) const {
  for (size_t done = 0; done < out.size(); done += kChunk) {
    const size_t n = std::min(kChunk, out.size() - done);
    PhiloxLanes l;
    blocks(l, key_, first + done, n);
    for (size_t i = 0; i < n; ++i) out[done + i] = uniform_of(l, i);
  }
}

void Rng::normal_run(uint64_t first, std::span<double> out) const {
  for (size_t done = 0; done < out.size(); done += kChunk) {
    const size_t n = std::min(kChunk, out.size() - done);
    uint32_t sums[kChunk];
    normal_sums(key_, first + done, n, sums);
    for (size_t i = 0; i < n; ++i) out[done + i] = static_cast<double>(sums[i]) * 0x1.0p-24 - 6.0;
  }
}

bool philox_kernel_available(PhiloxKernel k) {
  return k == PhiloxKernel::portable || (k == PhiloxKernel::avx2 && cpu_has_avx2());
}

PhiloxKernel philox_kernel() {
  const int chosen = g_chosen_kernel.load(std::memory_order_relaxed);
  return chosen < 0 ? fastest_kernel() : static_cast<PhiloxKernel>(chosen);
}

void set_philox_kernel(PhiloxKernel k) {
  if (!philox_kernel_available(k))
    throw std::invalid_argument("set_philox_kernel: this CPU cannot run the requested kernel");
  g_chosen_kernel.store(static_cast<int>(k), std::memory_order_relaxed);
}

void reset_philox_kernel() {
  g_chosen_kernel.store(-1, std::memory_order_relaxed);
}

void fill_normal(const Tensor& t, const Rng& rng, double mean, double stddev) {
  const DType dt = t.dtype();
  fill_chunks(t, [&](int64_t first, size_t n, std::byte* out) {
    double v[kChunk];
    rng.normal_run(static_cast<uint64_t>(first), {v, n});
    for (size_t i = 0; i < n; ++i) v[i] = mean + stddev * v[i];
    encode_chunk({v, n}, dt, out);
  });
}

void fill_uniform(const Tensor& t, const Rng& rng, double lo, double hi) {
  const DType dt = t.dtype();
  fill_chunks(t, [&](int64_t first, size_t n, std::byte* out) {
    double v[kChunk];
    rng.uniform_run(static_cast<uint64_t>(first), {v, n});
    for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * v[i];
    encode_chunk({v, n}, dt, out);
  });
}

void fill_uniform_int(const Tensor& t, const Rng& rng, int64_t lo, int64_t hi) {
  const auto range = static_cast<uint64_t>(hi - lo) + 1;
  const DType dt = t.dtype();
  fill_chunks(t, [&](int64_t first, size_t n, std::byte* out) {
    PhiloxLanes l;
    blocks(l, rng.key(), static_cast<uint64_t>(first), n);
    double v[kChunk];
    for (size_t i = 0; i < n; ++i) {
      const uint64_t bits = (static_cast<uint64_t>(l.w[0][i]) << 32) | l.w[1][i];
      // 64 random bits modulo a small range: bias below range / 2^64, irrelevant for test data.
      v[i] = static_cast<double>(lo + static_cast<int64_t>(bits % range));
    }
    encode_chunk({v, n}, dt, out);
  });
}

void fill_fp8_codes(const Tensor& t, const Rng& rng, double max_abs) {
  if (!is_fp8(t.dtype())) throw std::invalid_argument("fill_fp8_codes needs an fp8 tensor");
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    const double v = fp8_decode(static_cast<uint8_t>(c), t.dtype());
    if (std::isfinite(v) && std::fabs(v) <= max_abs) codes.push_back(static_cast<uint8_t>(c));
  }
  if (codes.empty())
    throw std::invalid_argument("fill_fp8_codes: no finite " + std::string(dtype_name(t.dtype())) +
                                " value has a magnitude of at most " + std::to_string(max_abs));
  const Mod32 mod_codes(static_cast<uint32_t>(codes.size()));
  fill_chunks(t, [&](int64_t first, size_t n, std::byte* out) {
    PhiloxLanes l;
    blocks(l, rng.key(), static_cast<uint64_t>(first), n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>(codes[mod_codes(l.w[0][i])]);
  });
}

std::vector<int64_t> permutation(int64_t n, Rng& rng) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.uniform_int(0, i)]);
  return p;
}

void poison(const Tensor& t) {
  auto& bytes = t.storage()->bytes;
  if (is_floating(t.dtype())) {
    const uint64_t bits = nan_bits(t.dtype());
    const size_t es = t.element_size();
    for (size_t i = 0; i + es <= bytes.size(); i += es) std::memcpy(&bytes[i], &bits, es);
  } else {
    std::fill(bytes.begin(), bytes.end(), std::byte{0xFF});
  }
}

}  // namespace attncheck
