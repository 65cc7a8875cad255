#include "rope.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace attncheck::ref {

namespace {

void check_args(const Tensor& x, const Tensor& positions, const Tensor& cache) {
  if (cache.ndim() != 2 || cache.size(1) % 2 != 0)
    throw std::invalid_argument("rope: cos_sin_cache must be [max_pos, even rot], got " +
                                cache.describe());
  if (x.ndim() < 2 || x.size(-1) != cache.size(1))
    throw std::invalid_argument("rope: x must be [T, ..., rot] with rot = " +
                                std::to_string(cache.size(1)) + ", got " + x.describe());
  if (positions.ndim() != 1 || positions.size(0) != x.size(0))
    throw std::invalid_argument("rope: positions must be [T] with T = " +
                                std::to_string(x.size(0)) + ", got " + positions.describe());
  if (positions.dtype() != DType::i32 && positions.dtype() != DType::i64)
    throw std::invalid_argument("rope: positions must be int32 or int64");
}

// Calls fn(row index without the last dim, position) for every rotated row of x.
template <class Fn>
void for_each_row(const Tensor& x, const Tensor& positions, int64_t max_pos, Fn&& fn) {
  x.select(-1, 0).for_each_index([&](const Index& row, int64_t) {
    const auto pos = static_cast<int64_t>(positions.get({row[0]}));
    if (pos < 0 || pos >= max_pos)
      throw std::invalid_argument("rope: position " + std::to_string(pos) + " of token " +
                                  std::to_string(row[0]) + " outside the cache [0, " +
                                  std::to_string(max_pos) + ")");
    fn(row, pos);
  });
}

// Rotates the row `row` of src into the same row of dst.
void rotate_row(const Tensor& src, const Tensor& dst, const Index& row, const Tensor& cache,
                int64_t pos, RopeStyle style) {
  const int64_t rot = cache.size(1), half = rot / 2;
  Index at = row;
  at.push_back(0);
  std::vector<double> in(static_cast<size_t>(rot));
  for (int64_t j = 0; j < rot; ++j) {
    at.back() = j;
    in[j] = src.get(at);
  }
  for (int64_t i = 0; i < half; ++i) {
    const double c = cache.get({pos, i}), s = cache.get({pos, half + i});
    const int64_t ia = style == RopeStyle::neox ? i : 2 * i;
    const int64_t ib = style == RopeStyle::neox ? i + half : 2 * i + 1;
    at.back() = ia;
    dst.set(at, in[ia] * c - in[ib] * s);
    at.back() = ib;
    dst.set(at, in[ib] * c + in[ia] * s);
  }
}

}  // namespace

Tensor rope_cos_sin_cache(int64_t max_pos, int64_t rot, double base, DType dtype) {
  if (max_pos < 1 || rot < 2 || rot % 2 != 0)
    throw std::invalid_argument("rope_cos_sin_cache: max_pos >= 1 and an even rot >= 2 needed");
  const int64_t half = rot / 2;
  Tensor cache = Tensor::empty(dtype, {max_pos, rot});
  for (int64_t i = 0; i < half; ++i) {
    const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
    for (int64_t p = 0; p < max_pos; ++p) {
      const double angle = static_cast<double>(p) * theta;
      cache.set({p, i}, std::cos(angle));
      cache.set({p, half + i}, std::sin(angle));
    }
  }
  return cache;
}

Tensor rope_inverse_cache(const Tensor& cache) {
  Tensor inv = cache.contiguous();
  const int64_t half = cache.size(1) / 2;
  for (int64_t p = 0; p < cache.size(0); ++p)
    for (int64_t i = half; i < cache.size(1); ++i) inv.set({p, i}, -cache.get({p, i}));
  return inv;
}

Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& cache, RopeStyle style) {
  check_args(x, positions, cache);
  Tensor out = Tensor::empty(x.dtype(), x.shape());
  for_each_row(x, positions, cache.size(0),
               [&](const Index& row, int64_t pos) { rotate_row(x, out, row, cache, pos, style); });
  return out;
}

void rope_inplace(const Tensor& x, const Tensor& positions, const Tensor& cache, RopeStyle style) {
  check_args(x, positions, cache);
  // rotate_row reads the whole row before writing it, so source and destination may coincide.
  for_each_row(x, positions, cache.size(0),
               [&](const Index& row, int64_t pos) { rotate_row(x, x, row, cache, pos, style); });
}

RotatedQK indexer_qk_rope(const Tensor& q, const Tensor& k, const Tensor& positions,
                          const Tensor& cache, RopeStyle style) {
  if (q.ndim() != 3 || k.ndim() != 2 || q.size(-1) != k.size(-1) || q.size(0) != k.size(0))
    throw std::invalid_argument("indexer_qk_rope: q must be [T, H, D] and k [T, D], got " +
                                q.describe() + " and " + k.describe());
  const int64_t rot = cache.size(1);
  if (rot > q.size(-1))
    throw std::invalid_argument("indexer_qk_rope: rope dim " + std::to_string(rot) +
                                " exceeds head dim " + std::to_string(q.size(-1)));
  RotatedQK r{q.contiguous(), k.contiguous()};
  rope_inplace(r.q.slice(-1, 0, rot), positions, cache, style);
  rope_inplace(r.k.slice(-1, 0, rot), positions, cache, style);
  return r;
}

}  // namespace attncheck::ref
