#include "rng.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "numeric.h"

namespace attncheck {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
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
// Calls set(element's bytes, k) for element k of `t` in logical row-major order. A dense storage
// is bounds-checked once for the whole view and walked by incremental offsets (Tensor's per-
// element access checks every index: most of the generators' cost); a sparse one element by
// element through its host window.
template <class SetFn>
void for_each_element(const Tensor& t, SetFn&& set) {
  if (t.numel() == 0) return;
  const auto es = static_cast<int64_t>(t.element_size());
  const Storage& s = *t.storage();
  const auto [lo, hi] = t.extent();
  if (s.sparse() || lo < 0 || hi * es > static_cast<int64_t>(s.bytes.size())) {
    t.for_each_index([&](const Index& idx, int64_t k) { set(t.element_ptr(idx), k); });
    return;
  }
  auto* base = const_cast<std::byte*>(s.bytes.data());
  t.for_each_offset([&](int64_t off, int64_t k) { set(base + off * es, k); });
}

void put(std::byte* p, double v, DType t, size_t es) {
  const uint64_t bits = encode_value(v, t);
  std::memcpy(p, &bits, es);
}
}  // namespace

void fill_normal(const Tensor& t, const Rng& rng, double mean, double stddev) {
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    put(p, mean + stddev * rng.normal_at(static_cast<uint64_t>(k)), dt, es);
  });
}

void fill_uniform(const Tensor& t, const Rng& rng, double lo, double hi) {
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    put(p, lo + (hi - lo) * rng.uniform_at(static_cast<uint64_t>(k)), dt, es);
  });
}

void fill_uniform_int(const Tensor& t, const Rng& rng, int64_t lo, int64_t hi) {
  const auto range = static_cast<uint64_t>(hi - lo) + 1;
  const DType dt = t.dtype();
  const size_t es = t.element_size();
  for_each_element(t, [&](std::byte* p, int64_t k) {
    const auto r = rng.block(static_cast<uint64_t>(k));
    const uint64_t v = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    // 64 random bits modulo a small range: bias below range / 2^64, irrelevant for test data.
    put(p, static_cast<double>(lo + static_cast<int64_t>(v % range)), dt, es);
  });
}

void fill_fp8_codes(const Tensor& t, const Rng& rng, double max_abs) {
  if (!is_fp8(t.dtype())) throw std::invalid_argument("fill_fp8_codes needs an fp8 tensor");
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    const double v = fp8_decode(static_cast<uint8_t>(c), t.dtype());
    if (std::isfinite(v) && std::fabs(v) <= max_abs) codes.push_back(static_cast<uint8_t>(c));
  }
  for_each_element(t, [&](std::byte* p, int64_t k) {
    const auto r = rng.block(static_cast<uint64_t>(k));
    *p = static_cast<std::byte>(codes[r[0] % codes.size()]);
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
